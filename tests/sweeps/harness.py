"""Run a case eagerly and through ember.compile, and compare everything a user could observe.

A case is a function registered with a module's `case` decorator (`case = cases(CASES)`) that
returns a `Spec`: the function or module to run, its calls (`call(*args, **kwargs)`), whether to
backpropagate through the outputs, a snapshot of state to compare after the calls, and extras
(`max_captures`: more captures than this over all calls is RECOMP; `no_grad`: run the calls
under torch.no_grad(); `post(out, args)`: run eagerly after each call, its result compared).

Per call it compares the outputs (or the exception eager raised), what the call printed, the
records of the "sweep" logger and the warnings issued; with `layout=True` also each output's
significant strides and which argument it is or shares memory with. After the calls: the
gradients of the module's parameters and of leaf tensor arguments, and the state snapshot.
Statuses: ok, ok~ (within float32 rounding), WRONG, CRASH, FALLBACK (ember warned), RECOMP
(more captures than `max_captures`), with "/eager-graph" added when a graph ran eagerly by
design (right answers, no speed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import math
import os
import traceback
import typing
import warnings

import pytest
import torch
import torch.nn as nn
from helpers import TOLERANCES

import ember
from ember import config
from ember.compiled_module import CompiledModule


@dataclasses.dataclass
class Spec:
    fn: typing.Any
    calls: list
    grad: bool = False
    state: typing.Callable | None = None  # Spec -> {name: value}, snapshot right after the calls
    extra: dict = dataclasses.field(default_factory=dict)


def cases(registry: dict) -> typing.Callable:
    """A decorator that registers a case-making function in `registry` under its name."""

    def case(make: typing.Callable) -> typing.Callable:
        assert make.__name__ not in registry, f"two cases named {make.__name__}"
        registry[make.__name__] = make
        return make

    return case


def call(*args: typing.Any, **kwargs: typing.Any) -> tuple:
    return (args, kwargs)


# a logger the cases write to; its records are compared
SWEEP_LOG = logging.getLogger("sweep.model")
SWEEP_LOG.setLevel(logging.INFO)
SWEEP_LOG.propagate = False


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.levelname}:{record.getMessage()}")


class Raised:
    def __init__(self, error):
        self.kind, self.message = type(error).__name__, str(error)

    def __eq__(self, other):
        return isinstance(other, Raised) and (self.kind, self.message) == (
            other.kind,
            other.message,
        )

    def __repr__(self):
        return f"raised {self.kind}({self.message!r})"


def leaves(value, path="out"):
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for f in value._fields:
            yield from leaves(getattr(value, f), f"{path}.{f}")
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k in value:
            yield from leaves(value[k], f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from leaves(getattr(value, f.name), f"{path}.{f.name}")
    else:
        yield path, value


def structure(value):
    if isinstance(value, torch.Tensor):
        return "T"
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(structure(v) for v in value))
    if isinstance(value, dict):
        return (type(value).__name__, tuple((k, structure(v)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value).__name__, tuple(structure(getattr(value, f.name)) for f in fields))
    return type(value).__name__


def snapshot(value):
    """Containers copied (tensors kept as they are) so that later calls mutating them do not
    change what was recorded."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    return value


def float_problem(path, a, b):
    """A difference past rtol 1e-5 / atol 1e-6: "rounding" when within the dtype's tolerance
    (tests/helpers.py's TOLERANCES), else "value"."""
    d = (a - b).abs().nan_to_num(float("inf")).max().item()
    scale = b.abs().max().item()
    tolerance = TOLERANCES.get(b.dtype, dict(rtol=0, atol=0))
    close = torch.allclose(a.to(b.dtype), b, equal_nan=True, **tolerance)
    kind = "rounding" if close or (scale > 0 and d / scale < 2e-6) else "value"
    return f"{kind} {path}: max |diff| {d:.3g} (largest |eager| {scale:.3g})"


def compare(got, want, where):
    problems = []
    if structure(got) != structure(want):
        return [
            f"{where}: structure {structure(got)} != {structure(want)}  "
            f"({got!r:.200} vs eager {want!r:.200})"
        ]
    for (path, a), (_, b) in zip(leaves(got, where), leaves(want, where)):
        if isinstance(b, torch.Tensor):
            if a.dtype != b.dtype or a.shape != b.shape:
                problems.append(
                    f"{path}: {a.dtype}{list(a.shape)} vs eager {b.dtype}{list(b.shape)}"
                )
            elif a.is_floating_point():
                if not torch.allclose(a.detach(), b.detach(), rtol=1e-5, atol=1e-6,
                                      equal_nan=True):
                    problems.append(float_problem(path, a.detach(), b.detach()))
            elif not torch.equal(a, b):
                problems.append(f"{path}: {a.tolist()} vs eager {b.tolist()}")
            if a.requires_grad != b.requires_grad:
                problems.append(
                    f"{path}: requires_grad {a.requires_grad} vs eager {b.requires_grad}"
                )
            if b.is_inference() != a.is_inference():
                problems.append(
                    f"{path}: is_inference {a.is_inference()} vs eager {b.is_inference()}"
                )
        elif isinstance(b, float) and isinstance(a, float) and math.isnan(a) and math.isnan(b):
            pass
        elif (isinstance(b, float) and isinstance(a, float) and a != b
              and math.isclose(a, b, rel_tol=2e-6, abs_tol=1e-7)):
            problems.append(f"rounding {path}: {a!r} vs eager {b!r} (a Python float from .item())")
        elif a != b or type(a) is not type(b):
            problems.append(f"{path}: {a!r:.300} vs eager {b!r:.300}")
    return problems


