"""Symbolic sizes: the FakeTensorMode over a ShapeEnv that ember/capture/symbols.py makes its
symbols with, the symbols' origins, ranges and guards, torch._dynamo's dim marks on a tensor,
and the sympy reading of SymInts below the lowering (ember/lower/symbolic.py). Only a capture
that asked for a symbol makes a ShapeEnv.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import Any

import torch

from ember.torch_internals.dynamo import (
    plain_source,
    stand_in_serves_symbolic,
    symbolic_stand_in,
)


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool, or a tensor whose shape or strides are symbolic."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride()))
    return False


# -- symbolic sizes (ember/capture/symbols.py) ---------------------------------------------
# NOTE: only captures that asked for a symbol come here: creating a ShapeEnv, and running
# fake tensors on it, costs many times the static path (see notes/2026-12-dynamic-shapes-*).
def make_symbolic_fake_mode() -> tuple[Any, Any]:
    """A FakeTensorMode over a fresh ShapeEnv (symbols, their ranges and the guards that
    branching on them records), and the ShapeEnv. Sizes are static unless symbolic_fake
    asks (a tensor the fake mode meets on its own stays static), and a data-dependent size
    (nonzero, a boolean mask) raises as without a ShapeEnv: a graph break, not an unbacked
    symbol."""
    stand_in_serves_symbolic(_trial)
    with symbolic_stand_in():  # (neither imports torch._dynamo: 0.85 s)
        return _new_symbolic_fake_mode()


def _new_symbolic_fake_mode() -> tuple[Any, Any]:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv(assume_static_by_default=True, allow_scalar_outputs=False,
                         allow_dynamic_output_shape_ops=False)
    _without_source_locations(shape_env)
    return _symbolic_fake_mode_class()(shape_env=shape_env, allow_non_fake_inputs=True), \
        shape_env


def _trial() -> None:
    """What a symbolic capture asks of fake tensors, in small: a fake mode, a fake of a
    symbolic size, an op on it and a guard (stand_in_serves_symbolic runs it once)."""
    mode, _ = _new_symbolic_fake_mode()
    fake = symbolic_fake(mode, torch.empty(3, 4), "trial", [(2, None), None])
    with mode:
        if not bool(fake.sum(1).shape[0] * 2 > 4):
            raise AssertionError("the trial's guard")


def _without_source_locations(shape_env: Any) -> None:
    """Keep `shape_env` from looking for the user's frame of each symbol and guard it makes
    (ShapeEnv._get_stack_summary, for Dynamo's logs: ember says where from its own capture).
    Its first look imports torch.export, AOTAutograd and Inductor to name the files it
    skips (symbolic_shapes.uninteresting_files): 0.36-0.41 s of the first symbolic capture
    of a process, a third of GPT-2's first decoding call on the CPU (2026-12-05)."""
    try:
        from torch.fx.experimental.symbolic_shapes import SLoc
    except ImportError:  # (another torch's ShapeEnv: left as it is)
        return
    if not hasattr(shape_env, "_get_stack_summary"):
        return

    def stack_summary(is_debug: bool = False, framework_loc: str | None = None
                      ) -> tuple[Any, str]:
        return SLoc(framework_loc or "ember's capture", None), ""

    shape_env._get_stack_summary = stack_summary


def refuses_symbolic_sizes(error: BaseException) -> bool:
    """Is `error` a C++ kernel's refusal of symbolic sizes ("SymIntArrayRef expected to
    contain only concrete integers": a kernel that takes plain ints only)?"""
    return "SymIntArrayRef expected to contain only concrete integers" in str(error)


# ops whose fake dispatch met that refusal: they run with torch's Python kernels from then on
_PYTHON_KERNELS: set[Any] = set()
_quiet = threading.local()


class _QuietRefusals(logging.Filter):
    """Drops fake_tensor's logged traceback of a meta kernel's failure while ember tries an
    op it may retry (the retry answers; the log would be a false alarm on the user's
    stderr)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_quiet, "depth", 0)


@functools.cache
def _symbolic_fake_mode_class() -> type:
    """FakeTensorMode that retries an op with torch's Python dispatcher on, as Dynamo traces,
    where the op's C++ kernel refuses symbolic sizes ("SymIntArrayRef expected to contain
    only concrete integers": `constant_pad_nd`, i.e. F.pad by an amount computed from a
    symbolic size, on torch 2.11 to 2.13). A fake dispatch skips such an op's Python meta
    kernel (in torch's meta table, not registered with the dispatcher); the Python
    dispatcher runs it. Only there: with the Python dispatcher on throughout, other ops'
    fake results change (a training step's views), so it stays off elsewhere."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    logging.getLogger(FakeTensorMode.__module__).addFilter(_QuietRefusals())

    class SymbolicFakeTensorMode(FakeTensorMode):
        def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in _CONCRETE_GEOMETRY and not getattr(_quiet, "python", 0) and \
                    is_symbolic(args[0]):
                raise ConcreteSizesAsked(f"{func} of a tensor with symbolic sizes")
            if func not in _PYTHON_KERNELS:
                _quiet.depth = getattr(_quiet, "depth", 0) + 1
                try:
                    return super().dispatch(func, types, args, kwargs)
                except RuntimeError as error:
                    if not refuses_symbolic_sizes(error):
                        raise
                    _PYTHON_KERNELS.add(func)
                finally:
                    _quiet.depth -= 1
            with _python_kernels():
                return super().dispatch(func, types, args, kwargs)

    return SymbolicFakeTensorMode


@contextlib.contextmanager
def _python_kernels() -> Any:
    """torch's Python dispatcher on (ops run their Python kernels and decompositions), and a
    question for concrete sizes answered in it as torch answers it (not refused again)."""
    from torch._dispatch.python import enable_python_dispatcher

    _quiet.python = getattr(_quiet, "python", 0) + 1
    try:
        with enable_python_dispatcher():
            yield
    finally:
        _quiet.python -= 1


# what a C++ kernel calls to read a tensor's sizes or strides as plain ints (a symbolic one's
# are not: torch's fake handler would make them ints, each symbol fixed to its example value)
_CONCRETE_GEOMETRY = (torch.ops.aten.size.default, torch.ops.aten.stride.default)


class ConcreteSizesAsked(RuntimeError):
    """A C++ kernel asked a tensor with symbolic sizes for plain ints (`aten.size.default`):
    on CUDA builds a composite op does so (one of an attention block's, torch 2.11), and
    torch's fake handler answers by fixing every symbol to its example value — a graph
    compiled for one length. SymbolicFakeTensorMode refuses instead; calling_composites
    runs the call again with torch's Python dispatcher, whose Python decompositions keep
    the symbols."""

    def __init__(self, what: str):
        super().__init__(f"SymIntArrayRef expected to contain only concrete integers ({what})")


def calling_composites(call: Any) -> Any:
    """call() (an op on fake tensors, under a SymbolicFakeTensorMode); where a C++ kernel
    inside it asked for concrete sizes, call() again with torch's Python dispatcher on, as
    Dynamo traces (there the question is answered, fixing the symbols, only if a Python
    decomposition asks it too)."""
    try:
        return call()
    except ConcreteSizesAsked:
        pass
    with _python_kernels():
        return call()


def _named(name: str) -> Any:
    """A torch source that only carries a name (ember's source expression): the ShapeEnv
    needs one per symbol, and names the symbol's origin by it (symbol_origins reads it)."""
    return plain_source(name)


def symbolic_fake(fake_mode: Any, tensor: torch.Tensor, name: str,
                  ranges: list[tuple[int, int | None] | None]) -> torch.Tensor:
    """A fake of `tensor` whose dims with a range (min, max or None) are symbols, the others
    static."""
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        StatelessSymbolicContext,
        StrictMinMaxConstraint,
    )
    from torch.utils._sympy.value_ranges import ValueRanges

    dynamic = [DimDynamic.STATIC if r is None else DimDynamic.DYNAMIC for r in ranges]
    constraints = [None if r is None else StrictMinMaxConstraint(
        vr=ValueRanges(r[0], _unbounded() if r[1] is None else r[1]), warn_only=False)
        for r in ranges]
    context = StatelessSymbolicContext(dynamic_sizes=dynamic, constraint_sizes=constraints)
    with symbolic_stand_in():  # (no structured trace: as torch_internals.fake_of)
        return fake_mode.from_tensor(tensor, source=_named(name), symbolic_context=context,
                                     trace=False)


def _unbounded() -> Any:
    from torch.utils._sympy.numbers import int_oo

    return int_oo


def symbolic_int(shape_env: Any, value: int, name: str) -> torch.SymInt:
    """A symbolic int whose hint is `value` (a Python int from the call, used as a size)."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    source = _named(name)
    symbol = shape_env.create_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
    return shape_env.create_symintnode(symbol, hint=value, source=source)


def symbol_hint(shape_env: Any, symbol: Any) -> int:
    """A symbol's value in the call it was made for (torch 2.13 renamed the table)."""
    values = getattr(shape_env, "backed_var_to_val", None)
    return int((values if values is not None else shape_env.var_to_val)[symbol])


def ranged_symbol(shape_env: Any, name: str, hint: int, low: int,
                  high: int | None) -> torch.SymInt:
    """A new symbol of `shape_env` for a size whose value lies in [low, high] (high None:
    unbounded), at `hint` (a symbolic graph's placeholders made again from what a warm
    start kept: ember/lower/symbolic.py)."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StrictMinMaxConstraint
    from torch.utils._sympy.value_ranges import ValueRanges

    source = _named(name)
    constraint = StrictMinMaxConstraint(
        vr=ValueRanges(low, _unbounded() if high is None else high), warn_only=False)
    symbol = shape_env.create_symbol(hint, source, dynamic_dim=DimDynamic.DYNAMIC,
                                     constraint_dim=constraint)
    return shape_env.create_symintnode(symbol, hint=hint, source=source)


def expression_of(value: Any) -> Any:
    """The sympy expression a SymInt/SymFloat/SymBool stands for."""
    return value.node.expr


def symbol_origins(shape_env: Any) -> dict[Any, tuple[str, str | None, int | None]]:
    """Each symbol's first origin: (the name symbolic_fake/symbolic_int was given, "size" /
    "stride" / "storage_offset", "item" (a 0-d tensor's value, read by the fake tensor's
    .item()) or None for an int, the dim or None)."""
    origins = {}
    for symbol, sources in shape_env.var_to_sources.items():
        source = sources[0]
        base = getattr(source, "base", None)
        if base is None:
            origins[symbol] = (source.name, None, None)
        elif getattr(source, "prop", None) is None:
            origins[symbol] = (base.name, "item", None)
        else:
            kind = source.prop.name.lower()
            origins[symbol] = (base.name, kind, source.idx)
    return origins


# the lower bound of a symbol unbounded below (a number read from a 0-d tensor by .item()
# may be negative)
LOWEST = -(2 ** 63)


def symbol_range(shape_env: Any, symbol: Any) -> tuple[int, int | None]:
    """The range a symbol is known to lie in (after the guards): (lower or LOWEST, upper or
    None)."""
    import sympy

    bounds = shape_env.var_to_range[symbol]
    lower, upper = bounds.lower, bounds.upper
    return (LOWEST if lower in (-_unbounded(), -sympy.oo) else int(lower),
            None if upper in (_unbounded(), sympy.oo) else int(upper))


def shape_guards(shape_env: Any) -> list[Any]:
    """The relations the ShapeEnv recorded while fake tensors branched on symbols (sympy
    booleans), in the order they were met."""
    return [guard.expr for guard in shape_env.guards]


def render_python(expression: Any, names: dict[Any, str]) -> str:
    """A sympy expression over symbols as Python source, symbols renamed by `names`."""
    import sympy
    from torch.utils._sympy.printers import PythonPrinter

    renamed = expression.xreplace({s: sympy.Symbol(n, integer=True) for s, n in names.items()})
    return PythonPrinter().doprint(renamed)


def dynamo_dim_marks(tensor: torch.Tensor) -> tuple[dict[int, tuple[int | None, int | None]],
                                                    set[int]]:
    """torch._dynamo.mark_dynamic / maybe_mark_dynamic / mark_static marks on a tensor:
    ({dim: (min, max)} to make symbolic, {dims} to keep static)."""
    dynamic: dict[int, tuple[int | None, int | None]] = {}
    marked = getattr(tensor, "__dict__", {})
    for dim in (*marked.get("_dynamo_dynamic_indices", ()),
                *marked.get("_dynamo_weak_dynamic_indices", ())):
        dynamic[dim] = (None, None)
    for bounds in marked.get("_dynamo_dynamic_range", ()):
        dynamic[bounds.dim] = (bounds.min, bounds.max)
    return dynamic, set(marked.get("_dynamo_static_indices", ()))


# -- symbolic sizes below the lowering (ember/lower/symbolic.py) -----------------------------
def fake_mode_of(value: Any) -> Any:
    """The FakeTensorMode a fake tensor (or a SymInt's ShapeEnv's tensors) belongs to, or
    None for a real tensor."""
    return getattr(value, "fake_mode", None)


def shape_env_of(value: Any) -> Any:
    """The ShapeEnv behind a SymInt."""
    return value.node.shape_env


def symbolic_expression(value: Any) -> Any:
    """A SymInt's sympy expression, with the ShapeEnv's replacements applied (s1 -> s0 once
    a guard made them equal), or the int itself."""
    if not isinstance(value, torch.SymInt):
        return value
    node = value.node
    constant = node.maybe_as_int()
    if constant is not None:
        return int(constant)
    return node.shape_env.replace(node.expr)


def polynomial_terms(expression: Any) -> list[tuple[list[Any], int]] | None:
    """A sympy expression as (symbols, coefficient) terms of a polynomial with int
    coefficients, or None when it is not one (a FloorDiv, a Mod, a Max)."""
    import sympy

    if isinstance(expression, int):
        return [([], expression)]
    if expression.is_Integer:
        return [([], int(expression))]
    if expression.is_Symbol:
        return [([expression], 1)]
    if isinstance(expression, sympy.Add):
        terms = []
        for argument in expression.args:
            part = polynomial_terms(argument)
            if part is None:
                return None
            terms += part
        return terms
    if isinstance(expression, sympy.Mul):
        terms = [([], 1)]
        for argument in expression.args:
            part = polynomial_terms(argument)
            if part is None:
                return None
            terms = [(a + b, x * y) for a, x in terms for b, y in part]
        return terms
    if isinstance(expression, sympy.Pow) and expression.exp.is_Integer and expression.exp > 0:
        base = polynomial_terms(expression.base)
        if base is None:
            return None
        terms = [([], 1)]
        for _ in range(int(expression.exp)):
            terms = [(a + b, x * y) for a, x in terms for b, y in base]
        return terms
    return None


def min_max_arguments(expression: Any) -> tuple[str, tuple] | None:
    """("max" or "min", its arguments) of a sympy Max/Min (`x[:, :-1]` sizes as
    Max(1, s - 1)), else None."""
    import sympy
    from torch.utils._sympy import functions

    if isinstance(expression, (sympy.Max, getattr(functions, "Max", sympy.Max))):
        return "max", tuple(expression.args)
    if isinstance(expression, (sympy.Min, getattr(functions, "Min", sympy.Min))):
        return "min", tuple(expression.args)
    return None


def known_true(condition: Any) -> bool:
    """Does a condition on sizes hold for every value of their symbols (a bool as it is)?
    Never guards."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(condition) if isinstance(condition, bool) else statically_known_true(condition)


def known_equal(a: Any, b: Any) -> bool:
    """Are two sizes (or shapes) equal for every value of their symbols? Never guards: `==`
    of SymInts read as a bool would pin a symbol to the value it has now (a sequence length
    of 4 compared with a batch of 4)."""
    if isinstance(a, (tuple, list, torch.Size)):
        return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b))
    if not isinstance(a, torch.SymInt) and not isinstance(b, torch.SymInt):
        return a == b
    return known_true(a == b)


def size_hint(value: Any) -> int:
    """A symbolic size's value in the call being compiled (an int as it is): for choices
    that only a run can make (eager's attention kernel), never for correctness."""
    if not isinstance(value, torch.SymInt):
        return int(value)
    constant = value.node.maybe_as_int()
    return int(constant) if constant is not None else int(value.node.hint)


def symbol_bounds(value: Any, symbol: Any) -> tuple[int, int | None]:
    """A torch symbol's range in the ShapeEnv of `value` (a SymInt)."""
    return symbol_range(value.node.shape_env, symbol)


def is_symbol(expression: Any) -> bool:
    return getattr(expression, "is_Symbol", False)
