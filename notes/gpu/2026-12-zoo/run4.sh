#!/usr/bin/env bash
# H200, 2026-12-01, call 4: MobileNetV3's bf16 mismatch (fp32 against fp64), the layout-sensitive
# models again after the memory-order fix, and a training step.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
timeout 90 python3 -m ember.bench.zoo_precision 2>&1 | tail -3
timeout 300 python3 -m ember bench --models --device cuda --modes infer,train \
    --only resnet50-infer convnext-infer mobilenetv3-infer gpt2-train \
    --process variant --out $OUT/zoo4 2>&1 | grep -A40 "^steady state"
