#!/usr/bin/env bash
# H200, 2026-12-02, call 10: the transformers models' inference after this change (padding,
# math-composite attention traced, outputs viewing library results, residuals stored once).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
timeout 500 python3 -m ember bench --models --device cuda --modes infer \
    --only gpt2 llama qwen2 bert t5 bart vit --process variant --out $OUT/infer10 2>&1 | \
    grep -A40 "^steady state"
