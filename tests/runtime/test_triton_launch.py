"""The Triton launch path's CPU-side decisions (ember/runtime/triton_launch.py)."""

import torch

import ember
from ember.codegen.triton import TritonKernel
from ember.runtime.triton_launch import _shape_of


def kernel(name: str, params: list[str], body: str, warps: int = 4) -> TritonKernel:
    text = (f"# grid (4, 1, 1), num_warps={warps}; {', '.join(params)}\n@triton.jit\n"
            f"def {name}({', '.join(params)}):\n{body}")
    return TritonKernel(name, text, [], {p: "*fp32" for p in params}, (4, 1, 1), warps, False)


def test_kernels_that_differ_only_in_names_compile_once():
    body = "    x = tl.arange(0, 8)\n    tl.store({1} + x, tl.tanh(tl.load({0} + x)) * 2.0)\n"
    first = kernel("kernel0", ["p_in0", "p_buf3"], body.format("p_in0", "p_buf3"))
    again = kernel("kernel7", ["p_in5", "p_buf9"], body.format("p_in5", "p_buf9"))
    other_constant = kernel("kernel8", ["p_in5", "p_buf9"],
                            body.format("p_in5", "p_buf9").replace("2.0", "3.0"))
    other_warps = kernel("kernel9", ["p_in5", "p_buf9"], body.format("p_in5", "p_buf9"), 8)
    aligned = [True, True]
    assert _shape_of(first, aligned) == _shape_of(again, aligned)
    assert _shape_of(first, aligned) != _shape_of(other_constant, aligned)
    assert _shape_of(first, aligned) != _shape_of(other_warps, aligned)
    assert _shape_of(first, aligned) != _shape_of(again, [True, False])


def test_a_models_repeated_layers_give_kernels_of_one_shape(monkeypatch):
    from ember import compile_plan, config

    written = []

    def write_module(plan, *options):
        text, launches = original(plan, *options)
        written.extend(k for launch in launches for k in launch.kernels)
        return text, launches

    original = compile_plan.write_module
    monkeypatch.setattr(compile_plan, "write_module", write_module)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh())
                                  for _ in range(3)]).eval()
    x = torch.randn(128, 64)
    with config.override(backend="triton"), torch.no_grad():
        torch.testing.assert_close(ember.compile(model)(x), model(x), rtol=1e-4, atol=1e-5)
    shapes = {_shape_of(k, [True] * len(k.signature)) for k in written}
    assert len(written) == 3 and len(shapes) == 1


def test_dependent_launches_wait_for_the_kernel_before_them(monkeypatch):
    # every kernel of a module written for dependent launch waits (gdc_wait) before its
    # first read, split reductions' stages included; on a Hopper GPU the chain runs as eager
    from ember import compile_plan, config

    written = []

    def write_module(plan, *options):
        text, launches = original(plan, True)
        written.extend(k for launch in launches for k in launch.kernels)
        return text, launches

    original = compile_plan.write_module
    if not torch.cuda.is_available():
        # the interpreter has no gdc_wait: here only the text is checked (the graph then
        # runs eagerly, as after any internal error)
        def load_module(text):
            raise RuntimeError("not run on a CPU")

        monkeypatch.setattr(compile_plan.triton_launch, "load_module", load_module)
    monkeypatch.setattr(compile_plan, "write_module", write_module)

    def chain(x, w):
        for _ in range(3):
            x = torch.tanh(x @ w + 1)
        return x.sum(0), x.sum()

    x, w = torch.randn(64, 32), torch.randn(32, 32) / 8
    with config.override(backend="triton"), torch.no_grad():
        torch.testing.assert_close(ember.compile(chain)(x, w), chain(x, w), rtol=1e-4,
                                   atol=1e-4)
    assert len(written) >= 4
    for k in written:
        body = k.text.split(":\n", 1)[1].splitlines()
        first = next(i for i, line in enumerate(body) if "tl.constexpr" not in line)
        assert body[first].strip() == "tl.extra.cuda.gdc_wait()", k.text
        assert k.dependent_launch


def test_the_file_key_changes_when_a_triton_file_changes(tmp_path, monkeypatch):
    import triton

    from ember.runtime import triton_launch

    # a stand-in Triton package: the key reads the files' names, sizes and times
    package = tmp_path / "triton"
    (package / "_C").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    library = package / "_C" / "libtriton.so"
    library.write_bytes(b"x" * 10)
    monkeypatch.setattr(triton, "__file__", str(package / "__init__.py"))
    before = triton_launch.file_key()
    assert triton_launch.file_key() == before
    library.write_bytes(b"y" * 11)  # a reinstall: another size (and time)
    assert triton_launch.file_key() != before
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"z")  # bytecode caches do not count
    after = triton_launch.file_key()
    assert after.startswith(triton.__version__) and after == triton_launch.file_key()


