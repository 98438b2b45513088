"""Graph breaks with resumption: compiled and eager side by side over several calls that take
different paths, comparing results, arguments, printed output and graph/break counts."""

from __future__ import annotations

import copy
import io
import logging
from contextlib import redirect_stdout

import pytest
import torch
import torch.nn.functional as F
from checks import same

import ember
from ember import config

CASES = []


def case(*calls, breaks=None):
    def register(fn):
        CASES.append(pytest.param(fn, list(calls), breaks, id=fn.__name__))
        return fn

    return register


def t(*shape, seed=0, sign=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device()).abs() * sign


POS, NEG = t(6, sign=1.0), t(6, seed=3, sign=-1.0)


def both(*args, **kwargs):
    return (args, kwargs)


@case(both(POS), both(NEG), both(POS * 2), breaks=1)
def seed_branch(x):
    x = x * 2
    if x.sum() > 0:
        return x + 1
    return x - 1


@case(both(POS), both(NEG), breaks=1)
def branch_else_continues(x):
    y = x + 1
    if (y > 1).any():
        y = y * 3
    else:
        y = y - 3
    return y.sum(), y


@case(both(POS), both(NEG))
def nested_branches(x):
    if x.mean() > 0:
        if x.max() > 100:
            return x * 0
        return x * 2
    return -x


@case(both(POS), both(NEG), breaks=1)
def branch_with_and(x):
    if x.sum() > 0 and x.shape[0] == 6:
        return x + 1
    return x


@case(both(POS), both(NEG))
def while_on_tensor_condition(x):
    steps = 0
    while x.abs().sum() > 1 and steps < 5:
        x = x / 2
        steps += 1
    return x, steps


@case(both(POS), both(NEG), breaks=1)
def item_in_arithmetic(x):
    scale = x.abs().max().item()
    return x / scale


@case(both(POS), both(NEG), breaks=1)
def tolist_then_python(x):
    values = x[:3].tolist()
    return x * len(values), [round(v, 3) for v in values]


@case(both(POS), both(NEG), breaks=1)
def bool_of_tensor(x):
    flag = bool((x > 0).all())
    return x + (1 if flag else -1)


@case(both(POS), both(NEG), breaks=1)
def print_in_the_middle(x):
    y = x * 2
    print("middle", y.shape, y.sum())
    return y + 1


@case(both(POS), both(NEG), breaks=2)
def two_prints(x):
    print("first", x.shape)
    y = x.exp()
    print("second")
    return y


@case(both(POS), both(NEG), breaks=1)
def explicit_graph_break(x):
    y = torch.relu(x)
    ember.graph_break()
    return y * 3


def untraceable(value):
    return sorted(value.tolist())[0]  # reads the data: cannot be captured


# A break inside a called function counts twice: at the call site, and in the function's own
# frame, which runs compiled on its own (as torch.compile counts them too).
@case(both(POS), both(NEG), breaks=2)
def call_into_untraceable_function(x):
    low = untraceable(x * 2)
    return x - low


def helper_with_print(x):
    y = x + 1
    print("helper", y.shape)
    return y * 2


@case(both(POS), both(NEG))
def break_inside_inlined_call(x):
    a = x * 3
    b = helper_with_print(a)
    return a + b


@case(both(POS), both(NEG))
def break_inside_method_call(x):
    class Scaler:
        def __init__(self, k):
            self.k = k

    return x * bump(Scaler(2), x)


def bump(scaler, x):
    print("bump", scaler.k)
    return scaler.k + 1


@case(both(POS, 3), both(NEG, 5), breaks=1)
def many_live_locals(x, n):
    a, b, c, d = x + 1, x * 2, n * 3, [x, n]
    e = {"k": x - 1, "n": n}
    f = (a, (b, (c, "deep")))
    print("break", n)
    return a + b + c + d[0] + e["k"] + f[1][0] + d[1] + e["n"], f[1][1][1]


