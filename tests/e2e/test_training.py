"""Training with compiled forward and backward: 20 steps of ember.compile(model) against the
same steps in eager (same initial weights, same data, same optimizer): losses and parameters
agree. Each model must compile for training (no graph falls back to eager)."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, watching_fallbacks
from training_models import TransformerModel

import ember
from ember import config

STEPS = 20
TOLERANCE = dict(rtol=1e-3, atol=1e-4)


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.head(x.flatten(1))


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


MODELS = {
    "mlp": (mlp, (8, 12)),
    "transformer_block": (TransformerModel, (2, 6, 16)),
    "cnn": (SmallCNN, (2, 3, 8, 8)),
}
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def train(model, optimizer, data, target, steps=STEPS):
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(data[step % len(data)]), target[step % len(target)])
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def compare(name: str, optimizer: str) -> None:
    build, shape = MODELS[name]
    torch.manual_seed(0)
    eager_model = build().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    generator = torch.Generator().manual_seed(1)
    data = [torch.randn(shape, generator=generator, device="cpu").to(DEVICE) for _ in range(4)]
    target = [torch.randn(shape[0], 4, generator=generator, device="cpu").to(DEVICE)
              for _ in range(4)]
    compiled = ember.compile(ember_model)
    # (cuDNN convolves in TF32 by default, 10 bits of mantissa, and ember's channels-last
    # convolutions sum in another order than eager's row-major ones: 2e-3 apart after 20
    # steps on an H100. Both in float32 here)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        with watching_fallbacks() as fallbacks:
            got = train(compiled, OPTIMIZERS[optimizer](ember_model.parameters()), data,
                        target)
        want = train(eager_model, OPTIMIZERS[optimizer](eager_model.parameters()), data,
                     target)
    assert not fallbacks.messages, "; ".join(fallbacks.messages)
    torch.testing.assert_close(got, want, **TOLERANCE)
    for (path, a), b in zip(ember_model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, **TOLERANCE, msg=lambda m, path=path: f"{path}: {m}")


@pytest.mark.parametrize("name", MODELS)
def test_twenty_sgd_steps_match_eager(name):
    compare(name, "sgd_momentum")


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_each_optimizer_over_a_compiled_mlp(optimizer):
    compare("mlp", optimizer)


def test_dropout_in_training_draws_the_same_masks_as_eager():
    torch.manual_seed(0)
    eager_model = TransformerModel(dropout=0.25).to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(3), device="cpu").to(DEVICE)
    compiled = ember.compile(ember_model)
    torch.manual_seed(7)
    got = compiled(x)
    got.sum().backward()
    torch.manual_seed(7)
    want = eager_model(x)
    want.sum().backward()
    torch.testing.assert_close(got, want, **TOLERANCE)
    for a, b in zip(ember_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_whole_training_step_compiles_with_three_explained_breaks(optimizer):
    torch.manual_seed(0)
    eager_model = mlp().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    eager_opt = OPTIMIZERS[optimizer](eager_model.parameters())
    ember_opt = OPTIMIZERS[optimizer](ember_model.parameters())
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 12, generator=generator, device="cpu").to(DEVICE),
             torch.randn(8, 4, generator=generator, device="cpu").to(DEVICE)) for _ in range(4)]
    step = ember.compile(train_step)
    with watching_fallbacks() as fallbacks:
        got = torch.stack([step(ember_model, ember_opt, *data[i % 4]).detach()
                           for i in range(STEPS)])
    want = torch.stack([train_step(eager_model, eager_opt, *data[i % 4]).detach()
                        for i in range(STEPS)])
    assert not fallbacks.messages, "; ".join(fallbacks.messages)
    torch.testing.assert_close(got, want, **TOLERANCE)
    for a, b in zip(ember_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, **TOLERANCE)
        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)
        for key, value in eager_opt.state[b].items():
            torch.testing.assert_close(ember_opt.state[a][key], value, **TOLERANCE)
    report = ember.explain(train_step)(copy.deepcopy(eager_model), eager_opt, *data[0])
    assert report.graph_break_count == 3
    assert [str(r).split(": ", 1)[-1].split(" runs")[0] for r in report.break_reasons] == \
        ["optimizer.zero_grad()", "tensor.backward()", "optimizer.step()"]


def test_the_fused_optimizer_step_is_one_compiled_update():
    import ember.optim

    model = mlp().to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step():
        optimizer.zero_grad()
        model(torch.randn(8, 12).to(DEVICE)).sum().backward()
        ember.optim.step(optimizer)

    step()  # the first step makes the state (the optimizer's own step)
    step()  # fused from here on
    update = ember.optim._compiled["adam"]
    captures = len(update.records)
    assert update.records[-1].graphs == 1 and not update.records[-1].breaks
    optimizer.param_groups[0]["lr"] = 5e-3  # a schedule changes numbers, not the program
    step()
    assert len(update.records) == captures


def test_batch_norm_in_training_updates_running_statistics_once():
    def build():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4))

    torch.manual_seed(0)
    eager_model = build().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    compiled = ember.compile(ember_model)
    generator = torch.Generator().manual_seed(1)
    data = [torch.randn(2, 3, 8, 8, generator=generator, device="cpu").to(DEVICE) for _ in range(4)]
    target = [torch.randn(2, 4, generator=generator, device="cpu").to(DEVICE) for _ in range(4)]
    got = train(compiled, torch.optim.SGD(ember_model.parameters(), lr=0.05), data, target, 6)
    want = train(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.05), data, target,
                 6)
    torch.testing.assert_close(got, want, **TOLERANCE)
    assert type(compiled._compiled_forward.records[-1].compiled).__name__ == "TrainingGraph"
    for a, b in zip(ember_model.state_dict().values(), eager_model.state_dict().values()):
        torch.testing.assert_close(a, b, **TOLERANCE)  # parameters and running statistics


def test_a_channels_last_batch_norm_trains_without_falling_back():
    # eager's batch-norm backward lays the input's gradient out channels-last, as its input:
    # ember's backward graph must say so, or its first call finds another layout and the
    # graph runs eagerly from then on
    def build():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 4, 3, padding=1)).to(memory_format=torch.channels_last)

    torch.manual_seed(0)
    eager_model = build().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    x = torch.randn(2, 3, 8, 8, device="cpu").to(DEVICE, memory_format=torch.channels_last)
    with watching_fallbacks() as fallbacks:
        got = ember.compile(ember_model)(x)
        got.square().sum().backward()
    want = eager_model(x)
    want.square().sum().backward()
    assert not [m for m in fallbacks.messages if "eager" in m]
    torch.testing.assert_close(got, want, **TOLERANCE)
    for a, b in zip(ember_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)


# -- a small GPT: embeddings, causal scaled_dot_product_attention, tied weights, cross entropy
class CausalAttention(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).contiguous().view(batch, length, width))


class GPTBlock(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.attention = CausalAttention(width, heads)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(approximate="tanh"),
            torch.nn.Linear(4 * width, width), torch.nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocabulary=50, width=32, heads=4, layers=2, context=16):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocabulary, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList([GPTBlock(width, heads) for _ in range(layers)])
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.tokens.weight  # tied

    def forward(self, tokens, targets):
        length = tokens.shape[1]
        positions = torch.arange(0, length, dtype=torch.long, device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_a_small_gpt_trains_as_eager_does():
    torch.manual_seed(0)
    eager_model = GPT().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    compiled = ember.compile(ember_model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=1e-2)
    ember_opt = torch.optim.SGD(ember_model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50, (4, 16), generator=generator, device="cpu").to(DEVICE)
    targets = torch.randint(0, 50, (4, 16), generator=generator, device="cpu").to(DEVICE)
    for step in range(5):
        for model, optimizer in ((compiled, ember_opt), (eager_model, eager_opt)):
            torch.manual_seed(step)  # the same dropout masks
            optimizer.zero_grad()
            model(tokens, targets).backward()
            optimizer.step()
    assert type(compiled._compiled_forward.records[-1].compiled).__name__ == "TrainingGraph"
    # (on CUDA eager's attention is a fused kernel that sums in another order)
    tolerance = dict(rtol=1e-3, atol=1e-3) if DEVICE == "cuda" else TOLERANCE
    for a, b in zip(ember_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, **tolerance)


# -- more model shapes: residual CNN with batch norm and pooling, embedding + LSTM, a ViT
class ResidualCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.norm1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.norm2 = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(2)
        self.average = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.norm1(self.conv1(x)))
        x = F.relu(x + self.norm2(self.conv2(x)), inplace=True)
        return self.head(torch.flatten(self.average(self.pool(x)), 1))


class Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(20, 8)
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, tokens):
        out, _ = self.lstm(self.embedding(tokens))
        return self.head(out[:, -1])


class RecurrentStack(torch.nn.Module):
    """Each recurrent layer kind over a whole sequence: one library call each, differentiated
    by eager's own autograd (its record kept on the step's tape)."""

    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(6, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.lstm = torch.nn.LSTM(16, 8, proj_size=4)
        self.rnn = torch.nn.RNN(4, 5, nonlinearity="relu", batch_first=True)

    def forward(self, x):
        y, h = self.gru(torch.tanh(x))
        # (cuDNN takes only contiguous states, as eager's call does)
        y, (h2, c) = self.lstm(y.transpose(0, 1) * 2, (h[:1, :, :4].contiguous(), h[1:2]))
        z, _ = self.rnn(y.transpose(0, 1))
        return z.sum(1) + h2.sum(0).mean() + c.mean()


class TinyViT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.patches = torch.nn.Conv2d(3, 16, 4, stride=4)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, 16))
        self.encoder = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                        batch_first=True)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        return self.head(self.encoder(x)[:, 0])


@pytest.mark.parametrize("build, make_input", [
    (ResidualCNN, lambda g: torch.randn(2, 3, 8, 8, generator=g, device="cpu")),
    pytest.param(Recurrent, lambda g: torch.randint(0, 20, (2, 5), generator=g, device="cpu"),
                 marks=pytest.mark.slow_in_interpreter),  # (28 s under the interpreter)
    (RecurrentStack, lambda g: torch.randn(3, 7, 6, generator=g, device="cpu")),
    (TinyViT, lambda g: torch.randn(2, 3, 8, 8, generator=g, device="cpu")),
], ids=["residual_cnn", "lstm", "recurrent_stack", "vit"])
def test_more_model_shapes_train_as_eager_does(build, make_input):
    torch.manual_seed(0)
    eager_model = build().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    compiled = ember.compile(ember_model)
    x = make_input(torch.Generator().manual_seed(1)).to(DEVICE)
    for model, parameters in ((compiled, ember_model), (eager_model, eager_model)):
        optimizer = torch.optim.SGD(parameters.parameters(), lr=0.05)
        for _ in range(3):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    assert "TrainingGraph" in {type(r.compiled).__name__
                               for r in compiled._compiled_forward.records}
    for a, b in zip(ember_model.state_dict().values(), eager_model.state_dict().values()):
        torch.testing.assert_close(a, b, **TOLERANCE)


def test_a_mixed_precision_training_step_matches_eager():
    # torch.autocast around the forward (float16 on CUDA, bfloat16 on the CPU), the backward
    # and an SGD step outside it: ember applies autocast's casts in its graph
    import ember

    dtype = torch.float16 if DEVICE == "cuda" else torch.bfloat16
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 8)).to(DEVICE)
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, 16, generator=generator, device="cpu").to(DEVICE)
        losses = []
        for net, optimizer in zip((model, compiled), optimizers):
            optimizer.zero_grad()
            with torch.autocast(DEVICE, dtype=dtype):
                out = net(x)
            assert out.dtype == dtype
            loss = out.float().pow(2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=2e-2)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q, p, rtol=2e-2, atol=2e-2)


def test_detached_values_and_no_grad_regions_stop_the_gradient():
    # (a wrong gradient before: detach lowered to the value itself and no_grad regions were
    # differentiated through, so x / 2 under no_grad added 0.5 to x's gradient)
    from helpers import check_grad

    def no_grad_region(x, w):
        with torch.no_grad():
            scale = (x * w).sum()
        return x * scale + w

    def detached(x, w):
        target = (x @ w).detach()
        return ((x @ w - target) ** 2).sum() + (x.data * 3 * w).sum() + torch.sin(x).detach()

    def stop_then_grad(x, w):
        with torch.no_grad():
            with torch.enable_grad():
                inner = x * w  # (tracked again inside)
        return inner.sum() * x

    for fn in (no_grad_region, detached, stop_then_grad):  # (Dynamo keeps the no_grad
        check_grad(fn, torch.randn(3, 3), torch.randn(3, 3), dynamo=True)  # regions in its graph)
    import ember  # and ember's own capture

    x, w = (torch.randn(3, 3, device=DEVICE, requires_grad=True) for _ in range(2))
    for fn in (no_grad_region, detached, stop_then_grad):
        compiled = ember.compile(fn)(x, w)
        compiled.sum().backward()
        got = x.grad.clone(), w.grad.clone()
        x.grad = w.grad = None
        fn(x, w).sum().backward()
        torch.testing.assert_close(got, (x.grad, w.grad), rtol=1e-4, atol=1e-4)
        x.grad = w.grad = None


def test_a_buffer_updated_under_no_grad_in_a_training_forward():
    # (an exponential moving average: the in-place updates under no_grad must reach the
    # buffer, and the gradient must not cross them)
    import ember

    class Tracked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("average", torch.zeros(4))

        def forward(self, x):
            y = self.linear(x)
            with torch.no_grad():
                self.average.mul_(0.9).add_(y.mean(0), alpha=0.1)
            return y * self.average.sum()

    torch.manual_seed(0)
    model = Tracked().to(DEVICE)
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2), device="cpu").to(DEVICE)
    for _ in range(3):
        model(x).sum().backward()
        compiled(x).sum().backward()
    torch.testing.assert_close(twin.average, model.average)
    torch.testing.assert_close(twin.linear.weight.grad, model.linear.weight.grad)


class _OutputsLM(torch.nn.Module):
    """A language model that answers as Hugging Face models do: a ModelOutput-style object
    (a dict subclass made inside the forward) holding the loss and the logits."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 20)

    def forward(self, tokens, labels=None):
        from model_outputs import LMOutputs

        hidden = torch.tanh(self.body(self.embed(tokens)))
        out = LMOutputs(logits=self.head(hidden), hidden=(hidden,))
        if labels is not None:
            out.loss = F.cross_entropy(out[0].flatten(0, 1), labels.flatten())
        return out


