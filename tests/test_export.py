"""ember.export / ember.load (ember/exported.py) and save(format="c") (ember/exported_c.py):
a program saved in one process runs in a fresh one that cannot import the model's code, with
eager's answers; inputs are checked per call with errors that name the argument; damaged and
foreign files are refused; dynamic batch sizes; a C program runs the C library with no
Python and matches eager."""

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import captured_log
from torch.export import Dim

import ember
from ember import config, exported_file
from ember.exported import ExportError
from ember.exported_c import CExportError
from ember.exported_file import ExportFileError
from ember.exported_signature import InputMismatch
from ember.passes.joined_cats import JoinedCall
from ember.schedule.plan import LibraryCall


@pytest.fixture(autouse=True)
def on_the_cpu():
    """ember.export writes CPU programs (C, or Triton under its interpreter): these tests make
    CPU tensors even where EMBER_TEST_DEVICE=cuda puts other tests' on the GPU."""
    previous = torch.get_default_device()
    if previous.type == "cpu":  # (no device mode to put in: set_default_device makes one)
        yield
        return
    torch.set_default_device("cpu")
    yield
    torch.set_default_device(previous)


ROOT = Path(__file__).resolve().parents[1]

MODEL = '''
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 16))

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.norm(self.lin(x))) * self.scale
        return {"h": h + y.sum(-1, keepdim=True), "mean": h.mean()}
'''


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False))
        self.register_buffer("scale", torch.linspace(1.0, 2.0, 4))

    def forward(self, x):
        return torch.relu(self.inner(self.lin(x))) * self.scale + x.sum(-1, keepdim=True)


def _eager(model, *args):
    with torch.no_grad():
        return model(*args)


def _run(program: str, cwd: Path, pythonpath: list[Path], cache: Path) -> str:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, pythonpath)),
                       EMBER_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], cwd=cwd,
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_fresh_process_runs_the_program_without_the_models_code(tmp_path):
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    models.mkdir()
    elsewhere.mkdir()
    (models / "mymodel.py").write_text(MODEL)
    _run("""
        import torch, ember, mymodel
        torch.manual_seed(0)
        model = mymodel.Block()
        x, y = torch.randn(5, 8), torch.randn(5, 3)
        ember.export(model, x, y).save("../model.ember")
        with torch.no_grad():
            torch.save({"x": x, "y": y, "want": model(x, y)}, "../io.pt")
    """, models, [ROOT, models], tmp_path / "cache1")
    out = _run("""
        import sys, torch, ember
        from ember import exported_file
        try:
            import mymodel
        except ModuleNotFoundError:
            print("no model code")
        data = torch.load("../io.pt")
        run = ember.load("../model.ember")
        got = run(data["x"], data["y"])
        assert got.keys() == data["want"].keys()
        for key in got:
            torch.testing.assert_close(got[key], data["want"][key], atol=1e-5, rtol=1e-5)
        print("modules", sorted(m for m in sys.modules if "mymodel" in m))
        print("counts", exported_file.counts)
    """, elsewhere, [ROOT], tmp_path / "cache2")
    assert "no model code" in out
    assert "modules []" in out
    # the saved binary is used as it is: nothing compiled, nothing rebuilt
    assert "counts {'binaries_loaded': 1, 'rebuilt': 0}" in out


def test_parameters_and_buffers_are_named_constants(tmp_path):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(3, 8)
    program = ember.export(model, x)
    assert list(program.constants) == ["lin.weight", "lin.bias", "inner.0.weight", "scale"]
    for name, tensor in program.constants.items():
        assert torch.equal(tensor, model.get_parameter(name) if "scale" not in name
                           else model.scale)
    text = str(program)
    assert "def program(x):" in text and "const  inner.0.weight: float32[4, 4]" in text
    assert "## kernels" in text and "def call(args):" in text
    torch.testing.assert_close(program(x), _eager(model, x))
    loaded = ember.load(program.save(tmp_path / "net.ember"))
    torch.testing.assert_close(loaded(x), _eager(model, x))
    assert str(loaded).startswith("# signature\n\ndef program(x):")
    # the loaded program's eager form (FX's code, rebuilt) answers as the kernels do
    inputs = [x] + list(loaded.constants.values())
    torch.testing.assert_close(loaded.compiled.eager(*inputs)[0], _eager(model, x))
    # the loaded constants are the file's own, not the module's memory
    assert all(t.data_ptr() != c.data_ptr() for t, c in zip(loaded.constants.values(),
                                                            program.constants.values()))


