#!/bin/bash
# Session 7, call 5 (machine still warm, ~100 s): S2's first call twice more (call 4 had it at
# 0.37x torch.compile's), and where an ember first call of S2 spends its time.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD; for i in 1 2; do timeout 70 python3 -m ember.bench.gpu --only S2 --variants "torch.compile,ember" --out $OUT/s2-first-$i 2>&1 | grep "^| S2\|first"; done; EMBER_LOGS=perf,kernels timeout 40 python3 -c "
import time,torch,ember
from ember.bench.gpu import build
fn,args=build('S2',False)
t=time.perf_counter(); c=ember.compile(fn); c(*args); torch.cuda.synchronize(); print('first call', time.perf_counter()-t)
" 2>&1 | tail -12
