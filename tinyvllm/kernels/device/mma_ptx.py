"""The PTX behind `mma.py`'s instructions: Numba intrinsics whose code is llvmlite inline assembly.

An `@intrinsic` types a call and hands back a code generator; this one's emits an
`ir.InlineAsm` call (numba-cuda's own `cache_hints.py` reaches `ld.global.cs` the same way).
Array arguments arrive as Numba's array structs: `element_pointer` (`vector_io.py`) finds the element, and
`shared_address` and `global_address` turn its generic pointer into the state space the
instruction names. Every call is `convergent`: a warp-collective instruction that LLVM must
not move into (or out of) divergent control flow. Imported only on a GPU: under the
simulator `mma.py` hands out Python stand-ins instead.
"""

MMA_PTX = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
MMA_F16_PTX = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


def ptx_instructions():
    """(mma_bf16_16816, ldmatrix_x4, ldmatrix_x4_trans, bf16x2, cp_async_16, cp_async_16_zfill,
    cp_async_commit, cp_async_wait, mma_f16_16816, f16x2) as Numba intrinsics (their contracts:
    `mma.py`)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from tinyvllm.kernels.device.vector_io import element_pointer

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    words_type = types.UniTuple(types.uint32, 4)
    results_type = types.UniTuple(types.float32, 4)

    def is_bf16_row(array):
        return isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.uint16

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
    def mma_16816(ptx):
        """The m16n8k16 mma with float32 accumulators whose operands `ptx` names (bf16 or f16)."""

        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            accumulators = (c0, c1, c2, c3)
            if not all(isinstance(r, types.Integer) for r in (a0, a1, a2, a3, b0, b1)):
                return None
            if not all(isinstance(c, types.Float) for c in accumulators):
                return None

            def codegen(context, builder, sig, args):
                words = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:6], sig.args[:6], strict=True)]
                sums = [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:], sig.args[6:], strict=True)]
                text = f"{ptx} {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, {{$10, $11, $12, $13}};"
                constraints = "=f,=f,=f,=f," + "r," * 6 + "f,f,f,f"
                operand_types = [i32] * 6 + [f32] * 4
                d = asm_call(builder, ir.LiteralStructType([f32] * 4), operand_types, text, constraints, words + sums)
                return context.make_tuple(builder, results_type, [builder.extract_value(d, k) for k in range(4)])

            return results_type(a0, a1, a2, a3, b0, b1, *accumulators), codegen

        return mma

    # --8<-- [end:mma]

    def ldmatrix(shape):
        @intrinsic
        def load(typingctx, shared, offset):
            if not (is_bf16_row(shared) and isinstance(offset, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                pointer = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                text = f"ldmatrix.sync.aligned.{shape}.shared.b16 {{$0, $1, $2, $3}}, [$4];"
                struct = ir.LiteralStructType([i32] * 4)
                address = shared_address(builder, pointer)
                # reads shared memory that syncthreads orders: the clobber keeps it after the barrier
                r = asm_call(builder, struct, [i32], text, "=r,=r,=r,=r,r,~{memory}", [address])
                return context.make_tuple(builder, words_type, [builder.extract_value(r, k) for k in range(4)])

            return words_type(shared, offset), codegen

        return load

    def pack_x2(half_type):
        """Two float32 rounded to nearest even into one register of two `half_type` (bf16 or f16)."""

        @intrinsic
        def pack(typingctx, low, high):
            if not all(isinstance(v, types.Float) for v in (low, high)):
                return None

            def codegen(context, builder, sig, args):
                values = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args, strict=True)]
                # cvt's first source goes to the upper half
                text = f"cvt.rn.{half_type}x2.f32 $0, $1, $2;"
                return asm_call(builder, i32, [f32, f32], text, "=r,f,f", [values[1], values[0]])

            return types.uint32(low, high), codegen

        return pack

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

    instructions = (mma_16816(MMA_PTX), ldmatrix("m8n8.x4"), ldmatrix("m8n8.x4.trans"), pack_x2("bf16"))
    copies = (cp_async_16, cp_async_16_zfill, cp_async_commit, cp_async_wait)
    return *instructions, *copies, mma_16816(MMA_F16_PTX), pack_x2("f16")
