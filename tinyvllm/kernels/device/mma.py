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

Shared addresses: Numba hands a shared array's data as a generic pointer; an LLVM
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
rounding PTX does not specify, so results agree to float32 rounding, not bit for bit.
The copies (`cp_async_16`, and `_zfill`'s copy or zeros) happen at once and the commit and
wait do nothing. Every lane of a warp must make the same calls (as on the GPU), and a block
is a whole number of warps.
"""

import threading
import weakref

import numpy as np

from tinyvllm.kernels.device.simulator import SIMULATOR

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 16
MMA_PTX = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def _ptx_instructions():
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    words_type = types.UniTuple(types.uint32, 4)
    results_type = types.UniTuple(types.float32, 4)

    def is_bf16_row(array):
        return isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.uint16

    def element_pointer(context, builder, array_type, array, index_type, index):
        struct = context.make_array(array_type)(context, builder, value=array)
        index = context.cast(builder, index, index_type, types.intp)
        return cgutils.get_item_pointer(context, builder, array_type, struct, [index])

    def shared_address(builder, pointer):
        # generic -> .shared: NVPTX emits cvta.to.shared; shared addresses fit 32 bits
        shared_pointer = builder.addrspacecast(pointer, ir.PointerType(pointer.type.pointee, addrspace=3))
        return builder.ptrtoint(shared_pointer, i32)

    def global_address(builder, pointer):
        return builder.ptrtoint(builder.addrspacecast(pointer, ir.PointerType(pointer.type.pointee, addrspace=1)), i64)

    def asm_call(builder, result_type, argument_types, text, constraints, arguments, side_effect=False):
        asm = ir.InlineAsm(ir.FunctionType(result_type, argument_types), text, constraints, side_effect=side_effect)
        # warp-collective: LLVM must not move the call into (or out of) divergent control flow
        return builder.call(asm, arguments, attrs=("convergent",))

    # --8<-- [start:mma]
    @intrinsic
    def mma_bf16_16816(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        accumulators = (c0, c1, c2, c3)
        if not all(isinstance(r, types.Integer) for r in (a0, a1, a2, a3, b0, b1)):
            return None
        if not all(isinstance(c, types.Float) for c in accumulators):
            return None

        def codegen(context, builder, sig, args):
            words = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:6], sig.args[:6], strict=True)]
            sums = [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:], sig.args[6:], strict=True)]
            text = f"{MMA_PTX} {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, {{$10, $11, $12, $13}};"
            constraints = "=f,=f,=f,=f," + "r," * 6 + "f,f,f,f"
            operand_types = [i32] * 6 + [f32] * 4
            d = asm_call(builder, ir.LiteralStructType([f32] * 4), operand_types, text, constraints, words + sums)
            return context.make_tuple(builder, results_type, [builder.extract_value(d, k) for k in range(4)])

        return results_type(a0, a1, a2, a3, b0, b1, *accumulators), codegen

    # --8<-- [end:mma]

    @intrinsic
    def ldmatrix_x4(typingctx, shared, offset):
        if not (is_bf16_row(shared) and isinstance(offset, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            pointer = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            text = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
            struct = ir.LiteralStructType([i32] * 4)
            address = shared_address(builder, pointer)
            # reads shared memory that syncthreads orders: the clobber keeps it after the barrier
            r = asm_call(builder, struct, [i32], text, "=r,=r,=r,=r,r,~{memory}", [address])
            return context.make_tuple(builder, words_type, [builder.extract_value(r, k) for k in range(4)])

        return words_type(shared, offset), codegen

    def copy_addresses(context, builder, sig, args):
        target = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        source = element_pointer(context, builder, sig.args[2], args[2], sig.args[3], args[3])
        return [shared_address(builder, target), global_address(builder, source)]

    @intrinsic
    def cp_async_16(typingctx, shared, shared_offset, row, row_offset):
        if not (is_bf16_row(shared) and is_bf16_row(row)):
            return None

        def codegen(context, builder, sig, args):
            text = "cp.async.cg.shared.global [$0], [$1], 16;"
            arguments = copy_addresses(context, builder, sig, args)
            asm_call(builder, ir.VoidType(), [i32, i64], text, "r,l,~{memory}", arguments, True)
            return context.get_dummy_value()

        return types.void(shared, shared_offset, row, row_offset), codegen

    @intrinsic
    def cp_async_16_zfill(typingctx, shared, shared_offset, row, row_offset, valid):
        if not (is_bf16_row(shared) and is_bf16_row(row) and isinstance(valid, (types.Boolean, types.Integer))):
            return None

        def codegen(context, builder, sig, args):
            text = "cp.async.cg.shared.global [$0], [$1], 16, $2;"
            is_valid = context.cast(builder, args[4], sig.args[4], types.boolean)
            source_size = builder.select(is_valid, ir.Constant(i32, 16), ir.Constant(i32, 0))
            arguments = [*copy_addresses(context, builder, sig, args), source_size]
            asm_call(builder, ir.VoidType(), [i32, i64, i32], text, "r,l,r,~{memory}", arguments, True)
            return context.get_dummy_value()

        return types.void(shared, shared_offset, row, row_offset, valid), codegen

    @intrinsic
    def cp_async_commit(typingctx):
        def codegen(context, builder, sig, args):
            asm_call(builder, ir.VoidType(), [], "cp.async.commit_group;", "~{memory}", [], True)
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def cp_async_wait(typingctx, pending):
        if not isinstance(pending, types.IntegerLiteral):
            return None  # wait_group takes an immediate

        def codegen(context, builder, sig, args):
            text = f"cp.async.wait_group {pending.literal_value};"
            asm_call(builder, ir.VoidType(), [], text, "~{memory}", [], True)
            return context.get_dummy_value()

        return types.void(pending), codegen

    return mma_bf16_16816, ldmatrix_x4, cp_async_16, cp_async_16_zfill, cp_async_commit, cp_async_wait


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


def _combined_mma(fragments):
    """The warp's D fragments from its A, B and C fragments: [lane] -> (d0, d1, d2, d3)."""
    words = np.array([f[:6] for f in fragments], np.uint32)  # [lane, register]
    low = (words << 16).view(np.float32).astype(np.float64)
    high = (words & 0xFFFF0000).view(np.float32).astype(np.float64)
    g, t2 = _G, 2 * _T
    a = np.zeros((MMA_M, MMA_K))
    b = np.zeros((MMA_K, MMA_N))
    for register, (row, column) in enumerate(((g, t2), (g + 8, t2), (g, t2 + 8), (g + 8, t2 + 8))):
        a[row, column], a[row, column + 1] = low[:, register], high[:, register]
    for register, k in enumerate((t2, t2 + 8)):
        b[k, g], b[k + 1, g] = low[:, 4 + register], high[:, 4 + register]
    c = np.array([f[6:] for f in fragments], np.float64)  # [lane, accumulator]
    product = a @ b
    d = np.stack([product[g, t2], product[g, t2 + 1], product[g + 8, t2], product[g + 8, t2 + 1]], axis=1) + c
    return [tuple(lane) for lane in d.astype(np.float32)]


def _simulated_mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_exchange((a0, a1, a2, a3, b0, b1, float(c0), float(c1), float(c2), float(c3)), _combined_mma)


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


if SIMULATOR:
    mma_bf16_16816, ldmatrix_x4 = _simulated_mma, _simulated_ldmatrix_x4
    cp_async_16, cp_async_16_zfill = _simulated_cp_async_16, _simulated_cp_async_16_zfill
    cp_async_commit, cp_async_wait = _simulated_nothing, _simulated_nothing
else:
    mma_bf16_16816, ldmatrix_x4, cp_async_16, cp_async_16_zfill, cp_async_commit, cp_async_wait = _ptx_instructions()
