"""A Python program that reaches the stand-in driver through ctypes, as perfscope's own
stages encode their maps (kernels/tensormap.py): cuTensorMapEncodeTiled and cuLaunchKernel
found by ctypes' dlsym on a CDLL handle. It encodes one bf16 8192 x 8192 map in 64 x 64
boxes and launches `_Z6kernel` on 4 blocks of 128 threads with the map as its parameter.

    python3 ctypes_app.py LIBCUDA
"""

import ctypes
import sys

BF16, SWIZZLE_128B, L2_256B = 9, 3, 3


class TensorMap(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


class FakeFunction(ctypes.Structure):      # fake_cuda.h
    _fields_ = [("name", ctypes.c_char_p), ("nparams", ctypes.c_size_t),
                ("sizes", ctypes.c_size_t * 8)]


def main(path: str) -> None:
    lib = ctypes.CDLL(path)
    buf = (ctypes.c_uint8 * 256)()
    addr = (ctypes.addressof(buf) + 63) // 64 * 64          # a CUtensorMap is 64-byte aligned
    tmap = TensorMap.from_address(addr)
    memory = ctypes.create_string_buffer(64)
    encoded = lib.cuTensorMapEncodeTiled(
        ctypes.byref(tmap), BF16, 2, memory, (ctypes.c_uint64 * 2)(8192, 8192),
        (ctypes.c_uint64 * 1)(16384), (ctypes.c_uint32 * 2)(64, 64), (ctypes.c_uint32 * 2)(1, 1),
        0, SWIZZLE_128B, L2_256B, 0)
    fn = FakeFunction(b"_Z6kernel", 1, (ctypes.c_size_t * 8)(128))
    launched = lib.cuLaunchKernel(ctypes.byref(fn), 4, 1, 1, 128, 1, 1, 0, None,
                                  (ctypes.c_void_p * 1)(addr), None)
    print("rc", encoded, launched, "launches", ctypes.c_int.in_dll(lib, "fake_launches").value)


if __name__ == "__main__":
    main(sys.argv[1])
