"""The sweep harness: run each case eagerly and through ember.compile, compare everything.

A case is a function decorated with `@case` that returns a `Spec`: the function (or module)
to run, its calls (`call(*args, **kwargs)`), whether to backpropagate through the outputs,
a snapshot of state to compare after the calls, and extras (`max_captures`: more captures
than this over all calls is RECOMP; `no_grad`: run the calls under torch.no_grad()).

Per call it compares the outputs (or the exception eager raised), what the call printed, the
records of the "sweep" logger, the warnings issued; after the calls the gradients of the
module's parameters and of leaf tensor arguments, and the state snapshot. It counts captures
over all calls (entries, resume functions made and compiled) and reads ember.explain of the
first call. Statuses: ok, ok~ (within rounding), WRONG, CRASH, FALLBACK (ember warned),
RECOMP, and "/eager-graph" when a graph ran eagerly by design.

A sweep script defines its cases and ends with `sweep_main()`:

    nice -n 10 .venv/bin/python notes/<sweep>.py [--md] [name ...]

(Written from session 7b's sweep, which the sessions after it share.)
"""
import collections, contextlib, copy, dataclasses, enum, functools, io, itertools, logging, math, sys
import traceback, typing, warnings
from typing import Optional

import os
os.environ.setdefault("EMBER_LOGS", "fallbacks,recompiles")    # (so that graphs run eagerly by design are seen too)
logging.getLogger("ember").handlers.clear()
logging.getLogger("ember").addHandler(logging.NullHandler())
import torch, torch.nn as nn, torch.nn.functional as F
import ember
logging.getLogger("ember").handlers[:] = [logging.NullHandler()]

warnings.simplefilter("ignore")


@dataclasses.dataclass
class Spec:
    fn: typing.Any
    calls: list
    grad: bool = False
    state: typing.Callable | None = None   # Spec -> {name: value}, snapshot right after the calls
    extra: dict = dataclasses.field(default_factory=dict)


CASES: dict = {}


def case(make):
    CASES[make.__name__] = make
    return make


def call(*args, **kwargs):
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


# ---------------------------------------------------------------------------------------------
# harness (session 7's, plus stdout, exceptions, "sweep" log records, warnings, state snapshots,
# resume counts)
class Raised:
    def __init__(self, error):
        self.kind, self.message = type(error).__name__, str(error)

    def __eq__(self, other):
        return isinstance(other, Raised) and (self.kind, self.message) == (other.kind, other.message)

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
        return (type(value).__name__, tuple(structure(getattr(value, f.name)) for f in dataclasses.fields(value)))
    return type(value).__name__


def snapshot(value):
    """Containers copied (tensors cloned, detached of nothing: requires_grad kept on the
    original) so that later calls mutating them do not change what was recorded."""
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
    d = (a - b).abs().nan_to_num(float("inf")).max().item()
    scale = b.abs().max().item()
    kind = "rounding" if scale > 0 and d / scale < 2e-6 else "value"
    return f"{kind} {path}: max |diff| {d:.3g} (largest |eager| {scale:.3g})"


def compare(got, want, where):
    problems = []
    if structure(got) != structure(want):
        return [f"{where}: structure {structure(got)} != {structure(want)}  ({got!r:.200} vs eager {want!r:.200})"]
    for (path, a), (_, b) in zip(leaves(got, where), leaves(want, where)):
        if isinstance(b, torch.Tensor):
            if a.dtype != b.dtype or a.shape != b.shape:
                problems.append(f"{path}: {a.dtype}{list(a.shape)} vs eager {b.dtype}{list(b.shape)}")
            elif a.is_floating_point():
                if not torch.allclose(a.detach(), b.detach(), rtol=1e-5, atol=1e-6, equal_nan=True):
                    problems.append(float_problem(path, a.detach(), b.detach()))
            elif not torch.equal(a, b):
                problems.append(f"{path}: {a.tolist()} vs eager {b.tolist()}")
            if a.requires_grad != b.requires_grad:
                problems.append(f"{path}: requires_grad {a.requires_grad} vs eager {b.requires_grad}")
            if b.is_inference() != a.is_inference():
                problems.append(f"{path}: is_inference {a.is_inference()} vs eager {b.is_inference()}")
        elif isinstance(b, float) and isinstance(a, float) and math.isnan(a) and math.isnan(b):
            pass
        elif isinstance(b, float) and isinstance(a, float) and a != b and math.isclose(a, b, rel_tol=2e-6, abs_tol=1e-7):
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


