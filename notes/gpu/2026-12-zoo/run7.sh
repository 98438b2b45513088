#!/usr/bin/env bash
# H200, 2026-12-02, call 7: attention that eager runs as its math composite is traced (T5);
# large odd-sized half matmuls padded (GPT-2, BART): tests on CUDA, then kernels against
# torch.compile's, and MobileNetV3's bf16 error with and without in-kernel small matmuls.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
EMBER_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/passes/test_matmul_padding.py tests/e2e/test_nn.py \
    "tests/e2e/test_zoo_models.py::test_inference_matches_eager" -k "attention or padd or t5 or bart or gpt2" 2>&1 | tail -3
timeout 300 python3 -m ember.bench.zoo_profile gpt2 t5 bart --variants ember,tc \
    --rows 16 > $OUT/profile.txt 2>&1
grep "^== " $OUT/profile.txt
for fuse in 1 0; do
  EMBER_MATMUL_EPILOGUE=$fuse timeout 90 python3 -m ember.bench.zoo_precision 2>&1 | tail -2
done