def test_a_model_answering_with_a_model_output_object_trains_in_one_graph():
    torch.manual_seed(0)
    eager_model = _OutputsLM().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    compiled = ember.compile(ember_model)
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 20, (2, 6), generator=generator, device="cpu").to(DEVICE)
    labels = torch.randint(0, 20, (2, 6), generator=generator, device="cpu").to(DEVICE)
    got, want = compiled(tokens, labels), eager_model(tokens, labels)
    # (the loss set after the object was made is an attribute, not an item: eager's rule)
    assert type(got) is type(want) and list(got.keys()) == list(want.keys()) == ["logits",
                                                                                 "hidden"]
    assert list(vars(got)) == list(vars(want))
    got.loss.backward()
    want.loss.backward()
    torch.testing.assert_close(got.to_tuple()[0], want.logits, **TOLERANCE)
    torch.testing.assert_close(got.loss, want.loss, **TOLERANCE)
    for a, b in zip(ember_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)
    assert ember.explain(ember_model)(tokens, labels).graph_count == 1
    assert type(compiled._compiled_forward.records[-1].compiled).__name__ == "TrainingGraph"


def test_a_break_inside_a_grad_mode_region_keeps_each_side_s_mode():
    # (the graph after a break inside `with torch.no_grad():` is entered with grad off and
    # turns it on again: it was compiled as an inference graph, and tracing its grad-mode
    # switches left the caller's mode changed; w got 3x its gradient)
    w = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    x = torch.randn(2, 4, device=DEVICE)

    def logged_under_no_grad(x):
        q = x @ w
        with torch.no_grad():
            ember.graph_break()
            t = (3 * x) @ w
        return q, t, q + t

    def tracked_again_under_no_grad(x):
        with torch.no_grad():
            s = x @ w
            with torch.enable_grad():
                ember.graph_break()
                q = s @ w
            r = q * 2
        return s, q, r

    for fn in (logged_under_no_grad, tracked_again_under_no_grad):
        results = []
        for run in (fn, ember.compile(fn)):
            w.grad = None
            outputs = run(x)
            flags = [o.requires_grad for o in outputs]
            sum(o.sum() for o in outputs if o.requires_grad).backward()
            results.append((flags, w.grad.clone(), outputs, torch.is_grad_enabled()))
        (flags, grad, outputs, mode), (flags_, grad_, outputs_, mode_) = results
        assert flags_ == flags and mode_ == mode is True
        torch.testing.assert_close(grad_, grad, **TOLERANCE)
        torch.testing.assert_close(outputs_, outputs, **TOLERANCE)


