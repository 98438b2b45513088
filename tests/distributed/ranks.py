"""What each rank of the distributed tests runs (a module of its own: torch.multiprocessing's
spawned processes import their function by name). Every rank trains the same models under
eager DDP/FSDP and under ember, on its own data, and saves what the parent compares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

STEPS = 10


class Block(torch.nn.Module):
    """A small transformer block: attention by matmul and softmax, layer norms, GELU MLP,
    residuals."""

    def __init__(self, width: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.project = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-1, -2) / (width // self.heads) ** 0.5, dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(batch, length, width)
        x = x + self.project(attended)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def build(name: str) -> tuple[torch.nn.Module, tuple[int, ...], tuple[int, ...]]:
    """A model, its input's shape and its target's shape (the same weights on every rank)."""
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        return model, (8, 12), (8, 4)
    return torch.nn.Sequential(Block(), Block()), (2, 6, 16), (2, 6, 16)


def wrap(model: torch.nn.Module, how: str) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ember

    if how in ("ddp", "step(ddp)"):  # (step(...): ember compiles the whole training step)
        return DDP(model)
    if how == "ddp(ember)":
        return DDP(ember.compile(model))
    if how == "ember(ddp)":
        return ember.compile(DDP(model))
    # FSDP2: each Linear (the MLP) or each block sharded, then the root
    parts = [m for m in model if isinstance(m, (torch.nn.Linear, Block))]
    for part in parts:
        fully_shard(part)
    fully_shard(model)
    if how == "fsdp(ember)":  # each sharded part's forward compiled, FSDP's hooks around it
        for index, part in enumerate(model):
            if part in parts:
                model[index] = ember.compile(part)
    if how == "ember(fsdp)":  # the sharded root compiled: ember compiles each part on its own
        return ember.compile(model)
    return model


def train(name: str, how: str, rank: int, device: torch.device) -> dict[str, Any]:
    import ember

    model, x_shape, y_shape = build(name)
    model = model.to(device)
    net = wrap(model, how.replace("step(fsdp)", "fsdp"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    run = ember.compile(step) if how.startswith("step") else step
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(x_shape, generator=generator), torch.randn(y_shape, generator=generator)
        losses.append(run(x.to(device), y.to(device)).detach().cpu())
    params = {}
    for path, param in model.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        params[path.replace("_orig_mod.", "").replace("module.", "")] = full.detach().cpu()
    return dict(losses=torch.stack(losses), params=params, graphs=_graphs(net, model))


def _graphs(net: torch.nn.Module, model: torch.nn.Module) -> int:
    """How many graphs ember compiled for this model (0: none, it ran eagerly)."""
    wrapped = getattr(net, "_wrapped", None)  # (ember.compile(DDP): the model inside)
    modules = [*net.modules(), *model.modules()] + ([wrapped] if wrapped is not None else [])
    # (modules whose calls ember routed to a compiled version: a DDP's model, FSDP parts)
    modules += [m.__dict__["_compiled_call_impl"].__self__ for m in modules
                if m.__dict__.get("_compiled_call_impl") is not None]
    compiled = {id(c): c for c in (getattr(m, "_compiled_forward", None) for m in modules)
                if c is not None}
    return sum(record.graphs for c in compiled.values() for record in c.records)


def run(rank: int, world: int, init: str, out: str, cases: list[tuple[str, str]],
        backend: str = "gloo") -> None:
    """gloo: CPU tensors; nccl: one GPU per rank."""
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        results = {f"{name} {how}": train(name, how, rank, device) for name, how in cases}
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

