"""Triton kernels: load the generated module, compile each kernel once, launch it directly.

The only module that touches Triton's internals (as ember/torch_internals/ is for torch's).
On a GPU each kernel is compiled with `triton.compile` for the current device (several at once
on a cold cache; Triton's own disk cache keeps the binaries) and launched through the compiled
kernel's launcher with its grid and metadata bound in advance, so a launch costs one call into
a C launcher instead of the `@triton.jit` dispatch (argument binding, specialization keys,
cache lookup) on every call: ember's own (runtime/cuda_launcher.c, one for every argument
list) where it serves the kernel, else the one Triton builds for the kernel's argument list.
Under TRITON_INTERPRET=1 the same kernels run on CPU tensors through Triton's interpreter,
which is how they are tested without a GPU.

Pointer arguments are compiled as 16-byte aligned (so loads and stores vectorize) except where
ember cannot know: the wrapper checks its inputs' alignment on each call and runs a second
build without that promise for misaligned inputs (see ember/codegen/wrapper.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import importlib.util
import os
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy
import torch

from ember import config, logs
from ember.runtime import cuda_launcher, disk_cache, triton_pool
from ember.runtime.triton_key import file_key, install_file_key  # noqa: F401
from ember.runtime.wrappers import KernelsNotBuilt

if TYPE_CHECKING:
    from ember.codegen.triton import TritonKernel


class TritonUnavailable(RuntimeError):
    pass


interpreting = config.triton_interpreted


def dependent_launch_supported(device_index: int) -> bool:
    """Can kernels compiled for this device be launched as programmatic dependent launches
    (compute capability 9.0 and later, a Triton that has gdc_wait)?"""
    if interpreting() or torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    start = time.perf_counter()
    import triton.language as tl  # (where warm_up's thread still imports it: a wait)

    waited = time.perf_counter() - start
    if waited > 1e-3:
        logs.channel("perf").info("waited %.1f ms for Triton's import", waited * 1e3)
    cuda = getattr(getattr(tl, "extra", None), "cuda", None)
    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


def available() -> str | None:
    """None when Triton can run kernels here, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def module_folder() -> Path:
    """(a process-private folder when the cache directory cannot be written)"""
    return disk_cache.writable_folder("triton")


def load_module(text: str) -> types.ModuleType:
    """Import the generated source from a content-addressed file (Triton reads the kernels'
    source through `inspect`, so it must live in a real file)."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    # (interpreted and compiled kernels are different objects: never share one module)
    name = f"ember_triton_{digest}" + ("_interpreted" if interpreting() else "")
    with _loading:  # (a module another thread is still running must not be handed out)
        module_texts[name] = text
        if name in sys.modules:
            return sys.modules[name]
        return _load_new_module(name, text)


_loading = threading.Lock()
# the source of each module load_module made, by module name (what a warm-start entry keeps of
# a Triton graph: runtime/warm_values.py)
module_texts: dict[str, str] = {}


def _load_new_module(name: str, text: str) -> types.ModuleType:
    path = module_folder() / f"{name}.py"
    if not path.exists() or path.read_text() != text:
        # (a fresh temporary per writer: a graph's forward and backward compile side by side,
        # and the same kernel text in both wrote one temporary file twice; removed on any
        # exception)
        disk_cache.remove_stale(path.parent)  # (a killed writer's, older than minutes)
        with disk_cache.temporary(path.parent, ".py") as partial:
            partial.write_text(text)
            partial.replace(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@dataclasses.dataclass
class InterpretedLaunch:
    """A kernel run by Triton's interpreter on CPU tensors."""

    fn: Any
    grid: tuple[int, int, int]
    name: str
    checks: bool
    module: str = ""  # (the name load_module gave the kernels' module: a warm start's)
    function: str = ""  # (its function in that module where not `name`: see same_as)

    def __call__(self, *args: Any) -> None:
        self.run(self.grid, *args)

    def run(self, grid: tuple[int, int, int], *args: Any) -> None:
        """Launched on `grid` (a symbolic graph's wrapper computes it per call)."""
        from triton.runtime import interpreter
        from triton.runtime.errors import InterpreterError

        _scalars_index(interpreter)

        from ember.runtime.wrappers import KernelIndexError

        builder = interpreter.interpreter_builder
        saved = builder.options
        if self.checks:  # the interpreter runs device_assert only with debug on
            builder.options = dataclasses.replace(saved, debug=True)
        try:
            # (the interpreter computes with numpy, whose warnings — a division by zero, an
            # overflow in a cast — eager's kernels do not give)
            with numpy.errstate(all="ignore"):
                self.fn[grid](*args)
        except InterpreterError as error:
            if "index out of range" in str(error):
                raise KernelIndexError(
                    f"index out of range in ember kernel {self.name}: an indexing op (take, "
                    f"gather, embedding, x[index]) read a position outside the tensor, as "
                    f"eager would refuse to") from None
            raise
        finally:
            builder.options = saved


