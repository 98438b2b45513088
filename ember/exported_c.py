"""An exported program as a C library: `program.save(path, format="c")` writes `<stem>.c`
(ember's kernels, the parameters as arrays, and a run function that follows the plan),
`<stem>.h` (the run function and each input's and output's shape) and `lib<stem>.so`, so
that a C program calls the model with no Python at all.

Takes a program whose graph is static, on the CPU, and made only of ember's C kernels,
matrix products (linear, mm, bmm, addmm, matmul: done here by a plain strided loop nest) and
the cats of passes/joined_cats (torch.cat into a buffer: done here by a strided copy of each
input into its slice); gives the files. It refuses, naming them, graphs with other library
calls, symbolic sizes, writes to inputs, or results that are inputs or views of them. It must
not change how the Python program runs: it only reads the program's plan.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import torch

from ember import config
from ember.codegen.c import write_source
from ember.exported_signature import render_structure
from ember.ir.library import Slot
from ember.ir.sizes import any_symbolic
from ember.passes.joined_cats import JoinedCall
from ember.runtime import build
from ember.schedule.plan import Buffer, Copy, Kernel, LibraryCall, Plan

C_TYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
           torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
           torch.uint8: "uint8_t", torch.bool: "bool"}
MATRIX_PRODUCTS = {"linear", "mm", "bmm", "addmm", "matmul"}


class CExportError(RuntimeError):
    """A program that cannot be written as a C library, and why."""


def save(program: Any, path: Path) -> Path:
    """Write `<stem>.c`, `<stem>.h` and `lib<stem>.so` beside `path`; the library's path."""
    stem = re.sub(r"\W", "_", path.name.split(".")[0]) or "model"
    folder = path.parent
    plan = _plan(program)
    source, header = write_library(program, plan, stem)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.h").write_text(header)
    (folder / f"{stem}.c").write_text(source)
    library = folder / f"lib{stem}.so"
    command = [build.find_compiler(), *config.settings.cflags, "-shared", "-fPIC",
               "-fvisibility=hidden", "-o", str(library), str(folder / f"{stem}.c"),
               "-lmvec", "-lm"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise CExportError(f"the C compiler failed on {folder / f'{stem}.c'}:\n"
                           f"{done.stderr[-3000:]}")
    return library


def _plan(program: Any) -> Plan:
    plan = getattr(program.compiled, "plan", None)
    if plan is None:
        raise CExportError("save(format='c'): this program carries no plan (a loaded "
                           "program); save it as C where it was exported")
    if plan.graph.device.type != "cpu":
        raise CExportError("save(format='c'): the program runs on "
                           f"{plan.graph.device}; C libraries are made of CPU graphs")
    if plan.graph.symbols or any(any_symbolic(b.shape) for b in plan.buffers):
        raise CExportError("save(format='c'): the program has dynamic sizes; C libraries are "
                           "made of static graphs for now (export without dynamic_shapes)")
    others = sorted({_library_name(step) for step in plan.steps
                     if isinstance(step, LibraryCall) and not _written_here(step)})
    if others:
        raise CExportError(f"save(format='c'): the graph calls {', '.join(others)} from "
                           f"torch's library; a C library holds only ember's kernels, "
                           f"matrix products ({', '.join(sorted(MATRIX_PRODUCTS))}) and the "
                           f"cats of ember's joined_cats pass")
    if any(isinstance(step, Copy) for step in plan.steps) or program.compiled.written_inputs:
        raise CExportError("save(format='c'): the graph writes its inputs in place")
    unsupported = sorted({str(b.dtype) for b in plan.buffers if b.dtype not in C_TYPES})
    if unsupported:
        raise CExportError(f"save(format='c'): tensors of {', '.join(unsupported)} have no C "
                           f"type here")
    returned = re.findall(r"^    return \(?(.*?),?\)?$", program.compiled.wrapper_source,
                          re.MULTILINE)
    names = [b.name for b in plan.outputs]
    if not returned or [n.strip() for n in returned[-1].split(",") if n.strip()] != names or \
            len(set(names)) != len(names):
        raise CExportError("save(format='c'): the graph returns inputs, views of them or one "
                           "result twice; a C library's results are new arrays")
    for buffer in plan.outputs:
        if buffer.role not in ("output", "library") or buffer.base is not None or \
                list(buffer.strides) != _row_major(buffer.shape):
            raise CExportError(f"save(format='c'): result {buffer.name} is not a new "
                               f"row-major array")
    return plan


def _written_here(step: LibraryCall) -> bool:
    """Whether the C library does `step` itself: a matrix product, or a cat joined_cats made
    (not another library call of torch.cat)."""
    return _library_name(step) in MATRIX_PRODUCTS or \
        isinstance(step.node.attrs["target"], JoinedCall)


def _library_name(step: LibraryCall) -> str:
    target = step.node.attrs["target"]
    text = str(target) if str(target).startswith("aten.") else \
        getattr(target, "__name__", str(target))
    return text.removeprefix("aten.").removesuffix(".default")


def _row_major(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


GEMM = """
/* c[b, i, j] = bias[i, j] + sum_p a[b, i, p] * b[b, p, j], every operand strided (a bias
   per column has row stride 0) */
#define EMBER_GEMM(T, NAME) \\
static void NAME(int64_t batch, int64_t m, int64_t n, int64_t k, \\
                 const T* a, int64_t sab, int64_t sam, int64_t sak, \\
                 const T* b, int64_t sbb, int64_t sbk, int64_t sbn, \\
                 const T* bias, int64_t sbiasm, int64_t sbias, \\
                 T* c, int64_t scb, int64_t scm, int64_t scn) { \\
    _Pragma("omp parallel for collapse(2)") \\
    for (int64_t q = 0; q < batch; q++) { \\
        for (int64_t i = 0; i < m; i++) { \\
            T* row = c + q * scb + i * scm; \\
            for (int64_t j = 0; j < n; j++) \\
                row[j * scn] = bias ? bias[i * sbiasm + j * sbias] : (T)0; \\
            for (int64_t p = 0; p < k; p++) { \\
                T x = a[q * sab + i * sam + p * sak]; \\
                const T* col = b + q * sbb + p * sbk; \\
                for (int64_t j = 0; j < n; j++) row[j * scn] += x * col[j * sbn]; \\
            } \\
        } \\
    } \\
}
EMBER_GEMM(float, ember_gemm_float)
EMBER_GEMM(double, ember_gemm_double)
"""


class _Writer:
    def __init__(self, program: Any, plan: Plan, stem: str):
        self.program = program
        self.plan = plan
        self.stem = stem
        self.lines: list[str] = []
        self.pointer: dict[Buffer, str] = {}
        self.allocated: list[str] = []   # (declared first, NULL: `goto done` frees them)
        self.outputs: dict[Buffer, str] = {}

    def ready(self, buffer: Buffer | None) -> None:
        """Give `buffer` a pointer before a step uses it (as the Python wrapper allocates)."""
        if buffer is None or buffer in self.pointer:
            return
        if buffer.base is not None:
            self.ready(buffer.base)
            ctype = C_TYPES[buffer.dtype]
            self.pointer[buffer] = f"(({ctype}*){self.pointer[buffer.base]} + {buffer.offset})"
        elif buffer in self.plan.reuse:
            self.pointer[buffer] = self.pointer[self.plan.reuse[buffer]]
        elif buffer in self.outputs:  # (written where the caller wants it)
            self.pointer[buffer] = self.outputs[buffer]
        else:  # a temporary, or a library result
            name = f"t_{buffer.name}"
            size = max(64, -(-buffer.nbytes // 64) * 64)
            self.lines.append(f"    {name} = aligned_alloc(64, {size});")
            self.lines.append(f"    if (!{name}) {{ status = -1; goto done; }}")
            self.allocated.append(f"{C_TYPES[buffer.dtype]}* {name}")
            self.pointer[buffer] = name

    def write(self) -> tuple[str, str]:
        program, plan, stem = self.program, self.plan, self.stem
        signature = program.signature
        arguments, declarations, constants = [], [], []
        for index, buffer in enumerate(plan.inputs):
            kind, which = signature.graph_inputs[index]
            ctype = C_TYPES[buffer.dtype]
            if kind == "expression":
                raise CExportError(f"save(format='c'): a graph input computed in Python "
                                   f"({which}); C libraries take tensors only")
            if kind == "argument":
                name = _identifier(signature.inputs[which].name, "in")
                arguments.append(f"const {ctype}* {name}")
                declarations.append(f" *   {signature.inputs[which].describe()}"
                                    + (f" (parameter {name})" if name != signature.inputs[
                                        which].name else ""))
                self.pointer[buffer] = f"(({ctype}*){name})"
            else:
                name = _identifier(which, "c")
                constants.append(_array(f"c_{name}", program.constants[which]))
                self.pointer[buffer] = f"(({ctype}*)c_{name})"
        for index, buffer in enumerate(plan.outputs):
            ctype = C_TYPES[buffer.dtype]
            arguments.append(f"{ctype}* out{index}")
            declarations.append(f" *   out{index}: {str(buffer.dtype).replace('torch.', '')}"
                                f"{list(buffer.shape)} row-major (written)")
            self.outputs[buffer] = f"out{index}"
        kernels = {k.name: k for k in write_source(plan)[1]}
        for step in plan.steps:
            if isinstance(step, Kernel):
                source = kernels[step.name]
                for buffer in source.arguments:
                    self.ready(buffer)
                if math.prod(n for d, n in enumerate(step.shape) if d not in step.axes) == 0:
                    continue
                pointers = ", ".join(f"(void*){self.pointer[b]}" for b in source.arguments)
                self.lines.append(f"    if ({step.name}({pointers})) {{ status = 1; goto done; }}")
            else:
                for buffer in step.inputs:
                    self.ready(buffer)
                for buffer in step.outputs:
                    self.ready(buffer)
                if isinstance(step.node.attrs["target"], JoinedCall):
                    self.lines += self._cat(step)
                else:
                    self.lines.append(self._product(step))
        for index, buffer in enumerate(plan.outputs):
            self.ready(buffer)
            if self.pointer[buffer] != f"out{index}":
                self.lines.append(f"    memcpy(out{index}, {self.pointer[buffer]}, "
                                  f"{buffer.nbytes});")
        prototype = f"int {stem}_run({', '.join(arguments)})"
        kernel_source = write_source(plan)[0]
        body = ["    int status = 0;", *[f"    {name} = NULL;" for name in self.allocated],
                *self.lines, "done:"]
        body += [f"    free({name.split('* ')[1]});" for name in self.allocated]
        body.append("    return status;")
        header = "\n".join([
            f"/* {stem}.h: a model exported by ember (ember.export(...).save(path, "
            f"format=\"c\")).",
            " *",
            f" * {prototype}",
            " * runs the model once: 0 on success, 1 where an index was out of range, -1 where",
            " * memory ran out. Arguments (C arrays, row-major unless said):",
            *declarations,
            f" * The Python program's result, over these: {render_structure(signature.outputs)}",
            " *",
            f" * Build the library:  cc {' '.join(config.settings.cflags)} -shared -fPIC "
            f"-fvisibility=hidden -o lib{stem}.so {stem}.c -lmvec -lm",
            f" * Link a program:     cc main.c -L. -l{stem} -Wl,-rpath,'$ORIGIN' -o main",
            " */",
            f"#ifndef EMBER_{stem.upper()}_H", f"#define EMBER_{stem.upper()}_H",
            "#include <stdint.h>", "#include <stdbool.h>",
            f"__attribute__((visibility(\"default\"))) {prototype};",
            "#endif", ""])
        source = "\n".join([
            f"/* {stem}.c: generated by ember; see {stem}.h */",
            "#include <stdlib.h>", kernel_source, GEMM, f'#include "{stem}.h"', *constants,
            "", f"{prototype} {{", *body, "}", ""])
        return source, header

    def _product(self, step: LibraryCall) -> str:
        """One matrix product as a call of the strided loop nest."""
        name = _library_name(step)
        attrs = step.node.attrs
        operands = [step.inputs[v.index] if isinstance(v, Slot) else v for v in attrs["args"]]
        if any(v not in (1, 1.0) for k, v in attrs["kwargs"].items() if k in ("alpha", "beta")
               ) or set(attrs["kwargs"]) - {"alpha", "beta"}:
            raise CExportError(f"save(format='c'): {name} with arguments {attrs['kwargs']}")
        bias = None
        if name == "addmm":
            bias, a, b = operands[:3]
        elif name == "linear":
            a, b = operands[0], operands[1]
            bias = operands[2] if len(operands) > 2 else None
        else:
            a, b = operands[:2]
        result = step.outputs[0]
        if not all(isinstance(x, Buffer) for x in (a, b)):
            raise CExportError(f"save(format='c'): {name} of non-tensor operands")
        ctype = C_TYPES[result.dtype]
        if ctype not in ("float", "double"):
            raise CExportError(f"save(format='c'): a matrix product of {result.dtype}")
        if name == "linear":  # x[..., k] @ w[n, k]^T: leading dims as rows
            batch, (m, sam), sak = 1, _rows(a), a.strides[-1]
            n, sbn, sbk = b.shape[0], b.strides[0], b.strides[1]
            sab = sbb = 0
        elif len(a.shape) == 2 and len(b.shape) == 2:
            batch, sab, sbb = 1, 0, 0
            m, sam, sak = a.shape[0], a.strides[0], a.strides[1]
            n, sbk, sbn = b.shape[1], b.strides[0], b.strides[1]
        elif len(a.shape) == 3 and len(b.shape) == 3 and a.shape[0] == b.shape[0]:
            batch, sab, sbb = a.shape[0], a.strides[0], b.strides[0]
            m, sam, sak = a.shape[1], a.strides[1], a.strides[2]
            n, sbk, sbn = b.shape[2], b.strides[1], b.strides[2]
        else:
            raise CExportError(f"save(format='c'): {name} of shapes {a.shape} and {b.shape}")
        k = a.shape[-1]
        rows, scm = _rows(result) if len(result.shape) != 3 else (result.shape[1],
                                                                   result.strides[1])
        scb = result.strides[0] if len(result.shape) == 3 else 0
        scn = result.strides[-1]
        if rows != m:
            raise CExportError(f"save(format='c'): {name} whose result is laid out otherwise")
        bias_pointer, sbiasm, sbias = "0", 0, 0
        if bias is not None:
            # (a bias per column, or one per element of a 2-d product: an addmm onto a sum,
            # passes/matmul_operands.matmuls_onto_sums)
            if not isinstance(bias, Buffer) or len(bias.shape) not in (1, 2) or \
                    (len(bias.shape) == 2 and (batch != 1 or bias.shape != (m, n))):
                raise CExportError(f"save(format='c'): {name} with a bias of shape "
                                   f"{getattr(bias, 'shape', bias)}")
            bias_pointer, sbias = self.pointer[bias], bias.strides[-1]
            sbiasm = bias.strides[0] if len(bias.shape) == 2 else 0
        return (f"    ember_gemm_{ctype}({batch}, {m}, {n}, {k}, {self.pointer[a]}, {sab}, "
                f"{sam}, {sak}, {self.pointer[b]}, {sbb}, {sbk}, {sbn}, {bias_pointer}, "
                f"{sbiasm}, {sbias}, {self.pointer[result]}, {scb}, {scm}, {scn});")

    def _cat(self, step: LibraryCall) -> list[str]:
        """A cat joined_cats made: each input copied into its slice of the result, which is
        laid out as the plan says (the inputs' strides may be anything)."""
        dim, result = step.node.attrs["target"].dim, step.outputs[0]
        sources = [step.inputs[v.index] if isinstance(v, Slot) else v
                   for v in step.node.attrs["args"]]
        if step.node.attrs["kwargs"] or not all(
                isinstance(x, Buffer) and x.dtype == result.dtype and
                len(x.shape) == len(result.shape) for x in sources):
            raise CExportError(f"save(format='c'): a cat into {result.name} of operands that "
                               f"are not tensors of its rank and dtype ({result.dtype})")
        lines, start = [], 0
        for source in sources:
            lines.append(f"    /* {result.name}[{start}:{start + source.shape[dim]} along dim "
                         f"{dim}] = {source.name} */")
            lines += _copy(source, self.pointer[source], result.strides,
                           f"({self.pointer[result]} + {start * result.strides[dim]})")
            start += source.shape[dim]
        return lines


def _copy(source: Buffer, pointer: str, strides: tuple[int, ...], into: str) -> list[str]:
    """A loop nest that copies `source` (at `pointer`) into an array of its shape and
    `strides` at `into`; the loops follow the target's strides, so that it is written in
    order."""
    order = sorted(range(len(source.shape)), key=lambda d: -strides[d])

    def index(steps: tuple[int, ...]) -> str:
        return " + ".join(f"i{d} * {steps[d]}" for d in order)

    lines = []
    if source.numel >= config.settings.parallel_threshold:
        lines.append(f"    #pragma omp parallel for collapse({max(len(order) - 1, 1)})")
    for depth, d in enumerate(order):
        lines.append(f"    {'    ' * depth}for (int64_t i{d} = 0; i{d} < {source.shape[d]}; "
                     f"i{d}++)")
    lines.append(f"    {'    ' * len(order)}{into}[{index(strides)}] = "
                 f"{pointer}[{index(source.strides)}];")
    return lines


def _rows(buffer: Buffer) -> tuple[int, int]:
    """A [..., k] operand's leading dims as one: (rows, row stride); they must collapse."""
    shape, strides = buffer.shape, buffer.strides
    if len(shape) == 1:
        return 1, 0
    for i in range(len(shape) - 2):
        if shape[i] > 1 and strides[i] != strides[i + 1] * shape[i + 1]:
            raise CExportError(f"save(format='c'): a matrix product operand {buffer.name} "
                               f"whose rows do not collapse (strides {buffer.strides})")
    return math.prod(shape[:-1]), strides[-2]


def _identifier(name: str, prefix: str) -> str:
    text = re.sub(r"\W+", "_", name).strip("_")
    return text if text and not text[0].isdigit() else f"{prefix}_{text}"


def _array(name: str, tensor: torch.Tensor) -> str:
    """A constant as a C array of its elements in row-major order (floats exact, in hex)."""
    ctype = C_TYPES.get(tensor.dtype)
    if ctype is None:
        raise CExportError(f"save(format='c'): a constant of {tensor.dtype}")
    values = tensor.detach().contiguous().reshape(-1).tolist()
    if tensor.dtype in (torch.float32, torch.float64):
        suffix = "f" if tensor.dtype == torch.float32 else ""
        items = [("NAN" if v != v else ("INFINITY" if v > 0 else "-INFINITY"))
                 if v in (float("inf"), float("-inf")) or v != v else float.hex(v) + suffix
                 for v in values]
    else:
        items = [str(int(v)) for v in values]
    rows = [", ".join(items[i:i + 8]) for i in range(0, len(items), 8)] or ["0"]
    return (f"static const {ctype} {name}[{max(len(items), 1)}] __attribute__((aligned(64)))"
            " = {\n    " + ",\n    ".join(rows) + "\n};")


def write_library(program: Any, plan: Plan, stem: str) -> tuple[str, str]:
    return _Writer(program, plan, stem).write()