def test_what_eager_does_not_track_comes_back_untracked():
    # (results of detach() and of no_grad regions came back requiring grad, and parameters
    # reached only through them got zero gradients, which AdamW's weight decay then moved)
    class Frozen(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x):
            with torch.no_grad():
                features = self.backbone(x)
            return self.head(features), features

    torch.manual_seed(0)
    model = Frozen().to(DEVICE)
    twin = copy.deepcopy(model)
    x = torch.randn(3, 4, device=DEVICE)
    (got, got_features), (want, want_features) = ember.compile(twin)(x), model(x)
    assert got_features.requires_grad is want_features.requires_grad is False
    got.sum().backward()
    want.sum().backward()
    assert twin.backbone.weight.grad is None and model.backbone.weight.grad is None
    torch.testing.assert_close(twin.head.weight.grad, model.head.weight.grad, **TOLERANCE)
    w = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    detached = ember.compile(lambda x: (x @ w).detach().sum())(x)
    assert not detached.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        detached.backward()


def test_inputs_lowering_cuts_off_still_get_eagers_zero_gradients():
    # (a piece of a cat with no elements and a slice of length 0 vanish from the IR, but eager's
    # autograd graph still reaches their sources: they get zeros, not None, so an optimizer
    # still decays and steps them)
    def pieces(a, b, c):
        return torch.cat([a, b[:0], c]) * 2, (c * 3).sum()

    results = []
    for run in (pieces, ember.compile(pieces)):
        a, b, c = (torch.randn(n, device=DEVICE, requires_grad=True) for n in (0, 3, 2))
        out, total = run(a, b, c)
        (out.sum() + total).backward()
        results.append([a.grad, b.grad, c.grad])
    for got, want in zip(*reversed(results)):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want, **TOLERANCE)
    unused = torch.randn(2, device=DEVICE, requires_grad=True)
    x = torch.randn(2, device=DEVICE, requires_grad=True)
    ember.compile(lambda x, unused: (x * 2, unused.shape[0]))(x, unused)[0].sum().backward()
    assert unused.grad is None   # (eager never visits an input no output depends on)


