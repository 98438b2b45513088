"""Plan → the Python function that runs one compiled graph.

The wrapper is generated source, so a call does only what this graph needs: allocate buffers
with precomputed shapes and strides, call each kernel with data pointers, call library ops,
free temporaries after their last use, write back mutated inputs, and return outputs (views of
inputs rebuilt with as_strided, exactly as eager returns them). Every constant it needs lives in
its namespace; nothing is looked up per call.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import torch

from ember import config, torch_internals
from ember.codegen.c import KernelSource
from ember.codegen.triton_sizes import INT32_SAFE, index_reach
from ember.ir.graph import IRError
from ember.ir.library import Slot, returns_views
from ember.ir.ops import Op
from ember.ir.sizes import Size, any_symbolic
from ember.lower.tracer import OutputSpec
from ember.passes.convolution_calls import ConvolutionCall, convolution_call
from ember.runtime import memory
from ember.runtime.memory import empty_cpu
from ember.runtime.switches import Switched
from ember.runtime.triton_launch import DeviceLaunch, PendingLaunch
from ember.runtime.wrappers import (  # noqa: F401  (re-exported: the wrapper's helpers)
    BuildNotKept,
    EmptyOn,
    KernelIndexError,
    LayoutMismatch,
    WrapperSource,
    raise_index_error,
    relaid,
    same_layout,
    shares_memory,
)
from ember.schedule.layout import lies_as, row_major
from ember.schedule.plan import Buffer, Copy, Kernel, LibraryCall, Plan


def _relaid_operands(inputs: list, operand_strides: tuple | None) -> list[tuple[int, tuple]]:
    """(position, eager's strides) of each library operand whose buffer lies otherwise."""
    return [(i, tuple(strides)) for i, (buffer, strides)
            in enumerate(zip(inputs, operand_strides or ()))
            if strides is not None and len(strides) == len(buffer.shape) and
            buffer.strides is not None and not lies_as(buffer, strides)]


def _cudnn_call(node: Any, inputs: list[Buffer], device: torch.device
                ) -> ConvolutionCall | None:
    """This library call as a 2-d convolution (no bias, not transposed, sizes known) that
    eager would hand to cuDNN, or None. Then the wrapper calls cuDNN's entry point as eager's
    dispatch does (torch_internals.cudnn_convolution), without that dispatch's host time."""
    call = convolution_call(node) if device.type == "cuda" else None
    if call is None or call.bias is not None or call.transposed or call.x.ndim != 4:
        return None
    layouts = node.attrs.get("operand_strides") or (None,) * len(inputs)
    operands = []
    for slot in node.attrs["args"][:2]:
        buffer = inputs[slot.index]
        strides = tuple(layouts[slot.index] or buffer.strides)
        if not all(type(n) is int for n in (*buffer.shape, *strides)):
            return None
        operands.append((tuple(buffer.shape), strides, buffer.dtype))
    chosen = _eager_calls_cudnn(*operands, tuple(call.stride), tuple(call.padding),
                                tuple(call.dilation), call.groups, device,
                                torch.backends.cudnn.enabled)
    return call if chosen else None


@functools.cache
def _eager_calls_cudnn(x: tuple, weight: tuple, stride: tuple, padding: tuple,
                       dilation: tuple, groups: int, device: torch.device, _enabled: bool
                       ) -> bool:
    """torch's choice for operands of these (shape, strides, dtype), asked once per geometry
    (every wrapper a graph writes asks again, and a network repeats its convolutions);
    `_enabled` (cuDNN switched on) keys the answer too."""
    stand_ins = [torch.empty_strided(shape, strides, dtype=dtype, device=device)
                 for shape, strides, dtype in (x, weight)]
    return torch_internals.convolution_backend(
        *stand_ins, list(stride), list(padding), list(dilation), groups) == "Cudnn"


class _Writer:
    def __init__(self, plan: Plan, device: torch.device):
        self.plan = plan
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = {
            "empty_strided": torch.empty_strided, "empty_cpu": empty_cpu, "device": device,
            "view": torch_internals.plain_view(),
            "raise_index_error": raise_index_error, "LayoutMismatch": LayoutMismatch,
            "same_layout": same_layout, "shares_memory": shares_memory, "relaid": relaid,
        }
        self.constants = 0
        self.device = device
        # the buffers the wrapper hands out as tensors (library calls' operands, copies, its
        # results); kernels take only their data pointers
        self.as_tensors: set[Buffer] = set(plan.outputs)
        for step in plan.steps:
            if isinstance(step, LibraryCall):
                self.as_tensors.update(step.inputs)
            elif isinstance(step, Copy):
                self.as_tensors.update((step.source, step.target))
        self.plain_empty = torch_internals.plain_empty(device)
        # buffers whose tensor has another buffer's shape (the memory is all kernels need)
        self.misshapen: set[Buffer] = set()

    def constant(self, value: Any, hint: str = "k") -> str:
        if value is None or isinstance(value, (bool, int, str, Size)):
            return repr(value)  # (a Size's repr is its Python expression over s0, s1, ...)
        if isinstance(value, (list, tuple)) and any_symbolic(value) and \
                all(isinstance(v, (int, Size)) and not isinstance(v, bool) for v in value):
            text = ", ".join(map(repr, value))
            return f"[{text}]" if isinstance(value, list) else f"({text}{',' * (len(value) == 1)})"
        if isinstance(value, float) and value == value and value not in (float("inf"),
                                                                          float("-inf")):
            return repr(value)
        if isinstance(value, (list, tuple)) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            return repr(list(value) if isinstance(value, list) else tuple(value))
        name = f"{hint}{self.constants}"
        self.constants += 1
        self.namespace[name] = value
        return name

    def named(self, value: Any, hint: str) -> str:
        """`value` by a name of the namespace, whatever it is (never written into the text:
        a value this process alone knows, such as a loaded kernel's handle)."""
        name = f"{hint}{self.constants}"
        self.constants += 1
        self.namespace[name] = value
        return name

    def dtype(self, dtype: torch.dtype) -> str:
        name = str(dtype).replace("torch.", "")
        self.namespace[name] = dtype
        return name

    def allocate(self, buffer: Buffer) -> None:
        if self.device.type == "cpu" and isinstance(buffer.nbytes, Size) and \
                self.plain_empty is not None and buffer.nbytes.bounds()[1] >= memory.MIN_BYTES:
            # (large or not is known per call: the huge-page allocator only for large ones)
            self.namespace["MIN_BYTES"] = memory.MIN_BYTES
            self.lines.append(f"{buffer.name} = (empty_cpu if {buffer.nbytes!r} >= MIN_BYTES "
                              f"else empty)({buffer.shape!r}, {buffer.strides!r}, "
                              f"{self.dtype(buffer.dtype)})")
            return
        largest = buffer.nbytes.bounds()[1] if isinstance(buffer.nbytes, Size) else buffer.nbytes
        if self.device.type == "cpu" and largest >= memory.MIN_BYTES:
            # large CPU buffers ask for huge pages (see ember/runtime/memory.py)
            self.lines.append(f"{buffer.name} = empty_cpu({buffer.shape!r}, {buffer.strides!r}, "
                              f"{self.dtype(buffer.dtype)})")
            return
        self.lines.append(self.empty(buffer.name, buffer.shape, buffer.strides, buffer.dtype))

    def empty(self, name: str, shape: tuple[int, ...], strides: tuple[int, ...],
              dtype: torch.dtype) -> str:
        """The line that allocates `name` uninitialized on the graph's device."""
        if self.plain_empty is not None:
            return f"{name} = empty({shape!r}, {strides!r}, {self.dtype(dtype)})"
        return (f"{name} = empty_strided({shape!r}, {strides!r}, dtype={self.dtype(dtype)}, "
                f"device=device)")

    def empty_prologue(self) -> list[str]:
        """Binds `empty` for allocate: torch's allocation without the dispatcher, which on
        CUDA allocates on the current device — when that is not the graph's, the usual way."""
        if self.plain_empty is None:
            return []
        self.namespace["plain_empty"] = self.plain_empty
        if self.device.type != "cuda":
            return ["empty = plain_empty"]
        self.namespace["current_device"] = torch_internals.current_cuda_device
        self.namespace["empty_on_device"] = EmptyOn(self.device)
        return [f"empty = plain_empty if current_device() == {self.device.index or 0} "
                f"else empty_on_device"]

    def alias(self, buffer: Buffer) -> None:
        base = buffer.base.name
        if buffer.root().role == "input" or buffer in self.plan.outputs:
            # (a view of the caller's tensor, or one the caller gets: autograd's view, which
            # shares its base's version counter)
            self.lines.append(f"{buffer.name} = {base}.as_strided({buffer.shape!r}, "
                              f"{buffer.strides!r}, {base}.storage_offset() + {buffer.offset})")
        else:
            self.lines.append(f"{buffer.name} = view({base}, {buffer.shape!r}, "
                              f"{buffer.strides!r}, {buffer.offset})")

    def take_over(self, buffer: Buffer, old: Buffer) -> None:
        """`buffer` takes the memory of the dead temporary `old`."""
        if (old.shape, old.strides) == (buffer.shape, buffer.strides) and \
                old not in self.misshapen:
            self.lines.append(f"{buffer.name} = {old.name}")
        elif buffer not in self.as_tensors:
            self.lines.append(f"{buffer.name} = {old.name}")  # (kernels take its pointer)
            self.misshapen.add(buffer)
        elif buffer in self.plan.outputs:
            self.lines.append(f"{buffer.name} = {old.name}.as_strided({buffer.shape!r}, "
                              f"{buffer.strides!r})")
        else:
            self.lines.append(f"{buffer.name} = view({old.name}, {buffer.shape!r}, "
                              f"{buffer.strides!r}, 0)")


def symbol_reads(plan: Plan) -> list[str]:
    """A symbolic graph's sizes read from its inputs: one shape a tensor, unpacked where it
    gives several (`s0, _, s1 = in0.shape`: one torch.Size made, not one a symbol)."""
    by_input: dict[int, dict[int, list[str]]] = {}
    for symbol, (index, dim) in plan.graph.symbols.items():
        by_input.setdefault(index, {}).setdefault(dim, []).append(symbol)
    lines, again = [], []
    for index, dims in by_input.items():
        name = plan.inputs[index].name
        if len(dims) == 1:
            (dim, (symbol, *_)), = dims.items()
            lines.append(f"{symbol} = {name}.shape[{dim}]")
        else:
            targets = [dims[d][0] if d in dims else "_"
                       for d in range(len(plan.inputs[index].shape))]
            lines.append(f"{', '.join(targets)} = {name}.shape")
        again += [f"{other} = {symbols[0]}" for symbols in dims.values()
                  for other in symbols[1:]]
    return lines + again


def write_wrapper(plan: Plan, outputs: list[OutputSpec], output_tree: Any,
                  sources: dict[str, KernelSource], functions: dict[str, Any],
                  device: torch.device, checked: bool, check_alignment: bool = True,
                  check_reach: bool = False, rows: tuple[str, tuple] | None = None
                  ) -> WrapperSource:
    """Python source of `call(args)`: `functions` are the loaded kernels by name; `checked`
    adds the first call's check that library calls return eager's layouts; `check_alignment`
    (CUDA) sends inputs that are not 16-byte aligned to the `misaligned` build;
    `check_reach` (symbolic Triton kernels) sends calls whose offsets may pass int32 to the
    `wide` build; `rows` (symbolic Triton reductions): the call's key as a Python expression
    and the key of this build: calls of another key go to `rows(key, args)`
    (ember/codegen/triton_sizes.py)."""
    w = _Writer(plan, device)
    w.namespace.update(functions)
    lines = w.lines
    names = ", ".join(b.name for b in plan.inputs)
    if plan.inputs:
        lines.append(f"{names}{',' if len(plan.inputs) == 1 else ''} = args")
    lines.extend(symbol_reads(plan))
    if check_reach:
        reach = index_reach(plan, [s for s in sources.values() if not isinstance(s, KernelSource)])
        if isinstance(reach, Size) and reach.bounds()[1] >= INT32_SAFE:
            lines.append(f"if {reach!r} >= {INT32_SAFE}: return wide(args)")
    if rows is not None:
        text, key = rows
        lines.append(f"row_key = {text}")
        lines.append(f"if row_key != {key!r}: return rows(row_key, args)")
    if device.type == "cuda" and any(isinstance(f, (DeviceLaunch, PendingLaunch))
                                     for f in functions.values()):
        lines.extend(_cuda_prologue(plan, sources, w, check_alignment))
    if any(b.role in ("temp", "output") for b in plan.buffers) or \
            any(source.workspaces for source in sources.values()
                if not isinstance(source, KernelSource)):
        lines.extend(w.empty_prologue())
    made: set[Buffer] = set(plan.inputs)
    # buffers deleted (their memory freed or taken over): a step that uses one after that
    # would read memory another buffer holds, or a fresh allocation's garbage
    freed: set[Buffer] = set()

    def ready(buffer: Buffer) -> None:
        """Emit allocations and alias views a step needs before it runs."""
        if buffer is None or buffer in made:
            return
        alive((buffer,))
        if buffer.role == "alias":
            ready(buffer.base)
            w.alias(buffer)
        elif buffer in plan.reuse:
            old = plan.reuse[buffer]
            w.take_over(buffer, old)
            lines.append(f"del {old.name}")
            made.discard(old)
            freed.add(old)
        elif buffer.role in ("temp", "output"):
            w.allocate(buffer)
        else:
            return  # library results appear when their call returns
        made.add(buffer)

    def alive(buffers: Iterable[Buffer | None]) -> None:
        """Raise where a step uses a freed buffer (freed at an earlier step, or as this
        step's output took over its memory while the step still reads it)."""
        for buffer in buffers:
            if buffer in freed:
                raise IRError(f"{buffer.name} is used after it was freed: the plan's "
                              f"lifetimes are wrong")

    for position, step in enumerate(plan.steps):
        if isinstance(step, Kernel):
            source = sources[step.name]
            for buffer in source.arguments:
                ready(buffer)
            alive(source.arguments)
            positions = math.prod(n for d, n in enumerate(step.shape) if d not in step.axes)
            if positions == 0:
                continue  # (no position to compute: nothing to launch)
            launch = _launch(step.name, source, functions, w)
            if config.settings.profile and launch:
                launch = _labelled(f"ember {step.name}: {_kernel_summary(step)}", launch, w)
            if isinstance(positions, Size) and positions.bounds()[0] <= 0:
                # (a symbolic extent that may be empty: decided per call)
                launch = [f"if {positions!r} > 0:"] + ["    " + line for line in launch]
            lines.extend(launch)
        elif isinstance(step, LibraryCall):
            for buffer in step.inputs:
                ready(buffer)
            alive(step.inputs)
            node = step.node
            if checked and returns_views(node.attrs) and node.attrs.get("operand_strides"):
                # its result depends on how its operands lie in memory: as eager's must
                for buffer, strides in zip(step.inputs, node.attrs["operand_strides"]):
                    lines.append(f"if not same_layout({buffer.name}, {tuple(strides)!r}): "
                                 f"raise LayoutMismatch({buffer.name!r})")
            target = w.constant(node.attrs["target"], "op")
            slots = {i: b.name for i, b in enumerate(step.inputs)}
            if not returns_views(node.attrs):
                for i, strides in _relaid_operands(step.inputs, node.attrs.get("operand_strides")):
                    # (eager's composite made this operand contiguous, or otherwise laid it
                    # out anew, before the call: a kernel may rely on that layout)
                    slots[i] = f"relaid{position}_{i}"
                    lines.append(f"{slots[i]} = relaid({step.inputs[i].name}, {strides!r})")
            arguments = [_fill(value, slots, w) for value in node.attrs["args"]]
            arguments += [f"{key}={_fill(value, slots, w)}"
                          for key, value in node.attrs["kwargs"].items()]
            switched = node.attrs.get("switches")  # (a library call made under torch's
            # backend switches: eager's dispatch reads their flags, cuDNN's entry point not)
            call = _cudnn_call(node, step.inputs, w.device) if not switched else None
            if call is not None:
                target = w.constant(torch_internals.cudnn_convolution, "op")
                arguments = [*arguments[:2], repr(call.stride), repr(call.padding),
                             repr(call.dilation), repr(call.groups)]
            first = len(lines)
            if node.attrs["tuple_result"]:
                result = f"result{position}"
                lines.append(f"{result} = {target}({', '.join(arguments)})")
                for index, buffer in enumerate(step.outputs):
                    if buffer is not None:
                        lines.append(f"{buffer.name} = {result}[{index}]")
            else:
                lines.append(f"{step.outputs[0].name} = {target}({', '.join(arguments)})")
            if switched:
                lines[first:] = [f"with {w.constant(Switched(switched), 'switched')}:"] + \
                    ["    " + line for line in lines[first:]]
            if config.settings.profile:
                lines[first:] = _labelled(f"ember {_call_name(node.attrs['target'])}",
                                          lines[first:], w)
            operands = ", ".join(b.name for b in step.inputs)
            for buffer in step.outputs:
                if buffer is None:
                    continue
                made.add(buffer)
                if checked:  # (a size-1 dim's stride places nothing: any will do)
                    lines.append(f"if not same_layout({buffer.name}, {buffer.strides!r}): "
                                 f"raise LayoutMismatch({buffer.name!r})")
                    if operands and not returns_views(node.attrs):
                        lines.append(f"if shares_memory({buffer.name}, {operands}): raise "
                                     f"LayoutMismatch({buffer.name!r} + ' views an operand')")
        else:
            ready(step.source)
            alive((step.source, step.target))
            lines.append(f"{step.target.name}.copy_({step.source.name})")
        reused = set(plan.reuse.values())
        for buffer in plan.frees[position]:
            if buffer in made and buffer.role != "input" and buffer not in reused:
                lines.append(f"del {buffer.name}")
                made.discard(buffer)
                freed.add(buffer)
    for buffer in plan.outputs:
        ready(buffer)
    results = []
    for position, spec in enumerate(outputs):
        if spec.kind == "node":
            results.append(plan.outputs[spec.index].name)
        elif spec.kind == "input":
            results.append(plan.inputs[spec.index].name)
        elif spec.kind == "view":
            base = plan.outputs[spec.index].name if spec.of_output \
                else plan.inputs[spec.index].name
            if spec.dtype is None:
                start = "" if spec.from_storage_start else f"{base}.storage_offset() + "
                results.append(f"{base}.as_strided({spec.size!r}, {spec.stride!r}, "
                               f"{start}{spec.offset})")
            else:  # the base's memory read as another dtype
                symbols = ", ".join(f"{name!r}: {name}" for name in plan.graph.symbols)
                results.append(f"{w.constant(spec, 'spec')}.view_of({base}, {{{symbols}}})")
        elif spec.kind == "same":
            results.append(f"r{spec.index}")
        else:
            results.append(w.constant(spec.value))
        if any(s.kind == "same" and s.index == position for s in outputs):
            lines.append(f"r{position} = {results[-1]}")
            results[-1] = f"r{position}"
    joined = ", ".join(results)
    kind = getattr(output_tree, "type", None)
    if output_tree.is_leaf():
        lines.append(f"return {joined}")
    elif kind is tuple and all(c.is_leaf() for c in output_tree.children()):
        lines.append(f"return ({joined}{',' if len(results) == 1 else ''})")
    elif kind is list and all(c.is_leaf() for c in output_tree.children()):
        lines.append(f"return [{joined}]")
    else:
        w.namespace["output_tree"] = output_tree
        lines.append(f"return output_tree.unflatten([{joined}])")
    text = "def call(args):\n" + "\n".join("    " + line for line in lines) + "\n"
    return WrapperSource(text, w.namespace)


def _labelled(label: str, lines: list[str], w: _Writer) -> list[str]:
    """`lines` inside a torch.profiler label (EMBER_PROFILE=1)."""
    w.namespace["record_function"] = torch.profiler.record_function
    return [f"with record_function({label!r}):"] + ["    " + line for line in lines]


def _call_name(target: Any) -> str:
    """A library call's target as a profile names it: aten.mm.default, convolution_as_matmul."""
    if torch_internals.is_op_overload(target):
        return str(target)
    return getattr(target, "__qualname__", None) or str(target)


def _kernel_summary(step: Kernel, most: int = 6) -> str:
    """What a kernel computes, for a profile: its members' ops and its iteration space."""
    ops = [node.op.value for node in step.members]
    shown = ", ".join(ops[:most]) + (f", +{len(ops) - most}" if len(ops) > most else "")
    return f"{shown} {list(step.shape)}"


def _launch(name: str, source: Any, functions: dict[str, Any], w: _Writer) -> list[str]:
    """The lines that run one kernel: a C function on data pointers, a Triton kernel through
    its launcher on tensors (grid and metadata as constants), or an interpreted one."""
    if isinstance(source, KernelSource):
        pointers = ", ".join([f"{b.name}.data_ptr()" for b in source.arguments] + source.sizes)
        call = f"{name}({pointers})"
        return [f"if {call}: raise_index_error({name!r})"] if source.checks else [call]
    if source.grid[0] == 0:
        return []  # an empty iteration space: nothing to launch
    lines = []
    for space in source.workspaces:  # a split reduction's partial results
        lines.append(w.empty(space.name, space.shape, row_major(space.shape), space.dtype))
    for kernel in source.kernels:
        # (a symbolic graph's kernels take its sizes after the pointers, as ints)
        tensors = ", ".join([b.name for b in kernel.arguments] + kernel.sizes)
        function = functions[kernel.name]
        if isinstance(function, DeviceLaunch):
            # (the kernel's handle by name: it is this process's, and a warm start's text
            # must not hold it; the rest is the same in every process)
            launcher, handle, *fixed = function.prefix()
            gx, gy, gz = function.grid
            rest = ", ".join([w.named(handle, "function")] +
                             [w.constant(value, "meta") for value in fixed])
            lines.append(f"{w.constant(launcher, 'launch')}({gx}, {gy}, {gz}, stream, {rest}, "
                         f"{tensors})")
        elif isinstance(function, PendingLaunch):  # (a first run's, beside the compiles)
            gx, gy, gz = function.grid
            lines.append(f"{w.constant(function, 'pending')}({gx}, {gy}, {gz}, stream, "
                         f"{tensors})")
        elif any(isinstance(extent, str) for extent in kernel.grid):  # (interpreted)
            gx, gy, gz = kernel.grid
            lines.append(f"{kernel.name}.run(({gx}, {gy}, {gz}), {tensors})")
        else:
            lines.append(f"{kernel.name}({tensors})")
    if source.workspaces:
        lines.append("del " + ", ".join(space.name for space in source.workspaces))
    return lines


def _cuda_prologue(plan: Plan, sources: dict[str, Any], w: _Writer, check_alignment: bool
                   ) -> list[str]:
    """The current stream, and the check that inputs passed to kernels are 16-byte aligned
    as the kernels were compiled to assume (else the build without that promise runs)."""
    w.namespace["current_stream"] = torch_internals.current_raw_stream
    lines = [f"stream = current_stream({w.device.index or 0})"]
    used = {b.root() for source in sources.values() for b in source.arguments}
    inputs = [b for b in plan.inputs if b in used]
    if inputs and check_alignment:
        pointers = " | ".join(f"{b.name}.data_ptr()" for b in inputs)
        lines.append(f"if ({pointers}) & 15: return misaligned(args)")
    return lines


def _fill(value: Any, slots: dict[int, str], w: _Writer) -> str:
    if isinstance(value, Slot):
        return slots[value.index]
    if isinstance(value, list) and any(isinstance(v, Slot) for v in value):
        return "[" + ", ".join(_fill(v, slots, w) for v in value) + "]"
    if isinstance(value, tuple) and any(isinstance(v, Slot) for v in value):
        return "(" + ", ".join(_fill(v, slots, w) for v in value) + ",)"
    return w.constant(value)


def library_node_count(plan: Plan) -> int:
    return sum(1 for node in plan.graph.nodes if node.op is Op.LIBRARY)
