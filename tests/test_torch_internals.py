"""Each private torch API ember uses exists and behaves as ember expects on the installed
torch (the package ember/torch_internals/ is the only code that imports them)."""

import pytest
import torch

from ember import torch_internals
from ember.torch_internals import (
    OpOverload,
    OpOverloadPacket,
    TorchDispatchMode,
    TreeSpec,
    tree_flatten,
    tree_map,
)

aten = torch.ops.aten


def test_op_overloads_and_packets():
    assert isinstance(aten.add.Tensor, OpOverload) and isinstance(aten.add, OpOverloadPacket)
    assert torch_internals.is_op_overload(aten.add.Tensor)
    assert not torch_internals.is_op_overload(aten.add) and not torch_internals.is_op_overload(1)
    assert aten.add.Tensor.overloadpacket is aten.add                  # registry.find_rule
    assert "Tensor" in aten.add.overloads() and "out" in aten.add.overloads()
    assert torch_internals.overload_name(aten.add.Tensor) == "Tensor"
    assert aten.mm.default.__name__ == "mm.default"                     # printer, wrapper
    assert torch.Tag.nondeterministic_seeded in aten.rand_like.default.tags   # dce
    assert torch.Tag.nondeterministic_seeded not in aten.add.Tensor.tags


def test_a_calls_arguments_by_their_schemas_names():
    # (attention's recorded calls and the tracer's as_strided read arguments by name)
    x = torch.ones(2)
    found = torch_internals.arguments_by_name(aten.as_strided.default, (x, [2], [1]),
                                              {"storage_offset": 0})
    assert found == {"self": x, "size": [2], "stride": [1], "storage_offset": 0}
    assert "storage_offset" not in torch_internals.arguments_by_name(
        aten.as_strided.default, (x, [2], [1]), {})
    bound = torch_internals.arguments_by_name(
        aten._scaled_dot_product_efficient_attention.default, (x, x, x, None, True),
        {"scale": 0.5})
    assert bound["compute_log_sumexp"] is True and bound["attn_bias"] is None
    assert bound["scale"] == 0.5 and "dropout_p" not in bound


def test_schemas_describe_arguments_and_aliasing():
    schema = torch_internals.schema_of(aten.add_.Tensor)
    assert schema.name == "aten::add_"
    names = [a.name for a in schema.arguments]
    assert names == ["self", "other", "alpha"]
    self_argument = schema.arguments[0]
    assert self_argument.alias_info is not None and self_argument.alias_info.is_write
    assert schema.arguments[1].alias_info is None
    assert [a.kwarg_only for a in schema.arguments] == [False, False, True]
    out = torch_internals.schema_of(aten.add.out)
    assert [(a.name, a.kwarg_only, a.alias_info is not None and a.alias_info.is_write)
            for a in out.arguments][-1] == ("out", True, True)
    view = torch_internals.schema_of(aten.t.default)
    assert view.returns[0].alias_info is not None and not view.returns[0].alias_info.is_write
    assert torch_internals.schema_of(aten.add.Tensor).returns[0].alias_info is None


def test_a_dispatch_mode_sees_aten_ops_on_meta_tensors():
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.empty(2, 3, device="meta")
    with Record():
        y = (x.t() * 2).sum(0)
    assert seen == [aten.t.default, aten.mul.Tensor, aten.sum.dim_IntList]
    assert y.device.type == "meta" and y.shape == (2,)


def test_outside_dispatch_modes_runs_ops_unseen_on_real_tensors():
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Record():
        with torch_internals.outside_dispatch_modes():
            real = torch.ones(3) * 2
        inside = torch.ones(2)
    assert real.tolist() == [2.0, 2.0, 2.0] and seen == [aten.ones.default]
    assert inside.tolist() == [1.0, 1.0]


def test_pytrees_flatten_and_rebuild():
    tree = (torch.ones(1), {"a": [2, torch.zeros(2)], "b": None})
    leaves, spec = tree_flatten(tree)
    assert isinstance(spec, TreeSpec) and len(leaves) == 4
    assert spec.type is tuple and not spec.is_leaf()                     # wrapper
    assert [child.is_leaf() for child in spec.children()] == [True, False]
    rebuilt = spec.unflatten(leaves)
    assert rebuilt[1]["a"][0] == 2 and rebuilt[1]["b"] is None
    doubled = tree_map(lambda v: v * 2 if isinstance(v, int) else v, tree)
    assert doubled[1]["a"][0] == 4
    assert tree_flatten(torch.ones(1))[1].is_leaf()


