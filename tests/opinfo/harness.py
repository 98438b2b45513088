"""PyTorch's OpInfo samples through ember.compile, compared with eager: the machinery behind
tests/opinfo/test_opinfo.py (and its sweep, tests/opinfo/sweep.py).

Each op is called as a new user would call it: `ember.compile(lambda *a, **k: op(*a, **k))`,
one fresh compiled function per sample (so recompiling across samples is part of the test), on
copies of the sample's tensors. What is compared, output by output: values (at the op's own
float32 tolerances), shape, strides (where eager's output is dense), dtype, device, layout,
requires_grad, whether it has a grad_fn, whether it shares memory with an input or another
output, whether it is an input object itself; and the inputs afterwards (in-place writes).
Gradients: the same under a fixed random cotangent, for every input that requires grad.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from opinfo.expectations import looser_tolerance

import ember
from ember import torch_internals
from ember.torch_internals import tree_flatten

SAMPLES_PER_OP = 3
DTYPE = torch.float32
# the CPU, or the GPU where the suite runs on one (EMBER_TEST_DEVICE=cuda, tests/conftest.py)
DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
# torch.testing's defaults for float32, which OpInfo tests use unless the op overrides them.
DEFAULT_TOLERANCE = (1e-5, 1.3e-6)   # (atol, rtol)

# Ops whose results are random or undefined by specification: nothing to compare.
RANDOM = "draws random numbers: eager's and ember's draws are not the same stream"
UNDEFINED = "its result is undefined by specification (uninitialized memory)"
SKIPS = {
    **dict.fromkeys(["bernoulli", "normal", "normal.number_mean", "normal.in_place",
                     "multinomial", "rand_like", "randn",
                     "randn_like", "randint", "randint_like", "uniform", "cauchy",
                     "exponential", "geometric", "log_normal", "nn.functional.dropout",
                     "nn.functional.dropout2d", "nn.functional.dropout3d",
                     "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
                     "nn.functional.feature_alpha_dropout.with_train",
                     "nn.functional.feature_alpha_dropout.without_train",
                     "nn.functional.fractional_max_pool2d",
                     "nn.functional.fractional_max_pool3d", "nn.functional.rrelu",
                     "nn.functional.multi_head_attention_forward", "svd_lowrank",
                     "pca_lowrank", "torch._refs.rand_like"], RANDOM),
    **dict.fromkeys(["empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                     "new_empty_strided"], UNDEFINED),
}


# Samples of otherwise deterministic ops that draw random numbers (attention with dropout).
def _random_sample(sample: Any) -> bool:
    return bool(sample.kwargs.get("dropout_p", 0.0))


class Mismatch(AssertionError):
    """Ember's answer differs from eager's (a wrong value or wrong metadata)."""


def op_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def forward_ops() -> list[Any]:
    """The ops of op_db with float32 samples on the device under test, in op_db's order."""
    return [op for op in torch_internals.opinfo_database()
            if DTYPE in op.supported_dtypes(DEVICE)]


def backward_ops() -> list[Any]:
    return [op for op in forward_ops()
            if op.supports_autograd and DTYPE in op.supported_backward_dtypes(DEVICE)]


def tolerance(op: Any, direction: str) -> tuple[float, float]:
    """The op's float32 tolerance: the largest of its own overrides (OpInfo decorators) on the
    CPU, or torch.testing's default; looser where expectations.py says why."""
    atol, rtol = DEFAULT_TOLERANCE
    overrides = torch_internals.opinfo_tolerance_overrides(op, DTYPE, DEVICE)
    looser = looser_tolerance(op_name(op), direction)
    for override in overrides + ([looser] if looser else []):
        atol, rtol = max(atol, override[0]), max(rtol, override[1])
    return atol, rtol


def samples(op: Any, requires_grad: bool) -> list[Any]:
    """The op's first SAMPLES_PER_OP float32 samples on the device under test (a fixed seed:
    the same every run)."""
    torch.manual_seed(0)
    drawn = (s for s in op.sample_inputs(DEVICE, DTYPE, requires_grad=requires_grad)
             if not _random_sample(s))
    return list(itertools.islice(drawn, SAMPLES_PER_OP))


