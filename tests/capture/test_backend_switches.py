"""torch's backend switches in compiled code (ember/runtime/switches.py): a with-block over
`torch.backends.cudnn.flags(...)` or `torch.nn.attention.sdpa_kernel(...)` is captured — no
break — and what eager would run under it runs under it: a library call made inside the block
sees the block's flags at run time, one made outside it does not, and the flags are the
caller's again after the call. A custom op that reads the flags makes them visible; every
test compares with eager and counts graphs and breaks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from checks import same
from torch.nn.attention import SDPBackend, sdpa_kernel

import ember
from ember.lower import Unsupported, lowerings
from ember.runtime.partitioned import PartitionedGraph

NS = "ember_switches_test"


@torch.library.custom_op(f"{NS}::plus_flags", mutates_args=())
def plus_flags(x: torch.Tensor) -> torch.Tensor:
    """x + what cuDNN's flags are at the call (enabled: 1, deterministic: 2)."""
    cudnn = torch.backends.cudnn
    return x + float(cudnn.enabled) + 2 * float(cudnn.deterministic)


@plus_flags.register_fake
def _(x):
    return torch.empty_like(x)


def t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       device="cpu").to(torch.get_default_device())


def flags():
    return torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic


def inside_and_outside(x):
    y = plus_flags(x.sin())
    with torch.backends.cudnn.flags(enabled=False, deterministic=True):
        z = plus_flags(y * 2)
    return z + plus_flags(y)


def nested(x):
    with torch.backends.cudnn.flags(enabled=False):
        a = plus_flags(x)
        with torch.backends.cudnn.flags(enabled=True, deterministic=True):
            b = plus_flags(a.cos())
        c = plus_flags(b)
    return a, b, c


@pytest.mark.parametrize("fn", [inside_and_outside, nested])
def test_library_calls_inside_the_block_run_under_its_flags(fn):
    report = ember.explain(fn)(t(6))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    before = flags()
    compiled = ember.compile(fn, fullgraph=True)
    for seed in range(3):
        same(compiled(t(6, seed=seed)), fn(t(6, seed=seed)))
        assert flags() == before


def test_a_flag_passed_in_is_guarded():
    def fn(x, enabled):
        with torch.backends.cudnn.flags(enabled=enabled):
            return plus_flags(x) * 2

    compiled = ember.compile(fn, fullgraph=True)
    for enabled in (False, True, False):
        same(compiled(t(4), enabled), fn(t(4), enabled))
    assert len(compiled.records) == 2


def attention(q, k, v, backends):
    with sdpa_kernel(backends) as bound:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.sin(), bound


@pytest.mark.parametrize("backends", [[SDPBackend.MATH], SDPBackend.MATH,
                                      [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]])
def test_sdpa_kernel_is_captured_and_eager_s_choice_made_under_it(backends):
    q, k, v = (t(2, 3, 16, 8, seed=s) for s in range(3))
    report = ember.explain(attention)(q, k, v, backends)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    compiled = ember.compile(attention, fullgraph=True)
    for _ in range(2):
        same(compiled(q, k, v, backends), attention(q, k, v, backends))
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()


def test_math_attention_is_the_composite_where_eager_s_own_choice_is_one_kernel():
    """On the CPU eager's attention picks its flash kernel for these inputs (one library
    call); under sdpa_kernel(MATH) eager runs the math composite: two matrix products called
    from the library, the scaling, mask and softmax between them fused."""
    if torch.get_default_device().type != "cpu":
        pytest.skip("the CPU's choice of kernel")
    q, k, v = (t(2, 3, 16, 8, seed=s) for s in range(3))

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sin()

    counts = []
    for fn in (plain, lambda q, k, v: attention(q, k, v, [SDPBackend.MATH])[0]):
        compiled = ember.compile(fn, fullgraph=True)
        same(compiled(q, k, v), fn(q, k, v))
        counts.append(compiled.records[0].compiled.library_count)
    assert counts == [1, 2]


def test_an_eager_island_inside_the_block_runs_under_its_flags(monkeypatch):
    def refused(*args, **kwargs):
        raise Unsupported("aten.cos refused by the test")

    monkeypatch.setitem(lowerings, torch.ops.aten.cos.default, refused)
    compiled = ember.compile(nested, fullgraph=True)
    for seed in range(2):
        same(compiled(t(6, seed=seed)), nested(t(6, seed=seed)))
    assert isinstance(compiled.records[0].compiled, PartitionedGraph)
    assert flags() == (True, False)


def test_a_break_inside_the_block_says_where_and_the_program_runs_as_eager():
    def fn(x):
        with torch.backends.cudnn.flags(enabled=False):
            y = plus_flags(x)
            print("inside")
            return plus_flags(y)

    report = ember.explain(fn)(t(4))
    assert report.graph_break_count == 1
    assert "inside a with-block of torch.backends.cudnn.flags(enabled=False)" in \
        str(report.break_reasons[0])
    compiled = ember.compile(fn)
    same(compiled(t(4)), fn(t(4)))
    assert flags() == (True, False)


def test_a_switch_over_a_tensor_s_value_breaks_the_graph():
    def fn(x):
        with torch.backends.cudnn.flags(enabled=bool(x.sum() > 0)):
            return plus_flags(x)

    report = ember.explain(fn)(t(4))
    assert report.graph_break_count >= 1
    compiled = ember.compile(fn)
    for x in (t(4).abs(), -t(4).abs()):
        same(compiled(x), fn(x))