def test_symbolic_values_are_recognized():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    size = ShapeEnv().create_unbacked_symint()
    assert torch_internals.is_symbolic(size)
    assert not torch_internals.is_symbolic(3) and not torch_internals.is_symbolic(torch.ones(2))


def test_dynamo_finds_registered_backends():
    calls = []

    def counting_backend(gm, example_inputs):
        calls.append(len(example_inputs))
        return gm.forward

    torch_internals.register_dynamo_backend("ember_test_counting", counting_backend)
    torch_internals.register_dynamo_backend("ember_test_counting", counting_backend)  # no error
    compiled = torch.compile(lambda x: x * 2 + 1, backend="ember_test_counting")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert calls == [1]
    import ember  # noqa: F401  (registers "ember")

    assert torch.equal(torch.compile(lambda x: x.sin(), backend="ember")(torch.zeros(2)),
                       torch.zeros(2))


REGISTRY_CHILD = """
import importlib.metadata, sys
found = importlib.metadata.entry_points
def without_ember(**options):  # (a source checkout: ember's entry point is not installed)
    points = found(**options)
    return points.select(name="no such backend") if "group" in options else points
importlib.metadata.entry_points = without_ember
import torch, ember
print("torch._dynamo" in sys.modules)
compiled = torch.compile(lambda x: x.sin() * 2, backend="ember")
x = torch.randn(5)
print(torch.allclose(compiled(x), x.sin() * 2))
"""


def test_ember_registers_with_dynamo_when_its_registry_is_imported():
    # without the entry point, `import ember` must not import torch._dynamo (seconds on a
    # cold file cache) to register its backend: the registration waits for torch.compile
    import os
    import subprocess
    import sys

    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", REGISTRY_CHILD], capture_output=True,
                          text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr[-3000:]


def test_tensor_checker_accepts_matching_metadata_and_rejects_each_difference():
    def cpu(*shape, **options):
        return torch.randn(*shape, device="cpu", **options)

    weight = torch.nn.Parameter(cpu(3))
    check = torch_internals.tensor_checker([cpu(4, 3), weight])
    assert check is not None, "this torch lacks TensorGuards: guards fall back to Python"
    assert check(cpu(4, 3), weight)
    assert not check(cpu(3, 4).t(), weight)                               # strides
    assert not check(cpu(4, 3, dtype=torch.float64), weight)              # dtype
    assert not check(cpu(4, 4), weight)                                   # shape
    assert not check(cpu(4, 3, requires_grad=True), weight)               # requires_grad
    assert not check(cpu(4, 3), weight.detach())                          # type
    if torch.cuda.is_available():
        assert not check(torch.randn(4, 3, device="cuda"), weight)        # device


def test_storage_use_count_sees_aliases_come_and_go():
    x = torch.randn(8)
    alone = torch_internals.storage_use_count(x)
    alias, view = x.detach(), x[2:]
    assert torch_internals.storage_use_count(x) == alone + 2
    del alias, view
    assert torch_internals.storage_use_count(x) == alone


def test_autocast_state_sees_any_device_types_region():
    assert torch_internals.autocast_state() is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch_internals.autocast_state() is not None
    assert torch_internals.autocast_state() is None


def test_autocast_state_and_a_graph_traced_under_it():
    assert torch_internals.autocast_state() is None
    graph = torch.fx.symbolic_trace(lambda a, b: a @ b)
    a, b = torch.randn(2, 3, device="cpu"), torch.randn(3, 4, device="cpu")  # (CPU autocast)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        state = torch_internals.autocast_state()
        traced = torch_internals.trace_under_autocast(graph, [a, b])
    assert state[0] == (True, torch.bfloat16) and state[1][0] is False
    casts = [n for n in traced.graph.nodes if n.target is aten._to_copy.default]
    assert len(casts) == 2 and traced(a, b).dtype == torch.bfloat16


def test_context_decorators_are_recognized():
    assert torch_internals.is_context_decorator(torch.no_grad())
    assert torch_internals.is_context_decorator(torch.enable_grad())
    assert not torch_internals.is_context_decorator(torch.sin)


