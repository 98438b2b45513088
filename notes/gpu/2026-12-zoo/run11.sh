#!/usr/bin/env bash
# H200, 2026-12-02, call 11: the last changes' tests on CUDA (attention replayed, the wrapper's plain views among them), then the timm models' inference.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
EMBER_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/lower/test_tracer.py \
    tests/codegen/test_wrapper.py tests/passes \
    tests/schedule tests/property tests/e2e/test_nn.py tests/e2e/test_training.py \
    tests/capture/test_dynamic.py 2>&1 | tail -40 | tee $OUT/tests11.txt
timeout 270 python3 -m ember bench --models --device cuda --modes infer \
    --only resnet50 convnext mobilenetv3 efficientnet --process variant --out $OUT/infer11 2>&1 | \
    grep -A20 "^steady state"
