"""Which of a zoo model's C loops gcc left scalar: every `#pragma omp simd` loop of the
generated kernels, compiled again with ember's own flags and gcc's vectorizer report
(-fopt-info-vec-all), listed with gcc's reasons where it gave up.

    python3 -m ember.bench.vectorization resnet50 bert [--mode train] [--size tiny]
        [--all]        (also the loops gcc found "not profitable": short ones, mostly)
    python3 -m ember.bench.vectorization --dump DIR   (an EMBER_DUMP folder already written)

A loop gcc leaves scalar can cost 8x (found so: a padded max pool's select became a branch
around its load; `codegen/c_rules.select`). The report is gcc's word, line by line; the
timing of a kernel is the benchmark's.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ember import config

_VECTORIZED = re.compile(r"kernels\.c:(\d+):\d+: optimized: loop vectorized")
_MISSED = re.compile(r"kernels\.c:(\d+):\d+: missed: (.*)")


@dataclass
class ScalarLoop:
    file: Path
    line: int          # the `for` line
    kernel: str        # the kernel's signature, cut short
    reasons: list[str]

    @property
    def unprofitable(self) -> bool:
        """gcc found it short, made it a memcpy or memset, or folded the kernel into its
        twin (then it says nothing of its loops)."""
        if not self.reasons or any("__builtin_mem" in r for r in self.reasons):
            return True
        return any("not profitable" in r for r in self.reasons) and not any(
            "complicated" in r or "data ref" in r or "not affine" in r for r in self.reasons)


def scalar_loops(source: Path) -> list[ScalarLoop]:
    """The simd loops of one kernels.c that gcc did not vectorize."""
    lines = source.read_text().split("\n")
    loops = [number + 2 for number, text in enumerate(lines) if "#pragma omp simd" in text]
    compiler = config.settings.cc or os.environ.get("CC") or "gcc"
    with tempfile.TemporaryDirectory() as folder:
        report = subprocess.run(
            [compiler, *config.settings.cflags, "-fPIC", "-c", "-fopt-info-vec-all",
             str(source), "-o", str(Path(folder) / "kernels.o")],
            capture_output=True, text=True, check=False).stderr
    vectorized = {int(m.group(1)) for m in _VECTORIZED.finditer(report)}
    missed: dict[int, list[str]] = {}
    for match in _MISSED.finditer(report):
        missed.setdefault(int(match.group(1)), []).append(match.group(2))
    found = []
    for line in loops:
        if {line - 1, line, line + 1} & vectorized:
            continue
        kernel = next((lines[k] for k in range(line - 1, -1, -1)
                       if lines[k].startswith("int kernel")), "?")
        end = next((k for k in range(line, len(lines)) if lines[k].startswith("}")), line + 60)
        reasons = sorted({text[:100] for k in range(line, end + 2) for text in missed.get(k, ())
                          if not text.startswith("couldn't vectorize loop")})
        found.append(ScalarLoop(source, line, kernel[:60], reasons))
    return found


def dump_model(name: str, mode: str, size: str, folder: Path) -> None:
    """Compile zoo model `name` in `mode` with EMBER_DUMP=folder, in a fresh process."""
    code = ("import torch, ember\nfrom ember.bench import zoo\n"
            f"step, args = zoo.instantiate(zoo.find({name!r}), {mode!r}, {size!r}, 'cpu')\n"
            "step.model_slot[0] = ember.compile(step.model)\n"
            f"with torch.set_grad_enabled({mode == 'train'}):\n    step(*args)\n")
    environment = dict(os.environ, EMBER_DUMP=str(folder), EMBER_WARM_START="0")
    subprocess.run([sys.executable, "-c", code], env=environment, check=True,
                   stdout=subprocess.DEVNULL)


def report(folder: Path, title: str, show_all: bool) -> int:
    loops = [loop for source in sorted(folder.rglob("kernels.c"))
             for loop in scalar_loops(source)]
    shown = [loop for loop in loops if show_all or not loop.unprofitable]
    total = sum(source.read_text().count("#pragma omp simd")
                for source in folder.rglob("kernels.c"))
    print(f"== {title}: {len(loops)} of {total} simd loops scalar "
          f"({len(loops) - len(shown)} of them 'not profitable', memcpy or twins of another "
          f"kernel, hidden without --all)")
    for loop in shown:
        where = f"{loop.file.parent.name}/kernels.c:{loop.line}"
        print(f"  {where}  {loop.kernel}\n      {'; '.join(loop.reasons) or '(no reason given)'}")
    return len(shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*")
    parser.add_argument("--mode", default="infer", choices=["infer", "train"])
    parser.add_argument("--size", default="tiny", choices=["tiny", "quick", "full"])
    parser.add_argument("--dump", type=Path, help="an EMBER_DUMP folder instead of models")
    parser.add_argument("--all", action="store_true")
    options = parser.parse_args()
    if options.dump is not None:
        report(options.dump, str(options.dump), options.all)
    for name in options.models:
        with tempfile.TemporaryDirectory() as folder:
            dump_model(name, options.mode, options.size, Path(folder))
            report(Path(folder), f"{name} {options.mode}", options.all)


if __name__ == "__main__":
    main()