def test_dynamos_spelling_of_tensor_data_is_found():
    (getter,) = torch_internals.data_attribute_getters()
    x = torch.ones(2, requires_grad=True)
    data = getter(x)
    assert not data.requires_grad and data.data_ptr() == x.data_ptr()


def test_any_autocast_is_the_state_s_quick_test():
    assert torch_internals.any_autocast() is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch_internals.any_autocast() is True


def test_module_hooks_are_seen_on_the_module_and_globally():
    module = torch.nn.Linear(2, 2)
    assert torch_internals.module_has_hooks(module) is False
    handle = module.register_forward_pre_hook(lambda m, args: None)
    assert torch_internals.module_has_hooks(module) is True
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: None)
    try:
        assert torch_internals.module_has_hooks(module) is True
    finally:
        handle.remove()
    assert torch_internals.module_has_hooks(module) is False


def test_set_grad_enabled_is_the_switch_torch_s_context_managers_call():
    with torch.no_grad():
        torch_internals.set_grad_enabled(True)
        assert torch.is_grad_enabled()
    assert torch.is_grad_enabled()
    torch_internals.set_grad_enabled(False)
    try:
        assert not torch.is_grad_enabled()
    finally:
        torch_internals.set_grad_enabled(True)


def test_dynamo_s_compiling_tests_are_found_and_answer_false_outside_a_compiler():
    tests = torch_internals.dynamo_compiling_tests()
    assert tests and all(callable(f) and f() is False for f in tests)


def test_autocast_region_functions_enter_and_leave_a_region():
    enter, leave = torch_internals.autocast_region_functions()
    region = enter("cpu", torch.bfloat16, True, None)
    try:
        assert torch.is_autocast_enabled("cpu")
    finally:
        leave(region)
    assert not torch.is_autocast_enabled("cpu")


def test_data_pointers_checker_sees_a_tensor_move():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = [torch.randn(4, device=device) for _ in range(3)]
    check = torch_internals.data_pointers_checker([t.data_ptr() for t in tensors])
    assert check(tensors, [0, 1, 2])
    tensors[1].data = torch.randn(4, device=device)   # moved, the same tensor object
    assert not check(tensors, [0, 1, 2])
    assert check(tensors, [0, 2])
    if hasattr(torch._C, "_tensors_data_ptrs_at_indices_equal"):  # (CUDA builds)
        assert check([*tensors[:1], 7, tensors[2]], [0, 2])          # non-tensors skipped


def test_hook_handles_are_counted_and_modules_looked_at_when_the_count_moved():
    module = torch.nn.Linear(2, 2)
    before = torch_internals.hooks_made()
    assert torch_internals.modules_still_plain(before, [module], [module.__dict__])
    handle = module.register_forward_hook(lambda *args: None)
    assert torch_internals.hooks_made() == before + 1
    assert not torch_internals.modules_still_plain(before, [module], [module.__dict__])
    handle.remove()
    assert torch_internals.modules_still_plain(before, [module], [module.__dict__])
    module.forward = lambda x: x
    assert torch_internals.instance_forward(module) is module.forward
    assert not torch_internals.modules_still_plain(before, [module], [module.__dict__])


def test_hook_tables_are_read_in_call_order_and_their_changes_seen():
    module = torch.nn.Linear(2, 2)
    before = torch_internals.hooks_made()
    tables = [*torch_internals.hook_tables(None), *torch_internals.hook_tables(module)]

    def unchanged(handles_made):
        return torch_internals.hook_tables_unchanged(
            handles_made, tables, [len(t) for t in tables], [tuple(t) for t in tables])

    first = module.register_forward_hook(lambda m, args, out: out)
    module.register_forward_hook(lambda m, args, kwargs, out: out, prepend=True,
                                 with_kwargs=True)
    module.register_forward_pre_hook(lambda m, args, kwargs: None, with_kwargs=True)
    pre, post = torch_internals.forward_hooks(module)
    assert [with_kwargs for *_, with_kwargs in pre] == [True]
    assert [with_kwargs for *_, with_kwargs in post] == [True, False]
    assert post[1][1] == first.id and post[1][0] is module._forward_hooks
    assert torch_internals.hooks_run_apart(module) is None
    made = torch_internals.hooks_made()
    assert made == before + 3
    lengths, keys = [len(t) for t in tables], [tuple(t) for t in tables]
    first.remove()
    assert not torch_internals.hook_tables_unchanged(made, tables, lengths, keys)
    assert unchanged(made)
    handle = module.register_full_backward_hook(lambda m, grad_in, grad_out: None)
    assert torch_internals.hooks_run_apart(module) == "backward hooks"
    handle.remove()


