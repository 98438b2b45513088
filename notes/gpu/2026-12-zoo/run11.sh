#!/usr/bin/env bash
# H200, 2026-12-02, call 11: the timm convolutional models' inference after this change, and
# ViT's first call by stage on cold caches.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
timeout 60 python3 -m ember.bench.zoo_first_call vit > $OUT/first-vit.txt 2>&1
grep "compiled in\|Triton kernels in\|^== " $OUT/first-vit.txt | cut -c1-300
timeout 330 python3 -m ember bench --models --device cuda --modes infer \
    --only resnet50 convnext mobilenetv3 efficientnet --process variant --out $OUT/infer11 \
    2>&1 | grep -A40 "^steady state"
