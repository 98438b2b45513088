"""SASS instruction counts of ember's Triton kernels, without a GPU.

    EMBER_DUMP=/tmp/dump TRITON_INTERPRET=1 EMBER_BACKEND=triton python my_program.py
    python -m ember.bench.sass_counts /tmp/dump/000_graph0/kernels.py [--arch 90]

Each kernel of the dumped module is compiled by Triton for an sm_90 target (no device is
needed to compile), assembled with the ptxas Triton ships and listed with its cuobjdump; the
opcodes are counted. Pointers are taken as 16-byte aligned, as ember compiles them for
aligned inputs. On 2026-11-29 it showed why S2's erf-gelu chain was issue-bound: libdevice's
erf spent 12 of its ~28 instructions on register moves of polynomial coefficients.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import re
import subprocess
import tempfile
from pathlib import Path


def opcodes(ptx: str, arch: int) -> collections.Counter:
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    folder = Path(tempfile.mkdtemp())
    (folder / "k.ptx").write_text(ptx)
    subprocess.run([str(tools / "ptxas"), f"--gpu-name=sm_{arch}a", str(folder / "k.ptx"),
                    "-o", str(folder / "k.cubin")], check=True)
    sass = subprocess.run([str(tools / "cuobjdump"), "-sass", str(folder / "k.cubin")],
                          capture_output=True, text=True, check=True).stdout
    found: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        match = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if match:
            found[match.group(1)] += 1
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("module", type=Path, help="a kernels.py that EMBER_DUMP wrote")
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("dumped_kernels", args.module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # each kernel follows a comment: "# grid (...), num_warps=N; name: type, ..."
    headers = re.findall(r"# grid \(.*?\), num_warps=(\d+); (.*)\n@triton.jit\ndef (\w+)\(",
                         args.module.read_text())
    for warps, parameters, name in headers:
        signature = dict(p.split(": ") for p in parameters.split(", "))
        attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values())
                 if t.startswith("*")}
        compiled = triton.compile(ASTSource(getattr(module, name), signature, {}, attrs),
                                  target=GPUTarget("cuda", args.arch, 32),
                                  options={"num_warps": int(warps), "num_stages": 1})
        found = opcodes(compiled.asm["ptx"], args.arch)
        print(f"{name}: {sum(found.values())} instructions; "
              + ", ".join(f"{op} {n}" for op, n in found.most_common(12)))


if __name__ == "__main__":
    main()