def test_threading_locks_are_recognised():
    import threading

    assert all(torch_internals.is_thread_lock(lock) for lock in
               (threading.Lock(), threading.RLock(), threading._PyRLock()))
    assert not torch_internals.is_thread_lock(threading.Semaphore())


def test_an_lr_scheduler_s_wrapper_of_step_leads_to_its_optimizer():
    parameter = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    assert torch_internals.scheduler_wrapped_optimizer(optimizer.step) is None
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    assert torch_internals.scheduler_wrapped_optimizer(optimizer.step) is optimizer


def test_torch_s_compiler_markers_are_read():
    import torch._dynamo

    assert torch_internals.dynamo_marker("graph_break") is torch._dynamo.graph_break
    assert torch_internals.dynamo_marker("no_such_marker") is None

    @torch.library.custom_op("ember_internals_test::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = torch_internals.custom_op_overload(double)
    assert op is torch.ops.ember_internals_test.double.default
    assert torch_internals.custom_op_overload(torch.sin) is None

    def plain(x):
        return x

    class Model(torch.nn.Module):
        def forward(self, x):
            return x

    assert torch_internals.disabled_reason(plain) is None
    assert torch_internals.disabled_reason(torch.compiler.disable(plain)) == ""
    assert torch_internals.disabled_reason(torch.compiler.disable(plain, recursive=False)) == ""
    assert torch_internals.disabled_reason(torch._dynamo.disable(plain, reason="why")) == "why"
    model = Model()
    assert torch_internals.disabled_reason(model) is None
    assert torch_internals.disabled_reason(torch.compiler.disable(model)) == ""
    method = torch.compiler.disable(Model.forward)
    assert torch_internals.disabled_reason(method.__get__(model)) == ""

    def allowed(x):
        return x

    assert not torch_internals.allowed_in_graph(allowed)
    torch.compiler.allow_in_graph(allowed)
    assert torch_internals.allowed_in_graph(allowed)
    assert not torch_internals.allowed_in_graph(torch.sin)  # (torch's own: not the user's mark)


def test_storage_identity_is_shared_by_aliases_of_fake_tensors():
    mode = torch_internals.make_fake_mode()
    with mode:
        x = mode.from_tensor(torch.randn(4, 3))
        same = [x.t(), x.detach(), x[1:], torch._C._autograd._get_data_attr(x)]
        other = x * 2
    assert all(torch_internals.storage_identity(v) == torch_internals.storage_identity(x)
               for v in same)
    assert torch_internals.storage_identity(other) != torch_internals.storage_identity(x)


def test_attention_backend_choice_sees_the_math_composite():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 8, 16, device="cpu")  # (CUDA's flash kernel takes no float32)
    with sdpa_kernel([SDPBackend.MATH]):
        assert torch_internals.attention_uses_math(q, q, q, None, {})
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        # (the CPU's flash kernel takes these; values of another head size only the composite)
        assert not torch_internals.attention_uses_math(q, q, q, None, {"is_causal": True})
        assert torch_internals.attention_uses_math(q, q, torch.randn(2, 4, 8, 32, device="cpu"),
                                                   None, {})


@pytest.mark.parametrize("stand_in", [True, False])
def test_symbolic_fakes_ints_ranges_guards_and_their_rendering(stand_in, monkeypatch):
    # (stand_in False: a torch whose symbolic work the stand-in does not serve, its trial
    # failed: torch._dynamo's own sources serve)
    from ember.torch_internals import dynamo

    torch_internals.make_symbolic_fake_mode()  # (the trial, once)
    if not stand_in:
        monkeypatch.setattr(dynamo, "_serves_symbolic", [False])
    fake_mode, shape_env = torch_internals.make_symbolic_fake_mode()
    x = torch_internals.symbolic_fake(fake_mode, torch.randn(6, 4), "L['x']",
                                      [(2, None), None])
    n = torch_internals.symbolic_int(shape_env, 5, "L['n']")
    assert isinstance(x.shape[0], torch.SymInt) and x.shape[1] == 4 and isinstance(n, torch.SymInt)
    origins = torch_internals.symbol_origins(shape_env)
    assert sorted(origins.values(), key=str) == [("L['n']", None, None), ("L['x']", "size", 0)]
    names = {symbol: f"s{k}" for k, symbol in enumerate(origins)}
    half = x.shape[0] // 2
    assert torch_internals.render_python(torch_internals.expression_of(half), names) in (
        "s0//2", "(s0//2)", "s0 // 2")
    assert bool(x.shape[0] > 3)  # (branching records a guard)
    guards = [torch_internals.render_python(g, names) for g in
              torch_internals.shape_guards(shape_env)]
    assert guards == ["s0 > 3"]
    symbol = next(iter(origins))
    assert torch_internals.symbol_range(shape_env, symbol) == (4, None)
    # a tensor the fake mode meets without a context stays static; data-dependent sizes raise
    with fake_mode:
        y = fake_mode.from_tensor(torch.randn(3, 2))
        assert y.shape == (3, 2)
        with pytest.raises(torch_internals.data_dependent_errors()):
            torch.nonzero(y)