def test_nested_arguments_and_baked_values():
    def f(pair, options, n):
        a, b = pair
        return {"sum": a * options["w"] + b, "scaled": (a - b) * n}, n + 1

    pair, options = (torch.randn(4, 4), torch.randn(4, 4)), {"w": torch.randn(4)}
    program = ember.export(f, pair, options, 3)
    got, want = program(pair, options, n=3), f(pair, options, 3)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == 4
    with pytest.raises(InputMismatch, match=r"argument n: the program was exported for n=3"):
        program(pair, options, 5)
    with pytest.raises(InputMismatch, match=r"argument pair: expected a tuple of 2 items"):
        program((pair[0],), options, 3)
    with pytest.raises(InputMismatch, match=r"argument options: expected a dict with keys"):
        program(pair, {"v": options["w"]}, 3)
    with pytest.raises(InputMismatch, match=r"argument options\['w'\]: expected shape \(4\)"):
        program(pair, {"w": torch.randn(5)}, 3)
    with pytest.raises(InputMismatch, match=r"missing argument n"):
        program(pair, options)


TABLE = torch.linspace(-1.0, 1.0, 4)


def test_globals_and_closures_become_named_constants(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())

    def f(x):
        scale = torch.tensor([1.0, 2.0, 3.0, 4.0])  # (made inside the graph)
        return model(x) * scale + TABLE

    x = torch.randn(2, 4)
    program = ember.export(f, x)
    assert list(program.constants) == ["model.0.weight", "model.0.bias", "TABLE"]
    memory = program.memory_analysis()  # (as planned: the argument, the named constants
    assert memory.argument_size_in_bytes == x.nbytes + sum(  # and the tensor made inside)
        t.nbytes for t in program.constants.values()) + 4 * 4
    loaded = ember.load(program.save(tmp_path / "f.ember"))
    torch.testing.assert_close(loaded(x), _eager(f, x))
    with pytest.raises(InputMismatch, match=r"argument x requires grad: an exported program "
                                            r"computes no gradients"):
        loaded(x.clone().requires_grad_())
    with torch.no_grad():
        torch.testing.assert_close(loaded(x.clone().requires_grad_()), _eager(f, x))


BIG = torch.randn(1000, 64)
ROWS = BIG[10:14]                # a view into 256 kB
TRANSPOSED = torch.randn(8, 4).t()


def test_view_constants_are_saved_alone_with_their_strides(tmp_path):
    def f(x):
        return x * ROWS.sum(0) + (x[:, :4] @ TRANSPOSED).sum()

    x = torch.randn(3, 64)
    path = ember.export(f, x).save(tmp_path / "views.ember")
    assert path.stat().st_size < BIG.nbytes // 2  # (not the whole storage of BIG)
    loaded = ember.load(path)
    assert loaded.constants["TRANSPOSED"].stride() == (1, 4)
    torch.testing.assert_close(loaded(x), f(x))


@pytest.mark.parametrize("bad, message", [
    (lambda x: torch.randn(3, 9), r"argument x: expected shape \(3, 8\), got \(3, 9\) "
                                  r"\(dimension 1 differs\)"),
    (lambda x: torch.randn(3, 8, 1), r"argument x: expected 2 dimensions"),
    (lambda x: x.double(), r"argument x: expected dtype torch.float32, got torch.float64"),
    (lambda x: x.to("meta"), r"argument x: expected a tensor on cpu, got one on meta"),
    (lambda x: torch.randn(8, 3).t(), r"argument x: expected strides \(8, 1\), got \(1, 3\)"),
    (lambda x: [x], r"argument x: expected a tensor, got list"),
])
def test_a_wrong_input_is_an_error_that_names_it(tmp_path, bad, message):
    model = Net()
    x = torch.randn(3, 8)
    loaded = ember.load(ember.export(model, x).save(tmp_path / "net.ember"))
    assert loaded._fast is not None  # (a miss of the one-expression check: the full checks)
    with pytest.raises(InputMismatch, match=message):
        loaded(bad(x))
    torch.testing.assert_close(loaded(x), _eager(model, x))  # (and the program still runs)


def _rewrite(path: Path, change) -> None:
    """The file with its record changed, and its digest made again (a foreign file that is
    not damaged)."""
    payload = path.read_bytes()[len(exported_file.MAGIC):].partition(b"\n")[2]
    record = torch.load(io.BytesIO(payload), weights_only=True)
    change(record)
    buffer = io.BytesIO()
    torch.save(record, buffer)
    data = buffer.getvalue()
    path.write_bytes(exported_file.MAGIC + exported_file._digest(data).encode() + b"\n" + data)


