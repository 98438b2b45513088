#!/bin/bash
# Session 8, call 2: the full GPU bench (every workload and variant in one run) with
# Triton's compile cache keyed on file stats.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 570 python3 -m ember.bench.gpu --out $OUT/full 2>&1 | tail -40
