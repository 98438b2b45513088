#!/bin/bash
# Session 6, call 3: S4/S5 reduce-overhead again (run 2: S4 ro 0.97x torch.compile ro, was 0.73x).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nproc; cat /proc/loadavg
timeout 60 python3 notes/gpu/session6/ro_probe.py > $OUT/ro-probe.json 2>&1; cat $OUT/ro-probe.json
timeout 300 python3 -m ember.bench.gpu --only S4,S5 --out $OUT/bench 2>&1 | tail -22