def run_all(spec, fn):
    """Per call: the output (or Raised), what it printed, the sweep log lines, the warnings."""
    outs, prints, logs, warns = [], [], [], []
    torch.manual_seed(1234)
    handler = _ListHandler()
    SWEEP_LOG.addHandler(handler)
    try:
        for args, kwargs in spec.calls:
            buf = io.StringIO()
            handler.lines = []
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buf):
                warnings.simplefilter("always")
                with torch.no_grad() if spec.extra.get("no_grad") else contextlib.nullcontext():
                    try:
                        out = fn(*args, **kwargs)
                    except Exception as error:
                        out = Raised(error)
                if spec.grad and not isinstance(out, Raised):
                    backward(out)
            outs.append(snapshot(out))
            prints.append(buf.getvalue())
            logs.append(list(handler.lines))
            warns.append([(w.category.__name__, str(w.message)) for w in caught])
    finally:
        SWEEP_LOG.removeHandler(handler)
    state = None
    if spec.state is not None:
        state = spec.state(spec)
        state = snapshot(state)
    return dict(outs=outs, prints=prints, logs=logs, warns=warns, state=state)


def records_of(compiled):
    if isinstance(compiled, functools.partial):  # (ember.compile(partial): its function's)
        compiled = compiled.func
    return compiled._compiled_forward if isinstance(compiled, ember.api.CompiledModule) else compiled


def summarize_reason(r):
    where = f"{r.location}: " if getattr(r, "location", None) else ""
    return f"{where}{r.reason}"


class _Grab(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []
        self.eager = []
        self.recompiles = []  # info: "recompiling f: <the guard that failed>"

    def emit(self, record):
        text = f"{record.name}: {record.getMessage()}"
        if record.levelno >= logging.WARNING:
            self.records.append(text)
        elif "runs eagerly" in text:
            self.eager.append(text)
        elif "recompiling" in text:
            self.recompiles.append(text.split(": ", 2)[-1])


def resume_counts(target):
    """(top-level entries, resume functions made, resume functions compiled, their entries)"""
    made = len(target.resumes)
    compiled = [r.compiled for r in target.resumes.values() if r.compiled is not None]
    entries = sum(len(c.entries) for c in compiled if isinstance(c, ember.api.CompiledFunction))
    return len(target.entries), made, len(compiled), entries


def run_case(name, make):
    row = dict(name=name, graphs="-", breaks="-", captures="-", status="?", reasons=[], detail=[], resumes="-")
    torch.manual_seed(0)
    s_eager = make()
    want = run_all(s_eager, s_eager.fn)
    want_grads = grads(s_eager) if s_eager.grad else {}
    torch.manual_seed(0)
    s_mine = make()
    fn = s_mine.fn
    try:
        compiled = ember.compile(fn)
        target = records_of(compiled)
        collector = []
        target.collector = collector
        grab = _Grab()
        logging.getLogger("ember").addHandler(grab)
        try:
            got = run_all(s_mine, compiled)
        finally:
            logging.getLogger("ember").removeHandler(grab)
    except Exception as error:
        row.update(status="CRASH", detail=[f"{type(error).__name__}: {str(error)[:400]}",
                                           "".join(traceback.format_exc().splitlines(True)[-6:])])
        return row
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
        gm = grads(s_mine)
        for k in want_grads:
            a, b = gm.get(k), want_grads[k]
            if (a is None) != (b is None):
                problems.append(f"{k}: {'None' if a is None else 'set'} vs eager {'None' if b is None else 'set'}")
            elif a is not None and not torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True):
                problems.append(float_problem(k, a, b))
    if want["state"] is not None:
        problems += compare(got["state"], want["state"], "state")
    row["captures"] = len(collector)
    row["resumes"] = resume_counts(target)
    row["graphs_all"] = sum(r.graphs for r in collector)
    row["breaks_all"] = sum(len(r.breaks) for r in collector)
    row["status"] = "ok" if not problems else "ok~" if all(p.startswith("rounding") for p in problems) else "WRONG"
    row["detail"] = problems[:8]
    if grab.records:
        row["detail"] += ["ember warned: " + r[:400] for r in grab.records[:4]]
        if row["status"] in ("ok", "ok~"):
            row["status"] = "FALLBACK"
    if grab.eager:
        row["detail"] += ["eager graph: " + r[:300] for r in sorted(set(grab.eager))[:4]]
        if row["status"] in ("ok", "ok~"):
            row["status"] += "/eager-graph"
    limit = s_mine.extra.get("max_captures")
    if limit is not None and len(collector) > limit and row["status"].startswith("ok"):
        row["status"] = "RECOMP"
        row["detail"].append(f"{len(collector)} captures > {limit} expected")
    # explain, first call, fresh objects
    torch.manual_seed(0)
    s_ex = make()
    try:
        args, kwargs = s_ex.calls[0]
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            e = ember.explain(s_ex.fn)(*args, **kwargs)
        row["graphs"], row["breaks"] = e.graph_count, e.graph_break_count
        row["reasons"] = [summarize_reason(r) for r in e.break_reasons]
    except Exception as error:
        row["reasons"] = [f"explain raised {type(error).__name__}: {error}"]
    row["all_reasons"] = sorted({summarize_reason(r) for r in collector for r in r.breaks})
    row["recompiles"] = grab.recompiles
    return row


