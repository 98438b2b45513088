#!/usr/bin/env bash
# H200, 2026-12-02, call 6: the first call's stages on cold caches; the host's side of Qwen2
# and T5 (launch-bound in call 5); GPT-2, BART and BERT with their odd vocabularies padded.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
for m in vit gpt2; do
  timeout 60 python3 -m ember.bench.zoo_first_call $m > $OUT/first-$m.txt 2>&1
  grep "compiled in\|Triton kernels in\|^== " $OUT/first-$m.txt | cut -c1-300
done
timeout 200 python3 -m ember.bench.zoo_profile qwen2 t5 --variants ember --host \
    --rows 30 > $OUT/host.txt 2>&1
grep "^== " $OUT/host.txt
timeout 300 python3 -m ember bench --models --device cuda --modes infer \
    --only gpt2 bart bert --process variant --out $OUT/infer6 2>&1 | grep -A40 "^steady state"
