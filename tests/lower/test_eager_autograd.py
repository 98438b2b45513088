"""lower/meta_interpreter.eager_autograd: what eager's autograd makes of a training graph's
results, read from the fake values the capture ran the graph on where they are the graph's
own, else from a run on fakes; both must give the same answer."""

import torch

import ember
from ember import backends
from ember.lower import meta_interpreter


def _answers(monkeypatch):
    """Each training graph's eager_autograd answer, beside a fresh run on fakes' answer."""
    seen = []
    original = meta_interpreter.eager_autograd

    def recording(module, example_inputs):
        answer = original(module, example_inputs)
        rerun = meta_interpreter._run_on_fakes(module, example_inputs, torch.fx.Interpreter)
        recorded = meta_interpreter._recorded_run(module, example_inputs)
        seen.append((answer, rerun, recorded))
        return answer

    monkeypatch.setattr(backends, "eager_autograd", recording)
    return seen


def _reached(run):
    flat, leaves = run
    return ([isinstance(v, torch.Tensor) and v.requires_grad for v in flat],
            {leaves[leaf] for v in flat for leaf in meta_interpreter._leaves_reached(v)
             if leaf in leaves})


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.unused = torch.nn.Linear(6, 6)  # (reached by no result)

    def forward(self, x, empty):
        y = torch.cat([self.norm(self.linear(x)), empty], 0)  # (a piece with no elements)
        return y.tanh(), y.detach() * 2, torch.native_layer_norm(x, (6,), None, None, 1e-5)


def test_the_captures_fakes_answer_as_a_run_on_fakes(monkeypatch):
    seen = _answers(monkeypatch)
    model = _Block()
    x = torch.randn(3, 6, requires_grad=True)
    empty = torch.randn(0, 6, requires_grad=True)
    compiled = ember.compile(model)
    got = compiled(x, empty)
    want = model(x, empty)
    for mine, theirs in zip(got, want):
        torch.testing.assert_close(mine, theirs)
    (answer, rerun, recorded), = seen
    assert recorded is not None  # (the capture's own values: no second run)
    assert _reached(recorded) == _reached(rerun)
    assert answer.requires_grad == [True, False, True, False, False]
    grads = torch.autograd.grad(sum(t.sum() for t in got[:1] + got[2][:1]), (x, empty))
    want_grads = torch.autograd.grad(sum(t.sum() for t in want[:1] + want[2][:1]), (x, empty))
    for mine, theirs in zip(grads, want_grads):
        torch.testing.assert_close(mine, theirs)


def test_a_result_made_a_leaf_after_its_graph_is_run_again(monkeypatch):
    # (the new leaf the caller sees is an eager island after the region that detaches: the
    # island's requires_grad_() sets it on the very fake the region's result was, so that
    # fake no longer says what the region gives)
    seen = _answers(monkeypatch)

    def fn(x):
        y = (x * 2).detach()
        y.requires_grad_()
        return y, x.sin()

    x = torch.randn(4, 5, requires_grad=True)
    got, want = ember.compile(fn)(x), fn(x)
    for mine, theirs in zip(got, want):
        torch.testing.assert_close(mine, theirs)
        assert mine.requires_grad == theirs.requires_grad
    assert [recorded is None for _, _, recorded in seen] == [True, False]
    for answer, rerun, _ in seen:
        assert answer.requires_grad == _reached(rerun)[0]
        assert answer.reached == _reached(rerun)[1]