def main(names):
    rows = []
    for name, make in CASES.items():
        if names and name not in names:
            continue
        row = run_case(name, make)
        rows.append(row)
        print(f"{row['status']:11s} {name:48s} explain: graphs={row['graphs']} breaks={row['breaks']}  "
              f"all calls: captures={row['captures']} graphs={row.get('graphs_all', '-')} "
              f"breaks={row.get('breaks_all', '-')} (entries, resumes made, compiled, resume entries)={row['resumes']}",
              flush=True)
        for d in row["detail"]:
            print("    !", d)
        for r in row.get("all_reasons") or row["reasons"]:
            print("    -", r[:300])
        for r, n in collections.Counter(row.get("recompiles", [])).items():
            print(f"    ~ recompile x{n}: {r[:200]}")
    print(f"\n{len(rows)} cases: " + ", ".join(f"{k} {v}" for k, v in collections.Counter(r['status'] for r in rows).items()))
    return rows


def markdown(rows):
    print("| # | pattern | graphs | breaks | captures (all calls) | entries/resumes/compiled/resume entries | result | break reasons (all calls) |")
    print("|---:|---|---:|---:|---:|---|---|---|")
    for k, r in enumerate(rows, 1):
        reasons = r.get("all_reasons") or r["reasons"]
        short = "; ".join(sorted({x.split(": ", 1)[-1].split(" (e.g.")[0] for x in reasons}))
        status = {"ok~": "ok (rounding)", "WRONG": "**wrong**", "CRASH": "**crash**", "FALLBACK": "**fallback**",
                  "RECOMP": "**recompiles**"}.get(r["status"], r["status"])
        if r["status"] == "CRASH":
            short = r["detail"][0][:90]
        res = "/".join(map(str, r["resumes"])) if isinstance(r["resumes"], tuple) else r["resumes"]
        print(f"| {k} | {r['name']} | {r['graphs']} | {r['breaks']} | {r['captures']} | {res} | {status} | {short.replace('|', '/')[:200]} |")


def sweep_main():
    md = "--md" in sys.argv
    rows = main([a for a in sys.argv[1:] if a != "--md"])
    if md:
        markdown(rows)