def backward(outputs):
    total = None
    for k, (_, t) in enumerate(leaves(outputs)):
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point():
            w = torch.linspace(-1, 1, t.numel()).reshape(t.shape) + (k + 1)
            term = (t * w).sum()
            total = term if total is None else total + term
    if total is not None:
        total.backward()


def grads(spec):
    found = {}
    if isinstance(spec.fn, nn.Module):
        for name, p in spec.fn.named_parameters():
            found[f"grad {name}"] = p.grad
    for i, (args, kwargs) in enumerate(spec.calls):
        for j, a in enumerate(list(args) + list(kwargs.values())):
            if isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad:
                found[f"grad call{i}.arg{j}"] = a.grad
    return found


def _storage_pointer(t):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return None


def layout_facts(out, args):
    """Per output tensor: its significant strides (size-1 dims left out) and which argument it
    is or shares storage with."""
    facts = []
    for path, t in leaves(out):
        if not isinstance(t, torch.Tensor):
            continue
        who = [f"is arg{i}" for i, a in enumerate(args) if t is a]
        if not who and t.numel() > 0:
            p = _storage_pointer(t)
            who = [f"aliases arg{i}" for i, a in enumerate(args)
                   if isinstance(a, torch.Tensor) and a.numel() > 0 and p is not None
                   and _storage_pointer(a) == p]
        if t.numel() > 1:
            strides = tuple(s if n > 1 else None for s, n in zip(t.stride(), t.shape))
        else:
            strides = "-"
        facts.append(f"{path} stride={strides} {' '.join(who)}".strip())
    return facts


# Warnings torch gives once per process (TORCH_WARN_ONCE): eager's run, first, takes them, or a
# test before it did; not compared.
ONCE_PER_PROCESS = (
    "index_reduce() is in beta",
    "The PyTorch API of nested tensors is in prototype",
)


def _compared(caught):
    return [w for w in caught if not str(w.message).startswith(ONCE_PER_PROCESS)]


# Under TRITON_INTERPRET=1 with EMBER_BACKEND=triton the interpreter's numpy raises
# RuntimeWarnings (divide by zero, overflow in cast, ...) that reach the caller: not compared.
_DROP_INTERPRETER_WARNINGS = os.environ.get("TRITON_INTERPRET") == "1"


def run_all(spec, fn, layout=False):
    """Per call: the output (or Raised), what it printed, the sweep log lines, the warnings."""
    outs, prints, logs, warns = [], [], [], []
    torch.manual_seed(1234)
    handler = _ListHandler()
    SWEEP_LOG.addHandler(handler)
    post = spec.extra.get("post")
    try:
        for args, kwargs in spec.calls:
            buf = io.StringIO()
            handler.lines = []
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buf):
                warnings.simplefilter("always")
                grad_mode = torch.no_grad() if spec.extra.get("no_grad") else \
                    contextlib.nullcontext()
                with grad_mode:
                    try:
                        out = fn(*args, **kwargs)
                    except Exception as error:
                        out = Raised(error)
                if spec.grad and not isinstance(out, Raised):
                    try:
                        backward(out)
                    except Exception as error:
                        out = Raised(error)
                        out.kind = "backward: " + out.kind
            if layout and not isinstance(out, Raised):
                facts = layout_facts(out, args)
                extra = None
                if post is not None:
                    try:
                        with torch.no_grad():
                            extra = post(out, args)
                    except Exception as error:
                        extra = f"post raised {type(error).__name__}: {error}"
                out = (snapshot(out), {"layout": " | ".join(facts), "post": extra})
            outs.append(snapshot(out))
            prints.append(buf.getvalue())
            logs.append(list(handler.lines))
            if _DROP_INTERPRETER_WARNINGS:
                caught = [w for w in caught if not (issubclass(w.category, RuntimeWarning)
                                                    and "triton" in (w.filename or ""))]
            warns.append([(w.category.__name__, str(w.message)) for w in _compared(caught)])
    finally:
        SWEEP_LOG.removeHandler(handler)
    state = None
    if spec.state is not None:
        state = snapshot(spec.state(spec))
    return dict(outs=outs, prints=prints, logs=logs, warns=warns, state=state)


def records_of(compiled):
    if isinstance(compiled, functools.partial):  # (ember.compile(partial): its function's)
        compiled = compiled.func
    if isinstance(compiled, CompiledModule):
        return compiled._compiled_forward
    return compiled


