#!/bin/bash
# Session 8, call 3: the CUDA suite after the sweep fixes (LR schedulers, fused update numbers,
# EMA under no_grad, dropout p=0.5, list indexing, max(dim)/norm gradients, attention masks,
# library layouts), then where S3's training step spends host time (ember vs torch.compile
# vs eager, torch.profiler's CPU view).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
EMBER_TEST_DEVICE=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider tests/e2e tests/capture tests/test_api.py tests/runtime tests/autodiff tests/test_torch_internals.py 2>&1 | tail -30 | tee $OUT/cuda-tests.txt
for v in ember tc eager; do timeout 90 python3 notes/gpu/session8/s3_profile.py $v 2>&1 | tail -26 | tee $OUT/s3-$v.txt; done
