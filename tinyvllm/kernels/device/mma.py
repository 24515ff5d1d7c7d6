"""Tensor cores from Numba: `mma.sync`, `ldmatrix` and `cp.async` through inline PTX.

numba-cuda has no tensor-core API, but an `@intrinsic` whose code generator emits an
llvmlite `ir.InlineAsm` call puts any PTX instruction in the kernel (numba-cuda's own
`cache_hints.py` does this for `ld.global.cs`). Three instructions make a tensor-core GEMM:

`mma_bf16_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)`
    `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: the 32 lanes of a warp together
    compute D[16, 8] = A[16, 16] @ B[16, 8] + C[16, 8], A and B in bf16, C and D in float32.
    Each lane holds a fragment: four uint32 registers of A (two bf16 each, the lower column
    in the low 16 bits), two of B (the lower k in the low half), four float32 of C and D.
    With g = lane // 4 and t = lane % 4 (PTX ISA, "Matrix fragments for mma.m16n8k16"):

        a0: A[g,     2t : 2t + 2]      a1: A[g + 8, 2t : 2t + 2]
        a2: A[g,     2t + 8 : 2t + 10] a3: A[g + 8, 2t + 8 : 2t + 10]
        b0: B[2t : 2t + 2, g]          b1: B[2t + 8 : 2t + 10, g]
        c0, c1: C[g, 2t], C[g, 2t + 1] c2, c3: C[g + 8, 2t], C[g + 8, 2t + 1]   (D the same)

    ".row.col" names the layouts the fragments come from: A row-major, B column-major, so
    a row of B^T (a weight row, [out, in] as stored) gives a lane its two b registers.
    The four results come back as a UniTuple(float32, 4): an SSA aggregate that stays in
    registers; writing into a local array passed in would leave that to LLVM's SROA.

`ldmatrix_x4(shared, offset) -> (r0, r1, r2, r3)`
    `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8x8 bf16 matrices from shared memory.
    Lane L names the start of one 8-element (16-byte aligned) row: lanes 8j .. 8j + 7 give
    the rows 0..7 of matrix j. Each lane then receives, in register j, the two elements
    2t, 2t + 1 of row g of matrix j: exactly the mma fragment layout above, so with matrix
    j = the 8x8 quarter (rows 8 * (j % 2), columns 8 * (j // 2)) of a 16x16 A tile, r0..r3
    are a0..a3. For B^T stored [n, k] (k contiguous), matrices (n 0-7, k 0-7), (n 0-7, k 8-15)
    give b0, b1 of one n8 tile; an x4 load covers two n8 tiles.
    `offset` is this lane's element index into the uint16 shared array `shared`.

`ldmatrix_x4_trans(shared, offset)`: the same four matrices, each transposed on the way:
    register j of a lane holds elements (rows 2t, 2t + 1; column g) of matrix j. From a tile
    stored [k, n] (n contiguous, as V is stored [key, dim]), matrices (k 0-7, n 0-7) and
    (k 8-15, n 0-7) give b0, b1 of one n8 tile: P @ V needs no transposed copy of V.

`bf16x2(low, high) -> uint32`: two float32 rounded to bf16 (nearest even) in one register,
    `low` in the low half (`cvt.rn.bf16x2.f32`). The accumulators of one mma, so packed,
    are the A fragment of the next: the C layout of n8 tiles 2j and 2j + 1 is the A layout
    of k-step j (FlashAttention-2 keeps its probabilities in registers this way).

`mma_f16_16816(...)`, `f16x2(low, high)`, `bf16x2_to_f16x2(word)`: the same with float16
    operands (`.f32.f16.f16.f32`, the fragment layout above; `cvt.rn.f16x2.f32`). float16 keeps
    10 mantissa bits to bf16's 7 but only 5 exponent bits: normal from 2^-14, finite below
    65520. `bf16x2_to_f16x2` converts a register of two bf16 (exactly, for magnitudes from 2^-14
    to 65280, bf16's largest below 2^16; smaller ones round to float16's subnormals, 2^16 and
    up become infinity).

`quad_max(value)`, `quad_sum(value)`: over the four lanes 4g .. 4g + 3 that hold one row
    of an accumulator tile (two butterfly shuffles; under the simulator, the warp exchange).

`cp_async_16(shared, shared_offset, row, row_offset)`, `cp_async_commit()`, `cp_async_wait(N)`
    `cp.async.cg.shared.global`: 16 bytes (8 bf16) from global to shared memory without a
    register in between, in flight until `cp.async.wait_group N` leaves at most N of this
    thread's committed groups pending. Other threads see the data after the wait and a
    `syncthreads`. Both offsets are multiples of 8 elements (16-byte aligned).

`cp_async_16_zfill(shared, shared_offset, row, row_offset, valid)`
    The same copy with a source size of 16 bytes if `valid`, else 0: PTX fills the bytes
    past the source size with zeros, so a chunk past a matrix's edge becomes 8 zeros in
    the same instruction, read from nowhere. The address must still be formed, so callers
    pass some row of the matrix (a clamped index) for an invalid chunk.

Alignment: every row address of ldmatrix and both addresses of cp.async are 16-byte
aligned, so offsets are multiples of 8 and the shared arrays are declared with
`alignment=SHARED_ALIGNMENT` (Numba aligns a uint16 shared array to 2 bytes otherwise); the
stand-ins refuse offsets that are not multiples of 8.

Shared addresses (`mma_ptx.py` emits the PTX): Numba hands a shared array's data as a generic pointer; an LLVM
`addrspacecast` to address space 3 and a 32-bit `ptrtoint` give the `.shared` address these
instructions take (NVPTX emits `cvta.to.shared`, or, for an array it knows is a shared
symbol, as in the kernels so far, the symbol's address itself).

Under the simulator there is no PTX, and each CUDA thread is a Python thread. The stand-ins
(chosen once at import, `simulator.py` lists them) are plain Python with the same fragment
layout: a warp's 32 lanes meet in a per-warp exchange (a slot per lane and a
`threading.Barrier(32)`, one per warp of each simulated block), each lane posts its
registers (or its row offset) and waits for the warp; the last lane to arrive computes what
the hardware would route to every lane, once for the warp, and each takes its part. The simulator has
no `syncwarp` and its `syncthreads` would tie the whole block; the barrier ties only the
warp, as `.sync.aligned` does. The mma stand-in sums the 16 products of each element in
float64 and rounds once to float32; the tensor core accumulates in float32 with an order and
rounding PTX does not specify, so results agree to float32 rounding, not bit for bit. The
conversions round as the hardware does, through `f32_to_bf16` and NumPy's float16.
The copies (`cp_async_16`, and `_zfill`'s copy or zeros) happen at once and the commit and
wait do nothing. Every lane of a warp must make the same calls (as on the GPU), and a block
is a whole number of warps.
"""

