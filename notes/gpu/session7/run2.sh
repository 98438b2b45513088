#!/bin/bash
# Session 7, call 2: programmatic dependent launch (EMBER_DEPENDENT_LAUNCH=1) and pipelined
# matmul steps (num_stages): correctness on CUDA with dependent launch on (capture, api,
# runtime, matmul epilogue, reductions), S4's tile sweep, then S4/S5 ro and S2 with it off/on.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
EMBER_DEPENDENT_LAUNCH=1 EMBER_TEST_DEVICE=cuda timeout 230 python3 -m pytest -q -p no:cacheprovider tests/capture tests/test_api.py tests/runtime tests/test_torch_internals.py tests/e2e/test_matmul_epilogue.py tests/e2e/test_reductions.py 2>&1 | tail -8 | tee $OUT/cuda-tests.txt
timeout 120 python3 -m ember.bench.gpu --only S4 --tune --variants ember --out $OUT/tune 2>&1 | tail -3
python3 - <<'PY'
import json, os
for r in json.load(open(os.environ["OUT"] + "/tune/results.json"))["results"]:
    for t in r.get("tiles", []):
        print({k: v for k, v in t.items() if k not in ("tb_s", "matmul_precision")})
PY
for pdl in 0 1; do
EMBER_DEPENDENT_LAUNCH=$pdl timeout 100 python3 -m ember.bench.gpu --only S4,S5 --variants "ember ro" --out $OUT/ro-pdl$pdl 2>&1 | grep "^| S"
EMBER_DEPENDENT_LAUNCH=$pdl timeout 60 python3 -m ember.bench.gpu --only S2 --variants "ember" --out $OUT/s2-pdl$pdl 2>&1 | grep "^| S"
done
