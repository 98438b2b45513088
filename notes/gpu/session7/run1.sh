#!/bin/bash
# Session 7, call 1: CUDA correctness of session 6's later changes (e2e, capture, api,
# runtime), then S4/S5 reduce-overhead after the one-C++-call parameter pointer check:
# cProfile of a call, and the bench twice.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
EMBER_TEST_DEVICE=cuda timeout 250 python3 -m pytest -q -x -p no:cacheprovider tests/e2e tests/capture tests/test_api.py tests/runtime tests/test_torch_internals.py 2>&1 | tail -15 | tee $OUT/cuda-tests.txt
timeout 90 python3 notes/gpu/session6/ro_profile.py 2>&1 | tee $OUT/ro-profile.txt
for i in 1 2; do
timeout 150 python3 -m ember.bench.gpu --only S4,S5 --variants "eager,torch.compile ro,ember ro" --out $OUT/bench-ro-$i 2>&1 | tail -8
done
