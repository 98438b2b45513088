#!/bin/bash
# Session 6, call 5 (the closing figures of issue 5's latency targets, one run): S1 and S2
# (eager, torch.compile, ember), then S4 and S5 under reduce-overhead (eager, both ro).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m ember.bench.gpu --only S1,S2 --out $OUT/bench-s1-s2 2>&1 | tail -10
python3 -m ember.bench.gpu --only S4,S5 --variants "eager,torch.compile ro,ember ro" --out $OUT/bench-s4-s5-ro 2>&1 | tail -10
