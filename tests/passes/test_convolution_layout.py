"""channels_last_convolutions: on the CPU a row-major image is convolved channels-last where
only ember's kernels produce the image and read the result; the values, the outputs' layouts
and the copies (one of the graph's input image, none between convolutions) against eager."""

import torch
import torch.nn.functional as F
from helpers import check, make

from ember import config
from ember.ir import Op
from ember.lower import trace
from ember.passes.convolution_layout import channels_last_convolutions


def _block(x, w1, w2, w3, mean, var):
    """conv -> batch norm (eval) -> relu6 -> depthwise conv -> relu -> 1x1 conv + residual:
    an inverted-residual block as MobileNet and EfficientNet have them."""
    h = F.conv2d(x, w1)
    h = F.relu6(F.batch_norm(h, mean, var, training=False))
    h = F.relu(F.conv2d(h, w2, padding=1, groups=h.shape[1]))
    return F.conv2d(h, w3) + x


def _args():
    return (make(2, 8, 6, 6), make(16, 8, 1, 1, seed=1), make(16, 1, 3, 3, seed=2),
            make(8, 16, 1, 1, seed=3), make(16, seed=4), make(16, low=0.5, high=2.0, seed=5))


def _switched(fn, *args) -> list[bool]:
    lowered = trace(torch.fx.symbolic_trace(fn), list(args))
    channels_last_convolutions(lowered.graph)
    return [n.attrs["operand_strides"][0][1] == 1 for n in lowered.graph.nodes
            if n.op is Op.LIBRARY]


def test_an_inverted_residual_block_runs_channels_last():
    args = _args()
    # (the residual add's kernel writes the output in eager's layout)
    assert _switched(_block, *args) == [True, True, True]
    graph = check(_block, *args, atol=1e-5, rtol=1e-5)
    source = graph.wrapper_source
    assert source.count("relaid(") == 1  # the input image, once
    assert source.count("relaid(in0") == 1


def test_a_result_a_library_call_reads_stays_row_major():
    def fn(x, w):
        return F.max_pool2d(F.conv2d(x, w), 2)

    args = make(2, 8, 6, 6), make(8, 8, 3, 3, seed=1)
    assert _switched(fn, *args) == [False, False]
    check(fn, *args, atol=1e-5, rtol=1e-5)


def test_a_convolution_whose_result_is_an_output_stays_row_major():
    args = _args()[:2]
    assert _switched(lambda x, w: F.conv2d(x.relu(), w), *args) == [False]


def test_switched_off():
    with config.override(convolution_layout="never"):
        assert _switched(_block, *_args()) == [False, False, False]


def test_float64_images_stay_row_major_on_the_cpu():
    """(oneDNN does not convolve float64: the slow path would copy each channels-last image
    back to row-major; float16 and bfloat16 switch)"""
    args = _args()
    assert _switched(_block, *(a.double() for a in args)) == [False, False, False]
    assert _switched(_block, *(a.bfloat16() for a in args)) == [True, True, True]
    assert _switched(_block, *(a.half() for a in args)) == [True, True, True]


def test_a_small_single_image_that_eager_convolves_on_its_slow_path_stays_row_major():
    """(eager convolves one image of at most 20480 values by an ungrouped 3x3 window on its
    slow path, which copies a channels-last image to row-major first: torchvision
    RetinaNet's head over its smaller FPN levels)"""
    def chain(x, w1, w2):
        return F.conv2d(F.conv2d(x, w1, padding=1).relu(), w2, padding=1).relu()

    weights = make(8, 8, 3, 3, seed=1), make(8, 8, 3, 3, seed=2)
    assert _switched(chain, make(1, 8, 6, 6), *weights) == [False, False]
    assert _switched(chain, make(2, 8, 6, 6), *weights) == [True, True]
    assert _switched(chain, make(1, 8, 64, 48), *weights) == [True, True]  # (24576 values)


def test_1x1_convolutions_switch_on_one_thread_where_the_matmul_pass_takes_them():
    """(on one thread eager's slow path takes a 1x1 filter over fewer than 16 images; the
    matmul pass runs it channels-last as a GEMM on a view of the image all the same)"""
    def chain(x, w1, w2):
        return F.conv2d(F.conv2d(x, w1).relu(), w2).relu()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = make(2, 8, 6, 6), make(8, 8, 1, 1, seed=1), make(8, 8, 1, 1, seed=2)
        assert _switched(chain, *args) == [True, True]
        with config.override(convolution_matmul=False):
            assert _switched(chain, *args) == [False, False]
    finally:
        torch.set_num_threads(threads)


