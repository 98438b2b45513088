"""ember.codegen.wrapper: the generated Python that runs a plan (golden text), and what it
does at run time: library calls, outputs that are views, layout checks, index errors."""

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, captured_log, check

import ember
from ember.codegen.c import write_source
from ember.codegen.wrapper import LayoutMismatch, write_wrapper
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.runtime.compiled import make_function
from ember.schedule.fuse import schedule


def _wrappers(fn, *args):
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    graph = run_passes(lowered.graph)
    plan = schedule(graph)
    _, kernels = write_source(plan)
    sources = {k.name: k for k in kernels}
    return [write_wrapper(plan, lowered.outputs, lowered.output_tree, sources, {}, graph.device,
                          checked) for checked in (False, True)]


def _library_graph(x, w):
    h = (x * 2) @ w
    return torch.relu(h) + 1, h.t()


@pytest.mark.skipif(DEVICE == "cuda", reason="the golden text is the CPU wrapper's")
def test_wrapper_text_for_a_graph_with_a_library_call():
    fast, checked = _wrappers(_library_graph, torch.randn(3, 4), torch.randn(4, 5))
    assert fast.text == """\
def call(args):
    in0, in1 = args
    empty = plain_empty
    buf2 = empty((3, 4), (4, 1), float32)
    kernel0(in0.data_ptr(), buf2.data_ptr())
    lib1 = op0(buf2, in1)
    del buf2
    out0 = empty((3, 5), (5, 1), float32)
    kernel1(lib1.data_ptr(), out0.data_ptr())
    return (out0, lib1.as_strided((5, 3), (1, 5), lib1.storage_offset() + 0))
"""
    assert fast.namespace["op0"] is torch.ops.aten.mm.default
    # the first call checks that the library result has the layout the plan assumed
    assert checked.text == fast.text.replace(
        "    lib1 = op0(buf2, in1)\n",
        "    lib1 = op0(buf2, in1)\n"
        "    if not same_layout(lib1, (5, 1)): raise LayoutMismatch('lib1')\n"
        "    if shares_memory(lib1, buf2, in1): raise LayoutMismatch('lib1' + ' views an "
        "operand')\n")
    check(_library_graph, torch.randn(3, 4), torch.randn(4, 5), kernels=2)


def test_a_layout_the_plan_did_not_expect_raises_on_the_checked_call():
    _, checked = _wrappers(_library_graph, torch.randn(3, 4), torch.randn(4, 5))
    namespace = dict(checked.namespace)
    namespace["op0"] = lambda a, b: (b.t() @ a.t()).t()  # right values, transposed layout
    namespace.update(kernel0=lambda *pointers: 0, kernel1=lambda *pointers: 0)
    call = make_function(type(checked)(checked.text, namespace), "<test>")
    with pytest.raises(LayoutMismatch, match="lib1"):
        call([torch.randn(3, 4), torch.randn(4, 5)])


@pytest.mark.skipif(DEVICE == "cuda", reason="on CUDA an index out of range is a device-side "
                    "assert, as in eager: it leaves the process's CUDA context unusable")
def test_out_of_range_indices_raise_like_eager():
    def fn(x, index):
        return x[index] * 2

    x = torch.randn(5, 3)
    check(fn, x, torch.tensor([4, 0, -5]))
    compiled = check(fn, x, torch.tensor([1, 2]))
    with pytest.raises(IndexError) as eager:
        fn(x, torch.tensor([1, 5]))
    with pytest.raises(IndexError) as raised:  # (the kernel's check, then eager's message)
        compiled(x, torch.tensor([1, 5]))
    assert str(raised.value) == str(eager.value) == \
        "index 5 is out of bounds for dimension 0 with size 5"


def test_outputs_that_are_python_values_and_repeated_tensors():
    def fn(x):
        y = x + 1
        return y, y, 3, {"a": y * 2, "b": [x.shape[0]]}

    fast, _ = _wrappers(fn, torch.randn(4))
    assert "r0 = out0" in fast.text and "output_tree.unflatten(" in fast.text
    check(fn, torch.randn(4))


def test_a_view_returning_library_call_on_an_operand_laid_out_unlike_eagers_runs_eagerly():
    """pad by nothing lowers to its input, a sliced tensor; eager's result is a dense copy,
    and as_strided reads memory by strides: ember's first call sees the difference and the
    graph runs eagerly (with a warning) rather than answer wrongly."""
    def fn(x):
        return torch.as_strided(F.pad(x, (0, 0)), (2,), (1,)).sum()

    x = torch.arange(8.0)[::2]
    with captured_log("fallbacks") as records:
        check(fn, x, may_switch_to_eager=True)
    assert any("layout" in r.getMessage() for r in records)
    check(lambda x: torch.as_strided(x * 2, (2, 2), (1, 2)) + 1, x)  # laid out as eager's