@pytest.mark.parametrize("options", [dict(padding_idx=1), dict(scale_grad_by_freq=True),
                                     dict(padding_idx=0, scale_grad_by_freq=True)])
def test_embedding_gradients_keep_padding_idx_and_scale_grad_by_freq(options):
    # (both were ignored: the padding row trained, repeated ids were not scaled)
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(6, 3, **options).to(DEVICE)
    twin = copy.deepcopy(embedding)
    ids = torch.tensor([[0, 2, 1, 1], [2, 2, 5, 0]], device=DEVICE)

    def loss(module, ids):
        return (module(ids) * torch.arange(3.0, device=DEVICE)).sum()

    loss(embedding, ids).backward()
    ember.compile(loss)(twin, ids).backward()
    torch.testing.assert_close(twin.weight.grad, embedding.weight.grad, **TOLERANCE)


def test_complex_intermediates_keep_their_gradients():
    # (complex values were passed over as not differentiable: the result came back untracked
    # and the weights before them got no gradient; such graphs now train eagerly)
    x = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    programs = [lambda x: torch.fft.fft(x).abs(),
                lambda x: torch.view_as_real(torch.view_as_complex(x.reshape(4, 4, 2)) * 2),
                lambda x: torch.fft.irfft(torch.fft.rfft(x) * 2, n=8)]
    for program in programs:
        want, got = program(x), ember.compile(program)(x)
        assert got.requires_grad
        torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0],
                                   torch.autograd.grad(want.sum(), x)[0], **TOLERANCE)


def test_an_in_place_write_of_a_tracked_value_into_an_untracked_input_tracks_it():
    # (Mixtral's `final.index_add_(0, rows, expert(x))` into a zeros buffer made outside:
    # eager's buffer requires grad afterwards; the write-back left it untracked)
    rows = torch.tensor([0, 2], device=DEVICE)

    def accumulate(final, v):
        final.index_add_(0, rows, v * 2)

    results = []
    for run in (accumulate, ember.compile(accumulate)):
        final = torch.zeros(3, 2, device=DEVICE)
        v = torch.ones(2, 2, device=DEVICE, requires_grad=True)
        run(final, v)
        assert final.requires_grad
        (final * 3).sum().backward()
        results.append((final.detach(), v.grad))
    torch.testing.assert_close(results[1], results[0], **TOLERANCE)


def test_a_clamp_through_data_leaves_what_autograd_saved_valid():
    # (CLIP's logit_scale.data.clamp_ after using logit_scale: `.data` was captured as
    # detach(), which shares the version counter, so the graph run eagerly made backward fail)
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.scale = torch.nn.Parameter(torch.tensor(5.0))

        def forward(self, x):
            out = self.linear(x) * self.scale
            self.scale.data.clamp_(0, 4.6)
            return out

    torch.manual_seed(0)
    model = Scaled().to(DEVICE)
    twin = copy.deepcopy(model)
    x = torch.randn(3, 4, device=DEVICE)
    model(x).sum().backward()
    ember.compile(twin)(x).sum().backward()
    for mine, theirs in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(mine, theirs, **TOLERANCE)
        torch.testing.assert_close(mine.grad, theirs.grad, **TOLERANCE)


def _scheduled_steps(compiled: bool, scheduler: str, inside: bool, steps: int = 6):
    import ember.optim  # noqa: F401 (its fused updates are counted)

    torch.manual_seed(0)
    model = mlp().to(DEVICE)
    if scheduler == "step":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    else:  # OneCycleLR cycles Adam's beta1 too
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05,
                                                       total_steps=steps + 1)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if inside:
            schedule.step()
        return loss.detach()

    run = ember.compile(step) if compiled else step
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = (torch.randn(8, n, generator=generator, device="cpu").to(DEVICE)
                for n in (12, 4))
        losses.append(run(x, y))
        if not inside:
            schedule.step()
    return torch.stack(losses), model, optimizer, run