def test_a_0d_tensor_s_item_and_a_view_s_storage_offset_name_their_symbols():
    # a number read as a 0-d tensor (capture/numbers.number_input) whose value the capture
    # asks (.item(): torchvision RetinaNet's `topk_idxs % num_classes`) is a symbol with an
    # item source and no lower bound (an internal error in capture: the source has no
    # `prop`, and int(-oo)); a view's storage offset is a symbol of its own kind
    fake_mode, shape_env = torch_internals.make_symbolic_fake_mode()
    number = torch_internals.symbolic_fake(fake_mode, torch.tensor(7), "N", [])
    with fake_mode:
        value = number.item()
    assert isinstance(value, torch.SymInt)
    symbol = next(iter(torch_internals.symbol_origins(shape_env)))
    assert torch_internals.symbol_origins(shape_env)[symbol] == ("N", "item", None)
    assert torch_internals.symbol_range(shape_env, symbol) == (torch_internals.LOWEST, None)


def test_the_stand_in_sources_name_a_symbolic_fake_s_sizes_as_torch_s_do():
    # (a symbolic fake made while torch._dynamo is not imported takes them: see
    # dynamo.symbolic_stand_in; another torch's naming falls back to its own classes)
    from torch._dynamo.source import ConstantSource, TensorProperty, TensorPropertySource

    from ember.torch_internals import dynamo

    assert dynamo._names_as_torch_does()
    for prop, idx in [("SIZE", 0), ("STRIDE", 2), ("STORAGE_OFFSET", None)]:
        ours = dynamo._TensorPropertySource(dynamo._PlainSource("L['x']"),
                                            dynamo._TensorProperty[prop], idx)
        theirs = TensorPropertySource(ConstantSource("L['x']"), TensorProperty[prop], idx)
        assert ours.name == theirs.name
        assert ours == dynamo._TensorPropertySource(dynamo._PlainSource("L['x']"),
                                                    dynamo._TensorProperty[prop], idx)
    size = dynamo._TensorPropertySource(dynamo._PlainSource("x"), dynamo._TensorProperty.SIZE, 0)
    assert size != dynamo._TensorPropertySource(dynamo._PlainSource("x"),
                                                dynamo._TensorProperty.STRIDE, 0)
    assert dynamo.plain_source("L['n']").name == "L['n']"
    assert dynamo._PlainSource("a") != dynamo._PlainSource("b")  # (by name, as torch's)


def test_dynamo_dim_marks_are_read():
    x = torch.randn(4, 5, 6)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    torch._dynamo.maybe_mark_dynamic(x, 2)
    torch._dynamo.mark_static(x, 1)
    dynamic, static = torch_internals.dynamo_dim_marks(x)
    assert dynamic == {0: (2, 64), 2: (None, None)} and static == {1}
    assert torch_internals.dynamo_dim_marks(torch.randn(2)) == ({}, set())


def test_opinfo_database_and_its_tolerances():
    ops = {op.name: op for op in torch_internals.opinfo_database()}
    assert "add" in ops and torch.float32 in ops["add"].supported_dtypes("cpu")
    sample = next(iter(ops["add"].sample_inputs("cpu", torch.float32)))
    assert isinstance(sample.input, torch.Tensor)
    found = [t for op in ops.values()
             for t in torch_internals.opinfo_tolerance_overrides(op, torch.float32, "cpu")]
    assert found and all(atol >= 0 and rtol >= 0 for atol, rtol in found)


