#!/bin/bash
# Session 8, call 6: the whole CUDA suite on the session's final code (the state-sweep fixes:
# hooks, instance forwards, guards on state read once, aliasing inputs, breaks inside code
# the capture calls itself).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
EMBER_TEST_DEVICE=cuda timeout 400 python3 -m pytest -q -p no:cacheprovider --tb=short -W ignore tests/e2e tests/capture tests/test_api.py tests/runtime tests/autodiff tests/test_torch_internals.py > $OUT/cuda-tests.txt 2>&1; tail -15 $OUT/cuda-tests.txt