def test_damaged_and_foreign_files_are_refused(tmp_path):
    path = ember.export(Net(), torch.randn(3, 8)).save(tmp_path / "net.ember")
    data = path.read_bytes()
    cut = tmp_path / "cut.ember"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(ExportFileError, match="cut.ember is damaged"):
        ember.load(cut)
    flipped = tmp_path / "flipped.ember"
    flipped.write_bytes(data[:-10] + bytes(b ^ 1 for b in data[-10:]))
    with pytest.raises(ExportFileError, match="is damaged"):
        ember.load(flipped)
    other = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(2)}, other)
    with pytest.raises(ExportFileError, match="weights.pt is not an ember export"):
        ember.load(other)
    with pytest.raises(ExportFileError, match="cannot read"):
        ember.load(tmp_path / "missing.ember")
    future = tmp_path / "future.ember"
    future.write_bytes(data)
    _rewrite(future, lambda record: record.update(format="ember-export-99"))
    with pytest.raises(ExportFileError, match="format 'ember-export-99'"):
        ember.load(future)


def test_a_binary_for_another_machine_is_rebuilt_from_its_source(tmp_path):
    model, x = Net(), torch.randn(3, 8)
    path = ember.export(model, x).save(tmp_path / "net.ember")
    _rewrite(path, lambda record: record.update(machine="another CPU, another compiler"))
    before = dict(exported_file.counts)
    loaded = ember.load(path)
    torch.testing.assert_close(loaded(x), _eager(model, x))
    assert exported_file.counts["rebuilt"] == before["rebuilt"] + 1
    assert exported_file.counts["binaries_loaded"] == before["binaries_loaded"]
    # a machine with this CPU and no C compiler to rebuild with runs the saved binary
    with config.override(cc="no-such-compiler"):
        loaded = ember.load(path)
    torch.testing.assert_close(loaded(x), _eager(model, x))
    assert exported_file.counts["rebuilt"] == before["rebuilt"] + 1
    assert exported_file.counts["binaries_loaded"] == before["binaries_loaded"] + 1


def test_a_torch_export_program_is_exported(tmp_path):
    model, x = Net(), torch.randn(3, 8)
    program = ember.export(torch.export.export(model, (x,)))
    assert program.signature.parameters == ["x"]
    assert sorted(program.constants) == ["inner.0.weight", "lin.bias", "lin.weight", "scale"]
    loaded = ember.load(program.save(tmp_path / "ep.ember"))
    other = torch.randn(3, 8)
    torch.testing.assert_close(loaded(other), _eager(model, other))


def test_a_dynamic_batch_serves_two_batch_sizes(tmp_path):
    model = Net()
    batch = Dim("batch", min=2, max=32)
    program = ember.export(model, torch.randn(5, 8), dynamic_shapes={"x": {0: batch}})
    assert list(program.compiled.plan.graph.symbols) == ["s0"]  # (one compile: kernels
    loaded = ember.load(program.save(tmp_path / "dynamic.ember"))  # take the batch)
    for size in (3, 17):
        x = torch.randn(size, 8)
        torch.testing.assert_close(loaded(x), _eager(model, x))
    with pytest.raises(InputMismatch, match=r"argument x: dimension 0 \(batch\) must lie in "
                                            r"\[2, 32\], got 33"):
        loaded(torch.randn(33, 8))
    with pytest.raises(InputMismatch, match=r"argument x: expected shape \(batch, 8\)"):
        loaded(torch.randn(5, 7))
    text = str(loaded)
    assert "input  x: torch.float32[batch∈[2, 32], 8] on cpu, row-major" in text
    # a batch equal to a weight's size (4) is one of the family: the capture guards no
    # relation between them (it once did: ember's duck sizing, a compile of its own)
    assert loaded.guards[-1] == "2 <= batch <= 32" and "batch != 4" not in text
    x = torch.randn(4, 8)
    torch.testing.assert_close(loaded(x), _eager(model, x))
    at_four = ember.export(model, torch.randn(4, 8), dynamic_shapes={"x": {0: batch}})
    x = torch.randn(9, 8)
    torch.testing.assert_close(at_four(x), _eager(model, x))


def _scaled_softmax(x):
    return torch.softmax(x, -1) * 2


