"""Dynamic shapes, stages 2 and 4 (issue 18): one build serves a family of shapes, with the C
backend and with Triton's (run by its interpreter here). Every call is compared with eager;
builds are counted on EMBER_LOGS=kernels (one line per C file built or loaded, per Triton
module made), captures on compiled.records."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.shapes import ShapeSpecialized

BATCHES = [2, 3, 5, 8, 13, 21, 31, 64]


def t(*shape, seed=0):
    # drawn on the CPU (a seeded CPU generator), then placed where tests make tensors (the
    # GPU under EMBER_TEST_DEVICE=cuda)
    drawn = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), device="cpu")
    return drawn.to(torch.get_default_device())


def c_only(kernel_backend):
    if kernel_backend != "c":
        pytest.skip("the C backend's symbolic strides (stage 3); Triton's compile per shape")


def over_batches(fn, compiled, width, batches=BATCHES, mark=True):
    for b in batches:
        x = t(b, width, seed=b)
        if mark:
            ember.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-5)


def s1(x):
    return 0.5 * x * (1 + torch.tanh(0.8 * (x + 0.04 * x ** 3)))


CASES = {
    "pointwise": (s1, 64),
    "softmax": (lambda x: F.softmax(x, -1), 48),
    "layer_norm": (nn.LayerNorm(32), 32),
    "sum_dim0": (lambda x: x.sum(0), 40),
    "mean_var_dim0": (lambda x: (x.mean(0), x.var(0)), 40),  # (divided by s0 in the kernel)
    "mlp": (nn.Sequential(nn.Linear(24, 32), nn.GELU(), nn.Linear(32, 8)), 24),
}


@pytest.mark.slow_in_interpreter  # (a Triton case under the interpreter: 6-16 s each)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_batch_marked_dynamic_builds_once_for_every_batch_size(name, kernel_backend, builds):
    fn, width = CASES[name]
    compiled = ember.compile(fn)
    with torch.no_grad():
        over_batches(fn, compiled, width)
    assert len(builds()) == 1, builds()
    forward = getattr(compiled, "_compiled_forward", compiled)
    assert len(forward.records) == 1 and forward.entries[0].captured.symbolic
    assert not isinstance(forward.records[0].compiled, ShapeSpecialized)


def test_automatic_dynamic_builds_twice_over_thirty_batch_sizes(kernel_backend, builds):
    # the first call compiles statically; the first recompile makes the batch a symbol
    compiled = ember.compile(s1)
    over_batches(s1, compiled, 16, range(2, 32), mark=False)
    assert len(compiled.records) == 2 and len(builds()) == 2, builds()


def test_torch_compile_dynamic_true_builds_once(kernel_backend, builds):
    # Dynamo makes every dim a symbol; the parameters' sizes settle the hidden one
    model = nn.Sequential(nn.Linear(16, 16), nn.Softmax(-1))
    compiled = torch.compile(model, backend="ember", dynamic=True)
    with torch.no_grad():
        over_batches(model, compiled, 16, [3, 4, 9, 30], mark=False)
    assert len(builds()) == 1, builds()


def test_a_symbolic_stride_builds_once_on_either_backend(kernel_backend, builds):
    # (dynamic=True: the row length is a symbol too, so a row's stride is symbolic)
    fn = lambda x: (x * 2).sum(1)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    for shape in [(3, 5), (4, 7), (6, 2)]:
        torch.testing.assert_close(compiled(t(*shape)), fn(t(*shape)))
    assert not isinstance(compiled.records[0].compiled, ShapeSpecialized)
    assert len(builds()) == 1


@pytest.mark.parametrize("name", ["cat_columns", "column_sum", "transpose", "last_column"])
def test_symbolic_coefficients_and_divisors_render_as_whole_expressions(name, kernel_backend,
                                                                         builds):
    # an index over [s0, 2*s1] divides and takes the modulo by 2*s1, a stride may be s1 - 1
    # or 2*s1: rendered without parentheses, `x % 2*s1` is `(x % 2) * s1` (a wrong answer)
    fn = {"cat_columns": lambda x: torch.cat([x, x * 2], 1),
          "column_sum": lambda x: torch.cat([x, -x], 1).sum(0),
          "transpose": lambda x: torch.cat([x, x + 1], 1).t() * 3,
          "last_column": lambda x: x[:, 1:] * x[:, :-1]}[name]
    compiled = ember.compile(fn, dynamic=True)
    for shape in [(3, 5), (4, 7), (6, 3), (5, 33)]:  # (s1 - 1 stays >= 2)
        torch.testing.assert_close(compiled(t(*shape)), fn(t(*shape)))
    assert not isinstance(compiled.records[0].compiled, ShapeSpecialized)
    assert len(builds()) == 1


def test_what_cannot_be_symbolic_compiles_per_shape_with_eagers_values(kernel_backend, builds):
    # view(b, -1, 4) of a [b, n] with both symbolic needs n % 4 == 0, a fact Size does not
    # carry: the graph is compiled per shape, and says why
    c_only(kernel_backend)
    fn = lambda x: x.view(x.shape[0], -1, 4).sum(-1)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    for shape in [(3, 8), (4, 12), (6, 4)]:
        torch.testing.assert_close(compiled(t(*shape)), fn(t(*shape)))
    specialized = compiled.records[0].compiled
    assert isinstance(specialized, ShapeSpecialized) and "not exact" in specialized.reason
    assert len(builds()) == 3


def test_sizes_one_and_odd_sizes_on_either_backend(kernel_backend, builds):
    # size 1 specializes (an entry of its own, static); odd sizes share the symbolic build
    compiled = ember.compile(s1)
    over_batches(s1, compiled, 24, [1, 2, 1, 3, 1000, 7])
    assert len(compiled.records) == 2 and len(builds()) == 2, builds()


class Offsets:
    """A cache as transformers' sliding-window layers keep one: a Python int on the object,
    grown by each call and only computed with (the mask's positions), never a size."""

    def __init__(self):
        self.length = 0

    def update(self, x):
        self.length += x.shape[1]
        return self.length - x.shape[1]


def offset_positions(x, cache):
    offset = cache.update(x)
    positions = torch.arange(x.shape[1]) + (offset - 3)
    return x * (positions >= 0) + positions


def test_an_int_only_computed_with_is_a_0d_tensor_input_of_one_build(kernel_backend, builds):
    # the length became a symbol after it changed, but no tensor input's size holds it, so
    # the kernels could not read it: compiled per shape, so once per step. Now the graph takes
    # it as a 0-d tensor: one build serves every later length
    compiled = ember.compile(offset_positions)
    mine, theirs = Offsets(), Offsets()
    for step in range(6):
        x = t(2, 5 if step == 0 else 1, seed=step)
        torch.testing.assert_close(compiled(x, mine), offset_positions(x, theirs))
        assert mine.length == theirs.length
    assert len(compiled.records) == 2 and len(builds()) == 2, builds()
    assert not isinstance(compiled.records[1].compiled, ShapeSpecialized)