import threading
import weakref

import numpy as np
from numba import cuda

from tinyvllm.kernels.device.bf16 import f32_to_bf16
from tinyvllm.kernels.device.mma_ptx import ptx_instructions
from tinyvllm.kernels.device.simulator import SIMULATOR
from tinyvllm.kernels.device.vector_io import high_half, low_half

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16


class _WarpExchange:
    """The simulator's stand-in for a warp's register crossbar: slots for the lanes, a barrier.

    Each lane posts its value and waits; the last to arrive runs `combine` on all 32 values,
    once for the warp, and each lane leaves with its own element of the result. Two sets of
    slots alternate, so one barrier a call suffices: a lane can post the next call's value
    while slower lanes still read this call's results, but not post the one after it until
    every lane has reached (so has finished reading) the next barrier.
    """

    def __init__(self):
        self.slots = ([None] * WARP, [None] * WARP)
        self.combines = [None, None]
        self.results = [None, None]
        self.calls_made = [0] * WARP
        self.calls_combined = 0
        self.barrier = threading.Barrier(WARP, action=self._combine)

    def _combine(self):
        turn = self.calls_combined % 2
        self.results[turn] = self.combines[turn](self.slots[turn])
        self.calls_combined += 1

    def exchange(self, lane, value, combine):
        turn = self.calls_made[lane] % 2
        self.calls_made[lane] += 1
        self.slots[turn][lane] = value
        self.combines[turn] = combine  # the same function from every lane
        self.barrier.wait()
        return self.results[turn][lane]