class _Grab(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []
        self.eager = []
        self.recompiles = []  # info: "f (...) is compiled again: ... because <guard>."

    def emit(self, record):
        text = f"{record.name}: {record.getMessage()}"
        if record.levelno >= logging.WARNING:
            self.records.append(text)
        elif "runs eagerly" in text:
            self.eager.append(text)
        elif "is compiled again" in text:
            self.recompiles.append(text.split(" because ", 1)[-1].rstrip("."))


def run_case(make, layout=False):
    """{status, detail}: `make()` run eagerly and through ember.compile, compared."""
    torch.manual_seed(0)
    s_eager = make()
    want = run_all(s_eager, s_eager.fn, layout)
    want_grads = grads(s_eager) if s_eager.grad else {}
    torch.manual_seed(0)
    s_mine = make()
    grab = _Grab()
    ember_log = logging.getLogger("ember")
    try:
        with config.override(logs=config.settings.logs | {"fallbacks", "recompiles"}):
            compiled = ember.compile(s_mine.fn)
            target = records_of(compiled)
            collector = []
            target.collector = collector
            ember_log.addHandler(grab)
            try:
                got = run_all(s_mine, compiled, layout)
            finally:
                ember_log.removeHandler(grab)
    except Exception as error:
        return dict(status="CRASH", detail=[f"{type(error).__name__}: {str(error)[:400]}",
                                            traceback.format_exc()[-1500:]])
    problems = []
    for i, (g, w) in enumerate(zip(got["outs"], want["outs"])):
        if isinstance(w, Raised) or isinstance(g, Raised):
            if not (isinstance(w, Raised) and isinstance(g, Raised) and g == w):
                problems.append(f"call{i}: {g!r:.300} vs eager {w!r:.300}")
            continue
        problems += compare(g, w, f"call{i}")
    for key in ("prints", "logs", "warns"):
        for i, (g, w) in enumerate(zip(got[key], want[key])):
            if g != w:
                problems.append(f"call{i} {key}: {g!r:.300} vs eager {w!r:.300}")
    if s_eager.grad:
        got_grads = grads(s_mine)
        for k in want_grads:
            a, b = got_grads.get(k), want_grads[k]
            if (a is None) != (b is None):
                problems.append(f"{k}: {'None' if a is None else 'set'} vs eager "
                                f"{'None' if b is None else 'set'}")
            elif a is not None and not torch.allclose(a, b, rtol=1e-5, atol=1e-6,
                                                      equal_nan=True):
                problems.append(float_problem(k, a, b))
    if want["state"] is not None:
        problems += compare(got["state"], want["state"], "state")
    if not problems:
        status = "ok"
    elif all(p.startswith("rounding") for p in problems):
        status = "ok~"
    else:
        status = "WRONG"
    detail = problems[:8]
    if grab.records:
        detail += ["ember warned: " + r[:400] for r in grab.records[:4]]
        if status in ("ok", "ok~"):
            status = "FALLBACK"
    if grab.eager:
        detail += ["eager graph: " + r[:300] for r in sorted(set(grab.eager))[:4]]
        if status in ("ok", "ok~"):
            status += "/eager-graph"
    limit = s_mine.extra.get("max_captures")
    if limit is not None and len(collector) > limit and status.startswith("ok"):
        status = "RECOMP"
        detail.append(f"{len(collector)} captures > {limit} expected; recompiles: "
                      f"{sorted(set(grab.recompiles))[:3]}")
    return dict(status=status, detail=detail)


def check_case(make, layout=False, partly: tuple[str, str] | None = None) -> None:
    """Fail unless `make()`'s case gives eager's answers (within float32 rounding) and compiles
    without falling back or recompiling past its limit; `partly` = (status, reason) names a
    known FALLBACK or RECOMP the case must still show (fixing it means updating the table)."""
    row = run_case(make, layout)
    status, detail = row["status"], "\n    ".join(row["detail"])
    assert status not in ("WRONG", "CRASH"), f"{status}:\n    {detail}"
    if partly is not None:
        assert status == partly[0], \
            f"known {partly[0]} ({partly[1]}) now gives {status}: update the table\n    {detail}"
    else:
        assert status.startswith("ok"), f"{status}:\n    {detail}"


def params(registry: dict, xfail: dict, slow: typing.Container = ()) -> list:
    """pytest params of a registry's cases: a known wrong answer or error (`xfail`: name ->
    reason) as a strict xfail, a heavy case (`slow`) marked slow."""
    unknown = (set(xfail) | set(slow)) - set(registry)
    assert not unknown, f"tables name cases that do not exist: {sorted(unknown)}"
    result = []
    for name in registry:
        marks = []
        if name in xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=xfail[name]))
        if name in slow:
            marks.append(pytest.mark.slow)
        result.append(pytest.param(name, marks=marks, id=name))
    return result


def safe(v):
    """A tensor's copy; anything that is not a plain tensor (a FakeTensor that leaked into user
    state) as its type's name, so that the comparison reports it instead of raising."""
    if isinstance(v, torch.Tensor):
        return (
            v.detach().clone()
            if type(v) in (torch.Tensor, torch.nn.Parameter)
            else f"<{type(v).__name__}>"
        )
    return v