def test_the_compiler_stance_and_error_on_recompile_are_read():
    import torch._dynamo

    assert torch_internals.dynamo_stance_is_default()
    with torch.compiler.set_stance("eager_on_recompile"):
        assert not torch_internals.dynamo_stance_is_default()
        assert torch_internals.dynamo_stance() == ("eager_on_recompile", False, None)
    with torch.compiler.set_stance("default", force_backend="eager"):
        assert not torch_internals.dynamo_stance_is_default()
        assert torch_internals.dynamo_stance() == ("default", False, "eager")
    assert torch_internals.dynamo_stance()[0] == "default"
    assert torch_internals.dynamo_stance_is_default()
    assert torch_internals.dynamo_error_on_recompile() is False
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch_internals.dynamo_error_on_recompile() is True


def test_compiler_resets_reach_a_chained_reset():
    import torch._dynamo

    reached = []
    chained = torch_internals.chain_compiler_reset
    before = torch.compiler.reset, torch._dynamo.reset
    try:
        torch.compiler.reset = torch.compiler.reset.__wrapped__ \
            if hasattr(torch.compiler.reset, "_ember_chained") else torch.compiler.reset
        torch._dynamo.reset = torch._dynamo.reset.__wrapped__ \
            if hasattr(torch._dynamo.reset, "_ember_chained") else torch._dynamo.reset
        chained(lambda: reached.append(1))
        chained(lambda: reached.append(2))  # (each is wrapped once)
        torch.compiler.reset()
        assert reached == [1, 1]  # (torch.compiler.reset calls torch._dynamo.reset)
        torch._dynamo.reset()
        assert reached == [1, 1, 1]
    finally:
        torch.compiler.reset, torch._dynamo.reset = before


