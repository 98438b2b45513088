#!/usr/bin/env bash
# H200, 2026-12-01, call 3: where ResNet-50's and GPT-2's time goes (eager against ember), the
# T5 fix, and the rest of the zoo's inference.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
EMBER_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider \
    tests/e2e/test_zoo_models.py -k "t5-infer or convnext-train" 2>&1 | tail -2
timeout 150 python3 -m ember.bench.zoo_profile resnet50 gpt2 > $OUT/profile.txt 2>&1
grep -A16 "^== " $OUT/profile.txt | cut -c1-60,100-200 | grep -v "^---" | head -75
timeout 330 python3 -m ember bench --models --device cuda --modes infer \
    --only t5 bart qwen2 convnext mobilenetv3 efficientnet \
    --process variant --out $OUT/infer3 2>&1 | grep -A40 "^steady state"