def _copy_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """An exact copy: the same strides and storage offset over a copy of the storage, a leaf
    that requires grad where the original does."""
    if tensor.layout != torch.strided:
        result = tensor.detach().clone()
    else:
        source = tensor.detach()
        result = torch.empty(0, dtype=source.dtype, device=source.device)
        result.set_(source.untyped_storage().clone(), source.storage_offset(), source.size(),
                    source.stride())
        result = result.clone() if source.is_conj() or source.is_neg() else result
    return result.requires_grad_(tensor.requires_grad)


def copy_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) of one call, every tensor an exact copy of the given ones'."""
    memo: dict[int, Any] = {}

    def copy_value(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in memo:
                memo[id(value)] = _copy_tensor(value)
            return memo[id(value)]
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(copy_value(v) for v in value)
        if isinstance(value, dict):
            return {k: copy_value(v) for k, v in value.items()}
        return copy.copy(value) if isinstance(value, torch.Generator) else value

    return copy_value(tuple(args)), copy_value(dict(kwargs))


def _calling(op: Any) -> Callable:
    operation = op.op

    def call(*args: Any, **kwargs: Any) -> Any:
        return operation(*args, **kwargs)

    return call


def _leaves(args: tuple, kwargs: dict) -> list[Any]:
    return tree_flatten((args, kwargs))[0]


def _dense(tensor: torch.Tensor) -> bool:
    """Eager's strides are part of its contract where its output is non-overlapping and dense
    (every element once, no gaps): a permutation of a contiguous layout."""
    if tensor.layout != torch.strided or tensor.numel() == 0:
        return False
    expected = 1
    for size, stride in sorted(zip(tensor.shape, tensor.stride()), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _significant_strides(tensor: torch.Tensor) -> tuple[int | None, ...]:
    return tuple(s if n > 1 else None for n, s in zip(tensor.shape, tensor.stride()))


def _storage(value: Any) -> int | None:
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    storage = value.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


def _aliasing(outputs: list[Any], inputs: list[Any]) -> list[tuple]:
    """For each output: which inputs and earlier outputs share its memory, which input it is."""
    pointers = [_storage(v) for v in outputs + inputs]
    result = []
    for i, value in enumerate(outputs):
        shares = tuple(j for j, p in enumerate(pointers)
                       if j != i and p is not None and p == pointers[i])
        same = tuple(j for j, v in enumerate(inputs) if v is value)
        result.append((shares, same))
    return result


def compare(actual: Any, expected: Any, actual_inputs: list[Any], expected_inputs: list[Any],
            limits: tuple[float, float], what: str) -> None:
    """Values (within `limits`: atol, rtol) and metadata of every output, and the inputs
    afterwards (for in-place ops)."""
    flat_actual, spec_actual = tree_flatten(actual)
    flat_expected, spec_expected = tree_flatten(expected)
    if type(actual) is not type(expected) or str(spec_actual) != str(spec_expected):
        raise Mismatch(f"{what}: result {type(actual).__name__} {spec_actual}, eager's "
                       f"{type(expected).__name__} {spec_expected}")
    atol, rtol = limits
    pairs = list(zip(flat_actual, flat_expected)) + list(zip(actual_inputs, expected_inputs))
    for index, (got, want) in enumerate(pairs):
        where = f"{what} output {index}" if index < len(flat_actual) else \
            f"{what} input {index - len(flat_actual)} afterwards"
        if not isinstance(want, torch.Tensor):
            if isinstance(want, float) and want != want:
                ok = isinstance(got, float) and got != got
            else:
                ok = type(got) is type(want) and got == want
            if not ok:
                raise Mismatch(f"{where}: {got!r}, eager's {want!r}")
            continue
        if not isinstance(got, torch.Tensor):
            raise Mismatch(f"{where}: a {type(got).__name__}, eager's is a tensor")
        for name in ("shape", "dtype", "device", "layout", "requires_grad"):
            if getattr(got, name) != getattr(want, name):
                raise Mismatch(f"{where}: {name} {getattr(got, name)}, eager's "
                               f"{getattr(want, name)}")
        if (got.grad_fn is None) != (want.grad_fn is None):
            raise Mismatch(f"{where}: grad_fn {got.grad_fn}, eager's {want.grad_fn}")
        if _dense(want) and _significant_strides(got) != _significant_strides(want):
            raise Mismatch(f"{where}: strides {got.stride()}, eager's {want.stride()}")
        if want.layout != torch.strided:
            got, want = got.to_dense(), want.to_dense()
        try:
            torch.testing.assert_close(got.detach(), want.detach(), atol=atol, rtol=rtol,
                                       equal_nan=True, check_stride=False)
        except AssertionError as error:
            raise Mismatch(f"{where}: {error}") from None
    if _aliasing(flat_actual, actual_inputs) != _aliasing(flat_expected, expected_inputs):
        raise Mismatch(f"{what}: outputs share memory with inputs or each other unlike "
                       f"eager's: {_aliasing(flat_actual, actual_inputs)}, eager's "
                       f"{_aliasing(flat_expected, expected_inputs)}")


def _eager(call: Callable, args: tuple, kwargs: dict) -> Any:
    """Eager's result, or None where eager itself raises on the sample (nothing to compare)."""
    try:
        return (call(*args, **kwargs),)
    except Exception:   # noqa: BLE001  (a sample eager rejects says nothing about ember)
        return None


def check_call(call: Callable, args: tuple, kwargs: dict, limits: tuple[float, float],
               what: str, gradients: bool) -> bool:
    """Run `call` eagerly and through ember.compile, each on its own exact copy of the
    arguments, and compare (raising Mismatch); with `gradients`, also the gradients of every
    input that requires grad under a fixed random cotangent. False where eager itself raises
    (nothing to compare)."""
    expected_args, expected_kwargs = copy_arguments(args, kwargs)
    eager = _eager(call, expected_args, expected_kwargs)
    if eager is None:
        return False
    actual_args, actual_kwargs = copy_arguments(args, kwargs)
    actual = ember.compile(call)(*actual_args, **actual_kwargs)
    inputs = _leaves(actual_args, actual_kwargs)
    expected_inputs = _leaves(expected_args, expected_kwargs)
    compare(actual, eager[0], inputs, expected_inputs, limits, what)
    if gradients:
        _compare_gradients(actual, eager[0], inputs, expected_inputs, limits, what)
    return True


def _compare_gradients(actual: Any, expected: Any, inputs: list, expected_inputs: list,
                       limits: tuple[float, float], what: str) -> None:
    wanted = [i for i, t in enumerate(tree_flatten(expected)[0])
              if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves = [i for i, t in enumerate(expected_inputs)
              if isinstance(t, torch.Tensor) and t.requires_grad]
    if not wanted or not leaves:
        return
    want_outputs = [tree_flatten(expected)[0][i] for i in wanted]
    got_outputs = [tree_flatten(actual)[0][i] for i in wanted]
    cotangents = _cotangents(want_outputs)
    try:
        want = torch.autograd.grad(want_outputs, [expected_inputs[i] for i in leaves],
                                   cotangents, allow_unused=True)
    except Exception:  # noqa: BLE001  (eager's own backward refuses: eig's phase)
        return
    got = torch.autograd.grad(got_outputs, [inputs[i] for i in leaves], cotangents,
                              allow_unused=True)
    atol, rtol = limits
    for position, got_grad, want_grad in zip(leaves, got, want):
        if want_grad is None and got_grad is None:
            continue
        reference = inputs[position]
        got_grad = torch.zeros_like(reference) if got_grad is None else got_grad
        want_grad = torch.zeros_like(reference) if want_grad is None else want_grad
        try:
            torch.testing.assert_close(got_grad, want_grad, atol=atol, rtol=rtol,
                                       equal_nan=True, check_stride=False)
        except AssertionError as error:
            raise Mismatch(f"{what}: gradient of input {position}: {error}") from None


def _cotangents(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(o.shape, generator=generator, dtype=o.dtype, device="cpu").to(o.device)
            for o in outputs]


def check_forward(op: Any) -> int:
    """Compare every sample's forward results; the number of samples compared."""
    return sum(check_call(_calling(op), (s.input, *s.args), dict(s.kwargs),
                          tolerance(op, "forward"), f"sample {number}", gradients=False)
               for number, s in enumerate(samples(op, requires_grad=False)))


def check_backward(op: Any) -> int:
    """Compare every sample's outputs and the gradients of each input that requires grad."""
    return sum(check_call(_calling(op), (s.input, *s.args), dict(s.kwargs),
                          tolerance(op, "backward"), f"sample {number}", gradients=True)
               for number, s in enumerate(samples(op, requires_grad=True)))


def all_ops(direction: str) -> Iterator[Any]:
    yield from (forward_ops() if direction == "forward" else backward_ops())
