#!/bin/bash
# Session 7, call 3: dependent launch and 3-stage matmul steps on by default. The CUDA e2e
# suite under the defaults, then the closing figures of issue 5's latency targets (S1, S2;
# S4 and S5 under reduce-overhead), as session 6's call 5 took them.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
EMBER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/e2e tests/test_torch_internals.py 2>&1 | tail -6 | tee $OUT/cuda-tests.txt
timeout 150 python3 -m ember.bench.gpu --only S1,S2 --out $OUT/bench-s1-s2 2>&1 | tail -10
timeout 150 python3 -m ember.bench.gpu --only S4,S5 --variants "eager,torch.compile ro,ember ro" --out $OUT/bench-s4-s5-ro 2>&1 | tail -10
