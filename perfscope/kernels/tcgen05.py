"""tcgen05 descriptor encoders, the Python mirror of the constexpr ones in blackwell.cu.

The unit tests hold these against the PTX ISA bit tables, then compile blackwell.cu with
``static_assert``s of its own encoders against the values computed here, so the two
cannot drift apart. Nothing here needs a GPU.

References (PTX ISA 9.0, "Tensorcore 5th Generation Family Instructions"):
- "Matrix Descriptors / Shared memory descriptor" (tcgen05-shared-memory-descriptor),
- "Matrix Descriptors / Instruction descriptor" (tcgen05-instruction-descriptor),
  table "Instruction descriptor format for .kind::tf32, .kind::f16, .kind::f8f6f4 and
  .kind::i8".
"""

from __future__ import annotations

from typing import NamedTuple

from perfscope.errors import PerfscopeError

# Swizzling mode, bits 61-63 of the shared memory descriptor.
SWIZZLE_NONE = 0
SWIZZLE_128B_BASE32B = 1
SWIZZLE_128B = 2
SWIZZLE_64B = 4
SWIZZLE_32B = 6
SWIZZLES = (SWIZZLE_NONE, SWIZZLE_128B_BASE32B, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_32B)

# atype/btype of .kind::f16; dtype (D) F16 = 0, F32 = 1.
AB_TYPES = {"fp16": 0, "bf16": 1}
D_F16, D_F32 = 0, 1


class Field(NamedTuple):
    """One bit field of a descriptor: first bit and width (PTX ISA tables)."""

    lo: int
    width: int

    def get(self, word: int) -> int:
        """This field's value in a descriptor word."""
        return (word >> self.lo) & ((1 << self.width) - 1)


SMEM_FIELDS = {
    "start_address": Field(0, 14),          # address >> 4
    "leading_byte_offset": Field(16, 14),   # bytes >> 4
    "stride_byte_offset": Field(32, 14),    # bytes >> 4
    "fixed_0b001": Field(46, 3),
    "base_offset": Field(49, 3),
    "lbo_mode": Field(52, 1),
    "fixed_zero": Field(53, 8),
    "swizzle": Field(61, 3),
}

INSTR_F16_FIELDS = {
    "sparsity_selector": Field(0, 2),
    "sparsity": Field(2, 1),
    "saturate": Field(3, 1),
    "dtype": Field(4, 2),
    "reserved6": Field(6, 1),
    "atype": Field(7, 3),
    "btype": Field(10, 3),
    "negate_a": Field(13, 1),
    "negate_b": Field(14, 1),
    "transpose_a": Field(15, 1),
    "transpose_b": Field(16, 1),
    "n_dim": Field(17, 6),                  # N >> 3
    "reserved23": Field(23, 1),
    "m_dim": Field(24, 5),                  # M >> 4
    "reserved29": Field(29, 1),
    "max_shift": Field(30, 2),
}


def smem_desc(addr: int, lbo_bytes: int, sbo_bytes: int, swizzle: int, base_offset: int = 0) -> int:
    """The 64-bit shared memory matrix descriptor (relative LBO mode)."""
    if swizzle not in SWIZZLES:
        raise PerfscopeError(f"swizzle mode {swizzle} is not one of {SWIZZLES}")
    for what, v in (("address", addr), ("LBO", lbo_bytes), ("SBO", sbo_bytes)):
        if v % 16:
            raise PerfscopeError(f"the descriptor drops the 4 low bits, so {what} {v} must be a "
                                 "multiple of 16")
    return (((addr & 0x3FFFF) >> 4)
            | (((lbo_bytes >> 4) & 0x3FFF) << 16)
            | (((sbo_bytes >> 4) & 0x3FFF) << 32)
            | (1 << 46)
            | ((base_offset & 0x7) << 49)
            | ((swizzle & 0x7) << 61))


def instr_desc_f16(ab: str, d_f32: bool, m: int, n: int, a_mn_major: bool, b_mn_major: bool) -> int:
    """The 32-bit instruction descriptor of a dense tcgen05.mma .kind::f16."""
    if ab not in AB_TYPES:
        raise PerfscopeError(f"kind::f16 takes fp16 or bf16 inputs, not {ab}")
    # cta_group::1 shapes for kind::f16 (PTX ISA "Matrix shape"): M 64 or 128; N a
    # multiple of 8 (M = 64) or 16 (M = 128) from 8/16 to 256.
    step = 8 if m == 64 else 16
    if m not in (64, 128) or not (step <= n <= 256 and n % step == 0):
        raise PerfscopeError(f"M={m}, N={n} is not a cta_group::1 kind::f16 shape")
    t = AB_TYPES[ab]
    return ((int(d_f32) << 4) | (t << 7) | (t << 10) | (int(a_mn_major) << 15)
            | (int(b_mn_major) << 16) | ((n >> 3) << 17) | ((m >> 4) << 24))


def decode(word: int, fields: dict[str, Field]) -> dict[str, int]:
    """Every named field's value in a descriptor word."""
    return {name: f.get(word) for name, f in fields.items()}


# The hgemm_tcgen05 operand layouts (see the header of blackwell.cu): K-major A and N-major
# B, both 128B-swizzled by TMA, 8-row groups 1024 bytes apart; B's 64-column atoms lie
# BK * 128 bytes apart.
def stage_descriptors(dtype: str, bm: int = 128, bn: int = 128, bk: int = 64,
                      a_addr: int = 0, b_addr: int = 0) -> tuple[int, int, int]:
    """(A descriptor, B descriptor, instruction descriptor) of the stage's first k step."""
    a = smem_desc(a_addr, 16, 1024, SWIZZLE_128B)
    b = smem_desc(b_addr, bk * 64 * 2, 1024, SWIZZLE_128B)
    return a, b, instr_desc_f16(dtype, True, bm, bn, a_mn_major=False, b_mn_major=True)
