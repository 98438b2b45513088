"""ember.schedule.fuse: fusion decisions, counted exactly, and the plans they give."""

import torch
import torch.nn.functional as F
from helpers import captured_log, check

from ember.codegen.triton_module import readers
from ember.lower import trace
from ember.passes.pipeline import run_passes
from ember.schedule.fuse import schedule
from ember.schedule.plan import Copy, Kernel, LibraryCall


def _plan(fn, *args):
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    return schedule(run_passes(lowered.graph, check=True))


def _steps(plan):
    return [type(step).__name__ for step in plan.steps]


def test_a_pointwise_chain_is_one_kernel():
    check(lambda x: torch.sigmoid(x * 2 + 1).exp() - x, torch.randn(8, 16), kernels=1)


def test_independent_outputs_of_one_shape_share_a_kernel_with_a_store_each():
    def fn(x, y):
        return x + y, x * y, (x - y).t()

    x, y = torch.randn(8, 16), torch.randn(8, 16)
    check(fn, x, y, kernels=1)
    (kernel,) = _plan(fn, x, y).steps
    assert len(kernel.stores) == 3 and all(s.buffer.role == "output" for s in kernel.stores)


def test_a_reduction_and_its_pointwise_epilogue_are_one_kernel():
    check(lambda x: x.sum(1, keepdim=True) * 2 + x, torch.randn(8, 16), kernels=1)
    check(lambda x: F.softmax(x, -1), torch.randn(8, 16), kernels=1)
    check(lambda x: F.softmax(x, 0), torch.randn(8, 16), kernels=1)
    check(lambda x: (x.sum(1), x.amax(1), x.argmax(1)), torch.randn(8, 16), kernels=1)


def test_a_reduction_read_transposed_needs_a_second_kernel():
    def fn(x):
        return x.exp().sum(1).reshape(2, 4).t() * 3

    check(fn, torch.randn(8, 16), kernels=2)
    plan = _plan(fn, torch.randn(8, 16))
    first, second = plan.steps
    assert first.axes == (1,) and second.axes == ()
    assert [s.buffer.role for s in first.stores] == ["temp"]


def test_library_calls_are_kernel_boundaries():
    def fn(x, w):
        return torch.relu((x * 2) @ w) + 1

    compiled = check(fn, torch.randn(8, 16), torch.randn(16, 4), kernels=2)
    assert compiled.library_count == 1
    assert _steps(_plan(fn, torch.randn(8, 16), torch.randn(16, 4))) == \
        ["Kernel", "LibraryCall", "Kernel"]


def test_a_view_of_an_input_goes_to_a_library_call_without_a_copy():
    def fn(x, w):
        return x.t()[1:] @ w

    x, w = torch.randn(16, 8), torch.randn(16, 4)
    compiled = check(fn, x, w, kernels=0)
    plan = _plan(fn, x, w)
    (call,) = plan.steps
    assert isinstance(call, LibraryCall) and call.inputs[0].role == "alias"
    assert compiled.library_count == 1


def test_one_view_feeding_two_library_calls():
    """Regression: a view that was already a library operand was aliased to itself and
    building its buffer recursed forever."""
    def fn(x):
        y = x.sum(0)
        return torch.pow(y, 2), torch.pow(y, 3)  # integer powers are library calls

    check(fn, torch.arange(12).reshape(3, 4))


def test_a_kernel_reads_an_output_alias_of_its_own_value_through_its_index_map():
    """Regression: an output returned as a view of a reduction computed in the same kernel
    was loaded before the kernel stored it."""
    def fn(x, y):
        total = torch.sum(y)
        return total + x, total

    check(fn, torch.tensor(-0.25), torch.tensor(-0.25, dtype=torch.float64), kernels=1)


def test_a_written_input_is_updated_in_place_unless_its_old_value_is_read_later():
    def in_place(x):
        x.mul_(2)
        return x.sum()

    def read_later(x):
        old = x.t() * 1      # read transposed: not at the index being written
        x.add_(1)
        return old

    x = torch.randn(6, 6)
    check(in_place, x)
    assert not any(isinstance(s, Copy) for s in _plan(in_place, x).steps)
    check(read_later, x)


def test_costly_shared_values_are_computed_once():
    def fn(x):
        shared = x
        for _ in range(14):
            shared = torch.sin(shared) * 1.5 + 0.1
        return shared.sum(0), shared.sum(1)

    plan = _plan(fn, torch.randn(8, 16))
    kernels = [s for s in plan.steps if isinstance(s, Kernel)]
    assert any(s.buffer.role == "temp" for k in kernels for s in k.stores)
    check(fn, torch.randn(8, 16))


