#!/usr/bin/env bash
# H200, 2026-12-01, call 1: the frontend on Python 3.12 / torch 2.11 (library Python, markers,
# the eager fast path, eager islands, the zoo's tiny models on CUDA), then a first zoo timing.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
python3 -c "import sys, torch, transformers, timm, triton; print(sys.version.split()[0], torch.__version__, transformers.__version__, timm.__version__, triton.__version__, torch.cuda.get_device_name())"
EMBER_TEST_DEVICE=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider \
    tests/capture/test_library_python.py tests/capture/test_torch_markers.py \
    tests/test_eager_fast_path.py tests/e2e/test_eager_islands.py tests/e2e/test_zoo_models.py \
    2>&1 | tee $OUT/tests.log | tail -25
timeout 200 python3 -m ember bench --models --device cuda --modes infer --only gpt2 resnet50 \
    --process variant --out $OUT/infer1 2>&1 | tail -30