_exchanges = weakref.WeakKeyDictionary()
_exchanges_lock = threading.Lock()


def _warp_exchange(value, combine):
    """`_WarpExchange.exchange` for the calling simulated thread's warp."""
    thread = threading.current_thread()
    manager = thread._manager  # the simulator's BlockManager: one per block of a launch
    if np.prod(manager._block_dim) % WARP != 0:
        raise ValueError(f"block {manager._block_dim}: warp-collective instructions need whole warps")
    warp, lane = divmod(thread.thread_id, WARP)
    with _exchanges_lock:
        warps = _exchanges.setdefault(manager, {})
        exchange = warps.setdefault(warp, _WarpExchange())
    return exchange.exchange(lane, value, combine)


_G, _T = np.arange(WARP) // 4, np.arange(WARP) % 4
"""Each lane's g and t (mma.py's fragment layout)."""


def _bf16_halves(words):
    return (words << 16).view(np.float32).astype(np.float64), (words & 0xFFFF0000).view(np.float32).astype(np.float64)


def _f16_halves(words):
    halves = words.astype("<u4").view(np.float16).astype(np.float64)  # [lane, register, (low, high)]
    return halves[..., 0::2], halves[..., 1::2]


def _combined_mma(fragments, halves=_bf16_halves):
    """The warp's D fragments from its A, B and C fragments: [lane] -> (d0, d1, d2, d3).
    `halves` reads a register's two operands (low, high) as float64."""
    words = np.array([f[:6] for f in fragments], np.uint32)  # [lane, register]
    low, high = halves(words)
    g, t2 = _G, 2 * _T
    a = np.zeros((MMA_M, MMA_K))
    b = np.zeros((MMA_K, MMA_N))
    for register, (row, column) in enumerate(((g, t2), (g + 8, t2), (g, t2 + 8), (g + 8, t2 + 8))):
        a[row, column], a[row, column + 1] = low[:, register], high[:, register]
    for register, k in enumerate((t2, t2 + 8)):
        b[k, g], b[k + 1, g] = low[:, 4 + register], high[:, 4 + register]
    c = np.array([f[6:] for f in fragments], np.float64)  # [lane, accumulator]
    with np.errstate(invalid="ignore"):  # 0 x inf is NaN there, as on the tensor core
        product = a @ b
        d = np.stack([product[g, t2], product[g, t2 + 1], product[g + 8, t2], product[g + 8, t2 + 1]], axis=1) + c
    return [tuple(lane) for lane in d.astype(np.float32)]


def _combined_mma_f16(fragments):
    return _combined_mma(fragments, _f16_halves)


def _simulated_mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_exchange((a0, a1, a2, a3, b0, b1, float(c0), float(c1), float(c2), float(c3)), _combined_mma)


def _simulated_mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_exchange((a0, a1, a2, a3, b0, b1, float(c0), float(c1), float(c2), float(c3)), _combined_mma_f16)


def _check_row_start(offset):
    if offset % 8 != 0:
        raise ValueError(f"offset {offset}: ldmatrix rows and cp.async chunks start on 16 bytes (8 bf16)")


def _combined_ldmatrix_x4(requests):
    """Each lane's four registers from the warp's (shared, row offset) pairs."""
    shared = requests[0][0]
    offsets = np.array([offset for _, offset in requests], np.int64)
    starts = offsets[8 * np.arange(4)[None, :] + _G[:, None]] + 2 * _T[:, None]  # [lane, matrix]
    words = shared[starts].astype(np.uint32) | (shared[starts + 1].astype(np.uint32) << np.uint32(16))
    return [tuple(lane) for lane in words]


def _simulated_ldmatrix_x4(shared, offset):
    _check_row_start(offset)
    return _warp_exchange((shared, int(offset)), _combined_ldmatrix_x4)


