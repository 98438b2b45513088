"""A graph's convolutions run once on stand-ins while its kernels compile.

A library's first call of a convolution of a new geometry pays for choosing and loading the
code that runs it: cuDNN's engine heuristics, its kernels loaded or compiled at run time,
oneDNN's primitive built on the CPU. Eager's first run pays that for eager's layouts only;
ember gives some convolutions other layouts (passes/convolution_layout.py) and a training
graph's backward calls its convolutions' gradients, so the graph's first compiled run paid
the rest: MobileNetV3's bf16 inference on an H100, 5.2 s in its first compiled run against
about 5 ms for the runs after (2026-12-06, `notes/device-runs.md` call 119), after a first call
that had returned at eager's pace — a cost that came after what the benchmark measured as its
first call.

Where a graph's first calls run eagerly while its kernels compile (EMBER_EAGER_FIRST), each
distinct convolution of its plan is called once on a thread of its own with operands of the
shapes, strides and dtypes the wrapper will pass (zeros, on the thread's current stream: the
memory they took serves the graph's own runs after), and the graph's compiled form waits for
that as it waits for its kernels: the calls meanwhile still run eagerly. Torch's convolution
entry points release the interpreter lock, and cuDNN's plans are cached process-wide, so the
graph's first compiled run finds them made. Nothing the caller has is read or written; a
call whose stand-ins would take more than an eighth of the device's free memory is left.
EMBER_WARM_LIBRARY=0 turns it off. Not on the CPU: there the stand-in calls compute as the real
ones do, on the cores the eager calls use (ResNet-50's full-size inference: 1.9 s of them, its
first compiled call no quicker).
"""

from __future__ import annotations

import concurrent.futures
import math
import time

import torch

from ember import config, logs
from ember.ir.library import fill
from ember.schedule.plan import LibraryCall, Plan

# (one thread: graphs that compile together warm their convolutions in turn)
_thread = concurrent.futures.ThreadPoolExecutor(1, "ember-library-warmup")
_pending: set[concurrent.futures.Future] = set()


def warmed(call: LibraryCall) -> bool:
    """Is this a call whose first use of a geometry is costly (a convolution, forward or
    backward, any dimension, transposed or not)?"""
    return "convolution" in str(call.node.attrs.get("target", ""))


def start(plan: Plan, device: torch.device, label: str) -> concurrent.futures.Future | None:
    """Start warming `plan`'s convolutions on CUDA (None where it has none, or where turned
    off)."""
    calls = [step for step in plan.steps if isinstance(step, LibraryCall) and warmed(step)]
    if not calls or not config.settings.warm_library or device.type != "cuda":
        return None  # (on the CPU the calls would compute: 1.9 s of ResNet-50's, no gain)
    future = _thread.submit(_warm, calls, device, label)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return future


def settle() -> None:
    """Wait for the warm-ups under way (a CUDA graph's recording must not meet another
    thread's launches and allocations: runtime/cudagraphs)."""
    concurrent.futures.wait(list(_pending))


def _warm(calls: list[LibraryCall], device: torch.device, label: str) -> None:
    """Each distinct call once; never raises (a call that fails here is the run's to meet)."""
    started = time.perf_counter()
    done: set[tuple] = set()
    failed = skipped = 0
    try:
        with torch.no_grad():
            for call in calls:
                operands = _operands(call)
                if operands is None:
                    continue
                key = (str(call.node.attrs["target"]), tuple(operands),
                       repr(call.node.attrs["args"]), repr(call.node.attrs["kwargs"]))
                if key in done:
                    continue
                done.add(key)
                if not _room_for(operands, device):
                    skipped += 1
                    continue
                try:
                    tensors = [_stand_in(shape, strides, dtype, device)
                               for shape, strides, dtype in operands]
                    call.node.attrs["target"](*fill(call.node.attrs["args"], tensors),
                                              **fill(call.node.attrs["kwargs"], tensors))
                except Exception:  # noqa: BLE001 (the graph's own run says what fails)
                    failed += 1
    except Exception as error:  # noqa: BLE001
        logs.channel("perf").info("%s: warming its convolutions stopped: %s", label, error)
        return
    logs.channel("perf").info(
        "%s: %d convolutions run once on stand-ins in %.1f ms, beside its kernels' compile%s",
        label, len(done) - skipped, (time.perf_counter() - started) * 1e3,
        "".join(f" ({n} {what})" for n, what in ((failed, "failed"),
                                                 (skipped, "left: too large")) if n))


# (the stand-ins' share of the device's free memory: the eager calls meanwhile need theirs)
ROOM = 8


def _room_for(operands: list[tuple], device: torch.device) -> bool:
    """Is there room for these stand-ins beside what the eager calls meanwhile allocate (at
    most an eighth of the device's free memory)?"""
    if device.type != "cuda":
        return True
    needed = sum(_span(shape, strides) * dtype.itemsize for shape, strides, dtype in operands)
    free, _ = torch.cuda.mem_get_info(device)
    return needed * ROOM <= free


def _operands(call: LibraryCall) -> list[tuple] | None:
    """(shape, strides, dtype) of each operand as the wrapper passes it (a layout eager's
    composite gave it, where the node says so), or None where a size is symbolic."""
    layouts = call.node.attrs.get("operand_strides") or (None,) * len(call.inputs)
    found = []
    for buffer, strides in zip(call.inputs, layouts):
        strides = tuple(strides) if strides is not None and \
            len(strides) == len(buffer.shape) else tuple(buffer.strides)
        if not all(type(n) is int for n in (*buffer.shape, *strides)):
            return None
        found.append((tuple(buffer.shape), strides, buffer.dtype))
    return found


def _stand_in(shape: tuple, strides: tuple, dtype: torch.dtype, device: torch.device
              ) -> torch.Tensor:
    """Zeros laid out so (deterministic work, whatever the memory held; strides may overlap,
    as an expanded operand's)."""
    return torch.zeros(_span(shape, strides), dtype=dtype, device=device).as_strided(
        shape, strides)


def _span(shape: tuple, strides: tuple) -> int:
    """Elements a tensor of this shape and strides reaches (its last one's end)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if math.prod(shape) else 0