@case(both(POS), both(NEG))
def nested_tuple_on_stack(x):
    return (x, (x + 1, torch.tensor(x.sum().item())))


@case(both(POS), both(NEG), breaks=2)
def keyword_call_break(x):
    return F.dropout(x, p=0.0, training=False) + untraceable_keywords(x, scale=2.0, shift=1)


def untraceable_keywords(x, *, scale, shift):
    return float(x.sum()) * scale + shift


@case(both(POS), both(NEG), breaks=1)
def method_call_break(x):
    parts = [x * 2]
    parts.append(x.sum().item())
    return parts[0] * parts[1]


@case(both(POS), both(NEG))
def break_in_no_grad_block(x):
    with torch.no_grad():
        y = x * 2
        print("grad enabled:", torch.is_grad_enabled())
        z = y + 1
    return z, torch.is_grad_enabled()


@case(both(POS), both(NEG), breaks=1)
def break_in_profiler_label(x):
    with torch.autograd.profiler.record_function("label"):  # captured as a null context
        y = x * 2
    with torch.profiler.record_function("around a break"):
        print("inside the label")
        return y + 1


@case(both(POS, [1, 2]), both(NEG, [3]))
def mutations_before_break(x, log):
    log.append(x.sum())
    log.append("before")
    print("logged", len(log))
    log.append("after")
    return x * len(log)


@case(both(POS), both(NEG))
def break_in_loop(x):
    total = x
    for i in range(3):
        total = total + i
        print("step", i)
    return total


LAYERS = [t(6, 6, seed=s) / 4 for s in range(5)]


@case(both(POS, LAYERS), both(NEG, LAYERS[:2]), both(POS, []), both(NEG, LAYERS))
def break_in_loop_over_a_list(x, layers):
    for w in layers:
        x = torch.tanh(x @ w)
        print("shape", x.shape)
    return x


@case(both(POS, tuple(LAYERS)), both(NEG, tuple(LAYERS[1:])))
def break_in_loop_over_a_tuple_with_enumerate_inside(x, layers):
    seen = []
    for w in layers:
        x = x @ w + len(seen)
        print("layer", len(seen))
        seen.append(x.sum())
    return x, seen


@case(both(POS, LAYERS))
def an_iterator_argument_taken_from_in_parts(x, layers):
    it = iter(layers)
    first = next(it)
    print("took one")
    x = x @ first
    for w in it:
        x = x + w.sum()
        print("again")
    return x, next(iter(layers)) is first


@case(both(POS), both(NEG))
def loop_item_used_after_a_break(x):
    # (the item taken before the break was read again after the iterator had moved on:
    # the next item's function ran, or past the end an IndexError)
    for i, fn in enumerate([torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid]):
        x = fn(x * x.sum().item()) if i in (0, 1) else fn(x)
    return x


LINEARS = torch.nn.ModuleList([torch.nn.Linear(6, 6) for _ in range(4)])


@case(both(POS), both(NEG))
def module_list_loop_with_a_data_dependent_branch(x):
    for layer in LINEARS:
        if x.sum() > 0:
            x = -x
        x = torch.tanh(layer(x))
    return x


@case(both(POS, LAYERS), both(NEG, LAYERS[:2]))
def one_iterator_looped_over_and_taken_from(x, layers):
    # (after a break the iterator is both the loop's and a local: one object, taken from
    # through either name)
    it = iter(layers)
    print("start")
    for w in it:
        x = x @ w
        print("step")
        following = next(it, None)
        if following is not None:
            x = x + following.sum()
    return x, list(it)


@case(both(POS, LAYERS[:3]), both(NEG, LAYERS[:1]))
def break_inside_a_comprehension(x, layers):
    # (the comprehension's iterator had advanced when the break came: the whole function
    # ran eagerly; it is put back, and the comprehension runs natively)
    y = x * 2
    norms = [w.sum().item() for w in layers]
    return y + sum(norms), len(norms)


