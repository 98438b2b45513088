"""The benchmark workloads: each a builder returning (fn or module, args), at three sizes.

`full` are the seed shapes of ../shared/ANCHORS.md, `quick` about 1/16 of the elements, `tiny`
what tests can afford. `resolve` also accepts user code as `file.py:builder` or
`package.module:builder`. Builders make tensors only; they never compile or time anything.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SIZES = ("full", "quick", "tiny")
SEED = 0

Builder = Callable[..., tuple[Callable[..., Any], tuple[Any, ...]]]


@dataclasses.dataclass(frozen=True)
class Workload:
    """`build(**sizes[size])` gives (fn, args). `grad` runs the calls with grad mode on
    (training steps); `mode` is the torch.compile mode of the compiled variants.
    `compile_model`: the compiled variants compile the model the function calls
    (`fn.model_slot[0]`, the zoo's way: `torch.compile(model)` as users write it) instead of
    the function. `tolerances` overrides `tolerance` on a device or at a size (the zoo's bf16
    on CUDA)."""

    name: str
    title: str
    what: str
    build: Builder
    sizes: dict[str, dict[str, Any]]
    tolerance: dict[str, float] = dataclasses.field(default_factory=dict)
    grad: bool = False
    mode: str | None = None
    compile_model: bool = False
    tolerances: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    def tolerance_at(self, size: str, device: str | None = None) -> dict[str, float]:
        """The check's tolerance: `tolerances` by device, then by size, else `tolerance`."""
        return self.tolerances.get(device or "", self.tolerances.get(size, self.tolerance))

    @property
    def label(self) -> str:
        return self.name if self.name == self.title else f"{self.name} {self.title}"

    def instantiate(self, size: str = "full", device: str | None = None
                    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """A fresh (fn, args), the same numbers every time (seeded): two instances can run
        side by side, one eagerly and one compiled, even when the function mutates state.
        `device` is for builders that take one (the zoo's); the seeds build on the CPU."""
        torch.manual_seed(SEED)
        options = dict(self.sizes[size])
        if device is not None:
            options["device"] = device
        with torch.no_grad():
            fn, args = self.build(**options)
        return fn, tuple(args)


def gelu_ish(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(0.8 * (x + 0.04 * x**3)))


def gelu_chain20(x: torch.Tensor) -> torch.Tensor:
    for _ in range(20):
        x = F.gelu(x * 1.01 + 0.01)
    return x


def softmax_last(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def layer_norm_last(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, weight.shape, weight, bias)


def build_elementwise(fn: Callable[..., Any]) -> Builder:
    return lambda rows, cols: (fn, (torch.randn(rows, cols),))


def build_layer_norm(rows: int, cols: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return layer_norm_last, (torch.randn(rows, cols), torch.randn(cols), torch.randn(cols))


def build_mlp3(batch: int, width: int, hidden: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    model = torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.SiLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.SiLU(),
        torch.nn.Linear(hidden, width)).eval()
    return model, (torch.randn(batch, width),)


def branchy(x: torch.Tensor) -> torch.Tensor:
    """S6: a branch on a tensor's value, one graph break."""
    x = x * 2
    if x.sum() > 0:
        return x + 1
    return x - 1


def branchless(x: torch.Tensor) -> torch.Tensor:
    """S6 written without the break (torch.where): the cost of the break is the difference."""
    x = x * 2
    return torch.where(x.sum() > 0, x + 1, x - 1)


class PrintingMLP(torch.nn.Module):
    """An MLP whose forward prints once: one graph break per call."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.first = torch.nn.Linear(width, hidden)
        self.second = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.first(x))
        print("hidden", tuple(h.shape))
        return self.second(h)


def build_printing_mlp(batch: int, width: int, hidden: int
                       ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return PrintingMLP(width, hidden).eval(), (torch.randn(batch, width),)


class GeluIsh(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_ish(x)


def build_s3_forward(batch: int, width: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """S3's model (4 Linear layers with gelu_ish between), forward only."""
    layers: list[torch.nn.Module] = []
    for position in range(4):
        layers.append(torch.nn.Linear(width, width))
        if position < 3:
            layers.append(GeluIsh())
    return torch.nn.Sequential(*layers), (torch.randn(batch, width),)


def build_s3_step(batch: int, width: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """S3: one SGD training step of S3's model on `.sum()` of its output. The step calls the
    model through `model_slot[0]`, so a variant can compile the model alone (torch.compile's
    usual use) while `ember` compiles the whole step."""
    model, (x,) = build_s3_forward(batch, width)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    model_slot = [model]

    def train_step(x: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = model_slot[0](x).sum()
        loss.backward()
        optimizer.step()
        return loss

    train_step.model_slot = model_slot
    return train_step, (x,)


def build_deep_thin(batch: int, width: int, depth: int
                    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """S4: `depth` x (Linear(width, width), Tanh), eval (run under no_grad)."""
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(batch, width),)


class SmallModel(torch.nn.Module):
    """A user's model as `model = ember.compile(MyModel()); model(x)` compiles it: a class of
    its own, submodules, a residual, a config attribute the forward reads, Dropout (reads
    `training`)."""

    def __init__(self, width: int, hidden: int, blocks: int = 2):
        super().__init__()
        self.embed = torch.nn.Linear(width, hidden)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
            torch.nn.Dropout(0.1)) for _ in range(blocks))
        self.head = torch.nn.Linear(hidden, width)
        self.residual_scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + self.residual_scale * block(h)
        return self.head(h)


def build_small_model(batch: int, width: int, hidden: int, train: bool = False
                      ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    model = SmallModel(width, hidden)
    if train:  # (dropout off, so that its output is eager's: `training` stays True)
        for block in model.blocks:
            block[3].p = 0.0
    return model.train(train), (torch.randn(batch, width),)


def one_op(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _square(full: int, quick: int, tiny: int) -> dict[str, dict[str, Any]]:
    return {"full": dict(rows=full, cols=full), "quick": dict(rows=quick, cols=quick),
            "tiny": dict(rows=tiny, cols=tiny)}


# The seed workloads, in the order the report lists them (S3's training step comes with the
# training issue; on the CPU, mode="reduce-overhead" is the default mode: no CUDA graphs).
WORKLOADS: tuple[Workload, ...] = (
    Workload("S1", "gelu_ish", "0.5*x*(1+tanh(0.8*(x+0.04*x**3)))", build_elementwise(gelu_ish),
             _square(4000, 1000, 64), dict(rtol=2e-5, atol=2e-5)),
    Workload("S2", "gelu_chain20", "20x gelu(x*1.01+0.01), erf gelu",
             build_elementwise(gelu_chain20), _square(4096, 1024, 64), dict(rtol=1e-4, atol=1e-4)),
    Workload("softmax", "softmax", "softmax(x, dim=-1)", build_elementwise(softmax_last),
             _square(4096, 1024, 64), dict(rtol=2e-5, atol=1e-6)),
    Workload("layer_norm", "layer_norm", "layer_norm over the last dim, with weight and bias",
             build_layer_norm, _square(4096, 1024, 64), dict(rtol=1e-4, atol=1e-4)),
    Workload("S3", "mlp_train_step", "4x Linear(1024,1024) with gelu_ish between; SGD step on "
             ".sum().backward(); x 512x1024", build_s3_step,
             {"full": dict(batch=512, width=1024), "quick": dict(batch=128, width=256),
              "tiny": dict(batch=4, width=32)}, dict(rtol=1e-4, atol=1e-2), grad=True),
    Workload("S4", "deep_thin_fwd", "60x (Linear(256,256), Tanh), eval, no_grad, x 64x256",
             build_deep_thin, {"full": dict(batch=64, width=256, depth=60),
                               "quick": dict(batch=64, width=256, depth=60),
                               "tiny": dict(batch=4, width=32, depth=6)},
             dict(rtol=1e-4, atol=1e-5)),
    Workload("S5", "mlp3_b16_fwd", "Linear width->hidden->hidden->width with SiLU between "
             "(1024 and 4096 at full size), eval, no_grad",
             build_mlp3, {"full": dict(batch=16, width=1024, hidden=4096),
                          "quick": dict(batch=16, width=256, hidden=1024),
                          "tiny": dict(batch=4, width=32, hidden=64)},
             dict(rtol=1e-4, atol=1e-5)),
    Workload("S6", "branchy", "x=x*2; if x.sum()>0: return x+1; return x-1 (one graph break)",
             build_elementwise(branchy), _square(4000, 1000, 64), dict(rtol=1e-5, atol=1e-5)),
    Workload("S6-where", "branchless", "S6 with torch.where instead of the branch (no break)",
             build_elementwise(branchless), _square(4000, 1000, 64),
             dict(rtol=1e-5, atol=1e-5)),
    Workload("mlp-print", "printing_mlp", "Linear-GELU-Linear whose forward prints once "
             "(one graph break), eval, no_grad", build_printing_mlp,
             {"full": dict(batch=64, width=1024, hidden=4096),
              "quick": dict(batch=64, width=256, hidden=1024),
              "tiny": dict(batch=4, width=32, hidden=64)}, dict(rtol=1e-4, atol=1e-5)),
    Workload("S3-forward", "mlp4_forward", "S3's model: 4x Linear(1024,1024) with gelu_ish "
             "between, X 512x1024, forward under no_grad", build_s3_forward,
             {"full": dict(batch=512, width=1024), "quick": dict(batch=128, width=256),
              "tiny": dict(batch=4, width=32)}, dict(rtol=1e-4, atol=1e-4)),
    Workload("overhead", "one_op", "x + 1 on 8 elements: per-call overhead over the op",
             lambda n: (one_op, (torch.randn(n),)),
             {"full": dict(n=8), "quick": dict(n=8), "tiny": dict(n=8)},
             dict(rtol=0, atol=0)),
)


# Not seeds: a user's model class compiled whole (what the warm-start bench measures for
# modules, ember/bench/warm_start.py; find() and resolve() know them by name too)
MODULE_WORKLOADS: tuple[Workload, ...] = (
    Workload("module", "small_model", "a model class of the user's (Linear, 2x LayerNorm-Linear-"
             "GELU-Dropout blocks with a scaled residual, Linear), ember.compile(model), eval, "
             "no_grad", build_small_model,
             {"full": dict(batch=64, width=512, hidden=2048),
              "quick": dict(batch=32, width=128, hidden=512),
              "tiny": dict(batch=4, width=16, hidden=32)}, dict(rtol=1e-4, atol=1e-5)),
    Workload("module-train", "small_model_train", "the same model in training mode (its "
             "first call compiles the forward and the backward)",
             lambda **sizes: build_small_model(**sizes, train=True),
             {"full": dict(batch=64, width=512, hidden=2048),
              "quick": dict(batch=32, width=128, hidden=512),
              "tiny": dict(batch=4, width=16, hidden=32)}, dict(rtol=1e-4, atol=1e-4),
             grad=True),
)


def find(name: str) -> Workload | None:
    """A seed workload, a module workload or a zoo workload (`gpt2-infer`) by name or
    title."""
    from ember.bench import zoo

    for workload in (*WORKLOADS, *MODULE_WORKLOADS, *zoo.workloads()):
        if name.lower() in (workload.name.lower(), workload.title.lower()):
            return workload
    return None


def resolve(spec: str) -> Workload:
    """A workload by name (`S1`, `gelu_ish`, case-insensitive) or user code: `file.py:builder`
    or `package.module:builder`, where `builder()` (or `builder(size=...)` when it takes a
    `size` argument) returns (fn or module, args)."""
    found = find(spec)
    if found is not None:
        return found
    if ":" not in spec:
        known = ", ".join(w.name for w in WORKLOADS)
        raise ValueError(f"unknown workload {spec!r}: use one of {known}, a zoo workload "
                         f"(gpt2-infer, ...: --models), or file.py:builder")
    location, _, attribute = spec.rpartition(":")
    builder = getattr(_load_module(location), attribute, None)
    if not callable(builder):
        raise ValueError(f"{location} has no function {attribute!r}")
    takes_size = "size" in inspect.signature(builder).parameters
    sizes = {size: ({"size": size} if takes_size else {}) for size in SIZES}
    return Workload(spec, spec, f"{attribute}() from {location}", builder, sizes)


def _load_module(location: str) -> Any:
    if not location.endswith(".py"):
        return importlib.import_module(location)
    path = Path(location).resolve()
    if not path.exists():
        raise ValueError(f"no such file: {location}")
    # Like running the file as a script: its own folder is importable.
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"ember_bench_user_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def describe(fn: Any, args: tuple[Any, ...]) -> str:
    """A short line on what is being run: `x 4000x4000 float32` or
    `Sequential 25.2M params; x 16x1024 float32`."""
    parts = []
    model = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "model", None)
    if isinstance(model, torch.nn.Module):  # (a zoo step names the model it calls)
        count = sum(p.numel() for p in model.parameters())
        parts.append(f"{type(model).__name__} " + (f"{count / 1e6:.1f}M" if count >= 1e5 else
                                                    f"{count:,}") + " params")
    if isinstance(fn, torch.nn.Module):
        names = list(inspect.signature(fn.forward).parameters)
    else:
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = []
    shown = []
    for position, value in enumerate(args):
        name = names[position] if position < len(names) else f"arg{position}"
        if isinstance(value, torch.Tensor):
            shape = "x".join(str(d) for d in value.shape) or "scalar"
            dtype = str(value.dtype).removeprefix("torch.")
            shown.append(f"{name} {shape} {dtype}")
        else:
            shown.append(f"{name} {type(value).__name__}")
    if shown:
        parts.append(", ".join(shown))
    return "; ".join(parts)