@pytest.mark.parametrize("inside", [True, False], ids=["scheduler-inside", "scheduler-outside"])
@pytest.mark.parametrize("scheduler", ["step", "one-cycle"])
def test_a_training_step_with_an_lr_scheduler_matches_eager(scheduler, inside):
    # (an LR scheduler replaces optimizer.step with a wrapper of its own: it used to be taken
    # for a torch op, and running it on fake tensors left fake optimizer state behind)
    import ember.optim

    kind = "sgd" if scheduler == "step" else "adam"
    captured = len(ember.optim._compiled[kind].records) if kind in ember.optim._compiled else 0
    with watching_fallbacks() as fallbacks:
        got, model, optimizer, run = _scheduled_steps(True, scheduler, inside)
    want, eager_model, eager_optimizer, _ = _scheduled_steps(False, scheduler, inside)
    assert not fallbacks.messages, "; ".join(fallbacks.messages)
    torch.testing.assert_close(got, want, **TOLERANCE)
    for a, b in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, **TOLERANCE)
        for key, value in eager_optimizer.state[b].items():
            assert type(optimizer.state[a][key]) is torch.Tensor
            torch.testing.assert_close(optimizer.state[a][key], value, **TOLERANCE)
    assert optimizer.param_groups[0]["lr"] == eager_optimizer.param_groups[0]["lr"]
    # the step through the scheduler's wrapper is ember's fused update, compiled at most
    # once more in this test (its numbers change every step: lr, and OneCycleLR's beta1)
    assert len(ember.optim._compiled[kind].records) - captured <= 1


def test_adam_groups_whose_parameters_are_at_different_steps_step_once():
    def run(compile_step: bool):
        torch.manual_seed(0)
        body, head_a, head_b = (torch.nn.Linear(4, 8), torch.nn.Linear(8, 2),
                                torch.nn.Linear(8, 2))
        optimizer = torch.optim.Adam(
            [{"params": [body.weight]},
             {"params": [body.bias, *head_a.parameters(), *head_b.parameters()]}], lr=0.1)

        def step(x, y, task):  # a head trained every other call: its step counts lag
            optimizer.zero_grad()
            head = head_a if task == "a" else head_b
            F.mse_loss(head(torch.relu(body(x))), y).backward()
            optimizer.step()

        fn = ember.compile(step) if compile_step else step
        generator = torch.Generator().manual_seed(1)
        for task in "abab":
            x, y = (torch.randn(3, n, generator=generator, device="cpu").to(DEVICE)
                    for n in (4, 2))
            fn(x, y, task)
        return body, optimizer

    (body, optimizer), (eager_body, _) = run(True), run(False)
    assert optimizer.state[body.weight]["step"].item() == 4
    torch.testing.assert_close(body.weight, eager_body.weight, **TOLERANCE)
    torch.testing.assert_close(body.bias, eager_body.bias, **TOLERANCE)


def test_an_ema_of_the_weights_under_no_grad_compiles_and_matches_eager():
    # (the write into the EMA copy reads the trained weights, which require grad; under
    # no_grad eager does not track it, so neither may the compiled graph)
    def run(compile_step: bool):
        torch.manual_seed(0)
        model = mlp().to(DEVICE)
        ema = copy.deepcopy(model).requires_grad_(False)

        def step(x, decay):
            loss = model(x).square().mean()
            with torch.no_grad():
                for average, weight in zip(ema.parameters(), model.parameters()):
                    average.mul_(decay).add_(weight, alpha=1 - decay)
            return loss

        fn = ember.compile(step) if compile_step else step
        generator = torch.Generator().manual_seed(1)
        for _ in range(3):
            fn(torch.randn(8, 12, generator=generator, device="cpu").to(DEVICE),
               0.9).backward()
        return model, ema

    with watching_fallbacks() as fallbacks:
        model, ema = run(True)
    eager_model, eager_ema = run(False)
    assert not fallbacks.messages, "; ".join(fallbacks.messages)
    for a, b in zip(ema.parameters(), eager_ema.parameters()):
        assert not a.requires_grad
        torch.testing.assert_close(a, b, **TOLERANCE)
    for a, b in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)


def test_dropout_at_its_default_half_compiles_and_draws_eagers_masks():
    # (the dispatcher leaves out bernoulli_'s p when it is its default, 0.5, and the
    # functional overload ember lowers to has no default: the graph used to run eagerly)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(),
                                torch.nn.Linear(16, 2)).to(DEVICE).train()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3), device="cpu").to(DEVICE)
    compiled = ember.compile(model)
    with watching_fallbacks() as fallbacks:
        torch.manual_seed(7)
        got = compiled(x)
        got.sum().backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(7)
    want = model(x)
    want.sum().backward()
    # (on CUDA dropout is eager's fused op, a library call by design: noted, not a fallback)
    graphs_eager = [m for m in fallbacks.messages if "runs as a library call" not in m]
    assert not graphs_eager, "; ".join(graphs_eager)
    torch.testing.assert_close(got, want, **TOLERANCE)
    for a, p in zip(got_grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, **TOLERANCE)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_trains_as_eager_does(mode):
    # (traced with tensors that require no grad, embedding_bag picks its forward-only op,
    # which has no backward: the compiled backward crashed)
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 4, mode=mode).to(DEVICE)
    eager_bag = copy.deepcopy(bag)
    indices = torch.tensor([1, 2, 3, 4, 1, 7], device=DEVICE)
    offsets = torch.tensor([0, 2, 5], device=DEVICE)
    got = ember.compile(bag)(indices, offsets)
    got.square().sum().backward()
    want = eager_bag(indices, offsets)
    want.square().sum().backward()
    torch.testing.assert_close(got, want, **TOLERANCE)
    torch.testing.assert_close(bag.weight.grad, eager_bag.weight.grad, **TOLERANCE)


def train_twice_beside_eager(model: torch.nn.Module, *inputs: torch.Tensor):
    """Two forward and backward passes of `model` under ember.compile and of an eager copy,
    comparing outputs and every gradient, with no fallback; the compiled model's training
    graph."""
    eager_model = model.to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    compiled = ember.compile(ember_model)
    with watching_fallbacks() as fallbacks:
        for _ in range(2):
            got, want = compiled(*inputs), eager_model(*inputs)
            torch.testing.assert_close(got, want, **TOLERANCE)
            got.square().sum().backward()
            want.square().sum().backward()
            for a, b in zip(ember_model.parameters(), eager_model.parameters()):
                torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)
    assert not fallbacks.messages, fallbacks.messages
    return compiled._compiled_forward.records[0].compiled


