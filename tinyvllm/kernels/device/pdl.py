"""Programmatic dependent launch (PDL): a kernel's blocks start before the kernel ahead ends.

In a CUDA graph, kernel n + 1 normally waits until kernel n has finished and flushed its
writes before any of its blocks is scheduled: a microsecond or more per kernel boundary
in which the memory system idles, on each of a decode step's kernels. On
sm_90 and later a kernel can be launched with *programmatic stream serialization*: its
blocks may start as soon as every block of the kernel ahead has called
`allow_dependent_launch()` (or exited). They do the work that depends on nothing the
kernel ahead writes (address arithmetic; loading weights, which no kernel writes), then
`wait_for_prior_grid()` holds them until the kernel ahead has completed and its writes
are visible.

The contract every kernel in this package keeps: it calls `allow_dependent_launch()`
first, and `wait_for_prior_grid()` before it reads anything an earlier kernel may have
written or writes anything an earlier kernel may read. Both instructions do nothing for a
kernel launched the ordinary way, and both are no-ops under the simulator and on GPUs
older than sm_90. `programmatic_launches()` turns the launch attribute on for the Numba
launches made inside it (the runner wraps its graph captures in it).
"""

import contextlib
import functools

from numba import cuda

from tinyvllm.kernels.device.simulator import SIMULATOR

MIN_COMPUTE_CAPABILITY = (9, 0)


def _instructions():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def griddepcontrol(operation):
        @intrinsic
        def instruction(typingctx):
            def codegen(context, builder, sig, args):
                if cuda.get_current_device().compute_capability >= MIN_COMPUTE_CAPABILITY:
                    asm = ir.InlineAsm(
                        ir.FunctionType(ir.VoidType(), []),
                        f"griddepcontrol.{operation};",
                        "~{memory}",
                        side_effect=True,
                    )
                    builder.call(asm, [])
                return context.get_dummy_value()

            return types.void(), codegen

        return instruction

    return griddepcontrol("wait"), griddepcontrol("launch_dependents")


@cuda.jit(device=True, inline=True)
def _nothing():
    pass


if SIMULATOR:
    wait_for_prior_grid = allow_dependent_launch = _nothing
else:
    wait_for_prior_grid, allow_dependent_launch = _instructions()


@functools.cache
def supported() -> bool:
    """Whether this GPU and cuda.core can launch with programmatic stream serialization."""
    if SIMULATOR or cuda.get_current_device().compute_capability < MIN_COMPUTE_CAPABILITY:
        return False
    from cuda.core import LaunchConfig

    try:
        LaunchConfig(grid=1, block=1, programmatic_stream_serialization=True)
    except TypeError:
        return False
    return True


# --8<-- [start:launches]
@contextlib.contextmanager
def programmatic_launches():
    """Numba kernels launched inside may start while the kernel ahead of them finishes.

    Numba builds a `cuda.core.LaunchConfig` for every launch; inside this block the one it
    builds also carries the PDL attribute. Only kernels that keep the contract above may
    be launched inside it.
    """
    if not supported():
        yield
        return
    from numba.cuda import dispatcher

    plain = dispatcher.LaunchConfig
    dispatcher.LaunchConfig = functools.partial(plain, programmatic_stream_serialization=True)
    try:
        yield
    finally:
        dispatcher.LaunchConfig = plain


# --8<-- [end:launches]