def _combined_ldmatrix_x4_trans(requests):
    """Each lane's four registers, each 8x8 matrix transposed: rows 2t, 2t + 1 of column g."""
    shared = requests[0][0]
    offsets = np.array([offset for _, offset in requests], np.int64)
    rows = 8 * np.arange(4)[None, :] + 2 * _T[:, None]  # [lane, matrix]
    low, high = shared[offsets[rows] + _G[:, None]], shared[offsets[rows + 1] + _G[:, None]]
    words = low.astype(np.uint32) | (high.astype(np.uint32) << np.uint32(16))
    return [tuple(lane) for lane in words]


def _simulated_ldmatrix_x4_trans(shared, offset):
    _check_row_start(offset)
    return _warp_exchange((shared, int(offset)), _combined_ldmatrix_x4_trans)


def _simulated_bf16x2(low, high):
    return np.uint32(int(f32_to_bf16(low)) | (int(f32_to_bf16(high)) << 16))


def _simulated_f16x2(low, high):
    with np.errstate(over="ignore"):  # past float16's range is infinity, as cvt.rn makes it
        halves = np.array([low, high], np.float32).astype(np.float16).view(np.uint16)
    return np.uint32(int(halves[0]) | (int(halves[1]) << 16))


def _simulated_quad(reduce):
    def combine(values):
        quads = np.array(values, np.float64).reshape(WARP // 4, 4)
        return list(np.repeat(reduce(quads, axis=1), 4).astype(np.float32))

    def quad(value):
        return _warp_exchange(float(value), combine)

    return quad


def _simulated_cp_async_16(shared, shared_offset, row, row_offset):
    _check_row_start(shared_offset)
    _check_row_start(row_offset)
    for k in range(8):
        shared[shared_offset + k] = row[row_offset + k]


def _simulated_cp_async_16_zfill(shared, shared_offset, row, row_offset, valid):
    if valid:
        _simulated_cp_async_16(shared, shared_offset, row, row_offset)
        return
    _check_row_start(shared_offset)
    shared[shared_offset : shared_offset + 8] = 0


def _simulated_nothing(pending=0):
    pass


# --8<-- [start:quad]
@cuda.jit(device=True, inline=True)
def _shuffle_quad_max(value):
    value = max(value, cuda.shfl_xor_sync(0xFFFFFFFF, value, 1))
    return max(value, cuda.shfl_xor_sync(0xFFFFFFFF, value, 2))


@cuda.jit(device=True, inline=True)
def _shuffle_quad_sum(value):
    value += cuda.shfl_xor_sync(0xFFFFFFFF, value, 1)
    return value + cuda.shfl_xor_sync(0xFFFFFFFF, value, 2)


# --8<-- [end:quad]

if SIMULATOR:
    mma_bf16_16816, ldmatrix_x4 = _simulated_mma, _simulated_ldmatrix_x4
    ldmatrix_x4_trans = _simulated_ldmatrix_x4_trans
    bf16x2, quad_max, quad_sum = _simulated_bf16x2, _simulated_quad(np.max), _simulated_quad(np.sum)
    cp_async_16, cp_async_16_zfill = _simulated_cp_async_16, _simulated_cp_async_16_zfill
    cp_async_commit, cp_async_wait = _simulated_nothing, _simulated_nothing
    mma_f16_16816, f16x2 = _simulated_mma_f16, _simulated_f16x2
else:
    mma_bf16_16816, ldmatrix_x4, ldmatrix_x4_trans, bf16x2, *_copies, mma_f16_16816, f16x2 = ptx_instructions()
    cp_async_16, cp_async_16_zfill, cp_async_commit, cp_async_wait = _copies
    quad_max, quad_sum = _shuffle_quad_max, _shuffle_quad_sum


@cuda.jit(device=True, inline=True)
def bf16x2_to_f16x2(word):
    """A register of two bf16 -> the same two values as float16 (each widened exactly to float32
    first, so the one rounding is cvt's)."""
    return f16x2(low_half(word), high_half(word))
