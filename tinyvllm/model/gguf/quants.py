"""GGML's quantized block formats decoded with NumPy, all blocks of a tensor at once.

A quantized tensor is rows of fixed-size blocks; a block holds `elements` consecutive values
of a row and the scales to rebuild them (little-endian, f16 scales). Each decoder takes
[blocks, block_bytes] uint8 and returns [blocks, elements] float32, computing in the order
ggml-quants.c's dequantize_row_* does, so the float32 results are the same bit for bit.

The legacy formats hold 32 values; in a 4-bit block byte j holds value j in its low nibble
and value j + 16 in its high nibble, and the 5-bit ones keep each value's fifth bit in a
32-bit word qh (bit j for value j):

    Q8_0  34 bytes: d, qs[32] int8                         x = d * q
    Q4_0  18 bytes: d, qs[16]                              x = d * (q - 8)
    Q4_1  20 bytes: d, m, qs[16]                           x = d * q + m
    Q5_0  22 bytes: d, qh[4], qs[16]                       x = d * (q - 16)
    Q5_1  24 bytes: d, m, qh[4], qs[16]                    x = d * q + m

The K-quants hold 256 values in sub-blocks of 16 or 32, each with its own small integer
scale (and min) that the block's f16 d (and dmin) multiply:

    Q2_K   84 bytes: scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin
                     x = d * scale * q - dmin * min                         (16 sub-blocks of 16)
    Q3_K  110 bytes: hmask[32], qs[64], scales[12] (sixteen 6-bit), d
                     x = d * (scale - 32) * (q - (4 if the hmask bit is 0 else 0))
    Q4_K  144 bytes: d, dmin, scales[12] (eight 6-bit scales, eight 6-bit mins), qs[128]
                     x = d * scale * q - dmin * min                         (8 sub-blocks of 32)
    Q5_K  176 bytes: d, dmin, scales[12], qh[32], qs[128]      as Q4_K with a fifth bit from qh
    Q6_K  210 bytes: ql[128], qh[64], scales[16] int8, d
                     x = d * scale * (q - 32)                               (16 sub-blocks of 16)

In the K-quants the values are laid out by gather tables below: for value e of a block, which
byte holds its low bits and at which shift (`_Gather`), as the loops of ggml-quants.c walk them.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as GGMLType

QK_K = 256


@dataclass(frozen=True)
class BlockFormat:
    elements: int  # values per block
    block_bytes: int
    decode: Callable[[np.ndarray], np.ndarray]  # [blocks, block_bytes] uint8 -> [blocks, elements] float32


@dataclass(frozen=True)
class _Gather:
    """Bit field `width` bits wide at `shift` of byte `byte[e]` (offset into the block) for each value e."""

    byte: np.ndarray
    shift: np.ndarray
    width: np.ndarray | int  # per value, or one for all; 0 reads nothing

    def __call__(self, blocks: np.ndarray) -> np.ndarray:
        mask = ((1 << np.asarray(self.width)) - 1).astype(np.uint8)
        return (blocks[:, self.byte] >> np.asarray(self.shift).astype(np.uint8)) & mask


def _f16(columns: np.ndarray) -> np.ndarray:
    """Two uint8 columns per block -> that f16 scale as float32, [blocks, 1]."""
    return np.ascontiguousarray(columns).view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[blocks, 16] packed bytes -> [blocks, 32] values 0..15: low nibbles first, then high."""
    return np.concatenate([packed & np.uint8(0x0F), packed >> np.uint8(4)], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[blocks, 4] bytes of a little-endian uint32 -> [blocks, 32] bit j of it, shifted to 16."""
    bits = np.unpackbits(qh, axis=1, bitorder="little")
    return bits << np.uint8(4)


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    return blocks[:, 2:].view(np.int8).astype(np.float32) * _f16(blocks[:, :2])


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    return (_nibbles(blocks[:, 2:]).astype(np.float32) - np.float32(8)) * _f16(blocks[:, :2])


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    return _f16(blocks[:, :2]) * _nibbles(blocks[:, 4:]).astype(np.float32) + _f16(blocks[:, 2:4])


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])).astype(np.float32) - np.float32(16)
    return q * _f16(blocks[:, :2])


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])).astype(np.float32)
    return _f16(blocks[:, :2]) * q + _f16(blocks[:, 2:4])


_E = np.arange(QK_K)  # value index within a K-quant block
_HALF, _QUARTER, _LANE = _E // 128, (_E % 128) // 32, _E % 32
# Q2_K/Q3_K: each 128-value half reads 32 bytes four times, 2 bits deeper each time.
_TWO_BITS = _Gather(byte=_HALF * 32 + _LANE, shift=2 * _QUARTER, width=2)
# Q3_K/Q5_K: value e's extra bit is bit e // 32 of byte e % 32 of the 32-byte mask.
_MASK_BIT = _Gather(byte=_LANE, shift=_E // 32, width=1)
# Q4_K/Q5_K: each 64 values read 32 bytes, low nibbles then high nibbles.
_FOUR_BITS = _Gather(byte=(_E // 64) * 32 + _LANE, shift=4 * ((_E // 32) % 2), width=4)
# Q6_K: per half, values 0-31 and 64-95 use the low/high nibbles of ql[0:32], 32-63 and 96-127 of ql[32:64];
# the two high bits come from qh[l], 2 bits deeper for each 32 values.
_Q6_LOW = _Gather(byte=_HALF * 64 + _LANE + 32 * (_QUARTER % 2), shift=4 * (_QUARTER // 2), width=4)
_Q6_HIGH = _Gather(byte=128 + _HALF * 32 + _LANE, shift=2 * _QUARTER, width=2)

_S = np.arange(8)  # Q4_K/Q5_K sub-block index
_LOW4 = _S < 4
# get_scale_min_k4: sub-blocks 0-3 keep their 6-bit scale in byte j and min in byte j + 4; sub-blocks
# 4-7 keep 4 low bits in byte j + 4 (scale: low nibble, min: high nibble) and 2 high bits in the top
# two bits of byte j - 4 (scale) or byte j (min).
_K4_SCALE = (
    _Gather(byte=np.where(_LOW4, _S, _S + 4), shift=np.zeros(8, int), width=np.where(_LOW4, 6, 4)),
    _Gather(byte=np.where(_LOW4, _S, _S - 4), shift=np.full(8, 6), width=np.where(_LOW4, 0, 2)),
)
_K4_MIN = (
    _Gather(byte=_S + 4, shift=np.where(_LOW4, 0, 4), width=np.where(_LOW4, 6, 4)),
    _Gather(byte=_S, shift=np.full(8, 6), width=np.where(_LOW4, 0, 2)),
)

_T = np.arange(16)  # Q3_K sub-block index
# Q3_K: scale t's low 4 bits are nibble t // 8 of byte t % 8, its high 2 bits are at 2 * (t // 4) of byte 8 + t % 4.
_Q3_SCALE = (
    _Gather(byte=_T % 8, shift=4 * (_T // 8), width=4),
    _Gather(byte=8 + _T % 4, shift=2 * (_T // 4), width=2),
)


def _six_bits(fields: tuple[_Gather, _Gather], scales: np.ndarray) -> np.ndarray:
    """A 6-bit field split into low bits and 2 high bits, joined: low | high << 4 (as uint8)."""
    low, high = fields
    return low(scales) | (high(scales) << np.uint8(4))


def _scaled(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray | None = None) -> np.ndarray:
    """[blocks, 256] values q of n equal sub-blocks -> scale * q (- minimum), with [blocks, n] scales and mins."""
    blocks, sub_blocks = scale.shape
    runs = q.astype(np.float32).reshape(blocks, sub_blocks, -1) * scale[:, :, None]
    if minimum is not None:
        runs -= minimum[:, :, None]
    return runs.reshape(blocks, QK_K)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    scales, d, dmin = blocks[:, :16], _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    scale = d * (scales & np.uint8(0x0F)).astype(np.float32)
    minimum = dmin * (scales >> np.uint8(4)).astype(np.float32)
    return _scaled(_TWO_BITS(blocks[:, 16:80]), scale, minimum)


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    hmask, qs, scales, d = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108], _f16(blocks[:, 108:110])
    scale = d * (_six_bits(_Q3_SCALE, scales).astype(np.float32) - np.float32(32))
    q = _TWO_BITS(qs).astype(np.int8) - np.int8(4) * (np.int8(1) - _MASK_BIT(hmask).astype(np.int8))
    return _scaled(q, scale)


def _scaled_with_min(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: values q of the 8 sub-blocks of 32 -> d * scale * q - dmin * min."""
    d, dmin, scales = _f16(blocks[:, :2]), _f16(blocks[:, 2:4]), blocks[:, 4:16]
    scale = d * _six_bits(_K4_SCALE, scales).astype(np.float32)
    minimum = dmin * _six_bits(_K4_MIN, scales).astype(np.float32)
    return _scaled(q, scale, minimum)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    return _scaled_with_min(blocks, _FOUR_BITS(blocks[:, 16:144]))


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    return _scaled_with_min(blocks, _FOUR_BITS(blocks[:, 48:176]) | (_MASK_BIT(blocks[:, 16:48]) << np.uint8(4)))


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    scales, d = blocks[:, 192:208].view(np.int8).astype(np.float32), _f16(blocks[:, 208:210])
    q = (_Q6_LOW(blocks) | (_Q6_HIGH(blocks) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return _scaled(q, d * scales)


BLOCK_FORMATS = {
    GGMLType.Q8_0: BlockFormat(32, 34, _q8_0),
    GGMLType.Q4_0: BlockFormat(32, 18, _q4_0),
    GGMLType.Q4_1: BlockFormat(32, 20, _q4_1),
    GGMLType.Q5_0: BlockFormat(32, 22, _q5_0),
    GGMLType.Q5_1: BlockFormat(32, 24, _q5_1),
    GGMLType.Q2_K: BlockFormat(QK_K, 84, _q2_k),
    GGMLType.Q3_K: BlockFormat(QK_K, 110, _q3_k),
    GGMLType.Q4_K: BlockFormat(QK_K, 144, _q4_k),
    GGMLType.Q5_K: BlockFormat(QK_K, 176, _q5_k),
    GGMLType.Q6_K: BlockFormat(QK_K, 210, _q6_k),
}
