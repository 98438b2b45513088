"""The default mode's generated sources stay exactly as they were before max-autotune: the C
file and the Triton module of a few seed workloads, as digests (golden/default_sources.json,
written from main on 2026-12-02 before the tuning hooks went in). A deliberate change to code
generation regenerates them with EMBER_UPDATE_GOLDEN=1; max-autotune's hooks must not."""

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from ember import config
from ember.bench import workloads
from ember.codegen import c
from ember.codegen.c import write_source
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule

GOLDEN = Path(__file__).parent / "golden" / "default_sources.json"
# (tiny sizes stay serial; quick ones take the parallel loops and column blocks)
CASES = [(name, size) for name in ("S1", "S2", "softmax", "layer_norm", "S4", "S5", "S6-where")
         for size in ("tiny", "quick")]


def plan_of(name: str, size: str):
    fn, args = workloads.find(name).instantiate(size)
    with torch.no_grad():
        lowered = trace(torch.fx.symbolic_trace(fn), list(args))
        return schedule(run_passes(lowered.graph))


def digests(backend: str) -> dict[str, str]:
    found = {}
    for name, size in CASES:
        with config.override(backend=backend):
            plan = plan_of(name, size)
            if backend == "c":
                # (every kernel's own text: the file holds a repeated kernel once)
                sources = write_source(plan)[1]
                text = "\n\n".join([c.INCLUDES.strip(), c.vector_math_declarations(),
                                     c.PRELUDE.strip(), *(s.text for s in sources)]) + "\n"
            else:
                from ember.codegen.triton_module import write_module
                from ember.codegen.triton_rules import prelude

                # (every kernel's own text: the module holds a repeated kernel once)
                launches = write_module(plan)[1]
                text = "\n\n\n".join([prelude().rstrip(), *(
                    k.text for launch in launches for k in launch.kernels)]) + "\n"
        found[f"{backend} {name} {size}"] = hashlib.sha256(text.encode()).hexdigest()
    return found


@pytest.fixture(autouse=True)
def machine_independent_gelu(monkeypatch):
    # float32 gelu's form follows eager's sign of gelu(-0.0) on the machine at hand (one CPU's
    # vector loop differs from AVX-512's); the digests are of AVX-512's form wherever they run
    from ember.lower.rules import activations

    monkeypatch.setattr(activations, "_eager_gelu_keeps_the_sign_of_zero", lambda device: True)


@pytest.mark.parametrize("backend", ["c", "triton"])
def test_default_mode_sources_are_unchanged(backend):
    if backend == "triton":
        pytest.importorskip("triton")
        if not config.triton_interpreted():
            pytest.skip("the digests are of the interpreter's sources (TRITON_INTERPRET=1)")
    found = digests(backend)
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("EMBER_UPDATE_GOLDEN") == "1":
        recorded.update(found)
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    assert found == {key: recorded.get(key) for key in found}