def test_a_triton_program_keeps_its_examples_row_class_and_calls_eager_for_others(tmp_path):
    # (Triton's interpreter on the CPU: a symbolic row's kernels are built per class of its
    # length; the file keeps the example's build, a row of another class runs eagerly, said
    # once)
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter runs CPU tensors (tests/conftest.py sets it off "
                    "EMBER_TEST_DEVICE=cuda runs)")
    with config.override(backend="triton"):
        program = ember.export(_scaled_softmax, torch.randn(3, 20),
                               dynamic_shapes={"x": {1: Dim("n", min=2, max=4096)}})
        loaded = ember.load(program.save(tmp_path / "rows.ember"))
        with captured_log("fallbacks") as records:
            for n in (30, 300, 40, 500):
                x = torch.randn(3, n)
                torch.testing.assert_close(loaded(x), _scaled_softmax(x))
    said = [r.getMessage() for r in records if "keeps the build" in r.getMessage()]
    assert len(said) == 1 and "rows of another length class" in said[0], said


def test_arguments_that_share_a_dynamic_size():
    linear = torch.nn.Linear(8, 3)

    def f(x, y):
        return torch.relu(linear(x)), y * 2

    batch = Dim("batch", max=32)
    program = ember.export(f, torch.randn(5, 8), torch.randn(5, 6),
                           dynamic_shapes=({0: batch}, {0: batch}))
    x, y = torch.randn(7, 8), torch.randn(7, 6)
    for got, want in zip(program(x, y), _eager(f, x, y)):
        torch.testing.assert_close(got, want)
    with pytest.raises(InputMismatch, match=r"argument y: dimension 0 is batch, which x sets "
                                            r"to 7; got 6"):
        program(x, torch.randn(6, 6))
    assert program.guards == ["x: torch.float32[batch∈[2, 32], 8] on cpu, row-major",
                              "y: torch.float32[batch∈[2, 32], 6] on cpu, row-major",
                              "2 <= batch <= 32"]


def test_what_cannot_be_exported_is_said():
    seen = []

    def logs(x):
        seen.append(1)
        return x * 2

    with pytest.raises(ExportError, match="side effects"):
        ember.export(logs, torch.randn(3))
    with pytest.raises(ExportError, match="argument s is a set"):
        ember.export(lambda x, s: x + 1, torch.randn(3), {1})


C_MAIN = r'''
#include <stdio.h>
#include "model.h"
int main(int argc, char** argv) {
    static float x[2 * 3 * 8], y[2 * 3 * 5], out0[2 * 3 * 4], out1[2 * 3 * 3], out2[3 * 3];
    FILE* f = fopen(argv[1], "rb");
    if (fread(x, sizeof x, 1, f) != 1 || fread(y, sizeof y, 1, f) != 1) return 2;
    fclose(f);
    int status = model_run(x, y, out0, out1, out2);
    f = fopen(argv[2], "wb");
    fwrite(out0, sizeof out0, 1, f); fwrite(out1, sizeof out1, 1, f);
    fwrite(out2, sizeof out2, 1, f);
    fclose(f);
    return status;
}
'''