def test_a_residual_stream_is_stored_once_per_layer_not_recomputed_by_each():
    # x = x + linear(norm(x)) per layer: each residual sum is read by the next layer's norm
    # and by the next sum; inlined, the last layer's kernel would read every layer's output
    def fn(x, w0, w1, w2, w3, w4):
        for w in (w0, w1, w2, w3, w4):
            x = x + F.layer_norm(x, (16,)) @ w
        return x

    args = (torch.randn(8, 16), *(torch.randn(16, 16) for _ in range(5)))
    plan = _plan(fn, *args)
    check(fn, *args, kernels=5)
    kernels = [s for s in plan.steps if isinstance(s, Kernel)]
    # every norm kernel but the first computes and stores the sum it normalizes; each reads
    # one product (the layer's), none reads an earlier layer's; the last sum, the output that
    # nothing reads, is an addmm onto the previous sum (matmuls_onto_sums)
    assert [len(k.stores) for k in kernels] == [1, 2, 2, 2, 2]
    read_by = readers(plan)
    products = [s.outputs[0].root() for s in plan.steps if isinstance(s, LibraryCall)]
    assert all(len(read_by[product]) == 1 for product in products[:-1])
    assert plan.steps[-1].node.attrs["target"] is torch.ops.aten.addmm.default


def test_an_output_viewing_a_library_result_is_that_result():
    # a linear's result reshaped and returned (a model's logits): no copy kernel
    def fn(x, w):
        return torch.nn.functional.linear(x, w).reshape(2, 4, 6)

    compiled = check(fn, torch.randn(8, 16), torch.randn(6, 16), kernels=0)
    assert compiled.library_count == 1


# Library ops that return a view of their operand (as_strided has no lowering rule; view(dtype)
# reinterprets bits): their results share memory with the operand's buffer.
def test_memory_viewed_by_a_library_result_is_not_reused_while_it_lives():
    def fn(x, w):
        y = x * 2
        z = torch.as_strided(y, (4, 4), (1, 4))     # a view of y's buffer
        b = torch.relu((x.sum(0, keepdim=True) * 3) @ w + 1)
        return (z + b.sum()).contiguous(), b        # new buffers born after y's last use

    check(fn, torch.randn(4, 4), torch.randn(4, 4))


def test_a_temporary_laid_out_as_a_slice_takes_no_smaller_memory():
    # the second convolution's operand is half a channel shuffle, laid out as eager's slice
    # of the whole (a batch stride of 16 channels' worth for 8): it spans 1536 bytes for its
    # 1024 bytes of elements, and the dead ReLU temporary of the same element count is too
    # small for it (ShuffleNetV2's blocks overran the heap: glibc aborted the program)
    def fn(x, w):
        a = F.conv2d(torch.relu(x), w)
        z = torch.cat([a, a.sin()], 1)
        half = z.view(2, 2, 8, 4, 4).transpose(1, 2).reshape(2, 16, 4, 4).chunk(2, 1)[1]
        return F.conv2d(half, w)

    x, w = torch.randn(2, 8, 4, 4), torch.randn(8, 8, 1, 1)
    plan = _plan(fn, x, w)
    sliced = [step.stores[0].buffer for step in plan.steps if isinstance(step, Kernel)][-1]
    assert sliced.strides == (256, 16, 4, 1) and sliced.nbytes == 1536
    assert all(new.nbytes <= old.nbytes for new, old in plan.reuse.items())
    check(fn, x, w)


def test_an_input_read_through_a_library_view_is_not_overwritten_before_the_read():
    def fn(x):
        z = torch.as_strided(x, (4, 4), (1, 4))
        w = z * 1                                   # simplified to z itself
        x.add_(1)
        return w

    check(fn, torch.randn(4, 4))


def test_library_operands_have_eagers_layout():
    def strided(x):
        return torch.as_strided(x.t() * 2, (3, 2), (1, 3)) + 1

    def bits(x):
        return (x.t() * 2).view(torch.int32) + 1

    for fn in (strided, bits):
        with captured_log("fallbacks") as records:
            check(fn, torch.randn(4, 3))
        assert not records  # no layout mismatch, no eager fallback


def test_a_value_computed_from_a_channels_last_input_is_stored_channels_last():
    """Its kernel streams the input and its own buffer alike (row-major, the store walked
    across the grain); from row-major inputs, row-major."""
    def fn(x):
        y = x
        for _ in range(8):  # (costly: two reductions read it, so it is stored once)
            y = torch.tanh(y * 1.1 + 0.1)
        return y.sum(1), y.sum((2, 3))

    for layout, strides in ((torch.channels_last, (144, 1, 24, 4)),
                            (torch.contiguous_format, (144, 36, 6, 1))):
        x = torch.randn(2, 4, 6, 6).contiguous(memory_format=layout)
        plan = _plan(fn, x)
        (temp,) = [s.buffer for step in plan.steps if isinstance(step, Kernel)
                   for s in step.stores if s.buffer.shape == (2, 4, 6, 6)]
        assert temp.strides == strides
        check(fn, x, atol=1e-5, rtol=1e-5)


def _temps(plan, shape):
    return [s.buffer.strides for step in plan.steps if isinstance(step, Kernel)
            for s in step.stores if s.buffer.shape == shape and s.buffer.role == "temp"]