def test_a_lone_convolution_of_an_input_stays_row_major():
    """(the input's copy to channels-last would cost what the convolution gains)"""
    args = _args()[:3]
    assert _switched(lambda x, w1: F.conv2d(x, w1).relu(), *args[:2]) == [False]
    # with a second convolution after it, both switch (the copy is paid once)
    assert _switched(lambda x, w1, w2: F.conv2d(F.conv2d(x, w1).relu(), w2, padding=1,
                                                groups=16).relu(), *args) == [True, True]


def test_a_strided_1x1_convolution_over_few_channels_stays_row_major():
    """(oneDNN's weight gradient of such a convolution over a channels-last image crashes
    the process; a RepVGG stem's shortcut over the RGB image, trained, met it)"""
    def stem(x, w3, w1, w):
        return F.conv2d(F.conv2d(x, w3, stride=2, padding=1) + F.conv2d(x, w1, stride=2),
                        w, padding=1).relu()

    args = (make(2, 3, 16, 16), make(8, 3, 3, 3, seed=1), make(8, 3, 1, 1, seed=2),
            make(8, 8, 3, 3, seed=3))
    assert _switched(stem, *args) == [True, False, True]


def test_a_repvgg_stem_trains_as_eager_does():
    import ember

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wide = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.shortcut = torch.nn.Conv2d(3, 8, 1, stride=2)
            self.next = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return self.next((self.wide(x) + self.shortcut(x)).relu()).relu().sum()

    torch.manual_seed(0)
    model, x = Stem(), torch.randn(4, 3, 32, 32)
    compiled = ember.compile(model)
    for _ in range(2):
        compiled(x).backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).backward()
        for have, want in zip(got, [p.grad for p in model.parameters()]):
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
        model.zero_grad()


def test_on_cuda_only_convolutions_cudnn_runs_faster_channels_last_switch():
    # (decided per convolution from its weight: the graph here is the CPU's, the rule the
    # one the pass applies to CUDA graphs)
    from ember.passes.convolution_layout import _faster_channels_last_on_cuda

    x = make(2, 32, 6, 6)
    cases = {  # weight, groups -> switched
        "depthwise": (make(32, 1, 3, 3), 32, True),
        "groups of two channels": (make(32, 2, 3, 3), 16, False),
        "fewer filters over a window": (make(16, 32, 3, 3), 1, False),
        "fewer filters, 1x1": (make(16, 32, 1, 1), 1, True),
        "as many filters": (make(32, 32, 3, 3), 1, True),
    }
    for name, (weight, groups, expected) in cases.items():
        lowered = trace(torch.fx.symbolic_trace(
            lambda x, w, groups=groups: F.conv2d(x, w, groups=groups)), [x, weight])
        (node,) = [n for n in lowered.graph.nodes if n.op is Op.LIBRARY]
        assert _faster_channels_last_on_cuda(node) is expected, name


def _train_block(x, w1, w2, w3):
    h = F.relu6(F.conv2d(x, w1))
    return F.conv2d(F.relu(F.conv2d(h, w2, padding=1, groups=h.shape[1])), w3) + x


def test_a_training_step_on_the_cpu_keeps_eager_s_layout():
    # (channels-last convolutions in training cost more than they gain on the CPU: ReXNet's
    # step 1.79x eager's time switched, 0.81x kept; passes.pipeline.CPU_INFERENCE_ONLY)
    from helpers import DEVICE, check_grad

    from ember.passes.pipeline import run_passes

    if DEVICE != "cpu":
        return
    args = _args()[:4]
    for merge in (True, False):  # (merge=False: a graph about to be differentiated)
        lowered = trace(torch.fx.symbolic_trace(_train_block), list(args))
        graph = run_passes(lowered.graph, merge=merge)
        layouts = [n.attrs["operand_strides"][0][1] == 1 for n in graph.nodes
                   if n.op is Op.LIBRARY and "operand_strides" in n.attrs]
        assert layouts and any(layouts) is merge
    check_grad(_train_block, *args, atol=1e-4, rtol=1e-4)
