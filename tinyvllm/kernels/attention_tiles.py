"""Flash attention on tensor cores: a block's query rows against K and V tiles of the paged cache.

What the prefill kernel (`attention_prefill.py`) and cascade's shared-prefix kernel
(`attention_cascade.py`) share. A block of WARPS warps serves one KV head; each warp owns 16
query rows, all G = Hq / Hkv query heads of that KV head packed row by row (row r is unit
r // G, head r % G, where a unit is a token of a prompt or a decoding sequence), so that one
staged K and V tile serves every head of the group. Per tile of `keys` keys (FlashAttention-2,
the fragment layouts of `device/mma.py`):

    S[16, keys] = Q K^T      D / 16 k-steps x keys / 8 n8 tiles of mma; Q's fragments stay
                             in registers for the whole walk, K's come by ldmatrix
    online softmax           on S's accumulators (`attention_softmax.py`): a lane holds rows g
                             and g + 8, columns 2t and 2t + 1 of each n8 tile, so a row's max
                             is the max of its quad of lanes (`quad_max`); the running sum
                             stays per lane until the end
    O[16, D] += P V          S's accumulators rounded to bf16 are P's A fragments as they lie
                             (`bf16x2`); V's come by ldmatrix.trans from V stored [key, dim].
                             P goes in twice: its bf16 rounding, then the rounding's
                             remainder, also in bf16. One bf16 P (FlashAttention-2's choice)
                             moved SmolLM2's prefill attention 2e-3 in norm from the float
                             reference, twenty times the rest of the kernel's error
                             (`p_precision="fp16"`: once, in float16, `attention_fp16.py`)

The tiles reach shared memory by `cp.async`, double-buffered: while a warp multiplies tile
i, tile i + 1 is in flight. Shared rows are D + 8 elements long, so the 8 rows one ldmatrix
reads start in 8 different 16-byte bank groups. A key past the range is loaded from the
range's last key (finite: a poisoned cache row would make 0 x NaN = NaN in the product) and
its score is masked to -inf. Scores are in base 2 (`attention_common`).

Registers a lane: Q D / 4 words, S keys / 2 and O D / 2 floats: 16 + 32 + 32 at D = 64 and
64 keys. Shared memory: 2 buffers x (K, V) x keys x (D + 8) x 2 bytes, 36 KB at D = 64 and 64
keys (the float16 fold adds a V tile: 9 KB).
"""

import functools
import math
from operator import attrgetter
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import LOG2_E
from tinyvllm.kernels.attention_fp16 import fp16_step
from tinyvllm.kernels.attention_softmax import tile_softmax
from tinyvllm.kernels.device.mma import (
    MMA_K,
    MMA_M,
    MMA_N,
    bf16x2,
    cp_async_16,
    cp_async_commit,
    cp_async_wait,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_bf16_16816,
    quad_sum,
)
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT, launch_bounds
from tinyvllm.kernels.device.vector_io import VECTOR, high_half, low_half

WARPS = 8
MAX_KEYS = 64
TILE_ELEMENTS = 4096
"""keys x D of one staged tile at most: 64 keys at D = 64, 32 at 128, 16 at 256 (static shared
memory is 48 KB: the float16 fold's two buffers of K and V and its V copy take 45 KB at 64 x 64).
On an H100, with P V in one float16 pass, eight warps and 64 keys beat 32 keys and four warps
(1 x 4,096 tokens 0.334 ms against 0.357 and 0.435 at 4 x 64; 16 x 1,024 0.448 against 0.472:
perf/bench_attention.py --sweep, 2026-12-07): eight warps share one staged tile, and a tile of
64 keys halves the barriers and copy rounds a key."""
BF16X2_MAX_KEYS = 32
"""The two-pass fold's cap: at 64 keys its score, P and remainder registers spill 40 bytes (D = 64,
ptxas for sm_90), so it keeps 32 (cascade's shared kernel, and prefill asked for "bf16x2")."""
PAD = 8
"""Elements after each shared row: D + 8 bf16 is an odd number of 16-byte groups."""
P_PRECISIONS = ("bf16x2", "fp16")
"""How P V takes P: two bf16 passes (`pv_bf16x2`), or one float16 pass (`attention_fp16.py`)."""