def test_a_pad_of_a_channels_last_image_is_stored_channels_last():
    # (ResNet's max pool after its stem: the pool's window reads the padded image, which
    # takes the image's order though its sizes differ)
    def fn(x):
        for _ in range(8):  # (costly: the pool's taps read it from a buffer of its own)
            x = torch.tanh(x * 1.1 + 0.1)
        return F.max_pool2d(x, 3, 2, 1) * 2

    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last)
    assert _temps(_plan(fn, x), (2, 4, 7, 7)) == [(196, 1, 28, 4)]  # (as the pool reads it)
    check(fn, x, atol=1e-5, rtol=1e-5)


def test_a_broadcast_operand_lends_no_order():
    # ViT's token stream: a class token before the patches, plus a position embedding of one
    # image broadcast over the batch: the stream is row-major (as its layer norms read it),
    # whatever order the embedding's size-1 batch dim could be said to have
    def fn(image, cls, pos):
        patches = image.flatten(2).transpose(1, 2)  # (the patch embedding's result)
        x = torch.cat([cls.expand(image.shape[0], -1, -1), patches], 1) + pos
        for _ in range(8):  # (costly: stored once, read by two reductions)
            x = torch.tanh(x * 1.1 + 0.1)
        return F.layer_norm(x, (8,)), x.sum(1)

    args = torch.randn(3, 8, 2, 2), torch.randn(1, 1, 8), torch.randn(1, 5, 8)
    assert _temps(_plan(fn, *args), (3, 5, 8)) == [(40, 8, 1)]
    check(fn, *args, atol=1e-5, rtol=1e-5)


def test_a_costly_value_read_at_each_tap_of_a_window_is_computed_once():
    """A max pool over exp(x) * 3: the pool's nine taps would compute exp at each; the
    padded image is a buffer of its own, read by the pool's kernel."""
    def fn(x):
        return F.max_pool2d(torch.exp(x).sin() * 3 + x.cos(), 3, 2, 1)

    check(fn, torch.randn(2, 3, 8, 8), kernels=2)
    check(lambda x: F.max_pool2d(x * 2 + 1, 3, 2, 1), torch.randn(2, 3, 8, 8), kernels=1)


def test_a_transposed_gradient_operand_views_the_gradient_as_computed():
    # ViT's qkv projection: the output's gradient comes back through a reshape of a permute
    # (not a strided view of the value computed); the weight's product takes it transposed.
    # The reshape is stored as computed and both products read views of it: one kernel, not
    # a second that wrote the transpose across the grain (110 us a layer on the H200)
    from helpers import check_grad

    def fn(x, w):
        u = F.linear(x, w).reshape(4, 10, 3, 3, 8).permute(2, 0, 3, 1, 4)
        return (u * u.tanh()).sum()

    generator = torch.Generator().manual_seed(0)
    graph = check_grad(fn, torch.randn(4, 10, 24, generator=generator),
                       torch.randn(72, 24, generator=generator) / 4)
    plan = graph.backward_graph.plan
    kernels = [step for step in plan.steps if isinstance(step, Kernel)]
    assert len(kernels) == 1, [step.shape for step in kernels]


def test_a_copied_operand_views_a_value_as_that_value_is_finally_laid_out():
    # t is passed to the second product as a strided view of x * 2 (no buffer of its own); the
    # reshape that copies it, the first product's operand, is then no view of t: it is computed
    # into a buffer of its own (judged before t's alias, t was taken as row-major and the
    # reshape as a view of it, with no buffer to view: the graph ran eagerly)
    def fn(x, w, v):
        t = (x * 2).t()
        return t.reshape(4, 9) @ w, t @ v

    generator = torch.Generator().manual_seed(0)
    check(fn, torch.randn(6, 6, generator=generator), torch.randn(9, 5, generator=generator),
          torch.randn(6, 3, generator=generator), kernels=2)


def test_a_costly_value_a_sum_reads_broadcast_is_computed_once():
    # (Mamba-2's chunked scan: SiLU(x)·exp(dt) summed against a wider operand, 16 times the
    # value's size; inlined, its exp and sigmoid ran at every point of the sum's space:
    # Bamba's forward 1.9x eager's time on the CPU, 0.44x computed once)
    def scan(x, dt, b):
        gated = F.silu(x) * torch.exp(dt - dt.amax())  # (chunk, state): four ops and more
        return (gated[:, None, :] * b).sum(-1)

    x, dt, b = torch.randn(64, 32), torch.randn(64, 32), torch.randn(64, 16, 32)
    check(scan, x, dt, b, kernels=2, atol=1e-5, rtol=1e-5)
    first, summed = _plan(scan, x, dt, b).steps
    # (the max, then the gated value stored once at its own size; the sum reads it)
    assert len(first.members) == 2 and [s.buffer.shape for s in first.stores] == [(64, 32)]
    assert len(summed.members) == 1

    def cheap(x, b):  # (a value of few ops stays inlined: a layer norm's rsqrt per row)
        return (torch.rsqrt(x + 1)[:, None, :] * b).sum(-1)

    check(cheap, x.abs(), b, kernels=1, atol=1e-5, rtol=1e-5)
