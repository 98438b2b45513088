"""Ember's one launcher for Triton kernels (runtime/cuda_launcher.c): built with the C compiler
here, and called with a stand-in for CUDA's cuLaunchKernelEx that records what it is handed,
so the packing of every argument type is checked without a GPU."""

import ctypes
import importlib.util
import os
import struct
import sysconfig

import pytest
import torch

from ember.runtime import cuda_launcher

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                       reason="the launcher includes Triton's cuda.h"),
    pytest.mark.skipif(not os.path.exists(os.path.join(sysconfig.get_paths()["include"],
                                                       "Python.h")),
                       reason="a Python extension: this Python has no headers"),
]


class _Config(ctypes.Structure):  # CUDA's CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attributes", ctypes.c_void_p), ("attribute_count", ctypes.c_uint)]


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: an id, then a 64-byte value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Config), ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
_SIZES = {"p": 8, "b": 1, "h": 2, "i": 4, "l": 8, "B": 1, "H": 2, "I": 4, "L": 8, "e": 2,
          "g": 2, "f": 4, "d": 8}


@pytest.fixture
def recorded():
    """The launcher, launching through a recorder; what each launch was handed, in a list."""
    module = cuda_launcher.load()
    launches = []
    answer = [0]

    def record(config, function, params, extra):
        c = config.contents
        attributes = ctypes.cast(c.attributes, ctypes.POINTER(_Attribute))
        launches.append(dict(
            grid=tuple(c.grid), block=tuple(c.block), shared=c.shared, stream=c.stream,
            function=function, params=params,
            attributes=[(attributes[k].id, attributes[k].value)
                        for k in range(c.attribute_count)]))
        return answer[0]

    stand_in = _LAUNCH(record)
    module.use_launch_function(ctypes.cast(stand_in, ctypes.c_void_p).value)
    try:
        yield module, launches, answer
    finally:
        module.use_launch_function(0)  # (the next launch opens CUDA's driver again)


def _bytes_of(params, types: str) -> list[bytes]:
    """Each parameter's bytes as the kernel reads them, constants left out, scratch after."""
    sizes = [_SIZES[t] for t in types if t != "x"] + [8, 8]
    return [ctypes.string_at(params[k], size) for k, size in enumerate(sizes)]


def test_each_argument_type_reaches_the_kernel_as_triton_packs_it(recorded):
    module, launches, _ = recorded
    tensor = torch.arange(4.0)
    types = "ppplihbLIefgdx"
    arguments = [tensor, 12345, None, -(2 ** 40), -7, 300, -3, 2 ** 63 + 5, 7, 1.5, 2.25,
                 -3.140625, 0.1, 99]
    module.launch(3, 2, 1, 0xABC, 0x1234, False, False, None, None, (4, 1, 96, types), None,
                  None, None, *arguments)
    (launch,) = launches
    assert launch["grid"] == (3, 2, 1) and launch["block"] == (128, 1, 1)
    assert launch["shared"] == 96 and launch["stream"] == 0xABC
    assert launch["function"] == 0x1234 and launch["attributes"] == []
    expected = [struct.pack("<Q", tensor.data_ptr()), struct.pack("<Q", 12345),
                struct.pack("<Q", 0), struct.pack("<q", -(2 ** 40)), struct.pack("<i", -7),
                struct.pack("<h", 300), struct.pack("<b", -3), struct.pack("<Q", 2 ** 63 + 5),
                struct.pack("<I", 7), struct.pack("<e", 1.5), struct.pack("<f", 2.25),
                struct.pack("<f", -3.140625)[2:],  # (bf16: the float's top half, as Triton)
                struct.pack("<d", 0.1),
                bytes(8), bytes(8)]  # (the scratch pointers: none)
    assert _bytes_of(launch["params"], types) == expected


def test_dependent_and_cooperative_launches_carry_their_attributes(recorded):
    module, launches, _ = recorded
    module.launch(1, 1, 1, 0, 1, True, True, None, None, (8, 1, 0, "p"), None, None, None, 0)
    # (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION is 6, COOPERATIVE 2)
    assert launches[0]["attributes"] == [(6, 1), (2, 1)]
    assert launches[0]["block"] == (256, 1, 1)


def test_an_empty_grid_launches_nothing(recorded):
    module, launches, _ = recorded
    module.launch(0, 1, 1, 0, 1, False, False, None, None, (4, 1, 0, "p"), None, None, None, 0)
    assert launches == []


def test_bad_calls_raise_and_a_failed_launch_says_so(recorded):
    module, launches, answer = recorded
    with pytest.raises(TypeError, match="2 arguments for 1 types"):
        module.launch(1, 1, 1, 0, 1, False, False, None, None, (4, 1, 0, "p"), None, None,
                      None, 0, 0)
    with pytest.raises(ValueError, match="several CTAs"):
        module.launch(1, 1, 1, 0, 1, False, False, None, None, (4, 2, 0, "p"), None, None,
                      None, 0)
    with pytest.raises(TypeError):
        module.launch(1, 1, 1, 0, 1, False, False, None, None, (4, 1, 0, "i"), None, None,
                      None, "not a number")
    with pytest.raises(OverflowError, match="does not fit"):  # (never truncated silently)
        module.launch(1, 1, 1, 0, 1, False, False, None, None, (4, 1, 0, "i"), None, None,
                      None, 2 ** 31)
    assert launches == []
    answer[0] = 1  # (CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(RuntimeError, match="Triton Error"):
        module.launch(1, 1, 1, 0, 1, False, False, None, None, (4, 1, 0, "p"), None, None,
                      None, 0)


def test_type_codes_cover_tritons_scalar_types_and_refuse_the_rest():
    assert cuda_launcher.type_codes(["*fp32", "*bf16", "i32", "i64", "fp32", "constexpr"]) \
        == "ppilfx"
    assert cuda_launcher.type_codes(["*fp32", "tensordesc<fp32[16, 16]>"]) is None
    assert cuda_launcher.type_codes(["*fp32", ("i32", "i32")]) is None
