#!/bin/bash
# One call of the lent H200 (the device tool runs it from the repository root, with carry:
# [".whl"]): installs the carried wheels, then runs the steps named in $STEPS (tests internals
# cuda views dyn decode autotune infer train warm warmdecode firstdecode prof), each under its own time limit, and leaves one tarball in $OUT:
#     STEPS="tests decode" ember/bench/h200_call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m compileall -q ember > /dev/null
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s);
  timeout $limit "$@" > $OUT/$name.txt 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a $OUT/steps.txt; tail -5 $OUT/$name.txt; }
for s in $STEPS; do
case $s in
tests) step tests 200 env EMBER_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider tests/e2e/test_dynamic.py tests/runtime/test_tune_triton.py tests/test_tuning.py tests/test_torch_internals.py ;;
internals) step internals 150 python -m pytest -q -p no:cacheprovider tests/test_import_cost.py tests/test_torch_internals.py ;;
cuda) step cuda ${CUDA_LIMIT:-200} env EMBER_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider tests/test_backends.py tests/runtime/test_compiled.py tests/runtime/test_cudagraphs.py ;;
views) step views 220 env EMBER_TEST_DEVICE=cuda python -m pytest -q --maxfail=6 -p no:cacheprovider tests/e2e/test_dynamic_views.py tests/e2e/test_dynamic_training.py tests/runtime/test_cudagraphs.py ;;
dyn) step dyn 150 python -m ember.bench.dynamic_triton --device cuda --lengths ${DYN_LENGTHS:-256,1000,1024,4096,5000} --json $OUT/dyn.json ;;
decode) step decode ${DECODE_LIMIT:-330} python -m ember bench --models --device cuda --modes decode --only gpt2 --variants eager,inductor,ember --process variant --out $OUT/decode ;;
autotune) step autotune ${AUTOTUNE_LIMIT:-150} python -m ember.bench.autotune --device cuda --size full --only ${AUTOTUNE_ONLY:-softmax S4} ${AUTOTUNE_ARGS} --json $OUT/autotune.json ;;
infer) step infer ${INFER_LIMIT:-420} python -m ember bench --models --device cuda --modes infer --only ${INFER_ONLY:-gpt2 bert vit resnet50} --process variant --out $OUT/infer ;;
train) step train ${TRAIN_LIMIT:-420} python -m ember bench --models --device cuda --modes train --only ${TRAIN_ONLY:-gpt2 bert vit} --process variant --out $OUT/train ;;
warm) step warm 170 python -m ember.bench.warm_start --device cuda --only ${WARM_ONLY:-softmax S2} --json $OUT/warm.json ;;
warmdecode) step warmdecode 220 python -m ember.bench.warm_start --device cuda --size quick --only ${WARM_ONLY:-zoo:gpt2:decode} --json $OUT/warmdecode.json ;;
firstdecode) step firstdecode 150 python -m ember.bench.zoo_first_call gpt2 --mode decode --size quick --calls 2 --profile --rows 45 ;;
prof) step prof 300 python -m ember.bench.zoo_profile gpt2 --mode decode --variants ember,tc --host --rows 30 ;;
esac
done
cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz $OUT/all.tgz