class BiasedAttention(torch.nn.Module):
    """T5-style attention: the mask is a learned bias per head and relative position, so it
    requires grad, and eager's CPU attention runs its math composite for it."""

    def __init__(self, width=32, heads=4, length=8):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(heads, length, length) * 0.1)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[None], scale=1.0)
        return y.transpose(1, 2).reshape(batch, length, width)


def test_attention_with_a_learned_bias_trains_through_embers_own_kernels():
    # eager runs the math composite here (its flash kernel takes no mask that requires
    # grad): ember traces that composite too, so its own backward differentiates it, rather
    # than calling eager's attention and its autograd from the compiled graph
    torch.manual_seed(0)
    training = train_twice_beside_eager(BiasedAttention(), torch.randn(2, 8, 32, device=DEVICE))
    if DEVICE == "cpu":  # (CUDA's kernels take such a mask: there eager's call stays whole)
        from ember.autodiff.tape import taped_call
        from ember.ir.ops import Op

        targets = [n.attrs["target"] for n in training.split.forward.nodes
                   if n.op is Op.LIBRARY]
        assert taped_call not in targets, targets


class MaskedAttention(torch.nn.Module):
    def __init__(self, width=32, heads=4, mask="causal"):
        super().__init__()
        self.heads, self.mask = heads, mask
        self.qkv = torch.nn.Linear(width, 3 * width)

    def forward(self, x, padding):
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=2))
        if self.mask == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.mask == "bool":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=padding[:, None, None, :])
        else:  # an additive mask, as Hugging Face makes from a padding mask
            additive = (1.0 - padding[:, None, None, :].float()) * torch.finfo(x.dtype).min
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
        return y.transpose(1, 2).reshape(batch, length, width)


@pytest.mark.parametrize("mask", ["causal", "bool", "additive"])
def test_the_attention_kernel_trains_with_its_own_backward_kernel(mask):
    # ember keeps the kernel's output and log-sum-exp and calls its backward kernel itself,
    # as eager's autograd does, instead of running eager's autograd from the graph: the CPU's
    # flash kernel, CUDA's memory-efficient one (float32)
    torch.manual_seed(0)
    model = MaskedAttention(mask=mask)
    padding = torch.ones(2, 8, dtype=torch.bool, device=DEVICE)
    padding[1, 5:] = False
    training = train_twice_beside_eager(model, torch.randn(2, 8, 32, device=DEVICE), padding)
    from ember.autodiff.tape import taped_call
    from ember.ir.ops import Op

    calls = [n.attrs["target"] for graph in (training.split.forward, training.split.backward)
             for n in graph.nodes if n.op is Op.LIBRARY]
    aten = torch.ops.aten
    kernel, backward = (aten._scaled_dot_product_flash_attention_for_cpu,
                        aten._scaled_dot_product_flash_attention_for_cpu_backward) \
        if DEVICE == "cpu" else (aten._scaled_dot_product_efficient_attention,
                                 aten._scaled_dot_product_efficient_attention_backward)
    assert taped_call not in calls, calls
    assert calls.count(kernel.default) == 1 and calls.count(backward.default) == 1, calls


class PooledConvolutions(torch.nn.Module):
    def __init__(self, pool: torch.nn.MaxPool2d):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = pool
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.stem(x))))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("pool", ["3x3/2 padded", "2x2", "ceil", "dilated"])
def test_a_max_pool_trains_with_eagers_backward_kernel_on_its_indices(pool, channels_last):
    # its backward is eager's max_pool2d_with_indices_backward on the forward's indices, the
    # incoming gradient laid out as the forward's result (channels-last models: a row-major
    # gradient sent eager's kernel down a slow path, and its result across the relu's grain)
    pools = {"3x3/2 padded": torch.nn.MaxPool2d(3, 2, 1), "2x2": torch.nn.MaxPool2d(2),
             "ceil": torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True),
             "dilated": torch.nn.MaxPool2d(2, 1, 0, dilation=2)}
    torch.manual_seed(0)
    model, x = PooledConvolutions(pools[pool]), torch.randn(2, 3, 15, 15)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    training = train_twice_beside_eager(model, x.to(DEVICE))
    from ember.autodiff.tape import taped_call, taped_vjp
    from ember.ir.ops import Op

    calls = [n.attrs["target"] for graph in (training.split.forward, training.split.backward)
             for n in graph.nodes if n.op is Op.LIBRARY]
    assert taped_call not in calls and taped_vjp not in calls, calls
    assert calls.count(torch.ops.aten.max_pool2d_with_indices_backward.default) == 1, calls


class LossInside(torch.nn.Module):
    """A model that computes its loss itself and returns it beside its logits and a cache,
    as Hugging Face's models do when given labels."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(32, 64)

    def forward(self, x, labels):
        hidden = torch.tanh(self.body(x))
        logits = self.head(hidden)
        return F.cross_entropy(logits, labels), logits, hidden * 2


def _loss_inside_pair():
    """LossInside twice (eager's and ember's, the same weights), ember's compiled, and a batch."""
    torch.manual_seed(0)
    eager_model = LossInside().to(DEVICE)
    ember_model = copy.deepcopy(eager_model)
    x, labels = torch.randn(8, 16, device=DEVICE), torch.randint(0, 64, (8,), device=DEVICE)
    return eager_model, ember_model, ember.compile(ember_model), x, labels