def test_tritons_compile_cache_is_keyed_on_the_file_key(monkeypatch):
    from triton.runtime import cache

    from ember.runtime import triton_launch

    monkeypatch.setattr(cache, "triton_key", cache.triton_key)  # (restored after the test)
    triton_launch.install_file_key()
    key = cache.get_cache_key(_Hashed("src"), _Hashed("backend"), _Hashed("options"), {})
    assert key.startswith(triton_launch.file_key() + "-src-backend-options")
    triton_launch.install_file_key()  # a second install keeps the first
    assert cache.triton_key.ember_file_key


class _Hashed:
    def __init__(self, text):
        self.text = text

    def hash(self):
        return self.text


def test_one_kernel_module_written_by_threads_at_once(tmp_path):
    # (a graph's forward and backward compile side by side; one kernel text in both wrote one
    # temporary file twice, and the second move found it gone)
    import threading
    import uuid

    from ember import config
    from ember.runtime import triton_launch

    text = f"# {uuid.uuid4()}\nVALUE = 7\n"
    errors = []

    def load():
        try:
            assert triton_launch.load_module(text).VALUE == 7
        except Exception as error:  # noqa: BLE001 (collected for the assert below)
            errors.append(error)

    with config.override(cache_dir=tmp_path):
        threads = [threading.Thread(target=load) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors


def test_each_kernel_is_told_ready_once_as_soon_as_its_compile_is_loaded(monkeypatch):
    # compile_kernels(ready=...) feeds a first run beside the compile (PendingLaunch): every
    # kernel once — one that repeats another (same_as, or the same body under another name)
    # with the binary of the one compiled, one of a shape another build compiled (`known`)
    # at once, before anything compiles — with its own grid. The GPU's parts stood in for.
    import types

    from ember.runtime import cuda_launcher, triton_launch

    compiled_names = []

    def compile_source(source, module):
        compiled_names.append(source.name)
        return f"binary of {source.name}"

    monkeypatch.setattr(triton_launch, "warm_up", lambda workers=True: None)
    monkeypatch.setattr(triton_launch, "_wait_for", lambda work: None)
    monkeypatch.setattr(triton_launch, "compile_source", compile_source)
    monkeypatch.setattr(triton_launch.triton_pool, "start", lambda target=None: None)
    monkeypatch.setattr(cuda_launcher, "launcher", lambda: object())  # (no launcher builds)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    body = "    x = tl.arange(0, 8)\n    tl.store({1} + x, tl.tanh(tl.load({0} + x)) * {2})\n"
    first = kernel("kernel0", ["a", "b"], body.format("a", "b", "2.0"))
    renamed = kernel("kernel1", ["c", "d"], body.format("c", "d", "2.0"))
    repeated = kernel("kernel2", ["a", "b"], body.format("a", "b", "2.0"))
    repeated.same_as, repeated.grid = "kernel0", (9, 1, 1)
    other = kernel("kernel3", ["a", "b"], body.format("a", "b", "3.0"))
    known_before = kernel("kernel4", ["a", "b"], body.format("a", "b", "4.0"))
    kernels = [first, renamed, repeated, other, known_before]
    aligned = [[True, True]] * len(kernels)
    known = {_shape_of(known_before, aligned[4]):
             triton_launch.DeviceLaunch("binary of another build", (4, 1, 1))}
    told = []
    module = types.SimpleNamespace(__file__="kernels.py", __name__="ember_triton_test")
    launches = triton_launch.compile_kernels(module, kernels, aligned, 0, known,
                                             lambda name, launch: told.append((name, launch)))
    assert sorted(compiled_names) == ["kernel0", "kernel3"]  # (one compile per shape)
    assert told[0][0] == "kernel4"  # (told before any compile)
    binaries = {name: (launch.compiled, launch.grid) for name, launch in told}
    assert len(told) == len(binaries) == 5
    assert binaries == {"kernel0": ("binary of kernel0", (4, 1, 1)),
                        "kernel1": ("binary of kernel0", (4, 1, 1)),
                        "kernel2": ("binary of kernel0", (9, 1, 1)),
                        "kernel3": ("binary of kernel3", (4, 1, 1)),
                        "kernel4": ("binary of another build", (4, 1, 1))}
    assert [(launch.compiled, launch.grid) for launch in launches] == \
        [binaries[k.name] for k in kernels]
