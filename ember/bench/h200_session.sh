#!/bin/bash
# A device call's steps beyond h200_call.sh's, given as lines of $JOBS ("name limit command"),
# each under its own time limit, its output in $OUT/name.txt:
#     JOBS=$'prof 200 python -m ember.bench.zoo_profile resnet50 --mode train' ember/bench/h200_session.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
while read -r name limit command; do
  [ -z "$name" ] && continue
  t0=$(date +%s)
  timeout "$limit" bash -c "$command" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
done <<< "$JOBS"