@pytest.mark.parametrize("backward_through", ["loss", "loss and logits", "every output"])
def test_outputs_given_no_gradient_get_a_backward_that_reads_none(backward_through):
    # autograd hands the backward None for an output whose gradient nobody asked (the logits
    # of a loss computed inside the model): a backward compiled without that gradient runs,
    # where eager's zeros were a fill and a read of the logits' size every step
    eager_model, ember_model, compiled, x, labels = _loss_inside_pair()

    def gradients_of(outputs):
        loss, logits, cache = outputs
        total = {"loss": loss, "loss and logits": loss + logits.square().mean(),
                 "every output": loss + logits.square().mean() + cache.sum()}[backward_through]
        total.backward()

    with watching_fallbacks() as fallbacks:
        for _ in range(2):
            got, want = compiled(x, labels), eager_model(x, labels)
            torch.testing.assert_close(got, want, **TOLERANCE)
            gradients_of(got)
            gradients_of(want)
            for a, b in zip(ember_model.parameters(), eager_model.parameters()):
                torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)
    assert not fallbacks.messages, fallbacks.messages
    training = compiled._compiled_forward.records[0].compiled
    absent = {"loss": {1, 2}, "loss and logits": {2}, "every output": set()}[backward_through]
    # (the logits' and the cache's, beside a loss, are guessed absent: compiled beside the
    # forward; another set gets its own backward on its first call)
    guessed = frozenset({1, 2})
    assert set(training._backwards) == {guessed} | ({frozenset(absent)} if absent else set())
    if absent:
        backward = training._backwards[frozenset(absent)]
        plan_inputs = backward.plan.inputs
        for position, (kind, k) in enumerate(training.split.backward_inputs):
            if kind == "grad" and k in absent:  # (named where args unpack, read nowhere)
                name = plan_inputs[position].name
                uses = re.findall(rf"\b{name}\b", backward.wrapper_source)
                assert len(uses) == 1, backward.wrapper_source


def test_backwards_made_per_set_of_absent_gradients_are_bounded():
    # every subset of four outputs given no gradient: eager's gradients each time, and at most
    # MAX_BACKWARDS backwards built (the backward for every output serves the rest)
    from ember.runtime.training import MAX_BACKWARDS

    def fn(x, w):
        h = torch.tanh(x @ w)
        return h.mean(), h * 3, h.exp(), h.square()

    x = torch.randn(6, 5, device=DEVICE, requires_grad=True)
    w = torch.randn(5, 7, device=DEVICE, requires_grad=True)
    compiled = ember.compile(fn)
    with watching_fallbacks() as fallbacks:
        for mask in range(1, 16):
            grads = []
            for run in (compiled, fn):
                outputs = run(x, w)
                total = sum(o.sum() * (k + 1) for k, o in enumerate(outputs) if mask >> k & 1)
                grads.append(torch.autograd.grad(total, [x, w]))
            for got, want in zip(*grads):
                torch.testing.assert_close(got, want, **TOLERANCE)
    assert not fallbacks.messages, fallbacks.messages
    training = compiled.records[0].compiled
    assert len(training._backwards) == MAX_BACKWARDS