class Products(torch.nn.Module):
    """Kernels and every form of matrix product the C library does itself."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.head = torch.nn.Linear(4, 4, bias=False)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 4))

    def forward(self, x, y):
        h = torch.relu(self.lin(x))
        return (self.head(h).softmax(-1) * self.scale, torch.bmm(y, y.transpose(1, 2)),
                torch.addmm(self.lin.bias[:3], h[0], h[1].t()))


def test_a_c_program_runs_the_c_library_without_python(tmp_path):
    torch.manual_seed(0)
    model = Products()
    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 5)
    program = ember.export(model, x, y)
    library = program.save(tmp_path / "model", format="c")
    assert library == tmp_path / "libmodel.so"
    header = (tmp_path / "model.h").read_text()
    assert "int model_run(const float* x, const float* y, float* out0, float* out1, " \
           "float* out2)" in header
    (tmp_path / "main.c").write_text(C_MAIN)
    (tmp_path / "in.bin").write_bytes(x.numpy().tobytes() + y.numpy().tobytes())
    done = subprocess.run("cc main.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o main && "
                          "./main in.bin out.bin", shell=True, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": os.environ["PATH"]})  # (no Python in its environment)
    assert done.returncode == 0, done.stderr[-3000:]
    flat = torch.from_numpy(np.fromfile(tmp_path / "out.bin", dtype=np.float32))
    want = _eager(model, x, y)
    sizes = [w.numel() for w in want]
    assert flat.numel() == sum(sizes)
    for got, expected in zip(flat.split(sizes), want):
        torch.testing.assert_close(got.reshape(expected.shape), expected, atol=1e-5, rtol=1e-5)


def test_c_refuses_graphs_with_other_library_calls(tmp_path):
    def f(x, w):
        return torch.nn.functional.conv2d(x, w).relu()

    program = ember.export(f, torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))
    with pytest.raises(CExportError, match=r"the graph calls convolution from torch's "
                                           r"library"):
        program.save(tmp_path / "conv", format="c")
    dynamic = ember.export(Net(), torch.randn(5, 8), dynamic_shapes=[{0: Dim("batch")}])
    with pytest.raises(CExportError, match="dynamic sizes"):
        dynamic.save(tmp_path / "dynamic", format="c")
    loaded = ember.load(ember.export(Net(), torch.randn(3, 8)).save(tmp_path / "n.ember"))
    with pytest.raises(CExportError, match="a loaded program"):
        loaded.save(tmp_path / "again", format="c")


class Joined(torch.nn.Module):
    """Cats that joined_cats makes one call of torch.cat, with pointwise kernels around them:
    along dim 0 with a transposed and a sliced input read in place, along dim 1 of
    channels-last tensors into a channels-last buffer, and one that is a result itself."""

    def forward(self, x, y, z, w):
        rows = torch.cat([x * 2, y.t(), z[:, 1::2]], dim=0)
        features = torch.cat([w, w.abs(), w * w], dim=1)
        return (rows.relu() + 1, (features - 1).contiguous(),
                torch.cat([x, x + 1, x * 3], dim=-1))


C_JOINED_MAIN = r'''
#include <stdio.h>
#include "joined.h"
int main(int argc, char** argv) {
    static float x[64 * 128], y[128 * 64], z[32 * 257], w[2 * 16 * 8 * 32];
    static float out0[160 * 128], out1[2 * 48 * 8 * 32], out2[64 * 384];
    FILE* f = fopen(argv[1], "rb");
    if (fread(x, sizeof x, 1, f) != 1 || fread(y, sizeof y, 1, f) != 1 ||
        fread(z, sizeof z, 1, f) != 1 || fread(w, sizeof w, 1, f) != 1) return 2;
    fclose(f);
    int status = joined_run(x, y, z, w, out0, out1, out2);
    f = fopen(argv[2], "wb");
    fwrite(out0, sizeof out0, 1, f); fwrite(out1, sizeof out1, 1, f);
    fwrite(out2, sizeof out2, 1, f);
    fclose(f);
    return status;
}
'''


def test_a_c_program_runs_joined_cats_as_strided_copies(tmp_path):
    torch.manual_seed(0)
    x, y, z = torch.randn(64, 128), torch.randn(128, 64), torch.randn(32, 257)
    w = torch.randn(2, 16, 8, 32).to(memory_format=torch.channels_last)
    program = ember.export(Joined(), x, y, z, w)
    calls = [s for s in program.compiled.plan.steps if isinstance(s, LibraryCall)]
    assert [type(s.node.attrs["target"]) for s in calls] == [JoinedCall] * 3
    assert [(b.strides, b.offset) for b in calls[0].inputs[1:]] == [((1, 64), 0), ((257, 2), 1)]
    assert calls[1].outputs[0].strides == (12288, 1, 1536, 48)  # (channels-last, as w)
    with config.override(parallel_threshold=8192):  # (all copies in parallel but z's slice)
        program.save(tmp_path / "joined", format="c")
    assert (tmp_path / "joined.c").read_text().count("    #pragma omp parallel for collapse(") == 8
    (tmp_path / "main.c").write_text(C_JOINED_MAIN)
    (tmp_path / "in.bin").write_bytes(b"".join(
        t.numpy().tobytes() for t in (x, y, z, w.permute(0, 2, 3, 1).contiguous())))
    done = subprocess.run("cc main.c -L. -ljoined -Wl,-rpath,'$ORIGIN' -o main && "
                          "./main in.bin out.bin", shell=True, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr[-3000:]
    flat = torch.from_numpy(np.fromfile(tmp_path / "out.bin", dtype=np.float32))
    want = _eager(Joined(), x, y, z, w)
    sizes = [t.numel() for t in want]
    assert flat.numel() == sum(sizes)
    for got, expected in zip(flat.split(sizes), want):
        assert torch.equal(got.reshape(expected.shape), expected)