def _scalars_index(interpreter: Any) -> None:
    """Let a loop's bound be a run-time scalar under the interpreter (`range(0, s0, RBLOCK)`
    in a kernel over a symbolic row): the interpreter holds a scalar as a one-element array,
    whose int() recent numpy refuses; compiled Triton takes it as it is. Patched in the
    interpreter's own per-launch scope (undone after each launch), once per process."""
    patch = interpreter._patch_lang
    if getattr(patch, "ember_scalar_index", False):
        return

    def patched(fn: Any) -> Any:
        scope = patch(fn)
        scope.set_attr(interpreter.tl.core.tensor, "__index__",
                       lambda self: int(self.handle.data.reshape(-1)[0]))
        return scope

    patched.ember_scalar_index = True
    interpreter._patch_lang = patched


@dataclasses.dataclass(frozen=True)
class CompileSource:
    """What one compiled kernel was made from: `triton.compile` of kernel `name` of the
    module `module` (a name load_module gave) with these argument types, alignment promises
    (per argument), options and target, loaded on device `device_index`. It rebuilds the
    kernel in a new process (a warm start), where Triton's own cache skips the compile."""

    module: str
    name: str
    signature: tuple[tuple[str, str], ...]
    aligned: tuple[bool | int, ...]  # (a pointer's 16-byte alignment, an int's divisibility)
    options: tuple[tuple[str, Any], ...]
    target: tuple[str, int, int]
    device_index: int


@dataclasses.dataclass
class DeviceLaunch:
    """A compiled kernel and the fixed part of its launcher's arguments."""

    compiled: Any
    grid: tuple[int | str, int | str, int | str]  # (a str: computed by the wrapper per call)
    source: CompileSource | None = None  # (what compiled it, where ember did)

    def prefix(self) -> tuple:
        """Arguments of the launcher before the stream, and after it up to the tensors."""
        compiled = self.compiled
        codes = getattr(compiled, "ember_types", None)
        if codes is not None:  # (loaded for ember's launcher: _load)
            metadata = compiled.metadata
            return (cuda_launcher.built().launch, compiled.function,
                    bool(metadata.launch_cooperative_grid), bool(metadata.launch_pdl), None,
                    None, (metadata.num_warps, metadata.num_ctas, metadata.shared, codes),
                    None, None, None)
        launcher = compiled.run
        direct = (getattr(launcher, "global_scratch_size", 1) == 0
                  and getattr(launcher, "profile_scratch_size", 1) == 0
                  and hasattr(launcher, "launch"))
        if direct:
            # straight into Triton's C launcher: grid, stream, function, cooperative, pdl,
            # scratch buffers (none), metadata, launch metadata and hooks (none)
            return (launcher.launch, compiled.function, launcher.launch_cooperative_grid,
                    launcher.launch_pdl, None, None, compiled.packed_metadata, None, None, None)
        return (launcher, compiled.function, compiled.packed_metadata, None, None, None)


class PendingLaunch:
    """A kernel that the graph's first run launches while the kernels still compile (the
    workers' compiles and the loads, on a thread of their own: compile_plan's
    `compiled_later`): its launch waits for them, then launches as a DeviceLaunch does.
    The first run so goes on beside the compiles (its library calls' first costs: cuBLAS's
    handle and heuristics, attention's kernels loaded) instead of after them."""

    def __init__(self, loaded: concurrent.futures.Future,
                 grid: tuple[int | str, int | str, int | str]):
        self.loaded = loaded  # (→ the kernel's DeviceLaunch, once loaded)
        self.grid = grid
        self.launch: DeviceLaunch | None = None

    def __call__(self, gx: int, gy: int, gz: int, stream: int, *args: Any) -> None:
        launch = self.launch
        if launch is None:
            try:
                launch = self.launch = self.loaded.result()
            except Exception as error:  # (the compile's own error, said by the graph)
                raise KernelsNotBuilt.because(error) from error
        launcher, function, *fixed = launch.prefix()
        launcher(gx, gy, gz, stream, function, *fixed, *args)