class LanguageModelHead(torch.nn.Module):
    """A language model's head: bias-free logits (over a 3-d input: a product of its 2-d
    view, viewed back; or over a 2-d one: the product itself) and the loss computed from
    them, both returned."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 64, bias=False)

    def forward(self, x, labels):
        logits = self.head(torch.tanh(self.body(x)))
        return logits, F.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1))


def _head_inputs(rank):
    shape = (4, 8) if rank == 3 else (32,)
    return (torch.randn(*shape, 16, device=DEVICE),
            torch.randint(0, 64, shape, device=DEVICE))


@pytest.mark.parametrize("rank", [3, 2])
def test_logits_a_loss_read_are_stored_once_and_train_as_eager(rank):
    # the backward reads the logits (the loss's softmax): saved as the very output the
    # caller gets, not a copy of it (GPT-2's logits: a 412 MB copy, 194 us a step on the H200)
    torch.manual_seed(0)
    eager_model = LanguageModelHead().to(DEVICE)
    x, labels = _head_inputs(rank)
    kernels = {}
    for shared in (True, False):
        model = copy.deepcopy(eager_model)
        with config.override(saved_outputs=shared):
            compiled = ember.compile(model)
            with watching_fallbacks() as fallbacks:
                for _ in range(2):
                    (logits, loss), (want_logits, want_loss) = compiled(x, labels), \
                        eager_model(x, labels)
                    torch.testing.assert_close(logits, want_logits, **TOLERANCE)
                    torch.testing.assert_close(loss, want_loss, **TOLERANCE)
                    # (a gradient through the logits too: the backward reads both)
                    (loss + logits.square().mean()).backward()
                    (want_loss + want_logits.square().mean()).backward()
                    for a, b in zip(model.parameters(), eager_model.parameters()):
                        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)
                        a.grad = b.grad = None
            assert not fallbacks.messages, fallbacks.messages
        training = compiled._compiled_forward.records[0].compiled
        kernels[shared] = training.forward_graph.kernel_count
    assert kernels[False] - kernels[True] == 1  # (the copy of the logits)


@pytest.mark.parametrize("rank", [3, 2])
def test_an_in_place_write_to_logits_the_backward_reads_is_an_error_not_a_wrong_gradient(rank):
    # eager's backward reads log_softmax's own result and not the logits; ember's reads the
    # logits (stored once): a write to them before the backward cannot give a wrong
    # gradient (torch.compile's does, silently), it stops the backward with what to do
    torch.manual_seed(0)
    model = LanguageModelHead().to(DEVICE)
    compiled = ember.compile(model)
    x, labels = _head_inputs(rank)
    logits, loss = compiled(x, labels)
    logits.mul_(2)
    with pytest.raises(RuntimeError, match="EMBER_SAVED_OUTPUTS=0"):
        loss.backward()
    # (with the copy, eager's answer)
    with config.override(saved_outputs=False):
        copied, eager_model = copy.deepcopy(model), copy.deepcopy(model)
        compiled = ember.compile(copied)
        (logits, loss), (want_logits, want_loss) = compiled(x, labels), eager_model(x, labels)
        logits.mul_(2)
        want_logits.mul_(2)
        loss.backward()
        want_loss.backward()
        for a, b in zip(copied.parameters(), eager_model.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)


def test_an_output_viewing_a_product_takes_in_place_ops_as_eager_does():
    # a linear over a 3-d input is a product of its 2-d view, viewed back: the compiled
    # step's output viewed the product's memory, and a custom Function's output that is a
    # view refuses in-place ops under grad mode ("Output 0 of _Step is a view and is being
    # modified inplace"); such outputs are now tensors of their own over that memory
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 64, bias=False).to(DEVICE)

    def fn(x):
        return head(torch.tanh(x))

    x = torch.randn(4, 8, 16, device=DEVICE)
    compiled = ember.compile(fn)
    results = []
    for run in (compiled, fn):
        for _ in range(2):
            out = run(x)
        out.mul_(2)
        out.square().sum().backward()
        results.append((out, head.weight.grad))
        head.weight.grad = None
    assert results[0][0]._base is None
    torch.testing.assert_close(results[0], results[1], **TOLERANCE)


def test_the_backward_for_every_output_compiles_while_the_first_calls_run():
    # a loss computed inside the model: its first call waits for the forward and the backward
    # of `loss.backward()` (built ahead), not for the backward for every output as well
    import concurrent.futures

    from ember.backends import wait_for_background_compiles

    eager_model, ember_model, compiled, x, labels = _loss_inside_pair()
    for run in (compiled, eager_model):
        run(x, labels)[0].backward()
    training = compiled._compiled_forward.records[0].compiled
    assert isinstance(training._backward, concurrent.futures.Future)  # (not needed yet)
    wait_for_background_compiles()  # (what a benchmark waits for before its steady state)
    assert training._backward.done() and training.pending is None
    # a backward through every output takes it, done by then or waited for
    for run in (compiled, eager_model):
        loss, logits, cache = run(x, labels)
        (loss + logits.square().mean() + cache.sum()).backward()
    assert not isinstance(training._backward, concurrent.futures.Future)
    for a, b in zip(ember_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)


def test_a_backward_built_ahead_that_fails_to_compile_leaves_the_general_one_to_serve(
        monkeypatch):
    # the first call's forward runs while the backward of `loss.backward()` still compiles;
    # where that compile fails, the backward for every output serves: eager's gradients
    from ember import backends

    compile_ir = backends.compile_ir

    def failing_ahead(graph, *args, **kwargs):
        if "absent)" in args[6]:  # (the label: "..._backward (gradients of outputs ... absent)")
            raise RuntimeError("a kernel did not build")
        return compile_ir(graph, *args, **kwargs)

    monkeypatch.setattr(backends, "compile_ir", failing_ahead)
    eager_model, ember_model, compiled, x, labels = _loss_inside_pair()
    messages = []
    with watching_fallbacks() as fallbacks:
        for _ in range(2):
            for run in (compiled, eager_model):
                run(x, labels)[0].backward()
            for a, b in zip(ember_model.parameters(), eager_model.parameters()):
                torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)
        messages = fallbacks.messages
    assert len(messages) == 1 and "did not compile" in messages[0], messages
    training = compiled._compiled_forward.records[0].compiled
    assert list(training._backwards.values()) == [None]


def test_the_backward_for_every_output_starts_compiling_with_the_second_call():
    # (beside the first call's runs its compile held the GIL they need, the optimizer step
    # after the first backward included): started by neither the first call's forward nor
    # its backward, started by the second call, waited for by a benchmark
    from ember.backends import wait_for_background_compiles

    eager_model, ember_model, compiled, x, labels = _loss_inside_pair()
    loss = compiled(x, labels)[0]
    training = compiled._compiled_forward.records[0].compiled
    assert not training._backward.running() and not training._backward.done()
    loss.backward()
    eager_model(x, labels)[0].backward()
    assert training._start_backward is not None and not training._backward.done()
    loss = compiled(x, labels)[0]
    assert training._start_backward is None  # (started)
    wait_for_background_compiles()
    assert training._backward.done() and training.pending is None
    loss.backward()
    eager_model(x, labels)[0].backward()
    for a, b in zip(ember_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOLERANCE)


def test_a_graph_dropped_before_its_first_backward_leaves_nothing_to_wait_for():
    # its deferred compile never starts: a benchmark's wait for background compiles must not
    # wait for it (it hung the suite once)
    import gc

    from ember.runtime import background

    eager_model, ember_model, compiled, x, labels = _loss_inside_pair()
    compiled(x, labels)
    del compiled, ember_model
    gc.collect()
    assert all(job.running() or job.done() for job in background._background)
    background.wait_for_background_compiles()
    assert not background._background


def test_a_view_of_an_input_returned_from_inside_enable_grad_under_no_grad_is_tracked():
    # (the view was taken outside the step, under the caller's no_grad: it required grad
    # with no grad_fn, and its backward left the input without a gradient; DBRX's experts
    # index a view of their weights after a graph break inside no_grad)
    import ember

    def tracked(v):
        with torch.enable_grad():
            return v.view(-1, 3, 3), v[2:] * 2

    def indexed(v, m, i):
        with torch.no_grad():
            a = m[i]  # (a break: a 0-d index tensor)
        return (v.view(-1, 3, 3)[i] * a).sum()

    m, i = torch.randn(4, 3, device=DEVICE), torch.tensor(1, device=DEVICE)
    for fn, under_no_grad in ((tracked, True), (indexed, False)):
        grads = []
        for run in (fn, ember.compile(fn)):
            v = torch.arange(36.0, device=DEVICE).view(12, 3).requires_grad_()
            with torch.set_grad_enabled(not under_no_grad):
                outputs = run(v, m, i) if fn is indexed else run(v)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            assert all(o.grad_fn is not None for o in outputs)
            sum(o.sum() for o in outputs).backward()
            grads.append(v.grad)
        torch.testing.assert_close(grads[1], grads[0], **TOLERANCE)
