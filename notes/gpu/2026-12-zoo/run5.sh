#!/usr/bin/env bash
# H200, 2026-12-02, call 5: where the first call goes on cold caches (ViT, GPT-2), and where
# the steady state goes against torch.compile for the models ember is slower on.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
nproc
for m in vit gpt2; do
  timeout 60 python3 -m ember.bench.zoo_first_call $m --rows 40 > $OUT/first-$m.txt 2>&1
  head -1 $OUT/first-$m.txt; grep -c "triton.compile" $OUT/first-$m.txt
  grep "compiled in\|Triton kernels in\|^== " $OUT/first-$m.txt | cut -c1-400
done
timeout 400 python3 -m ember.bench.zoo_profile qwen2 t5 gpt2 vit --variants eager,ember,tc \
    --rows 25 > $OUT/profile.txt 2>&1
grep "^== " $OUT/profile.txt
