"""Row-major images convolved channels-last, where nothing but ember's kernels sees the
difference.

Eager convolves a row-major (NCHW) image as it lies. On the CPU: its slow path's per-image
GEMMs, oneDNN with a reorder of the image and of the result; channels-last, oneDNN's depthwise
kernels run about twice as fast and a 1x1 convolution is a GEMM on a view of the image
(`convolutions_as_matmuls`): EfficientNet-B0's convolutions at 64x64, batch 4, take 4.0 ms
channels-last against 6.4 as eager lays them out.

On CUDA a row-major depthwise convolution runs ATen's own kernel (EfficientNet-B0's, bf16,
batch 32, 224x224: 1.0 ms of a 2.5 ms call on an H100) where cuDNN's channels-last kernels
run about twice as fast. The switch was once slower there as a whole (call 48: ember's
kernels read channels-last images across the grain, the squeeze-excite means over the
pixels); since reductions over a strided dim tile across the contiguous one, it is faster:
on an H100 (2026-12-06, one process, interleaved rounds, ms) EfficientNet-B0 2.27 against
3.21 row-major (torch.compile 2.97), MobileNetV3 1.74 against 1.89 (2.17), ResNet-50 and
ConvNeXt unchanged (their images are channels-last already, or their convolutions not
switched). EMBER_CONVOLUTION_LAYOUT=never keeps eager's layouts; =always switches on CUDA
also the convolutions that the rule below keeps (cuDNN's slower ones).

A convolution is switched when its image is computed by ember's kernels (or is an input of
the graph: then the wrapper copies it, once) and only ember's kernels read its result: they
read any layout by its strides, and the kernel that computes the next convolution's image
writes it channels-last (a library operand's buffer takes the layout the call is given).
A library call reading either would be handed a copy in eager's layout: those stay as they
are. Values: eager's algorithms on other layouts, equal up to the order of the sums.
"""

from __future__ import annotations

import torch

from ember import config
from ember.ir.graph import Graph, Node, row_major
from ember.ir.library import Slot
from ember.ir.ops import VIEWS, Op
from ember.lower.layout import eager_layout
from ember.passes.convolution_calls import (
    ConvolutionCall,
    channels_last,
    convolution_call,
    uses_onednn,
)

aten = torch.ops.aten


def channels_last_convolutions(graph: Graph) -> int:
    """Give each switchable convolution a channels-last image and result; changes made."""
    if config.settings.convolution_layout == "never" or graph.device.type not in ("cpu", "cuda"):
        return 0
    users = graph.users()
    outputs = set(graph.outputs) | {node for _, node in graph.writebacks}
    changed = 0

    def read_by_kernels_only(node: Node) -> bool:
        return node not in outputs and all(
            r.op is not Op.LIBRARY and r.op is not Op.ITEM and
            (r.op not in VIEWS or read_by_kernels_only(r)) for r in users.get(node, []))

    every = config.settings.convolution_layout == "always"  # (the CUDA rule overridden)
    candidates = [node for node in graph.nodes
                  if _switchable(node, outputs, read_by_kernels_only)
                  and (graph.device.type != "cuda" or every or
                       _faster_channels_last_on_cuda(node))
                  and (graph.device.type != "cpu" or
                       (not _crashes_one_dnn(node) and _one_dnn_convolves(node)))]
    for node in candidates:
        if node.inputs[node.attrs["args"][0].index].op is Op.INPUT and len(candidates) < 2:
            continue  # (a lone convolution of an input: the copy would cost what it gains)
        args = node.attrs["args"]
        layouts = list(node.attrs["operand_strides"])
        x = node.inputs[args[0].index]
        layouts[args[0].index] = channels_last(x.shape)
        metas = [torch.empty_strided(n.shape, strides or row_major(n.shape), dtype=n.dtype,
                                     device="meta") for n, strides in zip(node.inputs, layouts)]
        tensors = [metas[a.index] if isinstance(a, Slot) else a for a in args]
        result = eager_layout(aten.convolution.default, tuple(tensors), {},
                              aten.convolution.default(*tensors), graph.device.type)
        strides = tuple(result.stride())
        node.attrs["operand_strides"] = tuple(layouts)
        node.attrs["results"] = ((tuple(result.shape), result.dtype, strides),)
        node.strides = strides
        changed += 1
    return changed


