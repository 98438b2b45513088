"""PyTorch's OpInfo database through ember.compile, against eager: every op of op_db with
float32 CPU samples, forward and (where the op supports autograd) backward, three samples
each, values at the op's own tolerances and the metadata of every output (tests/opinfo/
harness.py says what is compared). Random ops and ops whose result is undefined are skipped
with the reason; expected errors (never wrong values) are strict xfails with theirs
(tests/opinfo/expectations.py).

Under CI=true a fixed slice runs: the ops whose name hashes to 0 modulo CI_SLICES, the same
ones on every run (about two minutes on two cores). The full run, every op:

    python -m pytest tests/opinfo            (outside CI; or CI=true ... -m slow)

and `python tests/opinfo/sweep.py forward|backward` prints the same run as a table of counts.
The Triton backend runs a chosen subset, forward and backward, under Triton's interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py) in CI too: about half a minute.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os

import pytest
from opinfo.expectations import expected_failure
from opinfo.harness import SKIPS, backward_ops, check_backward, check_forward, forward_ops, op_name

from ember import config

CI_SLICES = 8
# A few ops of each kind the Triton backend generates: pointwise, reductions, views, indexing,
# normalizations, and library calls between kernels.
TRITON_OPS = ("add", "mul", "sigmoid", "where", "clamp", "sum", "amax", "mean", "softmax",
              "log_softmax", "cumsum", "transpose", "index_select", "nn.functional.gelu",
              "nn.functional.layer_norm", "matmul")


# Ops ember once got wrong (values, metadata) or raised on: CI runs them on every run.
REGRESSIONS = {"as_strided.partial_views", "nn.functional.embedding_bag", "unsafe_split",
               "unsafe_chunk", "nn.functional.instance_norm", "native_layer_norm",
               "native_batch_norm", "torch.ops.aten._safe_softmax.default", "norm",
               "linalg.norm", "linalg.norm.subgradients_at_zero", "linalg.matrix_power",
               "lu_unpack", "linalg.lu", "view_as_complex", "fill", "zero_", "to_sparse",
               "chalf", "resize_", "sparse.mm.reduce", "sparse.sampled_addmm", "asin", "atanh",
               "nn.functional.layer_norm", "__getitem__", "index_put", "fft.rfftn",
               "linalg.eig"}


def _in_ci_slice(name: str) -> bool:
    return name in REGRESSIONS or int(hashlib.sha1(name.encode()).hexdigest(), 16) % CI_SLICES == 0


def _cases(ops: list, direction: str, sliced: bool = True) -> list:
    cases = []
    for op in ops:
        name = op_name(op)
        case_marks = []
        if name in SKIPS:
            case_marks.append(pytest.mark.skip(reason=SKIPS[name]))
        elif os.environ.get("CI") == "true" and sliced and not _in_ci_slice(name):
            case_marks.append(pytest.mark.skip(
                reason=f"CI runs one op in {CI_SLICES} (pytest tests/opinfo outside CI: all)"))
        known = expected_failure(name, direction)
        if known:
            case_marks.append(pytest.mark.xfail(reason=known, strict=True, raises=Exception))
        cases.append(pytest.param(op, id=name, marks=case_marks))
    return cases


def _check(check, op) -> None:
    compared = check(op)
    if not compared:
        pytest.skip("eager rejects every sample on the CPU")


@pytest.mark.parametrize("op", _cases(forward_ops(), "forward"))
def test_forward_matches_eager(op):
    _check(check_forward, op)


@pytest.mark.parametrize("op", _cases(backward_ops(), "backward"))
def test_gradients_match_eager(op):
    _check(check_backward, op)


@pytest.fixture
def triton_backend():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    with config.override(backend="triton"):
        yield


_TRITON_FORWARD = [op for op in forward_ops() if op_name(op) in TRITON_OPS]
_TRITON_BACKWARD = [op for op in backward_ops() if op_name(op) in TRITON_OPS]


@pytest.mark.parametrize("op", _cases(_TRITON_FORWARD, "forward", sliced=False))
def test_triton_forward_matches_eager(op, triton_backend):
    _check(check_forward, op)


@pytest.mark.parametrize("op", _cases(_TRITON_BACKWARD, "backward", sliced=False))
def test_triton_gradients_match_eager(op, triton_backend):
    _check(check_backward, op)
