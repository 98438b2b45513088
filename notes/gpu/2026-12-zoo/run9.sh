#!/usr/bin/env bash
# H200, 2026-12-02, call 9: the CUDA test that failed in call 8; MobileNetV3's prefixes under
# ember's IR interpreter (is the error the lowering's or the Triton kernels'?); ViT's schedule
# and kernels, packed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
EMBER_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -x \
    tests/schedule tests/e2e/test_nn.py tests/passes 2>&1 | grep -v "^\[ember" | tail -40 | cut -c1-300
EMBER_BACKEND=interp timeout 100 python3 -m ember.bench.zoo_precision --bisect 2>&1 | \
    grep "blocks.[0-3]" | head -6
EMBER_DUMP=/tmp/vitdump timeout 60 python3 -m ember.bench.zoo_first_call vit --warm \
    2>&1 | grep "^=="
tar czf $OUT/vitdump.tgz -C /tmp vitdump