def test_size_hints_guardless_equality_and_min_max_of_symbolic_sizes():
    # (issue 18, stage 3: eager's attention asked at the call's sizes; layout questions that
    # must not pin a symbol; Max(1, s - 1) from a slice's size)
    fake_mode, shape_env = torch_internals.make_symbolic_fake_mode()
    x = torch_internals.symbolic_fake(fake_mode, torch.randn(4, 3), "L['x']", [(2, None), None])
    rows, columns = x.shape
    assert torch_internals.size_hint(rows) == 4 and torch_internals.size_hint(columns) == 3
    assert not torch_internals.known_equal((rows, 3), (4, 3))  # (4 now, not for every call)
    assert torch_internals.known_equal((rows, 3), (rows, 3))
    assert torch_internals.known_true(rows >= 2) and not torch_internals.known_true(rows <= 1)
    assert not torch_internals.known_true(rows == 4) and torch_internals.known_true(3 > 2)
    assert torch_internals.symbolic_expression(rows * 3 // rows) == 3
    assert not shape_env.guards  # (no question above guarded)
    size = torch.sym_max(1, rows - 1)
    kind, arguments = torch_internals.min_max_arguments(
        torch_internals.symbolic_expression(size))
    assert kind == "max" and len(arguments) == 2
    assert torch_internals.min_max_arguments(torch_internals.symbolic_expression(rows)) is None


def test_a_kernel_asking_symbolic_sizes_as_ints_is_refused_then_retried_in_python():
    # (a CUDA build's composite op reads sizes() in C++, and torch's fake handler would fix
    # every symbol to its example value: an attention block compiled for one length)
    fake_mode, shape_env = torch_internals.make_symbolic_fake_mode()
    x = torch_internals.symbolic_fake(fake_mode, torch.randn(4, 3), "L['x']", [(2, None), None])
    with fake_mode:
        with pytest.raises(torch_internals.ConcreteSizesAsked):
            torch.ops.aten.size.default(x)
        assert torch_internals.is_symbolic(x) and not shape_env.guards
        assert torch_internals.refuses_symbolic_sizes(torch_internals.ConcreteSizesAsked("x"))
        # an op that never asks keeps its symbols and runs once
        calls = []
        doubled = torch_internals.calling_composites(lambda: calls.append(1) or x * 2)
        assert torch_internals.is_symbolic(doubled) and calls == [1]
        # the retry runs with torch's Python dispatcher, where a question still asked is
        # answered as torch answers it (the symbol fixed)
        sizes = torch_internals.calling_composites(lambda: torch.ops.aten.size.default(x))
        assert list(sizes) == [4, 3]


def test_a_cuda_spin_holds_the_stream_for_the_runs_queued_behind_it():
    assert callable(torch.cuda._sleep)  # what cuda_spin calls, on this torch
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU to spin")
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch_internals.cuda_spin(10_000_000)
    end.record()
    end.synchronize()
    assert begin.elapsed_time(end) > 0.5  # ms (ten million cycles last 2 ms at 5 GHz)


def test_convolution_uses_onednn_answers_for_eagers_choice():
    x = torch.randn(2, 8, 4, 4, device="cpu").to(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3, device="cpu")
    # a strided channels-last convolution: oneDNN whatever the thread count
    assert torch_internals.convolution_uses_onednn(x, w, [2, 2], [1, 1], [1, 1], 1)
    assert isinstance(torch_internals.convolution_uses_onednn(
        x.contiguous(), w, [1, 1], [1, 1], [1, 1], 1), bool)


def test_convolution_backend_names_eagers_kernel_family():
    x = torch.randn(2, 8, 6, 6, device="cpu")
    w = torch.randn(16, 8, 3, 3, device="cpu")
    backend = torch_internals.convolution_backend(x, w, [1, 1], [1, 1], [1, 1], 1)
    assert backend in torch._C._ConvBackend.__members__


@pytest.mark.parametrize("channels_last", [False, True])
def test_convolution_memory_format_is_that_of_eagers_result(channels_last):
    x = torch.empty(2, 8, 6, 6)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w = torch.empty(16, 8, 3, 3)
    options = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    memory_format = torch_internals.convolution_memory_format(x, w, None, None, *options)
    result = torch.ops.aten.convolution.default(x.zero_(), w.zero_(), None, *options)
    assert result.is_contiguous(memory_format=memory_format)
    assert memory_format == (torch.channels_last if channels_last else torch.contiguous_format)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cudnn_convolution_gives_eagers_bits_and_layout(dtype, channels_last):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 32, 20, 20, generator=generator, device="cpu").to("cuda", dtype)
    w = torch.randn(64, 32, 3, 3, generator=generator, device="cpu").to("cuda", dtype)
    if channels_last:
        x, w = (t.to(memory_format=torch.channels_last) for t in (x, w))
    assert torch_internals.convolution_backend(x, w, [2, 2], [1, 1], [1, 1], 1) == "Cudnn"
    expected = torch.ops.aten.convolution.default(x, w, None, [2, 2], [1, 1], [1, 1], False,
                                                  [0, 0], 1)
    got = torch_internals.cudnn_convolution(x, w, [2, 2], [1, 1], [1, 1], 1)
    assert got.stride() == expected.stride()
    assert torch.equal(got, expected)


def test_suggest_memory_format_reads_strides_as_torch_does():
    image = torch.randn(2, 3, 4, 5)
    assert torch_internals.suggest_memory_format(image) == torch.contiguous_format
    assert torch_internals.suggest_memory_format(
        image.to(memory_format=torch.channels_last)) == torch.channels_last
    meta = torch.empty_strided((2, 3, 4, 5), (60, 1, 15, 3), device="meta")
    assert torch_internals.suggest_memory_format(meta) == torch.channels_last


def test_torch_s_decompositions_are_found_by_op():
    aten = torch.ops.aten
    ones = torch_internals.decomposition_of(aten.ones.default)
    assert callable(ones)
    assert torch.equal(ones([2, 3], dtype=torch.float32, device="cpu"),
                       torch.ones(2, 3, device="cpu"))
    assert torch_internals.decomposition_of(aten.empty.memory_format) is None


def test_a_ranged_symbol_has_its_hint_and_range():
    _, shape_env = torch_internals.make_symbolic_fake_mode()
    size = torch_internals.ranged_symbol(shape_env, "length", 5, 2, 64)
    symbol = torch_internals.symbolic_expression(size)
    assert torch_internals.symbol_hint(shape_env, symbol) == 5
    assert torch_internals.symbol_range(shape_env, symbol) == (2, 64)
    unbounded = torch_internals.ranged_symbol(shape_env, "batch", 3, 2, None)
    assert torch_internals.symbol_range(
        shape_env, torch_internals.symbolic_expression(unbounded)) == (2, None)


