"""Fused optimizer steps: `opt.step()` of SGD, Adam and AdamW as one ember-compiled update of
every parameter of a group, instead of a dozen eager ops per parameter.

    ember.optim.step(opt)        # what a compiled train_step calls where it has opt.step()

The update is eager's single-tensor algorithm (torch/optim/{sgd,adam}.py) written over lists
of tensors and compiled by ember: fused into a few kernels, parameters, gradients and
optimizer state updated in place. Step-dependent numbers (learning rate, bias corrections) are
passed as one small float64 tensor per call, so a schedule of the learning rate, the momentum
or the betas (OneCycleLR cycles them) does not recompile.
Anything else — closures, hooks, amsgrad, capturable/differentiable/fused groups, sparse or
complex parameters, the first step (which creates the state) — runs the optimizer's own
step().
"""

from __future__ import annotations

from typing import Any

import torch

from ember.api import compile as ember_compile


def _sgd(params: list, grads: list, buffers: list, numbers: torch.Tensor, weight_decay: float,
         momentum: bool, nesterov: bool, maximize: bool) -> None:
    # numbers: [-lr, momentum, 1 - dampening]
    for param, grad, buffer in zip(params, grads, buffers):
        if maximize:
            grad = -grad
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum:
            buffer.mul_(numbers[1]).add_(grad * numbers[2])
            grad = grad + buffer * numbers[1] if nesterov else buffer
        param.add_(grad * numbers[0])


def _adam(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, numbers: torch.Tensor,
          eps: float, weight_decay: float, decoupled: bool, maximize: bool) -> None:
    # numbers: [step size (lr / bias correction 1), sqrt(bias correction 2), 1 - lr * wd,
    #           1 - beta1, beta2, 1 - beta2]
    for param, grad, exp_avg, exp_avg_sq in zip(params, grads, exp_avgs, exp_avg_sqs):
        if maximize:
            grad = -grad
        if weight_decay != 0:
            if decoupled:
                param.mul_(numbers[2])
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, numbers[3])
        exp_avg_sq.mul_(numbers[4]).add_(numbers[5] * grad * grad)
        denom = (exp_avg_sq.sqrt() / numbers[1]).add_(eps)
        param.sub_(exp_avg / denom * numbers[0])


_compiled: dict[str, Any] = {}


def _update(name: str) -> Any:
    if name not in _compiled:
        _compiled[name] = ember_compile({"sgd": _sgd, "adam": _adam}[name])
    return _compiled[name]


def step(optimizer: torch.optim.Optimizer, closure: Any = None) -> Any:
    """optimizer.step(closure), fused by ember where the optimizer and its state allow."""
    kind = _kind(optimizer)
    if kind is None or closure is not None or _hooked(optimizer):
        return optimizer.step(closure)
    groups = []
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse or p.is_complex() or not _has_state(optimizer, p, kind, group)
               or type(p) not in (torch.Tensor, torch.nn.Parameter)
               or type(p.grad) is not torch.Tensor
               for p in params):  # (tensor subclasses: FSDP's DTensor parameters, ...)
            return optimizer.step()  # (the first step makes the state)
        if kind == "adam" and len({float(optimizer.state[p]["step"]) for p in params}) > 1:
            # parameters of one group at different steps (a head trained every other call):
            # no shared bias correction. NOTE: decided for every group before any is updated,
            # since optimizer.step() updates them all.
            return optimizer.step()
        groups.append((group, params))
    with torch.no_grad():
        for group, params in groups:
            if params:
                _step_group(optimizer, kind, group, params)
    return None


def scheduled_step(wrapper: Any, closure: Any = None) -> Any:
    """`optimizer.step(closure)` where an LR scheduler replaced `optimizer.step` with `wrapper`
    (which notes that the step ran, for the scheduler's check of the calls' order)."""
    from ember import torch_internals

    optimizer = torch_internals.scheduler_wrapped_optimizer(wrapper)
    optimizer._opt_called = True
    return step(optimizer, closure)


def _kind(optimizer: torch.optim.Optimizer) -> str | None:
    defaults = optimizer.defaults
    if any(defaults.get(flag) for flag in ("differentiable", "capturable", "fused")):
        return None
    if type(optimizer) is torch.optim.SGD:
        return "sgd"
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and not defaults.get("amsgrad"):
        return "adam"
    return None


def _hooked(optimizer: torch.optim.Optimizer) -> bool:
    from torch.optim import optimizer as module

    return bool(getattr(optimizer, "_optimizer_step_pre_hooks", None)
                or getattr(optimizer, "_optimizer_step_post_hooks", None)
                or getattr(module, "_global_optimizer_pre_hooks", None)
                or getattr(module, "_global_optimizer_post_hooks", None))


def _has_state(optimizer: torch.optim.Optimizer, param: torch.Tensor, kind: str,
               group: dict) -> bool:
    """Does `param` (of `group`) have the state the fused update reads?"""
    state = optimizer.state.get(param) or {}
    if kind == "sgd":
        return not group["momentum"] or state.get("momentum_buffer") is not None
    return all(k in state for k in ("step", "exp_avg", "exp_avg_sq"))


_NUMBERS: dict[tuple, torch.Tensor] = {}
_NUMBERS_KEPT = 16


def _numbers(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """The update's step-dependent numbers as a float64 tensor on `device`. The same numbers
    (a constant learning rate) reuse one tensor; new ones reach a GPU by an asynchronous copy
    from pinned memory (torch.tensor(..., device="cuda") would wait for the GPU to finish the
    step's backward before the update could be queued)."""
    values = tuple(map(float, values))  # (a tensor learning rate too)
    key = (device, values)
    numbers = _NUMBERS.get(key)
    if numbers is None:
        cuda = device.type == "cuda"
        numbers = torch.tensor(values, dtype=torch.float64, pin_memory=cuda)
        numbers = numbers.to(device, non_blocking=True) if cuda else numbers
        if len(_NUMBERS) >= _NUMBERS_KEPT:
            del _NUMBERS[next(iter(_NUMBERS))]
        _NUMBERS[key] = numbers
    return numbers


def _step_group(optimizer: torch.optim.Optimizer, kind: str, group: dict,
                params: list[torch.Tensor]) -> None:
    grads = [p.grad for p in params]
    device = params[0].device
    if kind == "sgd":
        momentum = group["momentum"]
        buffers = [optimizer.state[p]["momentum_buffer"] if momentum else p for p in params]
        numbers = _numbers((-group["lr"], momentum, 1 - group["dampening"]), device)
        _update("sgd")(params, grads, buffers, numbers, group["weight_decay"], momentum != 0,
                       group["nesterov"], group["maximize"])
        return
    states = [optimizer.state[p] for p in params]
    steps = [s["step"] for s in states]
    for count in steps:  # (eager increments each parameter's step tensor too)
        count += 1
    count = float(steps[0])  # (the same for all: see step())
    beta1, beta2 = group["betas"]
    lr = group["lr"]
    decoupled = group.get("decoupled_weight_decay", type(optimizer) is torch.optim.AdamW)
    numbers = _numbers((lr / (1 - beta1 ** count), (1 - beta2 ** count) ** 0.5,
                        1 - lr * group["weight_decay"], 1 - beta1, beta2, 1 - beta2), device)
    _update("adam")(params, grads, [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states], numbers, group["eps"],
                    group["weight_decay"], decoupled, group["maximize"])