def _switchable(node: Node, outputs: set[Node], read_by_kernels_only) -> bool:
    """A 2-d convolution of a row-major image into a row-major result, where the image is
    ember's to lay out (computed by a kernel, or an input) and kernels alone read the
    result."""
    call = convolution_call(node)
    if call is None:
        return False
    args = node.attrs["args"]
    layouts = node.attrs.get("operand_strides") or ()
    if call.transposed or \
            len(layouts) != len(node.inputs) or node.ndim != 4 or \
            not node.dtype.is_floating_point or \
            not all(type(d) is int for n in (node, *node.inputs) for d in n.shape):
        return False
    x = call.x
    return x.shape[1] > 1 and layouts[args[0].index] == row_major(x.shape) and \
        tuple(node.attrs["results"][0][2]) == row_major(node.shape) and \
        x.op not in (Op.LIBRARY, Op.ITEM) and x not in outputs and \
        read_by_kernels_only(node)


def _crashes_one_dnn(node: Node) -> bool:
    """A 1x1 convolution with a stride: oneDNN's weight gradient for it over a channels-last
    image can take the process down (a segfault, or a heap corrupted silently and found
    later, in aten.convolution_backward; torch 2.13 on a CPU without AVX-512; eager's
    row-major image never meets it): RepVGG's strided 1x1 shortcut over the RGB image, in
    training. Seen with 2 to 7 channels in one call each; a sweep of layouts showed it over
    1 channel too, so every such convolution keeps eager's layout (a 3x3 window, stride 1:
    no crash)."""
    call = convolution_call(node)
    _, _, kh, kw = call.weight.shape
    return (kh, kw) == (1, 1) and any(s > 1 for s in call.stride)


def _one_dnn_convolves(node: Node) -> bool:
    """Would eager convolve this image channels-last without copying it back? Where torch
    picks its slow path (per-image GEMMs) for a float32 or float64 one, that path copies a
    channels-last image to row-major first: timm's ResNet-18 in float64 (batch 2, 96x96, 2
    threads, 2026-12-07) took 57.6 ms switched against 40.5 as eager lays it out (eager
    42.0); torchvision RetinaNet's head, whose smaller FPN levels (1x256x8x8 and below, 120
    of its 150 convolutions) take the slow path, 89 ms against 56. bfloat16 and float16 take
    the slow path too on a CPU without their oneDNN kernels, and there switched runs faster
    (ResNet-18: 84 and 96 ms against 276 and 275, eager 271 and 278): they switch."""
    if node.dtype in (torch.bfloat16, torch.float16):
        return True
    call = convolution_call(node)
    if _a_matmul_on_the_image(call):
        return True
    return uses_onednn(call.x, channels_last(call.x.shape), call.weight,
                       row_major(call.weight.shape), call.stride, call.padding, call.dilation,
                       call.groups)


def _a_matmul_on_the_image(call: ConvolutionCall) -> bool:
    """A float32 1x1 convolution without stride or padding: channels-last, the matmul pass
    (convolution_matmul.convolutions_as_matmuls) runs it as one GEMM on a view of the image,
    whatever eager would call — no copy. (Kept row-major where eager takes its slow path —
    1x1 filters over fewer than 16 images on one thread — they lost that GEMM: one zoo run
    read timm's ResNet-50 inference at 1.02x eager's time against 0.60x at noon.)"""
    return config.settings.convolution_matmul and call.x.dtype == torch.float32 and \
        tuple(call.weight.shape[2:]) == (1, 1) and all(s == 1 for s in call.stride) and \
        not any(call.padding) and call.groups == 1


def _faster_channels_last_on_cuda(node: Node) -> bool:
    """cuDNN's channels-last kernels are not faster for every convolution: a grouped one whose
    groups take more than one channel each can run many times slower (31x for 224 channels
    in two groups at 112x112, by the measurements behind Inductor's layout choice), and one
    with half as many filters as input channels or fewer, over a window, slower too. A
    depthwise one (one channel a group) runs about 1.9x faster there."""
    call = convolution_call(node)
    filters, per_group, kh, kw = call.weight.shape
    if call.groups > 1 and per_group > 1:
        return False
    return not (filters * 2 <= per_group and kh * kw > 1)
