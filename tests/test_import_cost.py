"""What a fresh process pays before its first result: `import ember` and a first compiled
call must not import torch._dynamo (1-3 s, and it wraps torch functions); code that imports
it itself still finds ember's rules for its functions."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, tmp_path: Path) -> str:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), EMBER_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_import_and_first_call_do_not_import_dynamo(tmp_path):
    out = _run("""
import sys
import torch
import ember
print("import", "torch._dynamo" in sys.modules)
def f(x, y):
    return torch.relu(x @ y + 1).softmax(-1)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
x, y = torch.randn(32, 32), torch.randn(32, 32)
assert torch.allclose(ember.compile(f)(x, y), f(x, y), atol=1e-5)
z = torch.randn(4, 8)
with torch.no_grad():
    assert torch.allclose(ember.compile(m)(z), m(z), atol=1e-5)
print("call", "torch._dynamo" in sys.modules, "torch._inductor" in sys.modules)
def g(x):  # (code that reaches torch._dynamo itself: its functions' rules apply)
    if torch._dynamo.is_compiling():
        return x + 1
    return x - 1
print("later", ember.compile(g)(torch.zeros(3)).tolist())
""", tmp_path)
    assert "import False" in out and "call False False" in out
    assert "later [1.0, 1.0, 1.0]" in out


def test_a_symbolic_capture_imports_neither_export_nor_inductor(tmp_path):
    # (torch's ShapeEnv looks for the user's frame of each symbol it makes, and its first look
    # imports torch.export, AOTAutograd and Inductor to name the files it skips: 0.4 s)
    out = _run("""
import sys
import torch
import ember
def f(x):
    return torch.tanh(x[:, : x.shape[1] // 2]).sum(1)
compiled = ember.compile(f, dynamic=True)
for n in (6, 10):
    x = torch.randn(3, n)
    assert torch.allclose(compiled(x), f(x), atol=1e-6)
print("captures", len(compiled.entries), compiled.entries[0].captured.symbolic)
print("imported", *(name in sys.modules for name in
                    ("torch.export._trace", "torch._functorch.aot_autograd",
                     "torch._inductor.sizevars", "torch._dynamo")))
""", tmp_path)
    assert "captures 1 True" in out and "imported False False False False" in out