@case(both(POS), both(NEG))
def break_in_loop_with_try_except(x):
    for i in range(4):
        try:
            x = x * 2
            print("step", i)
            if i == 2:
                raise ValueError(i)
        except ValueError as error:
            x = x - int(str(error))
    return x


@case(both(POS), both(NEG))
def data_dependent_in_loop(x):
    for _ in range(3):
        if x.sum() > 0:
            x = x - 1
        else:
            x = x + 1
    return x


@case(both(POS), both(NEG))
def early_exit_on_tensor(x):
    for i in range(4):
        if (x > 10).all():
            return x, i
        x = x * 2
    return x, -1


@case(both(POS), both(NEG))
def conditional_expression_on_tensor(x):
    return x if x.sum() > 0 else -x


@case(both(POS), both(NEG))
def break_then_more_graph(x):
    y = torch.tanh(x)
    print("y")
    z = F.softmax(y, dim=0)
    w = z.cumsum(0)
    return w * 2


@case(both(POS), both(NEG))
def result_of_item_used_in_shapes(x):
    n = int(x.abs().sum().item()) % 3 + 1
    return x[:n] * 2


@case(both(POS), both(NEG))
def closure_and_break(x):
    k = 3

    def scale(v):
        return v * k

    print("closure")
    return scale(x)


@case(both(POS), both(NEG))
def return_in_branch_with_tuple(x):
    if x[0] > 0:
        return x.sum(), "positive"
    return x.mean(), "negative"


@case(both(POS), both(NEG))
def item_in_fstring(x):
    message = f"sum={x.sum().item():.3f}"
    return x + 1, message


@case(both(POS), both(NEG))
def kwargs_star_call_break(x):
    options = {"sep": "|"}
    print("a", "b", **options)
    return x * 2


@case(both(POS), both(NEG))
def list_comprehension_with_item(x):
    values = [v.item() for v in x[:3]]
    return x * sum(values)


@case(both(POS - 1.0), both(NEG + 0.5), breaks=1)
def boolean_mask_indexing(x):
    # (its result's length is the mask's count: the runner indexes natively, the rest is
    # captured after it)
    kept = x[x > 0]
    return kept * 2 + kept.sum(), x.shape


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)

    def forward(self, x):
        h = torch.relu(self.first(x))
        if h.sum() > 0:
            h = h * 2
        return self.second(h)


def module_with_branch(x):
    return NET(x)


NET = Net()


@case(both(POS.reshape(1, 6)), both(NEG.reshape(1, 6)))
def submodule_with_data_dependent_forward(x):
    return module_with_branch(x) + 1


def _fill_then_print(x, table, rows):
    table[0] = torch.zeros(6) + x  # (undone at the break: the native rerun fills them)
    rows.append(x * 2)
    rows[0] = x - 1
    del table[1]
    print("filled")
    return x


@case(both(POS), both(NEG), breaks=2)
def containers_made_here_filled_by_a_call_that_breaks(x):
    # (the state kept to undo was taken after the change: the graph's result read a node the
    # rollback had taken out, an internal error, and the whole function ran eagerly)
    table, rows = dict.fromkeys(range(2)), [None]
    y = _fill_then_print(x, table, rows)
    return y + table[0] + rows[0] + rows[1], list(table)


@pytest.mark.parametrize("fn, calls, breaks", CASES)
def test_breaks_match_eager(fn, calls, breaks):
    compiled = ember.compile(fn, backend="eager")
    with torch.no_grad():
        for number, (args, kwargs) in enumerate(calls):
            eager_in, compiled_in = copy.deepcopy((args, kwargs)), copy.deepcopy((args, kwargs))
            eager_out, compiled_out = io.StringIO(), io.StringIO()
            with redirect_stdout(eager_out):
                expected = fn(*eager_in[0], **eager_in[1])
            with redirect_stdout(compiled_out):
                actual = compiled(*compiled_in[0], **compiled_in[1])
            same(actual, expected, f"call {number} result")
            same(compiled_in, eager_in, f"call {number} arguments")
            assert compiled_out.getvalue() == eager_out.getvalue(), f"call {number} printed"
    if breaks is not None:
        with redirect_stdout(io.StringIO()), torch.no_grad():
            report = ember.explain(fn)(*copy.deepcopy(calls[0][0]), **calls[0][1])
        assert report.graph_break_count == breaks


