"""A plan's Triton module: each kernel written (ember/codegen/triton.py: one kernel's text) with
its tile chosen, a split reduction's stages in order, a kernel that repeats another's
structure renamed from it (kernel_reuse.py), and the helpers every kernel calls; and what the
plan's steps read, for the passes that fuse across them (ember/compile_plan.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from ember.codegen import kernel_reuse
from ember.codegen.triton import KernelLaunches, TritonKernelWriter, row_length
from ember.codegen.triton_rules import prelude
from ember.codegen.triton_tiling import Tiling, choose_tiling
from ember.ir.sizes import Dim
from ember.schedule.plan import Buffer, Kernel, LibraryCall, Plan


def write_kernel(kernel: Kernel, plan: Plan, tiling: Tiling | None = None,
                 dependent_launch: bool = False, wide: bool = False,
                 rows: Mapping[Dim, int] | None = None) -> KernelLaunches:
    """Write once to see every memory access, choose the tile, write again (once per stage
    for a split reduction). `wide`: every index int64 (a symbolic graph's int64 build).
    `rows`: the class of each symbolic row length this build serves (see choose_tiling)."""
    first = TritonKernelWriter(kernel, plan, None, wide=wide)
    first.write()
    tiling = tiling or choose_tiling(first, rows=rows)
    row = row_length(kernel)
    if tiling.parts <= 1:
        return KernelLaunches(kernel.name, [TritonKernelWriter(
            kernel, plan, tiling, dependent_launch=dependent_launch, wide=wide).write()], [],
            row)
    workspaces: dict = {}
    final = TritonKernelWriter(kernel, plan, tiling, 0, workspaces, wide=wide)
    stages = []
    for stage in range(1, max(final.levels.values()) + 1):
        stages.append(TritonKernelWriter(kernel, plan, tiling, stage, workspaces,
                                         dependent_launch, wide).write())
        if stage in final.gathered_levels:
            stages.append(TritonKernelWriter(kernel, plan, tiling, stage, workspaces,
                                             dependent_launch, wide, gathering=True).write())
    stages.append(TritonKernelWriter(kernel, plan, tiling, 0, workspaces,
                                     dependent_launch, wide).write())
    spaces = [space for group in workspaces.values() for space in group]
    return KernelLaunches(kernel.name, stages, spaces, row)


def readers(plan: Plan) -> dict[Buffer, list[int]]:
    """Each buffer (by its root) -> the positions of the plan's steps that read it."""
    found: dict[Buffer, list[int]] = {}
    for position, step in enumerate(plan.steps):
        if isinstance(step, Kernel):
            writer = TritonKernelWriter(step, plan, None)
            writer.write()
            read = list(writer.arguments)  # (those it stores too: a superset is safe here)
        elif isinstance(step, LibraryCall):
            read = [b.root() for b in step.inputs]
        else:
            read = [step.source.root()]
        for buffer in read:
            found.setdefault(buffer, []).append(position)
    return found


def reads_product_elsewhere(kernel: Kernel, plan: Plan) -> bool:
    writer = TritonKernelWriter(kernel, plan, None)
    writer.write()
    return writer.reads_product_elsewhere


def write_module(plan: Plan, dependent_launch: bool = False, wide: bool = False,
                 tilings: dict[str, Tiling] | None = None, rows: Mapping[Dim, int] | None = None
                 ) -> tuple[str, list[KernelLaunches]]:
    """One Python module holding every kernel of the plan (and the helpers they call).

    `dependent_launch` (Hopper and later, compiled kernels only): each kernel is launched as a
    programmatic dependent launch, so the GPU starts it while the kernel before it on the
    stream is still running; it waits for that kernel's completion (gdc_wait: all of its
    writes visible) before its first read, and lets the next kernel start at once. The
    launches of a chain of small kernels overlap the kernels' execution instead of following
    it. `wide`: a symbolic graph's int64 build (ember/codegen/triton_sizes.py). `tilings`:
    max-autotune's choices by kernel name (ember/runtime/tune_triton.py); the other kernels'
    tiles as the heuristics choose them. `rows`: a build for one class of each symbolic row
    length (ember/compile_plan.py chooses the build per call)."""
    tilings = tilings or {}
    # (a kernel of a structure written before is renamed from it: see kernel_reuse.py)
    launches = kernel_reuse.write_all(
        plan.kernels, plan, lambda kernel: write_kernel(
            kernel, plan, tilings.get(kernel.name), dependent_launch=dependent_launch,
            wide=wide, rows=rows),
        "p_", set(tilings))
    texts = [k.text for launch in launches for k in launch.kernels if k.same_as is None]
    return "\n\n\n".join([prelude().rstrip(), *texts]) + "\n", launches
