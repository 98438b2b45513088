#!/bin/bash
# Session 6, call 2: the erf bit by bit, the training test fixed, the full bench.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 60 python3 notes/gpu/session6/erf_probe.py $OUT > $OUT/erf-probe.json 2>&1; cat $OUT/erf-probe.json
EMBER_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider tests/e2e/test_training.py -k "no_grad" 2>&1 | tail -3
timeout 480 python3 -m ember.bench.gpu --out $OUT/bench 2>&1 | tail -30
