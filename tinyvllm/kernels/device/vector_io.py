"""16-byte loads and stores: eight bf16 values per instruction.

A bandwidth-bound kernel reaches the HBM roofline only with many bytes in flight per
thread. Numba indexes a uint16 array two bytes at a time, and LLVM cannot merge
neighbouring loads into one wide load because it does not know the address is 16-byte
aligned. `load_words(row, i)` tells it: it loads `row[i : i + 8]` as one aligned
`<4 x i32>`, which the NVPTX backend emits as a single `ld.global.v4.u32`, and returns
the four 32-bit words (each holds two bf16 values, the lower index in the low half).
`store_words(row, i, words)` is the matching `st.global.v4.u32`. Both are ordinary LLVM
loads and stores, so the compiler still sees every memory dependence. `prefetch_l2(row, i)`
asks for the line holding `row[i]` to be brought into L2 (`prefetch.global.L2`): no register
receives it and nothing waits for it, so a kernel whose registers are full can still keep
device memory busy with what it will load next.

The caller guarantees alignment: `row` is a C-contiguous uint16 row, `i` a multiple of 8,
and the launcher has run `check_rows_of_eight` on the array the row comes from (rows a
multiple of 8 elements long, base address a multiple of 16 bytes).

`flat_view(matrix)` is a C-contiguous array's elements as one row (the same memory), for
kernels that index it by row * K + col in 32-bit integers.

`load_bf16x8` / `store_bf16x8` add the bf16 <-> float32 conversion into a local
float32[8] array. The CUDA simulator runs no LLVM, so there the same contract is met with
eight scalar accesses (and `prefetch_l2` does nothing); the choice is made once, at import
(`simulator.py` lists every such choice).
"""

import numpy as np
from numba import cuda

from tinyvllm.kernels.device.bf16 import f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.simulator import SIMULATOR

VECTOR = 8
ALIGNMENT_BYTES = 16
BF16_NAN_PAIR = 0x7FC07FC0


def element_pointer(context, builder, array_type, array, index_type, index):
    """Code generation: the LLVM pointer to array[index] of a 1-D Numba array (its struct)."""
    from numba import types
    from numba.cuda import cgutils

    struct = context.make_array(array_type)(context, builder, value=array)
    index = context.cast(builder, index, index_type, types.intp)
    return cgutils.get_item_pointer(context, builder, array_type, struct, [index])