_warm_ups: dict[str, threading.Thread] = {}


def on_gpu(values: Any) -> bool:
    """Are any of these (a call's arguments) tensors on a GPU, or modules whose parameters
    are?"""
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.is_cuda:
                return True
        elif isinstance(value, torch.nn.Module):
            parameter = next(value.parameters(), None)
            if parameter is not None and parameter.is_cuda:
                return True
    return False


def warm_up_for_cuda() -> None:
    """warm_up, where graphs on CUDA compile to Triton kernels (not under EMBER_BACKEND=c or
    interp)."""
    if config.kernel_backend("cuda") == "triton":
        warm_up()


def warm_up(workers: bool = True) -> None:
    """Start Triton's one-time costs in the background, while the graph is being lowered:
    importing it, keying its compile cache, and starting its CUDA driver (on a cold cache
    that builds Triton's CUDA utilities with the C compiler), and (`workers`) the compile
    workers. Compiling waits for the import and the key only; loading a compiled kernel
    waits for the driver. (A warm start, whose kernels are in Triton's cache, starts no
    workers: compile_kernels starts them when a graph is compiled.)"""
    if _warm_ups or interpreting():
        return
    target = None  # (the current GPU's, where CUDA is up: the graph's tensors are there)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        major, minor = torch.cuda.get_device_capability()
        target = ("cuda", major * 10 + minor, 32)
    if workers:
        triton_pool.start(target)  # (the compile workers import Triton and warm up meanwhile)
    cuda_launcher.start()  # (the C compiler's run, where the launcher is not in the cache)

    def import_triton() -> None:
        import triton  # noqa: F401

        if config.settings.triton_file_key:
            install_file_key()
        else:
            from triton.runtime.cache import triton_key

            triton_key()  # (cached for the process)

    def start_driver() -> None:
        import triton

        driver = triton.runtime.driver.active
        driver.get_current_target()
        driver.utils  # noqa: B018 (builds or loads cuda_utils)

    for work in (import_triton, start_driver):
        thread = threading.Thread(target=_logged(work), name=f"ember-{work.__name__}",
                                  daemon=True)
        thread.start()
        _warm_ups[work.__name__] = thread


def _wait_for(work: str) -> None:
    thread = _warm_ups.get(work)
    if thread is not None:
        thread.join()


def _logged(work: Any) -> Any:
    def run() -> None:
        try:
            work()
        except Exception as error:  # noqa: BLE001 (compile_kernels will meet it again)
            logs.channel("perf").info("Triton warm-up (%s) failed: %s", work.__name__, error)
    return run


def _options(kernel: TritonKernel) -> dict:
    return {"num_warps": kernel.num_warps, "num_stages": kernel.num_stages,
            "debug": kernel.checks, "launch_pdl": kernel.dependent_launch}


def _attrs(aligned: Sequence[bool | int]) -> dict:
    """Triton's promises per argument: a pointer 16-byte aligned (True), an int divisible by
    this power of two (an int > 1)."""
    promised = {(i,): 16 if value is True else value for i, value in enumerate(aligned)}
    return {at: [["tt.divisibility", value]] for at, value in promised.items()
            if value is not False and value > 1}


