#!/bin/bash
# Session 6, call 4: S4/S5 reduce-overhead after the guard-and-run fusion and the direct copy-in.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 90 python3 notes/gpu/session6/ro_profile.py 2>&1 | tee $OUT/ro-profile.txt
EMBER_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider tests/e2e/test_pointwise.py -k erf tests/runtime/test_cudagraphs.py 2>&1 | tail -3
timeout 300 python3 -m ember.bench.gpu --only S4,S5 --out $OUT/bench 2>&1 | tail -16
