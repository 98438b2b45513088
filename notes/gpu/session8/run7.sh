#!/bin/bash
# Session 8, call 7: S4 and S5 under reduce-overhead on the final code (the guards added
# after call 2: hooks and instance forwards of inlined modules, class members), against
# torch.compile's, to see that the host part did not grow.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 -m ember.bench.gpu --only S4,S5 --variants "eager,torch.compile ro,ember ro" --out $OUT/s4-s5-ro 2>&1 | grep "^| S\|^- S"