def test_shares_memory_sees_a_result_that_views_an_operand():
    from ember.codegen.wrapper import shares_memory

    x = torch.randn(4, 6)
    assert shares_memory(x[:, 2:], torch.randn(2), x)
    assert not shares_memory(x.clone(), x)
    assert not shares_memory(torch.empty(0), x)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_large_buffers_take_the_huge_page_allocator_only_on_the_cpu(device):
    # (an operator-precedence slip once sent every large CUDA output to host memory: each
    # Triton launch then refused the pointer; the text is written without a GPU)
    from ember.codegen.wrapper import _Writer
    from ember.runtime import memory
    from ember.schedule.plan import Buffer, Plan

    large = Buffer("out0", (memory.MIN_BYTES,), (1,), torch.float32, "output")
    small = Buffer("buf1", (4,), (1,), torch.float32, "temp")
    plan = Plan(graph=None, steps=[], buffer_of={}, inputs=[], outputs=[large],
                buffers=[large, small])
    writer = _Writer(plan, torch.device(device))
    writer.allocate(large)
    writer.allocate(small)
    assert ("empty_cpu(" in writer.lines[0]) == (device == "cpu")
    assert "empty_cpu" not in writer.lines[1]


def test_ember_profile_names_each_kernel_and_library_call_in_torch_profiler():
    # EMBER_PROFILE=1: a profile of a compiled call shows one labelled event per kernel
    # launch and per library call, with the answer unchanged
    from torch.profiler import ProfilerActivity, profile

    import ember
    from ember import config

    def fn(x, w):
        return torch.relu(x @ w + 1).sum(-1)

    # (the CPU: on CUDA a matmul this small is computed inside the kernel that reads it)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with config.override(profile=True, warm_start=False):
        compiled = ember.compile(fn)
        torch.testing.assert_close(compiled(x, w), fn(x, w))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                compiled(x, w)
    labels = {e.key: e.count for e in prof.key_averages() if e.key.startswith("ember ")}
    kernels = [k for k in labels if not k.startswith("ember aten.")]
    library = [k for k in labels if k.startswith("ember aten.mm")]
    assert len(kernels) == 1 and labels[kernels[0]] == 3, labels
    assert "sum" in kernels[0] and "[8, 4]" in kernels[0], kernels
    assert len(library) == 1 and labels[library[0]] == 3, labels


def _multi_query_attention(x, w):
    # GPT-BigCode's multi-query attention: one key and value head, put after an empty cache
    # (a cat: eager's copy is contiguous, ember's a view of the projection) and repeated over
    # the query heads by an expand that a reshape keeps a view (stride 0), as sdpa's operand
    b, s = x.shape[:2]
    query, key, value = (x @ w).unsqueeze(1).split((64, 16, 16), dim=3)
    query = query.view(b, s, 4, 16).transpose(1, 2)
    empty = x.new_zeros(b, 1, 0, 16)
    key, value = (torch.cat([empty, t], dim=-2)[:, :, None].expand(b, 1, 4, s, 16)
                  .reshape(b, 4, s, 16) for t in (key, value))
    return F.scaled_dot_product_attention(query, key, value, is_causal=True)


def test_a_library_operand_that_eager_passes_expanded_is_relaid_as_an_expand():
    # eager's key and value have stride 0 over the heads; ember's buffer lies otherwise, so
    # the wrapper relays them out as eager passes them (a copy into stride-0 memory raised,
    # and the graph ran eagerly from then on)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 64, generator=generator)
    w = torch.randn(64, 96, generator=generator) / 8
    check(_multi_query_attention, x, w)


def _attention_over_its_cache(x, w):
    # a decoder's layer with a cache, as Hugging Face's GPT-2 runs in training: key and value
    # split from one projection are concatenated after the empty cache (eager's copy, returned
    # as the cache) and attention reads that copy
    parts = (x @ w).split(64, dim=2)
    query, key, value = (parts[i].view(2, 12, 4, 16).transpose(1, 2) for i in range(3))
    key = torch.cat([x.new_zeros(0), key], dim=-2)
    value = torch.cat([x.new_zeros(0), value], dim=-2)
    return F.scaled_dot_product_attention(query, key, value, is_causal=True), key, value


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU's attention kernel and copies")
def test_a_library_operand_that_an_output_copies_into_eagers_layout_reads_that_output():
    # the returned key and value are copies laid out as eager's attention takes them: the
    # call reads them instead of a second copy of its own (`relaid`, two a layer on GPT-2)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 64, generator=generator)
    w = torch.randn(64, 192, generator=generator) / 8
    compiled = check(_attention_over_its_cache, x, w, kernels=2)
    assert "relaid" not in compiled.wrapper_source, compiled.wrapper_source


def test_a_symbolic_graph_reads_each_inputs_shape_once():
    # (one torch.Size a tensor, unpacked where it gives several: the sizes are read on every
    # call; y's rows are x's, s0)
    def fn(x, y):
        return (x * 2).sum(-1) + y[:, 0]

    compiled = ember.compile(fn, dynamic=True)
    for n, m in ((3, 5), (6, 2)):
        x, y = torch.randn(n, m), torch.randn(n, 4)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    source = compiled.records[0].compiled.wrapper_source
    assert "s0, s1 = in0.shape\n    s2 = in1.shape[1]\n" in source, source