def tile_shape(head_dim: int, p_precision: str) -> tuple[int, int]:
    """(threads, keys a tile) of a block for this head size and fold (`P_PRECISIONS`)."""
    keys = min(MAX_KEYS, TILE_ELEMENTS // head_dim)
    if p_precision == "bf16x2":
        keys = min(keys, BF16X2_MAX_KEYS)
    return WARPS * 32, max(MMA_K, keys)


def check_head_dim(head_dim: int) -> None:
    if head_dim % MMA_K or head_dim > 256:
        raise ValueError(f"head_dim {head_dim}: the tensor-core attention needs a multiple of {MMA_K} up to 256")


def flash_bounds(head_dim: int, threads: int) -> dict:
    """`cuda.jit` launch bounds of a flash kernel: two blocks an SM (128 registers a thread) up to
    D = 64; none past it, where the tiles need more (180 registers at D = 128)."""
    return launch_bounds(threads, 2) if head_dim <= 64 else {}


def block_rows() -> int:
    """Query rows a block: 16 a warp."""
    return WARPS * MMA_M


@functools.cache
def flash_tiles(head_dim: int, threads: int, keys: int, p_precision: str = "bf16x2"):
    """The three inline device functions of one block shape:

        load_query(row0, row1, query)      the lane's Q fragments of its rows g and g + 8
        fold(k_flat, v_flat, table, kv_head, start, end, shift, last0, last1,
             query, out, maxes, sums)      keys [start, end) of the sequence whose block table
                                           is `table` into the rows' states; row g sees keys
                                           up to position last0, row g + 8 up to last1
                                           (start < end: the first tile's copies start before the loop)
        finish(maxes, sums) -> (sum0, sum1)  the rows' whole sums (the quad's lanes added)

    `out` is float32[D / 8, 4] (the O accumulators), `maxes` and `sums` float32[2]; the
    caller empties them (`empty_state`). `p_precision` picks fold's P V (`P_PRECISIONS`)."""
    check_p_precision(p_precision)
    parts = tile_parts(head_dim, threads, keys)
    step = fp16_step(parts) if p_precision == "fp16" else bf16x2_step(parts)
    return parts.load_query, tile_walk(parts, step), parts.finish


def check_p_precision(p_precision: str) -> None:
    if p_precision not in P_PRECISIONS:
        raise ValueError(f"p_precision {p_precision!r}: one of {', '.join(P_PRECISIONS)}")


@functools.cache
def tile_parts(head_dim: int, threads: int, keys: int) -> SimpleNamespace:
    """What both folds are made of: the block shape's sizes and device functions."""
    steps = head_dim // MMA_K
    dim_tiles = head_dim // MMA_N
    key_tiles = keys // MMA_N
    key_steps = keys // MMA_K
    tile_keys = np.int32(keys)  # Numba types a global np.int32 as int32, a Python int as int64
    stride = head_dim + PAD
    tile_elements = keys * stride
    chunks_per_key = head_dim // VECTOR
    tile_chunks = keys * chunks_per_key
    chunks_per_thread = -(-tile_chunks // threads)
    whole = tile_chunks % threads == 0  # else (a small D) the last round leaves threads idle
    head_dim_u = np.uint32(head_dim)

    @cuda.jit(device=True, inline=True)
    def pair(row, d):
        return np.uint32(row[d]) | np.uint32(np.uint32(row[d + 1]) << np.uint32(16))

    @cuda.jit(device=True, inline=True)
    def load_query(row0, row1, query):
        t2 = 2 * (cuda.threadIdx.x % 4)
        for s in range(steps):
            d = MMA_K * s + t2
            query[s, 0] = pair(row0, d)
            query[s, 1] = pair(row1, d)
            query[s, 2] = pair(row0, d + 8)
            query[s, 3] = pair(row1, d + 8)

    @cuda.jit(device=True, inline=True)
    def chunk_at(c):
        """The thread's chunk c of a tile (8 elements): (whether the tile has it, its key, its column)."""
        chunk = np.uint32(cuda.threadIdx.x + c * threads)
        return whole or chunk < tile_chunks, chunk // chunks_per_key, chunk % chunks_per_key * VECTOR

    @cuda.jit(device=True, inline=True)
    def issue(k_flat, v_flat, table, kv_head, tile_start, end, shift, k_tiles, v_tiles, base):
        """Start the copies of the tile at tile_start into the buffer at `base` (gridDim.x = Hkv)."""
        row_mask = (np.uint32(1) << shift) - np.uint32(1)
        row_stride = np.uint32(cuda.gridDim.x) * head_dim_u
        block_stride = np.uint64(row_stride) << np.uint64(shift)
        for c in range(chunks_per_thread):
            inside, key, column = chunk_at(c)
            if inside:
                # 32-bit within the cache block (Numba widens uint32 + uint32 to 64 bits); 64-bit for its base only
                position = min(np.uint32(np.uint32(tile_start) + key), np.uint32(end - 1))
                within = np.uint32((position & row_mask) * row_stride + np.uint32(kv_head) * head_dim_u + column)
                offset = np.uint64(np.uint32(table[position >> shift])) * block_stride + np.uint64(within)
                target = base + key * stride + column
                cp_async_16(k_tiles, target, k_flat, offset)
                cp_async_16(v_tiles, target, v_flat, offset)
        cp_async_commit()

    @cuda.jit(device=True, inline=True)
    def lane_offsets():
        """ldmatrix: lanes 8j .. 8j + 7 name the rows of matrix j (mma.py): this lane's row in
        a K tile (x4: two n8 tiles of keys, two k halves) and in a V tile (x4.trans: two k
        halves, two n8 tiles of dimensions)."""
        lane = cuda.threadIdx.x % 32
        matrix, matrix_row = lane // 8, lane % 8
        k_lane = (matrix_row + 8 * (matrix // 2)) * stride + 8 * (matrix % 2)
        v_lane = (matrix_row + 8 * (matrix % 2)) * stride + 8 * (matrix // 2)
        return k_lane, v_lane

    @cuda.jit(device=True, inline=True)
    def mma_into(acc, n, a0, a1, a2, a3, b0, b1):
        d0, d1, d2, d3 = mma_bf16_16816(a0, a1, a2, a3, b0, b1, acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3])
        acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3] = d0, d1, d2, d3

    @cuda.jit(device=True, inline=True)
    def tile_scores(k_tiles, k_at, query, scores):
        """S = Q K^T of the K tile whose lane row starts at k_at."""
        for j in range(key_tiles):
            for c in range(4):
                scores[j, c] = float32(0.0)
        for s in range(steps):
            for j in range(0, key_tiles, 2):
                b00, b01, b10, b11 = ldmatrix_x4(k_tiles, k_at + MMA_N * j * stride + MMA_K * s)
                mma_into(scores, j, query[s, 0], query[s, 1], query[s, 2], query[s, 3], b00, b01)
                mma_into(scores, j + 1, query[s, 0], query[s, 1], query[s, 2], query[s, 3], b10, b11)

    softmax_tile = tile_softmax(keys, dim_tiles, LOG2_E / math.sqrt(head_dim))

    @cuda.jit(device=True, inline=True)
    def split_pair(low, high):
        """Two probabilities as bf16 pairs: the rounded values, and what the rounding left
        (P = head + rest to about 16 bits, so P V loses no more than float32 sums do)."""
        head = bf16x2(low, high)
        return head, bf16x2(low - low_half(head), high - high_half(head))

    # --8<-- [start:pv]
    @cuda.jit(device=True, inline=True)
    def pv_bf16x2(v_tiles, v_at, scores, out):
        """O += P V for the bf16 V tile whose lane row starts at v_at: P's bf16 rounding, then its remainder."""
        for s in range(key_steps):
            a0, r0 = split_pair(scores[2 * s, 0], scores[2 * s, 1])
            a1, r1 = split_pair(scores[2 * s, 2], scores[2 * s, 3])
            a2, r2 = split_pair(scores[2 * s + 1, 0], scores[2 * s + 1, 1])
            a3, r3 = split_pair(scores[2 * s + 1, 2], scores[2 * s + 1, 3])
            for n in range(0, dim_tiles, 2):
                b00, b01, b10, b11 = ldmatrix_x4_trans(v_tiles, v_at + MMA_K * s * stride + MMA_N * n)
                mma_into(out, n, a0, a1, a2, a3, b00, b01)
                mma_into(out, n + 1, a0, a1, a2, a3, b10, b11)
                mma_into(out, n, r0, r1, r2, r3, b00, b01)
                mma_into(out, n + 1, r0, r1, r2, r3, b10, b11)

    # --8<-- [end:pv]

    @cuda.jit(device=True, inline=True)
    def finish(sums):
        return quad_sum(sums[0]), quad_sum(sums[1])

    return SimpleNamespace(**locals())


def bf16x2_step(parts: SimpleNamespace):
    """`tile_walk`'s step with P V in two bf16 passes (`pv_bf16x2`)."""
    tile_scores, softmax_tile, pv_bf16x2 = attrgetter("tile_scores", "softmax_tile", "pv_bf16x2")(parts)

    # --8<-- [start:step]
    @cuda.jit(device=True, inline=True)
    def step(k_tiles, v_tiles, base, k_lane, v_lane, tile_start, last0, last1, query, scores, out, maxes, sums):
        cuda.syncthreads()
        tile_scores(k_tiles, base + k_lane, query, scores)
        softmax_tile(scores, tile_start, last0, last1, out, maxes, sums)
        pv_bf16x2(v_tiles, base + v_lane, scores, out)

    # --8<-- [end:step]
    return step


def tile_walk(parts: SimpleNamespace, step):
    """`flash_tiles`'s fold: the K and V tiles of the range double-buffered through `cp.async`, and
    `step(k_tiles, v_tiles, base, ...)` on each once its copies are in (the step's first barrier
    makes them the block's); a fold's P precision is its step (`bf16x2_step`, `fp16_step`)."""
    issue, lane_offsets = attrgetter("issue", "lane_offsets")(parts)
    keys, tile_keys, tile_elements, key_tiles = attrgetter("keys", "tile_keys", "tile_elements", "key_tiles")(parts)
    buffers_shape, scores_shape = 2 * tile_elements, (key_tiles, 4)

    # --8<-- [start:fold]
    @cuda.jit(device=True, inline=True)
    def fold(k_flat, v_flat, table, kv_head, start, end, shift, last0, last1, query, out, maxes, sums):
        # two buffers: one tile filling while the other is used
        k_tiles = cuda.shared.array(buffers_shape, np.uint16, alignment=SHARED_ALIGNMENT)
        v_tiles = cuda.shared.array(buffers_shape, np.uint16, alignment=SHARED_ALIGNMENT)
        scores = cuda.local.array(scores_shape, float32)
        k_lane, v_lane = lane_offsets()
        issue(k_flat, v_flat, table, kv_head, start, end, shift, k_tiles, v_tiles, 0)
        # int32 positions: Numba's default int64 doubles every add and compare
        for tile_start in range(np.int32(start), np.int32(end), tile_keys):
            base = np.uint32(tile_start - start) // np.uint32(keys) % np.uint32(2) * np.uint32(tile_elements)
            if np.int32(tile_start + tile_keys) < np.int32(end):
                issue(k_flat, v_flat, table, kv_head, tile_start + tile_keys, end, shift, k_tiles, v_tiles,
                      tile_elements - base)  # fmt: skip
            else:
                cp_async_commit()  # an empty group, so that one wait rule serves every tile
            cp_async_wait(1)
            step(k_tiles, v_tiles, base, k_lane, v_lane, tile_start, last0, last1, query, scores, out, maxes, sums)
            cuda.syncthreads()  # every warp is done with this buffer before it is refilled
        cp_async_wait(0)

    # --8<-- [end:fold]
    return fold


@cuda.jit(device=True, inline=True)
def lane_rows(first_unit, kv_head, group):
    """This lane's two rows, g and g + 8 of its warp's 16: (the first's row in the block, then
    for each its unit first_unit + row // G and its query head kv_head * G + row % G)."""
    row = 2 * MMA_N * (cuda.threadIdx.x // 32) + (cuda.threadIdx.x % 32) // 4
    unit_a, unit_b = first_unit + row // group, first_unit + (row + 8) // group
    return row, unit_a, kv_head * group + row % group, unit_b, kv_head * group + (row + 8) % group


@cuda.jit(device=True, inline=True)
def empty_state(out, maxes, sums):
    """O = 0, max = -inf, sum = 0 for both of a lane's rows."""
    for n in range(out.shape[0]):
        for c in range(4):
            out[n, c] = float32(0.0)
    for i in range(2):
        maxes[i] = -math.inf
        sums[i] = float32(0.0)
