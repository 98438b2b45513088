#!/bin/bash
# Session 6, call 1: correctness of session 5's late changes on CUDA, then the erf timing.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv
( EMBER_TEST_DEVICE=cuda timeout 290 python3 -m pytest -q -x -p no:cacheprovider \
    tests/e2e/test_pointwise.py -k "erf or gelu" 2>&1 | tail -15 ) > $OUT/erf-tests.txt 2>&1
cat $OUT/erf-tests.txt
timeout 200 python3 -m ember.bench.gpu --only S2,S1 --out $OUT/bench 2>&1 | tail -25
( EMBER_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider \
    tests/e2e tests/capture tests/test_api.py 2>&1 | tail -40 ) > $OUT/cuda-e2e.txt 2>&1
tail -40 $OUT/cuda-e2e.txt