def compile_source(source: CompileSource, module: types.ModuleType) -> Any:
    """`triton.compile` of what `source` names, loaded on its device (the binary from Triton's
    disk cache where it is there)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(module, source.name)
    ast = ASTSource(fn, dict(source.signature), {}, _attrs(source.aligned))
    compiled = triton.compile(ast, target=GPUTarget(*source.target),
                              options=dict(source.options))
    _wait_for("start_driver")
    with torch.cuda.device(source.device_index):
        _load(compiled)
    return compiled


def _load(compiled: Any) -> None:
    """Load a compiled kernel's binary on the current device, for ember's launcher where it
    serves the kernel (then `compiled.ember_types` holds its type string), else with the
    launcher Triton builds for its argument list (CompiledKernel._init_handles, whose checks
    of the device's limits this repeats)."""
    if compiled.module is not None:  # (loaded before)
        return
    codes = _ember_types(compiled)
    if codes is None:
        compiled._init_handles()
        return
    from triton.runtime.autotuner import OutOfResources
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    metadata = compiled.metadata
    most = driver.active.utils.get_device_properties(device)["max_shared_mem"]
    if metadata.shared > most:
        raise OutOfResources(metadata.shared, most, "shared memory")
    compiled.module, compiled.function, compiled.n_regs, compiled.n_spills, \
        compiled.n_max_threads = driver.active.utils.load_binary(
            compiled.name, compiled.kernel, metadata.shared, device)
    threads = metadata.num_warps * driver.active.get_current_target().warp_size
    if threads > compiled.n_max_threads:
        raise OutOfResources(threads, compiled.n_max_threads, "threads")
    compiled.ember_types = codes


_LAUNCHER_TRITON = "3.6."


def _ember_types(compiled: Any) -> str | None:
    """The kernel's type string for ember's launcher, or None where that launcher cannot
    serve it (scratch memory, a cluster of CTAs, tensor descriptors, an unknown argument
    type, or no launcher)."""
    import triton

    metadata = compiled.metadata
    signature = getattr(compiled.src, "signature", None)
    # (the kernels' parameters as that launcher passes them, the two scratch pointers last:
    # Triton 3.6's)
    if not triton.__version__.startswith(_LAUNCHER_TRITON) or \
            not isinstance(signature, dict) or getattr(metadata, "global_scratch_size", 1) or \
            getattr(metadata, "profile_scratch_size", 1) or \
            getattr(metadata, "num_ctas", 2) != 1 or getattr(metadata, "tensordesc_meta", None):
        return None
    codes = cuda_launcher.type_codes(signature.values())
    if codes is None or cuda_launcher.launcher() is None:
        return None
    return codes


def rebuild_launch(text: str, source: CompileSource, grid: tuple) -> DeviceLaunch:
    """A kernel compiled in another process, compiled again here from its module's source
    (`source.module` aside: the name load_module gives that source here)."""
    warm_up(workers=False)
    _wait_for("import_triton")
    module = load_module(text)
    source = dataclasses.replace(source, module=module.__name__)
    return DeviceLaunch(compile_source(source, module), tuple(grid), source)


def compile_kernels(module: types.ModuleType, kernels: list[TritonKernel],
                    aligned: list[list[bool | int]], device_index: int,
                    known: dict[tuple, DeviceLaunch] | None = None,
                    ready: Callable[[str, DeviceLaunch], None] | None = None
                    ) -> list[DeviceLaunch]:
    """Compile each kernel for the current GPU, several at a time, and load them. `known`:
    kernels compiled before for the same graph (another build of it), by what they compile
    to; those compiled here are added. `ready(name, launch)`: told of each kernel as soon as
    it is loaded (a first run beside the compile launches it then: PendingLaunch)."""
    warm_up()
    known = {} if known is None else known
    # kernels that differ only in their names (a model's repeated layers) compile once; a
    # kernel that repeats another (`same_as`) is that one's function in the module
    position_of = {k.name: i for i, k in enumerate(kernels)}
    functions = [kernels[position_of[k.same_as]] if k.same_as is not None else k
                 for k in kernels]
    bodies: dict[str, str] = {}
    shapes = [_shape_of(function, aligned[i], bodies) for i, function in enumerate(functions)]
    first_of: dict[tuple, int] = {}
    same_as = [first_of.setdefault(shape, i) for i, shape in enumerate(shapes)]
    distinct = sorted(i for i in set(same_as) if shapes[i] not in known)

    def launch_of(i: int, binary: DeviceLaunch) -> DeviceLaunch:
        """Kernel i launched as `binary` (its own, or the one compiled for its shape: a
        kernel launched as another's keeps the other's source, what compiled it)."""
        return DeviceLaunch(binary.compiled, kernels[i].grid, binary.source)

    users: dict[int, list[int]] = {}  # a distinct kernel → the kernels launched as it
    for i, first in enumerate(same_as):
        users.setdefault(first, []).append(i)
        if ready is not None and shapes[first] in known:
            ready(kernels[i].name, launch_of(i, known[shapes[first]]))
    # On a cold cache each new argument count also needs its C launcher built (a compiler
    # run): start those at once, beside the warm-up and the kernels' compilation.
    launchers = sorted({tuple(k.signature.values()) for k in kernels} - _launchers_built) \
        if cuda_launcher.launcher() is None else []  # (ember's serves them: _load)
    workers = max(1, min(len(distinct) + len(launchers), os.cpu_count() or 1, 16))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        prebuilt = [pool.submit(_build_launcher, types) for types in launchers]
        _wait_for("import_triton")
        # (the target from torch: the driver may still be starting; compiling needs no driver)
        major, minor = torch.cuda.get_device_capability(device_index)
        target = ("cuda", major * 10 + minor, 32)
        # each distinct kernel compiled by a worker process into Triton's disk cache, where
        # its compile below finds it (runtime/triton_pool.py)
        compilers = triton_pool.start()
        # (the longest first: the last kernels to start are then the quickest to compile)
        longest_first = sorted(distinct, key=lambda position: -len(functions[position].text))
        ahead = {position: compilers.submit(module.__file__, functions[position].name,
                                          functions[position].signature,
                                          _attrs(aligned[position]),
                                          _options(functions[position]), target)
                 for position in longest_first} if compilers is not None else {}

        def build(position: int) -> DeviceLaunch:
            kernel = functions[position]
            source = CompileSource(module.__name__, kernel.name, tuple(kernel.signature.items()),
                                   tuple(aligned[position]),
                                   tuple(_options(kernel).items()), target, device_index)
            start = time.perf_counter()
            if position in ahead:
                done, said = ahead[position].result()
                logs.channel("perf").info("%s: a worker %s", kernel.name,
                                          f"compiled it in {said:.3f} s" if done
                                          else f"failed ({said}): compiled here")
            waited = time.perf_counter()
            compiled = compile_source(source, module)
            logs.channel("perf").info("%s: waited %.3f s, triton.compile and load %.3f s",
                                       kernel.name, waited - start,
                                       time.perf_counter() - waited)
            launch = DeviceLaunch(compiled, kernels[position].grid, source)
            if ready is not None:
                for i in users[position]:
                    ready(kernels[i].name, launch_of(i, launch))
            return launch

        built = dict(zip(distinct, pool.map(build, distinct)))
        for future in prebuilt:
            future.result()
    for position, launch in built.items():
        known[shapes[position]] = launch
    return [built[i] if i in built else launch_of(i, known[shapes[first]])
            for i, first in enumerate(same_as)]


def _shape_of(kernel: TritonKernel, aligned: Sequence[bool],
              bodies: dict[str, str] | None = None) -> tuple:
    """What a kernel compiles to depends on: its body with its own name and its parameters'
    names put aside, the argument types, the alignment promised, the warps, the checks and
    the stages. (`bodies`: the bodies found so far, by kernel name.)"""
    bodies = {} if bodies is None else bodies
    text = bodies.get(kernel.name)
    if text is None:
        text = kernel.text.split("\n", 1)[1]  # (the first line: a comment naming the grid)
        names = {kernel.name: "kernel"}
        names.update((name, f"a{i}") for i, name in enumerate(kernel.signature))
        text = bodies[kernel.name] = re.sub(
            r"\b\w+\b", lambda word: names.get(word.group(), word.group()), text)
    return (text, tuple(kernel.signature.values()), tuple(aligned), kernel.num_warps,
            kernel.checks, kernel.num_stages, kernel.dependent_launch)


_launchers_built: set[tuple[str, ...]] = set()


def _build_launcher(types: tuple[str, ...]) -> None:
    """Build (or find in Triton's cache) the C launcher that kernels with these argument
    types use, exactly as Triton's CudaLauncher would; a Triton whose internals differ just
    builds it later, when the kernel is loaded."""
    try:
        from triton.backends.nvidia import driver as nvidia
        from triton.runtime.build import compile_module_from_src

        source = nvidia.make_launcher({}, {f"a{i}": t for i, t in enumerate(types)}, None)
        compile_module_from_src(src=source, name="__triton_launcher",
                                library_dirs=nvidia.library_dirs(),
                                include_dirs=nvidia.include_dirs, libraries=nvidia.libraries)
        _launchers_built.add(types)
    except Exception as error:  # noqa: BLE001 (only a head start; the load builds it anyway)
        logs.channel("perf").info("no head start on the Triton launcher: %s", error)


def interpreted_kernels(module: types.ModuleType, kernels: list[TritonKernel]
                        ) -> list[InterpretedLaunch]:
    return [InterpretedLaunch(getattr(module, k.same_as or k.name), k.grid, k.name, k.checks,
                              module.__name__, k.same_as or "") for k in kernels]