def test_a_break_inside_a_loop_compiles_the_loop_body_once():
    # the code after the break resumes through one resume function whatever the iteration
    # (its iterator guarded on items left, not on its position), and the loop variable about
    # to be rebound is not an input: before the loop + the body + the loop's end
    calls = []

    def on_graph(gm, example_inputs):
        calls.append(len(example_inputs))
        return gm.forward

    compiled = ember.compile(break_in_loop_over_a_list, backend=on_graph)
    with redirect_stdout(io.StringIO()), torch.no_grad():
        for layers in (LAYERS, LAYERS, LAYERS[:3]):
            same(compiled(POS, layers), break_in_loop_over_a_list(POS, layers))
    assert len(calls) == 3
    assert compiled.entries and all(len(f.entries) <= 2 for f in _resumed(compiled))


def _resumed(compiled):
    return [resume.compiled for resume in compiled.resumes.values()
            if resume.compiled is not None]


def test_live_locals_leave_out_what_is_written_before_it_is_read():
    from ember.capture.breaks import live_locals

    def loop(x, layers):
        total = 0
        for w in layers:
            x = x @ w
            total = total + 1
        return x, total

    instructions = [i for i in __import__("dis").get_instructions(loop)
                    if i.opname != "EXTENDED_ARG"]
    store_w = next(n for n, i in enumerate(instructions)
                   if i.opname == "STORE_FAST" and i.argval == "w")
    after_store = live_locals(loop.__code__, [store_w + 1])
    at_for = live_locals(loop.__code__, [store_w - 1])
    assert {"x", "w", "total"} <= after_store and "w" not in at_for
    assert {"x", "total"} <= at_for and "layers" not in at_for


def test_there_are_enough_break_cases():
    assert len(CASES) >= 30


def test_seed_branch_has_one_break_and_two_graphs():
    report = ember.explain(seed_branch)(POS)
    assert (report.graph_count, report.graph_break_count) == (2, 1)
    assert "torch.where" in report.break_reasons[0].hint


def test_graph_break_between_two_model_calls_adds_one_graph():
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())

    def clean(x):
        return model(model(x))

    def broken(x):
        y = model(x)
        ember.graph_break()
        return model(y)

    x = POS.reshape(1, 6)
    with torch.no_grad():
        clean_report = ember.explain(clean)(x)
        broken_report = ember.explain(broken)(x)
    assert clean_report.graph_count == 1 and clean_report.graph_break_count == 0
    assert broken_report.graph_count == clean_report.graph_count + 1
    assert broken_report.graph_break_count == 1


def test_fullgraph_raises_at_the_first_break():
    with pytest.raises(ember.capture.errors.CaptureError) as raised:
        ember.compile(print_in_the_middle, fullgraph=True)(POS)
    assert "print()" in str(raised.value) and __file__ in str(raised.value)


def test_graph_breaks_log_one_line_per_break(caplog):
    root = logging.getLogger("ember")
    root.addHandler(caplog.handler)
    try:
        with config.override(logs=frozenset({"graph_breaks"})), redirect_stdout(io.StringIO()):
            compiled = ember.compile(two_prints, backend="eager")
            for _ in range(3):
                compiled(POS)
    finally:
        root.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "graph break" in r.getMessage()]
    assert len(lines) == 2  # each break once, when first met
    assert all("two_prints" in line for line in lines)


def test_breaks_with_the_ember_backend_compile_kernels():
    def fn(x):
        y = torch.tanh(x * 2) + 1
        if y.sum() > 0:
            return F.softmax(y, dim=0)
        return y

    compiled = ember.compile(fn)
    with torch.no_grad():
        for x in (POS, NEG):
            same(compiled(x), fn(x))


