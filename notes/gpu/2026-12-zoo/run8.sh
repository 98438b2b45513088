#!/usr/bin/env bash
# H200, 2026-12-02, call 8: which MobileNetV3 layer takes ember's bf16 error away from
# eager's; ViT's schedule and kernels (its add + layer-norm kernels took 60 µs against
# torch.compile's 10-18); an output that views a library result is that result (no copy).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
EMBER_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -x \
    tests/schedule tests/e2e/test_nn.py tests/passes 2>&1 | tail -2
timeout 120 python3 -m ember.bench.zoo_precision --bisect 2>&1 | tail -22
EMBER_DUMP=$OUT/vitdump timeout 100 python3 -m ember.bench.zoo_profile vit gpt2 \
    --variants ember --rows 40 > $OUT/profile.txt 2>&1
grep "^== " $OUT/profile.txt