def _wide_intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    words_type = types.UniTuple(types.uint32, 4)
    vector_type = ir.VectorType(ir.IntType(32), 4)

    def is_contiguous_bf16_row(row):
        return isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C" and row.dtype == types.uint16

    def vector_pointer(context, builder, row_type, row, index_type, index):
        element = element_pointer(context, builder, row_type, row, index_type, index)
        return builder.bitcast(element, vector_type.as_pointer())

    # --8<-- [start:load-words]
    @intrinsic
    def load_words(typingctx, row, index):
        if not (is_contiguous_bf16_row(row) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            pointer = vector_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            vector = builder.load(pointer, align=ALIGNMENT_BYTES)
            words = [builder.extract_element(vector, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, words_type, words)

        return words_type(row, index), codegen

    # --8<-- [end:load-words]

    @intrinsic
    def store_words(typingctx, row, index, words):
        if not (is_contiguous_bf16_row(row) and isinstance(index, types.Integer) and words == words_type):
            return None

        def codegen(context, builder, sig, args):
            pointer = vector_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            vector = ir.Constant(vector_type, ir.Undefined)
            for k in range(4):
                word = builder.extract_value(args[2], k)
                vector = builder.insert_element(vector, word, ir.Constant(ir.IntType(32), k))
            builder.store(vector, pointer, align=ALIGNMENT_BYTES)

        return types.void(row, index, words), codegen

    @intrinsic
    def prefetch_l2(typingctx, row, index):
        if not (is_contiguous_bf16_row(row) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            pointer = vector_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            address = builder.ptrtoint(pointer, ir.IntType(64))
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [ir.IntType(64)]), "prefetch.global.L2 [$0];", "l", side_effect=True
            )
            builder.call(asm, [address])
            return context.get_dummy_value()

        return types.void(row, index), codegen

    return load_words, store_words, prefetch_l2


def _flat_view_intrinsic():
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import populate_array

    @intrinsic
    def flat_view(typingctx, array):
        if not (isinstance(array, types.Array) and array.layout == "C"):
            return None
        flat_type = array.copy(ndim=1, layout="C")

        def codegen(context, builder, sig, args):
            source = context.make_array(sig.args[0])(context, builder, value=args[0])
            size = cgutils.unpack_tuple(builder, source.shape)[0]
            for extent in cgutils.unpack_tuple(builder, source.shape)[1:]:
                size = builder.mul(size, extent)
            flat = context.make_array(flat_type)(context, builder)
            populate_array(flat, data=source.data, shape=[size], strides=[source.itemsize], itemsize=source.itemsize,
                           meminfo=source.meminfo, parent=source.parent)  # fmt: skip
            return flat._getvalue()

        return flat_type(array), codegen

    return flat_view


@cuda.jit(device=True)
def _flat_view_reshape(array):
    return array.reshape(array.size)


@cuda.jit(device=True)
def _load_words_scalar(row, index):
    return (
        np.uint32(row[index]) | np.uint32(np.uint32(row[index + 1]) << np.uint32(16)),
        np.uint32(row[index + 2]) | np.uint32(np.uint32(row[index + 3]) << np.uint32(16)),
        np.uint32(row[index + 4]) | np.uint32(np.uint32(row[index + 5]) << np.uint32(16)),
        np.uint32(row[index + 6]) | np.uint32(np.uint32(row[index + 7]) << np.uint32(16)),
    )


@cuda.jit(device=True)
def _store_words_scalar(row, index, words):
    for k in range(4):
        row[index + 2 * k] = np.uint16(words[k] & np.uint32(0xFFFF))
        row[index + 2 * k + 1] = np.uint16(words[k] >> np.uint32(16))


@cuda.jit(device=True)
def _prefetch_nothing(row, index):
    pass


if SIMULATOR:
    load_words, store_words, prefetch_l2 = _load_words_scalar, _store_words_scalar, _prefetch_nothing
    flat_view = _flat_view_reshape
else:
    load_words, store_words, prefetch_l2 = _wide_intrinsics()
    # Numba's reshape calls a C helper that no CUDA module links; the view is a new array struct
    flat_view = _flat_view_intrinsic()


# --8<-- [start:halves]
@cuda.jit(device=True, inline=True)
def low_half(word):
    """The bf16 in the low 16 bits of a word, as float32."""
    return np.uint32(word << np.uint32(16)).view(np.float32)


@cuda.jit(device=True, inline=True)
def high_half(word):
    """The bf16 in the high 16 bits of a word, as float32."""
    return np.uint32(word & np.uint32(0xFFFF0000)).view(np.float32)


@cuda.jit(device=True, inline=True)
def pack_pair(low, high):
    """Two float32 -> one word of two bf16 (each rounded to nearest even)."""
    return np.uint32(np.uint32(f32_to_bf16(low)) | np.uint32(np.uint32(f32_to_bf16(high)) << np.uint32(16)))


# --8<-- [end:halves]


@cuda.jit(device=True, inline=True)
def load_bf16x8(row, index, values):
    """values[0:8] = float32(row[index : index + 8]) with one 16-byte load."""
    w0, w1, w2, w3 = load_words(row, index)
    values[0] = low_half(w0)
    values[1] = high_half(w0)
    values[2] = low_half(w1)
    values[3] = high_half(w1)
    values[4] = low_half(w2)
    values[5] = high_half(w2)
    values[6] = low_half(w3)
    values[7] = high_half(w3)


@cuda.jit(device=True, inline=True)
def store_bf16x8(row, index, values):
    """row[index : index + 8] = bf16(values[0:8]) with one 16-byte store."""
    words = (
        pack_pair(values[0], values[1]),
        pack_pair(values[2], values[3]),
        pack_pair(values[4], values[5]),
        pack_pair(values[6], values[7]),
    )
    store_words(row, index, words)


def data_address(array) -> int:
    """The address of element 0: a Numba device array's own pointer (its CUDA array interface
    builds a dict on every call, and a prefill step asks hundreds of times), other device
    arrays through the CUDA array interface, NumPy through its own."""
    pointer = getattr(array, "device_ctypes_pointer", None)
    if pointer is not None:
        return pointer.value or 0
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__
    return interface["data"][0]


def check_rows_of_eight(name: str, array, shape) -> tuple[int, ...]:
    """check_array, plus what 16-byte access needs: rows of a multiple of 8, a 16-byte aligned start."""
    shape = check_array(name, array, np.uint16, shape)
    if shape[-1] % VECTOR != 0:
        raise ValueError(f"{name}: last dimension {shape[-1]} must be a multiple of {VECTOR} for 16-byte access")
    if data_address(array) % ALIGNMENT_BYTES != 0:
        raise ValueError(f"{name}: data must start on a {ALIGNMENT_BYTES}-byte boundary")
    return shape
