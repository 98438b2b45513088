#!/usr/bin/env bash
# H200, 2026-12-01, call 2: the CUDA checks again (tests drew CPU generators under a CUDA
# default device), where ResNet-50's time goes, and more of the zoo's inference.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
EMBER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/capture/test_library_python.py tests/capture/test_torch_markers.py \
    tests/test_eager_fast_path.py tests/e2e/test_zoo_models.py -k "not slow" \
    2>&1 | tee $OUT/tests.log | tail -8
timeout 120 python3 -m ember.bench.zoo_profile resnet50 > $OUT/profile.txt 2>&1
grep -A18 "^== " $OUT/profile.txt | cut -c1-160 | head -80
timeout 240 python3 -m ember bench --models --device cuda --modes infer --only llama vit bert \
    --process variant --out $OUT/infer2 2>&1 | grep -A40 "^steady state"
