#!/bin/bash
# Session 7, call 4: the full GPU bench under this session's defaults (dependent launch,
# three-stage matmul steps, the one-call pointer check): every workload and variant.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 555 python3 -m ember.bench.gpu --out $OUT/full 2>&1 | tail -40