def test_an_op_namespace_is_named():
    assert torch_internals.op_namespace_name(torch.ops.aten) == "aten"
    assert torch_internals.op_namespace_name(torch) is None


def test_the_dispatch_mode_stack_lists_the_active_modes():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    stack = torch_internals.dispatch_mode_stack_function()
    assert stack() == []
    with Passing() as mode:
        assert stack() == [mode]


def _described(fake):
    return (type(fake), fake.shape, fake.stride(), fake.dtype, fake.device, fake.requires_grad,
            fake.is_leaf, isinstance(fake, torch.nn.Parameter), fake.storage_offset(),
            fake.untyped_storage().nbytes())


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Parameter(torch.randn(5, 3)),
    lambda: torch.nn.Parameter(torch.randn(3, 5).t()),
    lambda: torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
    lambda: torch.zeros(7, dtype=torch.int64),
    lambda: torch.randn(4, requires_grad=True),
], ids=["parameter", "transposed", "channels_last", "buffer", "leaf"])
def test_a_plain_leafs_quick_fake_is_the_fake_from_tensor_makes(make):
    from ember.torch_internals.fakes import quick_fake

    tensor = make()
    quick = quick_fake(torch_internals.make_fake_mode(), tensor)
    assert quick is not None
    with torch_internals.make_fake_mode() as mode:
        slow = mode.from_tensor(tensor)
    assert _described(quick) == _described(slow)
    assert quick.fake_mode.from_tensor(tensor) is quick  # (in the mode's memo)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(6)[2:],                             # a view
    lambda: torch.randn(6).detach(),                         # (plain: the control)
    lambda: _with_grad(torch.nn.Parameter(torch.randn(3))),  # a gradient attached
    lambda: (torch.randn(3, requires_grad=True) * 2),        # not a leaf
    lambda: _inference(),
    lambda: torch.randn(6).as_strided((3,), (2,)),           # storage larger than the tensor
    lambda: torch.randn(0),
    lambda: torch.randn(3, dtype=torch.complex64).conj(),
])
def test_anything_else_is_left_to_from_tensor(make):
    from ember.torch_internals.fakes import quick_fake

    tensor = make()
    plain = tensor.dim() == 1 and tensor.numel() == 6 and tensor._base is None
    assert (quick_fake(torch_internals.make_fake_mode(), tensor) is not None) == plain


def test_tensors_sharing_a_storage_keep_sharing_it_as_fakes():
    weight = torch.nn.Parameter(torch.randn(4, 4))
    alias = weight.detach()  # (shares the storage: no quick fake for either)
    mode = torch_internals.make_fake_mode()
    first, second = torch_internals.fake_of(mode, weight), torch_internals.fake_of(mode, alias)
    assert torch_internals.storage_identity(first) == torch_internals.storage_identity(second)


def _with_grad(parameter):
    parameter.grad = torch.ones_like(parameter)
    return parameter


def _inference():
    with torch.inference_mode():
        return torch.randn(3)


def test_a_quick_fake_made_under_inference_mode_is_no_inference_tensor():
    tensor = torch.nn.Parameter(torch.randn(3))
    with torch.inference_mode():
        fake = torch_internals.fake_of(torch_internals.make_fake_mode(), tensor)
    assert not fake.is_inference() and fake._version == 0


def test_an_autocast_object_s_settings_are_read_as_torch_autocast_took_them():
    region = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)
    assert torch_internals.autocast_arguments(region) == ("cpu", torch.bfloat16, True, False)
    off = torch.autocast("cpu", enabled=False)
    assert torch_internals.autocast_arguments(off)[2] is False


def test_torch_compiled_original_names_what_dynamo_would_inline():
    def f(x):
        return x + 1

    linear = torch.nn.Linear(2, 2)
    assert torch_internals.torch_compiled_original(torch.compile(f, backend="eager")) is f
    assert torch_internals.torch_compiled_original(torch.compile(linear)) is linear
    assert torch_internals.torch_compiled_original(torch.compiler.disable(f)) is None
    assert torch_internals.torch_compiled_original(f) is None
    assert torch_internals.torch_compiled_original(linear) is None


def test_parse_to_reads_to_s_arguments():
    assert torch_internals.parse_to(torch.float64) == (None, torch.float64, False, None)
    assert torch_internals.parse_to("cpu", dtype=torch.float16, non_blocking=True) == \
        (torch.device("cpu"), torch.float16, True, None)
