#!/usr/bin/env bash
# H200, 2026-12-02, call 12: the attention replay's tests and the training tests on CUDA (log
# kept whole), then the transformers models' inference with the replay and the wrapper's
# plain views and allocations.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
EMBER_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q -rf --tb=short -p no:cacheprovider \
    tests/lower/test_tracer.py tests/e2e/test_training.py tests/property > $OUT/tests12.txt 2>&1
grep -E "passed|failed" $OUT/tests12.txt | tail -3
grep -B2 -A12 "is_block" $OUT/tests12.txt | head -40
timeout 390 python3 -m ember bench --models --device cuda --modes infer \
    --only gpt2 llama qwen2 bert bart --process variant --out $OUT/infer12 2>&1 | \
    grep -A12 "^steady state"
