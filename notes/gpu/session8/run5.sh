#!/bin/bash
# Session 8, call 5: call 4's failures after their fixes (tests' CPU generators, ember.optim
# imported by the test, convolution layouts from a run on CUDA too), then the e2e suite once
# more.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
EMBER_TEST_DEVICE=cuda timeout 250 python3 -m pytest -q -p no:cacheprovider --tb=short -W ignore tests/e2e tests/autodiff > $OUT/cuda-tests.txt 2>&1; tail -12 $OUT/cuda-tests.txt
