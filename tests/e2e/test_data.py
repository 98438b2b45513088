"""Creation and data movement against eager: full/arange/eye, tril/triu, cat/stack, pad,
flip/roll/repeat, indexing (index_select, embedding, gather, advanced indexing)."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE, LAYOUTS, check, check_grad, make, make_layout, watching_fallbacks

from ember.backends import compile_graph
from ember.runtime.compiled import CompiledGraph

aten = torch.ops.aten


@pytest.mark.skipif(DEVICE == "cuda", reason="under torch.set_default_device('cuda') Dynamo's "
                    "fake tensors and FX constants of these factory calls land on the CPU")
def test_creation():
    def fn(x):
        return {"full": torch.full((3, 4), 2.5), "full_int": torch.full((2, 3), 7),
                "full_bool": torch.full((2,), True), "zeros": torch.zeros(2, 3),
                "ones_i32": torch.ones(3, dtype=torch.int32), "zeros_like": torch.zeros_like(x),
                "ones_like_f64": torch.ones_like(x, dtype=torch.float64),
                "full_like": torch.full_like(x, -1.5), "new_zeros": x.new_zeros(2, 2),
                "new_ones": x.new_ones((3,)), "new_full": x.new_full((2, 1), 4.0),
                "empty_filled": torch.empty(2, 3).fill_(3.0),
                "empty_like_zeroed": torch.empty_like(x).zero_(),
                "scalar_tensor": torch.scalar_tensor(4.5) + x.sum(),
                "zeros_empty": torch.zeros(0, 3), "zero_dim": torch.ones(())}

    # Dynamo keeps factory calls in the graph (torch.fx.symbolic_trace would fold them)
    check(fn, make(3, 4), library=0, dynamo=True)


ARANGES = {
    "int": lambda: torch.arange(10), "start": lambda: torch.arange(3, 11),
    "step": lambda: torch.arange(2, 20, 3), "negative_step": lambda: torch.arange(10, -5, -2),
    "float": lambda: torch.arange(0.0, 1.0, 0.1),
    "float_negative": lambda: torch.arange(1, -1, -0.3),
    "float_step_int_bounds": lambda: torch.arange(0, 5, 0.5),
    "dtype": lambda: torch.arange(5, dtype=torch.float16),
    "int32": lambda: torch.arange(-3, 4, dtype=torch.int32), "empty": lambda: torch.arange(5, 5),
    "linspace": lambda: torch.linspace(0, 1, 7), "linspace_one": lambda: torch.linspace(-2, 2, 1),
    "linspace_int": lambda: torch.linspace(0, 10, 4, dtype=torch.int64),
    "linspace_half": lambda: torch.linspace(-1, 1.3, 9, dtype=torch.float16),
    "linspace_double": lambda: torch.linspace(-3, 1e3, 100, dtype=torch.float64),
    "linspace_long": lambda: torch.linspace(0.1, 7.3, 1001),
}


@pytest.mark.skipif(DEVICE == "cuda", reason="under torch.set_default_device('cuda') Dynamo's "
                    "fake tensors and FX constants of these factory calls land on the CPU")
def test_arange_and_linspace():
    # Dynamo keeps factory calls in the graph; the input keeps the graph on a device
    check(lambda x: {"x": x * 2, **{name: fn() for name, fn in ARANGES.items()}}, make(3),
          library=0, dynamo=True)


@pytest.mark.skipif(DEVICE == "cuda", reason="under torch.set_default_device('cuda') Dynamo's "
                    "fake tensors and FX constants of these factory calls land on the CPU")
def test_eye_tril_triu():
    def fn(x, y):
        return {"eye": torch.eye(4) + x[0, 0], "eye_rect": torch.eye(3, 5, dtype=torch.int64),
                "tril": x.tril(), "triu": x.triu(), "tril_1": x.tril(1), "triu_-1": x.triu(-1),
                "tril_batched": y.tril(-2), "triu_big": y.triu(7), "triu_int": x.int().triu(2)}

    check(fn, make(4, 5), make(2, 3, 4), library=0, dynamo=True)


CATS = [
    ((3, 4), (2, 4), 0), ((3, 4), (3, 1), 1), ((3, 4), (3, 2), -1), ((2, 3, 4), (2, 5, 4), -2),
    ((0, 4), (2, 4), 0), ((3, 4), (3, 0), 1),
]


@pytest.mark.parametrize("case", CATS, ids=str)
def test_cat(case):
    a_shape, b_shape, dim = case
    check(lambda a, b: (torch.cat([a, b], dim), torch.cat([b, a, b], dim) * 2,
                        torch.cat([a], dim)), make(*a_shape), make(*b_shape, seed=1), library=0)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_cat_of_strided_inputs(layout):
    a, b = make_layout(layout, 4, 6), make_layout("transposed", 4, 6, seed=1)
    check(lambda a, b: (torch.cat([a, b]), torch.cat([a, b], 1), torch.stack([a, b], 1)), a, b,
          library=0)


def test_cat_promotes_and_skips_legacy_empty():
    a, b = make(3, 4), make(2, 4, dtype=torch.int64)
    c = make(2, 4, dtype=torch.float16)
    empty = torch.empty(0)
    check(lambda a, b, c, e: (torch.cat([a, b]), torch.cat([b, c]), torch.cat([e, a, e]),
                              torch.cat([b.bool(), b.bool()]), torch.cat([e, e])),
          a, b, c, empty, library=0)


@pytest.mark.parametrize("dim", (0, 1, 2, -1, -3))
def test_stack(dim):
    a, b = make(3, 4), make(3, 4, seed=1)
    check(lambda a, b: (torch.stack([a, b], dim), torch.stack([a, b.int(), a], dim)), a, b,
          library=0)


def test_stack_of_zero_dim_and_hstack_vstack():
    a, b = torch.tensor(1.5), torch.tensor(-2.0)
    x, y = make(3, 2), make(3, 2, seed=1)
    check(lambda a, b, x, y: (torch.stack([a, b]), torch.hstack([x, y]), torch.vstack([x, y]),
                              torch.dstack([x, y]), torch.column_stack([x, y])),
          a, b, x, y, library=0)


PADS = [(1, 2), (0, 0, 2, 1), (-1, 2), (1, -2, -1, 1), (2, 2, 1, 1, 1, 0), (0, 3)]


@pytest.mark.parametrize("pad", PADS, ids=str)
def test_constant_pad(pad):
    x = make(2, 4, 5)
    check(lambda x: (F.pad(x, pad), F.pad(x, pad, value=-1.5), F.pad(x.int(), pad, value=3),
                     F.pad(x.transpose(1, 2), pad)), x, library=0)


def masked_mean_of_padded_sequences(a, b, c):
    padded = torch.nn.utils.rnn.pad_sequence([a, b, c], batch_first=True)
    lengths = torch.tensor([len(s) for s in (a, b, c)])
    mask = torch.arange(padded.shape[1])[None, :] < lengths[:, None]
    return (padded.sum(-1) * mask).sum(1) / lengths


def nested_pads_stacked(a, b, c):
    return torch.stack([F.pad(a, (0, 0, 0, 2)), F.pad(F.pad(b[1:, 1:], (0, 0, 1, 0)), (1, 0)),
                        F.pad(F.pad(c, (0, 0, 3, 0)), (0, 1))[:, 1:]]).sum(-1)


# Sequences of different lengths padded into rows and reduced: pad_sequence is a pad of each
# row's pad (its rows taken back by fixed slices), so one kernel reads the same input values
# under several pads' conditions
PADDED_SEQUENCES = {
    "masked_mean": masked_mean_of_padded_sequences,
    "row_sums": lambda a, b, c: torch.nn.utils.rnn.pad_sequence([a, b, c], True).sum((1, 2)),
    "time_major_maxima": lambda a, b, c: torch.nn.utils.rnn.pad_sequence([a, b, c]).amax(0),
    "nested_pads": lambda a, b, c: nested_pads_stacked(a, b, c).sum(-1),
    "nested_pads_columns": lambda a, b, c: nested_pads_stacked(a, b, c).sum(0),
    "cat_of_pads": lambda a, b, c: torch.cat([F.pad(a, (1, 0)), F.pad(b, (0, 1)),
                                              F.pad(c, (1, 0))]).sum(1),
}


@pytest.mark.parametrize("name", PADDED_SEQUENCES)
def test_padded_sequences_then_reductions(name):
    # (a pad inside a pad at a fixed position of the outer's input masked its loads with the
    # outer's condition too, and that value was reused where the outer's condition fails:
    # a sequence's sum came out 0)
    fn = PADDED_SEQUENCES[name]
    args = make(2, 3), make(4, 3, seed=1), make(1, 3, seed=2)
    check(fn, *args, library=0, dynamo=True)
    check_grad(fn, *args, dynamo=True)


def test_flip_roll_repeat():
    x = make(3, 4, 5)

    def fn(x):
        return {"flip0": x.flip(0), "flip_neg": x.flip(-1, 0), "fliplr": torch.fliplr(x),
                "flipud": torch.flipud(x), "roll": x.roll(1, 0), "roll_neg": x.roll(-2, -1),
                "roll_many": x.roll((1, 7), (1, 2)), "roll_flat": x.roll(3),
                "roll_zero": x.roll(4, 1), "repeat": x.repeat(2, 1, 3),
                "repeat_new_dims": x.repeat(2, 1, 1, 2), "tile": x.tile((2,)),
                "rot90": torch.rot90(x, 1, (1, 2)),
                "rot90_2": torch.rot90(x, 2, (0, -1)),
                "rot90_3": torch.rot90(x, -1, (2, 0)), "expand_as_repeat": x[:, :1].repeat(1, 3, 1)}

    check(fn, x, library=0)
    check(fn, make_layout("transposed", 3, 4, 5), library=0)


def test_roll_of_a_channels_last_tensor_stays_channels_last():
    # (on the CPU roll is a cat of two pieces, and cat keeps channels-last)
    x = make(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    check(lambda x: {"one": x.roll(1, 1), "two": x.roll((1, 2), (2, 3))}, x, library=0)


def test_nearest_upsampling_and_pixel_shuffle():
    image = make(2, 8, 3, 5)
    signal, volume = make(2, 3, 7, seed=1), make(1, 2, 2, 3, 4, seed=2)

    def fn(image, signal, volume):
        return {"twice": F.interpolate(image, scale_factor=2),
                "size": F.interpolate(image, size=(7, 4)),
                "fraction": F.interpolate(image, scale_factor=1.7),
                "recompute": F.interpolate(image, scale_factor=1.5, recompute_scale_factor=True),
                "down": F.interpolate(image, size=(2, 2)), "1d": F.interpolate(signal, size=10),
                "3d": F.interpolate(volume, scale_factor=(2, 1.5, 0.5)),
                "shuffle": F.pixel_shuffle(image, 2),
                "unshuffle": F.pixel_unshuffle(image[..., :2, :4], 2)}

    check(fn, image, signal, volume, library=0)


def test_a_pad_of_an_upsampling_takes_no_index_where_it_pads():
    # (the C kernel checked the nearest index at the pad's border positions too, where the
    # pad reads nothing: an index error of ember's own, and the graph ran eagerly from then
    # on; timm's GhostNetV2 gates its features so before a padded depthwise convolution)
    image, gate = make(1, 4, 4, 4), make(1, 4, 8, 8, seed=1)
    weight = make(4, 1, 3, 3, seed=2)

    def fn(image, gate, weight):
        up = F.interpolate(image, scale_factor=2, mode="nearest")
        return F.pad(up, (1, 1, 1, 1)), F.conv2d(gate * up, weight, padding=1, groups=4)

    check(fn, image, gate, weight, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("index_dtype", (torch.int64, torch.int32), ids=str)
def test_index_select_and_embedding(index_dtype):
    x = make(6, 5)
    index = torch.tensor([0, 5, 2, 2, 3], dtype=index_dtype)
    table = make(10, 4, seed=1)
    tokens = torch.tensor([[1, 9, 0], [4, 4, 7]])

    def fn(x, index, table, tokens):
        return {"rows": x.index_select(0, index), "cols": x.index_select(1, index[2:]),
                "neg_dim": x.index_select(-1, index[1:2] % 5),
                "embedding": F.embedding(tokens, table),
                "embedding_padding": F.embedding(tokens, table, padding_idx=0),
                "embedding_1d": F.embedding(tokens[0], table),
                "embedding_scalar": F.embedding(tokens[0, 0], table),
                "zero_dim": x[0, 0].index_select(0, index[:1] * 0)}

    check(fn, x, index, table, tokens, library=0)


@pytest.mark.skipif(DEVICE == "cuda", reason="on CUDA an index out of range is a device-side "
                    "assert, as in eager: it ends the CUDA context, and every later test")
def test_index_out_of_range_raises():
    x = make(4, 5)
    compiled_fn = check(lambda x, i: x.index_select(0, i), x, torch.tensor([0, 3]), library=0)
    with pytest.raises(IndexError):
        compiled_fn(x, torch.tensor([0, 4]))
    # (eager's gather raises RuntimeError: the same except clause catches ember's error)
    gathered = check(lambda x, i: x.gather(0, i), x, torch.tensor([[0], [3]]), library=0)
    with pytest.raises(RuntimeError):
        gathered(x, torch.tensor([[0], [4]]))


def test_gather():
    x = make(4, 5, 3)
    index = torch.tensor([[[0, 1, 2], [2, 1, 0]], [[4, 4, 4], [0, 0, 0]]])

    def fn(x, index):
        return {"dim1": x.gather(1, index), "dim0": x.gather(0, index % 4),
                "dim_neg": x.gather(-1, index[:, :, :2] % 3),
                "take_along": torch.take_along_dim(x[:2, :2], index % 3, dim=2)}

    check(fn, x, index, library=0)


def test_advanced_indexing():
    x = make(5, 6, 7)
    i = torch.tensor([0, 4, -1, 2])
    j = torch.tensor([[1], [-2]])

    def fn(x, i, j):
        return {"first": x[i], "middle": x[:, i], "last": x[..., i], "two_adjacent": x[i, i],
                "broadcast": x[j, i], "apart": x[i, :, i], "with_slice": x[1:, i, ::2],
                "int_and_tensor": x[2, i], "neg_dims": x[:, :, j], "after_none": x[None, i]}

    check(fn, x, i, j, library=0)


def test_indexing_with_lists_of_integers():
    # (torch makes a list index a tensor on the indexed tensor's device: traced on meta
    # tensors, one without values — the graph ran eagerly)
    x = make(4, 6)

    def fn(x):
        y = x.clone()
        y[[0, 2]] = 5.0
        y[[1, 3], [0, -1]] += 1
        return {"rows": x[[0, 2]], "channels": x[:, [2, 1, 0]], "pairs": x[[0, 1], [1, 2]],
                "negative": x[[-1, 0]] * 2, "written": y}

    check(fn, x, library=2, dynamo=True)  # (index_put: the library)


def test_data_dependent_shapes_run_eagerly():
    # x[mask] has a shape only the data knows: the graph runs eagerly, with the reason logged
    x = make(4, 5)
    with watching_fallbacks() as fallbacks:
        compiled = compile_graph(torch.fx.symbolic_trace(lambda x: (x[x > 0] * 2, x.exp())), [x])
    assert not isinstance(compiled, CompiledGraph)
    assert any("nonzero" in message for message in fallbacks.messages)
    for got, want in zip(compiled(x), (x[x > 0] * 2, x.exp())):
        torch.testing.assert_close(got, want)


def test_where_of_nan_and_masked_data():
    x = make(4, 5, special=True)
    check(lambda x: (torch.where(torch.isnan(x), torch.zeros_like(x), x),
                     torch.where(x > 0, x, math.nan), x.masked_fill(torch.isinf(x), 0)), x,
          library=0)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float64, torch.int32,
                                   torch.int64, torch.uint8, torch.int8, torch.bool), ids=str)
def test_data_movement_in_every_dtype(dtype):
    x, y = make(4, 5, dtype=dtype), make(4, 5, dtype=dtype, seed=1)
    index = torch.tensor([3, 0, 0, 2])

    def fn(x, y, index):
        return {"cat": torch.cat([x, y], 1), "stack": torch.stack([x, y.t().t()]),
                "pad": F.pad(x, (1, 2, 0, 1)), "flip": x.flip(1), "roll": x.roll(2, 1),
                "repeat": x.repeat(2, 1), "index_select": x.index_select(0, index),
                "gather": x.gather(1, index[:, None].expand(4, 2)), "take": x[index],
                "where": torch.where(y.bool(), x, y), "tril": x.tril(), "triu": y.triu(1),
                "transpose_copy": x.t().contiguous(), "full_like": torch.full_like(x, 1),
                "zeros_like": torch.zeros_like(y)}

    check(fn, x, y, index, library=0)


@pytest.mark.skipif(DEVICE == "cuda", reason="under torch.set_default_device('cuda') Dynamo's "
                    "fake tensors and FX constants of these factory calls land on the CPU")
def test_aten_creation_overloads_called_directly():
    # what decompositions and exported programs call
    def fn(x):
        return {"full": aten.full.default([2, 3], 1.5, device=x.device) + x[0, 0],
                "zeros": aten.zeros.default([3], dtype=torch.int32, device=x.device),
                "empty_strided": aten.empty_strided.default([2, 2], [1, 2]).fill_(2.0),
                "new_empty": aten.new_empty.default(x, [2]).zero_(),
                "new_empty_strided": aten.new_empty_strided.default(x, [2], [1]).fill_(1),
                "arange": aten.arange.start_step(1, 10, 2, device=x.device),
                "arange_end": aten.arange.default(4, dtype=torch.float32, device=x.device),
                "arange_start": aten.arange.start(-2, 3, device=x.device),
                "eye_m": aten.eye.m(2, 3, device=x.device), "eye": aten.eye.default(2),
                "lift": aten.lift_fresh_copy.default(x) * 2}

    check(fn, make(3, 4), library=0)


def test_cat_of_empty_tensors():
    # (found by the property tests: a cat over an empty extent had no piece to read from)
    empty = torch.empty(1, 1).expand(0, 1)
    check(lambda x: torch.cat([x, x], -1), empty)
    check(lambda x, y: torch.cat([x, y], 0) * 2, empty, make(2, 1))