def test_profiler_labels_and_nullcontext_stay_in_the_graph(caplog):
    import contextlib

    def fn(x):
        with torch.autograd.profiler.record_function("label"):
            y = x * 2
        with contextlib.nullcontext():
            return y + 1

    report = ember.explain(fn)(t(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    compiled = ember.compile(fn)
    for _ in range(3):
        same(compiled(t(3)), fn(t(3)))
    assert len(compiled.entries) == 1


def test_a_boolean_mask_in_a_loss_splits_the_graph_and_keeps_gradients():
    def masked_loss(logits, labels):
        keep = labels != -100
        return F.cross_entropy(logits[keep], labels[keep]) * 2

    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(1),
                         device="cpu").to(torch.get_default_device())
    labels = torch.tensor([1, -100, 3, 0, -100, 2])
    report = ember.explain(masked_loss)(logits, labels)
    assert (report.graph_count, report.graph_break_count) == (3, 2)
    grads = []
    for run in (masked_loss, ember.compile(masked_loss)):
        tracked = logits.clone().requires_grad_()
        loss = run(tracked, labels)
        loss.backward()
        grads.append((loss.detach(), tracked.grad))
    same(grads[1], grads[0])


def test_model_code_takes_its_compiler_friendly_branch():
    # (Hugging Face skips data-dependent shortcuts when Dynamo compiles; ember answers the
    # Dynamo spellings of is_compiling as torch.compiler.is_compiling: no break here)
    import torch._dynamo

    def masked(x, mask):
        if not torch.compiler.is_dynamo_compiling() and (mask == 1).all():
            return x
        if not torch._dynamo.is_compiling() and (mask == 1).all():
            return x
        return x * mask

    x, mask = t(6), torch.ones(6)
    report = ember.explain(masked)(x, mask)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    same(ember.compile(masked)(x, mask), masked(x, mask))


def test_inference_mode_blocks_and_decorators_are_captured_as_no_grad_regions():
    w = t(3).requires_grad_()

    @torch.inference_mode()
    def scaled(x):
        return x * w

    def block(x):
        with torch.inference_mode():
            y = x * w
        with torch.inference_mode(False):
            z = x * w
        return y + 1, scaled(x) * 2, z

    x = t(3, seed=1)
    report = ember.explain(block)(x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    got, want = ember.compile(block)(x), block(x)
    same(got, want)  # (values and requires_grad; eager's y is an inference tensor, ember's not)


def test_results_made_under_inference_mode_are_inference_tensors_as_eager_s():
    w = t(3)

    @torch.inference_mode()
    def decorated(x):
        return x * w, (x + w).relu()

    def mixed(x):
        with torch.inference_mode():
            inside = x * w
        return inside, x + 1  # (one result made inside, one outside: run as eager runs it)

    def cached(x):
        with torch.inference_mode():
            table = torch.outer(torch.arange(3.0), w)
        return x + table, (x + table).is_inference(), table.is_inference()

    x = t(3, seed=2)
    for fn in (decorated, mixed, cached):
        got, want = ember.compile(fn)(x), fn(x)
        same(got, want)
        assert [r.is_inference() for r in got if isinstance(r, torch.Tensor)] == \
            [r.is_inference() for r in want if isinstance(r, torch.Tensor)]
    assert ember.explain(decorated)(x).graph_count == 1
    assert ember.explain(cached)(x).graph_break_count == 0


def test_a_value_read_at_a_break_is_guarded_on_what_the_code_asked_of_it():
    # (loss.item() breaks; the resume function takes the number: compared with a constant,
    # it is guarded on the comparison's outcome, handed on it is not guarded at all — a loss
    # that changes every call compiled every call, and ran eagerly after eight)
    def step(x, w):
        loss = ((x @ w) ** 2).mean()
        value = loss.item()
        if value > 1e6 or not value:
            print("diverging")
            return loss * 0, value
        return loss * 2, value

    compiled = ember.compile(step, backend="eager")
    w = t(6, 6) / 4
    with torch.no_grad():
        for seed in range(10):
            x = t(3, 6, seed=seed)
            same(compiled(x, w), step(x, w))
        (resume,) = [r.compiled for r in compiled.resumes.values() if r.compiled]
        assert len(resume.entries) == 1 and not resume.given_up
        big = x * 1e5
        with redirect_stdout(io.StringIO()) as printed:
            same(compiled(big, w), step(big, w))
        assert len(resume.entries) == 2 and printed.getvalue().count("diverging") == 2


def test_a_bound_method_taken_before_a_break_is_no_new_object_each_call(caplog):
    # (log.info(..., loss.item()): the method is on the stack at the .item() break, a new
    # bound method each call, and was guarded by its identity: every call compiled again)
    log = logging.getLogger("ember.tests.breaks")

    def step(x):
        y = x * 2
        log.info("mean %.4f", y.mean().item())
        return y + 1

    compiled = ember.compile(step, backend="eager")
    with caplog.at_level(logging.INFO, logger=log.name):
        for seed in range(4):
            x = t(3, seed=seed)
            same(compiled(x), x * 2 + 1)
    assert len(caplog.records) == 4
    assert [len(r.compiled.entries) for r in compiled.resumes.values() if r.compiled] == [1]


def test_a_list_from_outside_that_is_only_appended_to_is_not_guarded_on_its_length():
    # (history.append(loss.item()): the list grows every call and its length was guarded, so
    # every call compiled again; appends are replayed on the real list instead)
    history, lengths = [], []

    def step(x):
        loss = (x * 2).sum()
        history.append(loss.item())
        history.append(x.shape[0])
        return loss

    def seen(x, log):
        log.append(x.sum())
        lengths.append(len(log))   # (read after an append: it sees it)
        return x + 1

    compiled = ember.compile(step, backend="eager")
    expected = []
    for seed in range(5):
        x = t(3, seed=seed)
        same(compiled(x), (x * 2).sum())
        expected += [float((x * 2).sum()), 3]
    assert history[1::2] == expected[1::2]
    torch.testing.assert_close(torch.tensor(history[::2]), torch.tensor(expected[::2]))
    resumed = [r.compiled for r in compiled.resumes.values() if r.compiled]
    assert len(compiled.entries) == 1 and [len(r.entries) for r in resumed] == [1]
    compiled = ember.compile(seen, backend="eager")
    for n in range(3):
        log = [0] * n
        same(compiled(t(2), log), t(2) + 1)
        assert len(log) == n + 1 and lengths[-1] == n + 1


def test_running_totals_and_counters_are_expressions_read_each_call():
    # (total += x.item(), n += 1, avg = 0.9 * avg + 0.1 * v in a loop that breaks: each
    # value was guarded, so every iteration compiled again; and a number handed on is read
    # before the effects that change where it came from)
    class Steps:
        count = 0

    steps = Steps()

    def totals(x, ws):
        total, n, avg = 0.0, 0, 0.0
        for w in ws:
            value = (x * w).sum().item()
            total += value
            n += 1
            avg = 0.9 * avg + 0.1 * value
        before = steps.count
        steps.count = steps.count + n
        return total / n, n, avg, before

    compiled = ember.compile(totals, backend="eager")
    for seed in range(3):
        x, ws = t(3, seed=seed), [t(3, seed=seed + k) for k in range(10)]
        got = compiled(x, ws)
        steps.count -= got[1]
        want = totals(x, ws)
        assert got[1] == want[1] and got[3] == want[3]
        torch.testing.assert_close(torch.tensor(got[::2]), torch.tensor(want[::2]))
    resumed = [r.compiled for r in compiled.resumes.values() if r.compiled]
    assert sorted(len(r.entries) for r in resumed) == [2]


def test_two_numbers_from_outside_compared_are_guarded_on_the_outcome():
    # (early stopping: `if value > limit` with both numbers from outside)
    def until(x, limit):
        for i in range(6):
            value = x.sum().item()
            if value > limit:
                return x, i
            x = x * 1.5
        return x, -1

    compiled = ember.compile(until, backend="eager")
    for limit in (1.5, 10.0, 3.0, 100.0, 2.5):
        x = torch.ones(2)
        same(compiled(x, limit), until(x, limit))
    resumed = [r.compiled for r in compiled.resumes.values() if r.compiled]
    assert len(compiled.entries) == 1 and [len(r.entries) for r in resumed] == [3]


def test_a_number_formatted_into_a_printed_string_is_not_guarded_on_its_value():
    # (print(f"loss {loss.item():.4f}") in a training step: the formatted text was guarded
    # on the number, so every step compiled again)
    def step(x):
        loss = (x * 2).sum()
        print(f"loss {loss.item():.4f} raw {loss.item()!r:>8} n={x.shape[0]}")
        return loss

    compiled = ember.compile(step, backend="eager")
    for seed in range(5):
        x = torch.arange(3.0) * seed   # (sums exact in float32: the same text both ways)
        printed = []
        for run in (step, compiled):
            with redirect_stdout(io.StringIO()) as out:
                same(run(x), (x * 2).sum())
            printed.append(out.getvalue())
        assert printed[0] == printed[1] and "loss" in printed[0]
    resumed = [r.compiled for r in compiled.resumes.values() if r.compiled]
    assert len(compiled.entries) == 1 and all(len(r.entries) == 1 for r in resumed)


def test_a_decoder_layer_with_a_float_mask_is_one_graph():
    # (MultiheadAttention asks F._none_or_dtype for each mask's dtype: a torch function that
    # returns a dtype — known from the guarded inputs — broke the graph four times per call)
    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    target, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5)
    report = ember.explain(layer)(target, memory, tgt_mask=mask)
    assert report.graph_count == 1 and report.graph_break_count == 0
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(layer)(target, memory, tgt_mask=mask),
                                   layer(target, memory, tgt_mask=mask))


