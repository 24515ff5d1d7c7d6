"""`exp2_ftz(x)`: 2^x as one MUFU.EX2, the softmax weights' exponential.

libdevice's `exp2f` (what `math.exp2` compiles to) is `ex2.approx.f32`, and ptxas wraps that
in four instructions so that a result below 2^-126 comes out subnormal: halve the argument
under -126, MUFU.EX2, square the result. `ex2.approx.ftz.f32` is the bare MUFU.EX2 (relative
error about 2^-22): a subnormal argument counts as 0 and a result below 2^-126 is +0. In
softmax a weight that small sits beside a weight of 1 (the row's max) in the same float32
sum, which it cannot move, so flushing it changes no output.

Under the simulator there is no PTX: the stand-in is exp2 in float64 of the float32 argument,
with both flushes, rounded to float32 (`simulator.py` lists it).
"""

import numpy as np

from tinyvllm.kernels.device.simulator import SIMULATOR

SMALLEST_NORMAL = np.float32(2.0**-126)


def _simulated_exp2_ftz(x):
    x = np.float32(x)
    if abs(x) < SMALLEST_NORMAL:
        x = np.float32(0.0)
    with np.errstate(over="ignore"):  # past float32's range is infinity, as on the GPU
        result = np.float32(np.exp2(np.float64(x)))
    return np.float32(0.0) if result < SMALLEST_NORMAL else result


def _ptx_exp2_ftz():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32 = ir.FloatType()

    @intrinsic
    def exp2_ftz(typingctx, x):
        if not isinstance(x, types.Float):
            return None

        def codegen(context, builder, sig, args):
            value = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(f32, [f32]), "ex2.approx.ftz.f32 $0, $1;", "=f,f")
            return builder.call(asm, [value])

        return types.float32(x), codegen

    return exp2_ftz


exp2_ftz = _simulated_exp2_ftz if SIMULATOR else _ptx_exp2_ftz()
