"""Every switch of ember, declared once: its name, environment variable, default and help.

Code reads `config.settings.<name>`; nothing else in ember looks at os.environ. Tests change a
setting for a block with `config.override(name=value)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class SettingError(ValueError):
    """An EMBER_* variable holds a value ember cannot use (the message names the variable and
    the values it takes)."""


# Log channels (logs.py prints them), and the words EMBER_LOGS takes besides: "all", and
# "raise" (internal errors raise instead of falling back to eager: for ember's own tests).
LOG_HELP = {
    "graph_breaks": "where a graph breaks or a function runs eagerly, and why (file:line)",
    "recompiles": "why a function is compiled again (the guard that failed), the recompile "
                  "limit, symbolic sizes, stances",
    "guards": "each compiled version's guard function, as Python",
    "ir": "ember's IR after lowering and after each pass",
    "kernels": "kernels built or found in the disk cache, per graph",
    "output_code": "the generated kernel sources (C or Triton) and the wrapper that launches "
                   "them, whole",
    "perf": "compile time per stage, warm starts, CUDA graphs, shape padding",
    "fallbacks": "what runs eagerly instead of compiled (eager islands, a whole graph) and why",
    "all": "every channel above",
    "raise": "not a channel: an internal error of ember's raises instead of running the code "
             "eagerly with a warning (for debugging ember)",
}
LOG_CHANNELS = ("graph_breaks", "recompiles", "guards", "ir", "kernels", "output_code", "perf",
                "fallbacks")
LOG_WORDS = (*LOG_CHANNELS, "all", "raise")

# C compiler flags that let the compiler assume no NaN, no inf or no signed zero, or reorder
# float arithmetic: results would differ from eager's (inf and NaN, signed zeros, rounding)
UNSAFE_CFLAGS = ("-ffast-math", "-Ofast", "-ffinite-math-only", "-fno-honor-nans",
                 "-fno-honor-infinities", "-funsafe-math-optimizations", "-fassociative-math",
                 "-freciprocal-math", "-fno-signed-zeros", "-fapprox-func",
                 "-menable-unsafe-fp-math", "-ffp-model=fast", "-ffp-model=aggressive")


def _words(text: str) -> frozenset[str]:
    words = frozenset(w.strip() for w in text.replace(";", ",").split(",") if w.strip())
    unknown = sorted(words - set(LOG_WORDS))
    if unknown:
        close = [difflib.get_close_matches(word, LOG_WORDS, n=1) for word in unknown]
        guesses = [f"{word!r} -> {match[0]!r}" for word, match in zip(unknown, close) if match]
        guess = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise ValueError(f"unknown channel {', '.join(unknown)}{guess}; the channels are "
                         f"{', '.join(LOG_WORDS)} (comma-separated)")
    return words


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _flag(text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError(f"use one of {', '.join(_TRUE)} or {', '.join(w for w in _FALSE if w)}")
    return word in _TRUE


def _optional_path(text: str) -> Path | None:
    return Path(text).expanduser() if text.strip() else None


def _cache_path(text: str) -> Path:
    # (empty means the default: a relative "" would fill the current directory with kernels)
    return Path(text.strip() or "~/.cache/ember").expanduser()


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        word = text.strip()
        if word not in choices:
            raise ValueError("use one of " + ", ".join(c or "(empty)" for c in choices))
        return word

    return parse


def _count(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < least:
            raise ValueError(f"use a whole number >= {least}")
        return value

    return parse


def _cflags(text: str) -> list[str]:
    flags = text.split()
    unsafe = [f for f in flags if f in UNSAFE_CFLAGS or f.startswith("-Ofast")]
    if unsafe:
        raise ValueError(f"{' '.join(unsafe)} would change results (NaN, inf, signed zeros or "
                         f"the order of float arithmetic) from eager's; ember refuses "
                         f"{', '.join(UNSAFE_CFLAGS)}")
    return flags


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str
    env: str
    default: str
    parse: Callable[[str], Any]
    help: str


FLAGS: tuple[Flag, ...] = (
    Flag("logs", "EMBER_LOGS", "", _words,
         "comma-separated log channels to print (listed below), 'all', and 'raise'"),
    Flag("dump_dir", "EMBER_DUMP", "", _optional_path,
         "directory where every stage's text is written: captured graph, IR after each pass, "
         "kernel sources, wrapper"),
    Flag("cache_dir", "EMBER_CACHE_DIR", "~/.cache/ember", _cache_path,
         "directory of the disk cache: built kernels, and compiled graphs for a warm start "
         "in a new process (empty: the default)"),
    Flag("cache_max_mb", "EMBER_CACHE_MAX_MB", "4096", _count(0),
         "size cap of the disk cache in MiB (built kernels and warm-start entries): past it "
         "the least recently used entries are removed; 0: no cap"),
    Flag("warm_start", "EMBER_WARM_START", "1", _flag,
         "keep compiled graphs in the disk cache and rebuild them in a new process instead of "
         "compiling again; a plain function's first call in a new process starts from its "
         "kept entry (guards, runner) without a capture (0: capture and compile every "
         "process's graphs afresh)"),
    Flag("disable", "EMBER_DISABLE", "0", _flag,
         "run every compiled function eagerly (compile nothing)"),
    Flag("backend", "EMBER_BACKEND", "", _choice("", "c", "triton", "interp"),
         "kernel backend: c, triton or interp (IR interpreter); empty picks by device"),
    Flag("cc", "EMBER_CC", "", str.strip,
         "C compiler for CPU kernels; empty means $CC, then cc, gcc, clang"),
    Flag("cflags", "EMBER_CFLAGS", "-O3 -march=native -fno-math-errno -fwrapv -fopenmp",
         _cflags, "flags for the C compiler (never -ffast-math, -Ofast or the like: they "
         "break inf, NaN and signed zeros)"),
    Flag("parallel_threshold", "EMBER_PARALLEL_THRESHOLD", "32768", _count(0),
         "elements a CPU kernel must touch before it opens an OpenMP parallel region"),
    Flag("recompile_limit", "EMBER_RECOMPILE_LIMIT", "8", _count(1),
         "compiled versions kept per function before it runs eagerly with a warning"),
    Flag("shape_compiles", "EMBER_SHAPE_COMPILES", "8", _count(1),
         "a graph with symbolic sizes is still compiled per concrete shape by ember's "
         "backend (issue 18, stage 1): how many shapes' compiled versions each keeps, least "
         "recently used dropped"),
    Flag("cuda_graph_shapes", "EMBER_CUDA_GRAPH_SHAPES", "8", _count(1),
         "mode=\"reduce-overhead\": a graph compiled once for every shape keeps a CUDA graph "
         "per shape met (each recorded on that shape's second call); how many, least recently "
         "used dropped"),
    Flag("dependent_launch", "EMBER_DEPENDENT_LAUNCH", "1", _flag,
         "Triton on Hopper and later: launch kernels as programmatic dependent launches "
         "(each starts while the one before it finishes; see codegen/triton_module.write_module)"),
    Flag("triton_file_key", "EMBER_TRITON_FILE_KEY", "1", _flag,
         "Triton: key its compile cache on its files' names, sizes and times instead of a "
         "hash of their contents (a 400 MB library: ~0.6 s of a process's first compile; "
         "see runtime/triton_launch.file_key)"),
    Flag("c_launcher", "EMBER_C_LAUNCHER", "1", _flag,
         "C: call generated kernels through ember's launcher (a Python extension built once "
         "per machine; ~0.2 us a call) instead of ctypes (~0.56 us; 0; see "
         "runtime/c_launcher.c)"),
    Flag("triton_launcher", "EMBER_TRITON_LAUNCHER", "1", _flag,
         "Triton: launch compiled kernels through ember's one launcher (built once per "
         "machine) instead of the one Triton builds with the C compiler per argument list "
         "(0; see runtime/cuda_launcher.c)"),
    Flag("kernels_later", "EMBER_KERNELS_LATER", "1", _flag,
         "Triton: a graph's first run starts while its kernels still compile, each launch "
         "waiting for its kernel (the first run's library calls meanwhile); 0: the compile "
         "returns with every kernel loaded (see compile_plan.compiled_later)"),
    Flag("eager_trial", "EMBER_EAGER_TRIAL", "1", _flag,
         "a function whose graph breaks is timed against eager once its compiles are done "
         "(a few calls each way), and called directly where its compiled calls cost more "
         "(see giving_up.TRIAL_ROUNDS)"),
    Flag("eager_first", "EMBER_EAGER_FIRST", "1", _flag,
         "a graph's calls that come while its kernels still compile (Triton's in their "
         "worker processes, a C library in the compiler's) run eagerly beside them, and so "
         "does a training graph's first call while its backward compiled ahead compiles "
         "(later calls wait for it); 0: the first call runs compiled, waiting for them"),
    Flag("warm_library", "EMBER_WARM_LIBRARY", "1", _flag,
         "CUDA: while a graph's first calls run eagerly beside its kernels' compile, its "
         "convolutions run once on stand-ins, so that its first compiled run finds cuDNN's "
         "plans made (see runtime/library_warmup.py)"),
    Flag("triton_workers", "EMBER_TRITON_WORKERS", "8", _count(0),
         "Triton: processes that compile a graph's kernels side by side (started with the "
         "first CUDA capture, at most one per core; 0: compile in threads of this process "
         "only; see runtime/triton_pool.py)"),
    Flag("matmul_epilogue", "EMBER_MATMUL_EPILOGUE", "1", _flag,
         "Triton: compute small matmuls (up to 4M multiply-adds) inside the pointwise kernel "
         "that reads them (0: always cuBLAS + a kernel; see notes/device-runs.md)"),
    Flag("absent_gradients", "EMBER_ABSENT_GRADIENTS", "1", _flag,
         "training graphs: a backward compiled for the outputs a call's backward gives no "
         "gradient (a model's logits when the loss is computed inside it), guessed and "
         "compiled beside the forward, else made on the first such call (0: zeros are "
         "passed, as eager's autograd makes them)"),
    Flag("saved_outputs", "EMBER_SAVED_OUTPUTS", "1", _flag,
         "training graphs: an output that views a value the backward reads (a model's "
         "logits beside the loss it computed) is that value's memory, stored once; an "
         "in-place write to it before the backward is then an error there, not a wrong "
         "gradient (0: the output is a copy; see runtime/training.py)"),
    Flag("attention_backward", "EMBER_ATTENTION_BACKWARD", "1", _flag,
         "CUDA training graphs: call the memory-efficient attention kernel's backward from "
         "the results the forward kept (0: eager's autograd runs the composite's backward, "
         "on the step's tape)"),
    Flag("shape_padding", "EMBER_SHAPE_PADDING", "auto", _choice("auto", "always", "never"),
         "pad a large half-precision matmul's sizes that are not a multiple of 16 bytes "
         "(cuBLAS's fast kernels need them): auto (on CUDA), always, never "
         "(see passes/matmul_operands.aligned_matmuls)"),
    Flag("convolution_matmul", "EMBER_CONVOLUTION_MATMUL", "1", _flag,
         "CPU: call a convolution as one matrix product where oneDNN's per-call weight "
         "reorder would cost more (0: as eager calls it; see passes/convolution_matmul.py)"),
    Flag("convolution_layout", "EMBER_CONVOLUTION_LAYOUT", "auto",
         _choice("auto", "always", "never"),
         "convolve a row-major image channels-last where only ember's kernels read the "
         "image and the result: auto (on CUDA where cuDNN runs that convolution faster "
         "so), always (every such convolution), never (see passes/convolution_layout.py)"),
    Flag("convolution_depthwise", "EMBER_CONVOLUTION_DEPTHWISE", "1", _flag,
         "CPU: compute a depthwise convolution in ember's kernels, as a sum over its taps, "
         "and in a backward its weight's gradient where that sums few products (0: eager's "
         "calls; see passes/convolution_depthwise.py)"),
    Flag("factored_sums", "EMBER_FACTORED_SUMS", "1", _flag,
         "training: take factors constant along a broadcast's gradient sum out of the sum, "
         "so that a normalization's backward sums what eager's does (0: the sums of the "
         "products; see autodiff/broadcast_sums.py)"),
    Flag("max_autotune", "EMBER_MAX_AUTOTUNE", "0", _flag,
         "time a few configurations of each generated kernel at compile time and keep the "
         "fastest, recorded in the disk cache (what mode=\"max-autotune\" turns on; see "
         "ember/tuning.py)"),
    Flag("check_reused_kernels", "EMBER_CHECK_REUSED_KERNELS", "0", _flag,
         "Triton: write every kernel even where one of the same structure was written (a "
         "model's repeated layers) and raise where the renamed one differs (the tests set "
         "it; see codegen/kernel_reuse.py)"),
    Flag("profile", "EMBER_PROFILE", "0", _flag,
         "label each generated kernel and library call for torch.profiler (`ember k3: "
         "mul, add, relu [4, 256]`), so a profile names them; compile-time; a label costs ~5 us "
         "a launch, profiler or not (python -m ember.bench.zoo_profile uses it)"),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    logs: frozenset[str]
    dump_dir: Path | None
    cache_dir: Path
    cache_max_mb: int
    warm_start: bool
    disable: bool
    backend: str
    cc: str
    cflags: list[str]
    parallel_threshold: int
    recompile_limit: int
    shape_compiles: int
    cuda_graph_shapes: int
    dependent_launch: bool
    triton_file_key: bool
    c_launcher: bool
    triton_launcher: bool
    kernels_later: bool
    eager_trial: bool
    eager_first: bool
    warm_library: bool
    triton_workers: int
    matmul_epilogue: bool
    saved_outputs: bool
    attention_backward: bool
    absent_gradients: bool
    shape_padding: str
    convolution_matmul: bool
    convolution_layout: str
    convolution_depthwise: bool
    factored_sums: bool
    max_autotune: bool
    check_reused_kernels: bool
    profile: bool


def load(environ: dict[str, str] | None = None) -> Settings:
    """Every setting from the environment, checked: a value ember cannot use raises
    SettingError naming the variable and what it takes (at import: never a silent default)."""
    environ = os.environ if environ is None else environ
    values = {}
    for flag in FLAGS:
        text = environ.get(flag.env, flag.default)
        try:
            values[flag.name] = flag.parse(text)
        except ValueError as error:
            raise SettingError(f"{flag.env}={text!r} is not a valid setting: {error}. "
                               f"({flag.env}: {flag.help})") from None
    _warn_of_misspellings(environ)
    return Settings(**values)


def _warn_of_misspellings(environ: Any) -> None:
    """An EMBER_* variable that is not a setting but nearly spells one (EMBER_BAKCEND) is
    most likely meant as it: say so (other EMBER_* names, the tests' own, pass silently)."""
    known = [flag.env for flag in FLAGS]
    for name in environ:
        if name.startswith("EMBER_") and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            if close:
                warnings.warn(f"{name} is not an ember setting (did you mean {close[0]}?); "
                              f"it is ignored", stacklevel=3)


settings: Settings = load()


def reload() -> Settings:
    """Re-read the environment (tests and long-lived processes that change it)."""
    global settings
    settings = load()
    return settings


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[Settings]:
    global settings
    saved = settings
    settings = dataclasses.replace(settings, **changes)
    try:
        yield settings
    finally:
        settings = saved


@contextlib.contextmanager
def using(chosen: Settings) -> Iterator[Settings]:
    """Every setting as `chosen` holds it (a compile made later under the settings of the
    one it belongs to)."""
    global settings
    saved = settings
    settings = chosen
    try:
        yield settings
    finally:
        settings = saved


def kernel_backend(device_type: str, under: Settings | None = None) -> str:
    """Which code generator compiles for this device: EMBER_BACKEND (of `under`, else of the
    process's settings), else C on the CPU and Triton on CUDA."""
    chosen = (under if under is not None else settings).backend
    if chosen:
        return chosen
    return "triton" if device_type == "cuda" else "c"


def triton_interpreted() -> bool:
    """Do Triton kernels run under Triton's interpreter, on the CPU (TRITON_INTERPRET=1)?"""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def describe() -> str:
    """The help text of every switch, as the README and `python -m ember --help` show it."""
    lines = []
    for flag in FLAGS:
        default = flag.default or "(empty)"
        lines.append(f"{flag.env:<26} default {default}\n    {flag.help}")
    lines.append("\nEMBER_LOGS channels (e.g. EMBER_LOGS=graph_breaks,recompiles):")
    lines.extend(f"  {word:<14} {text}" for word, text in LOG_HELP.items())
    return "\n".join(lines)