def test_a_break_inside_code_the_capture_calls_itself_runs_that_code_natively():
    # (a property's getter, a class's __getitem__, map's function: run with no parent frame,
    # their breaks were taken as breaks of the compiled function — a print inside a property
    # returned None from the whole forward)
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        @property
        def scaled(self):
            print("reading the property")
            return self.w * 2

        def __getitem__(self, k):
            print("item", k)
            return self.w * k

        def forward(self, x):
            doubled = list(map(lambda v: print("mapped") or v * 2, [x, x + 1]))
            return x + self.scaled + self[3] + doubled[1]

    model, x = Model(), t(3)
    for run in (model, ember.compile(model)):
        out = io.StringIO()
        with redirect_stdout(out):
            got = run(x)
        if run is model:
            want, printed = got, out.getvalue()
        else:
            same(got, want)
            assert out.getvalue() == printed


class _Base:
    @classmethod
    def scale(cls, x):
        return x * cls.factor

    def shift(self, x):
        return x + self.offset


class _Derived(_Base):
    factor, offset = 3.0, 0.5

    @classmethod
    def scale(cls, x):
        y = x.sin()
        print("a break before super()")  # (the rest resumes in another function)
        return super().scale(y) + 1

    def shift(self, x):
        y = x.cos()
        print("a break before super()")
        return super().shift(y) * 2


def test_super_without_arguments_after_a_break_in_methods_and_class_methods():
    # (a resume function's first parameter is the method's own first argument, which
    # super() reads from the frame's first slot; a class method's super() walks the class's
    # MRO and binds the base's class method to the class)
    x = torch.randn(4)
    for function in (_Derived.scale, _Derived().shift):
        compiled = ember.compile(function)
        with redirect_stdout(io.StringIO()) as printed:
            got = compiled(x)
        same(got, function(x))
        assert printed.getvalue() == "a break before super()\n"
        assert compiled.entries[0].eager_reason is None
