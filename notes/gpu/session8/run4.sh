#!/bin/bash
# Session 8, call 4: why call 3's new CUDA tests failed (full tracebacks).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
EMBER_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -W ignore tests/e2e/test_training.py -k "scheduler or different_steps or ema or default_half" > $OUT/failures-training.txt 2>&1; tail -3 $OUT/failures-training.txt
EMBER_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -W ignore tests/e2e/test_nn.py::test_a_convolution_of_a_channels_last_view_compiles_forward_and_backward tests/autodiff/test_vjp.py::test_unary > $OUT/failures-other.txt 2>&1; tail -3 $OUT/failures-other.txt
