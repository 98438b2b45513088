#!/bin/bash
# Session 8, call 1: Triton's compile cache keyed on its files' stats (not a 0.6 s hash of
# its 400 MB library) and kernels compiling while the CUDA driver starts. S2's first call
# three times against torch.compile's, where one ember first call goes, then the CUDA suite
# (session 7's capture changes after its last GPU call were never run on CUDA).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
for i in 1 2 3; do timeout 80 python3 -m ember.bench.gpu --only S2 --variants "torch.compile,ember" --out $OUT/s2-first-$i 2>&1 | grep "^| S2\|first"; done
for i in 1 2; do
  export TRITON_CACHE_DIR=$(mktemp -d) EMBER_CACHE_DIR=$(mktemp -d)
  EMBER_LOGS=perf,kernels timeout 40 python3 -c "
import time,torch,ember
from ember.bench.gpu import build
fn,args=build('S2',False)
t=time.perf_counter(); c=ember.compile(fn); c(*args); torch.cuda.synchronize(); print('first call', time.perf_counter()-t)
" 2>&1 | tail -14
done
unset TRITON_CACHE_DIR EMBER_CACHE_DIR
EMBER_TEST_DEVICE=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider tests/e2e tests/capture tests/test_api.py tests/runtime tests/test_torch_internals.py 2>&1 | tail -25 | tee $OUT/cuda-tests.txt
