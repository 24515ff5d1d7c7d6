"""Block-wide sum and max: every thread of a block contributes a value and gets the total.
`block_argmax` does the same for (value, index) pairs: the largest value, and among equal
values the lowest index (as np.argmax); every thread gets the index.

On the GPU a warp adds its 32 values with butterfly shuffles (`shfl_xor`), each warp
leaves its partial in shared memory, and the first warp reduces those. The CUDA
simulator has no shuffles, so there the same contract is met with a shared-memory tree.
The choice is made once, at import (`simulator.py` lists every such choice).

`scratch` is a shared float32 array with one slot per thread of the block (the GPU path
uses only the first 32), and `index_scratch` an int32 one; the block size must be a power
of two no larger than 1024.

Lane groups. Some kernels spread one dot product over a small group of adjacent lanes,
each holding a slice of D, and add the slices with butterfly shuffles (`lane_group_sum`).
Under the simulator the same sum goes through shared memory (`group_scratch_shape` gives
the scratch each world needs), and every thread of the block must make the call the same
number of times, since that version synchronises the block.
"""

import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.device.simulator import SIMULATOR

WARP = 32


# --8<-- [start:shuffle]
@cuda.jit(device=True, inline=True)
def _warp_sum(value):
    offset = WARP // 2
    while offset > 0:
        value += cuda.shfl_xor_sync(0xFFFFFFFF, value, offset)
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def _warp_max(value):
    offset = WARP // 2
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(0xFFFFFFFF, value, offset))
        offset //= 2
    return value


@cuda.jit(device=True, inline=True)
def _shuffle_block_sum(value, scratch):
    lane = cuda.threadIdx.x % WARP
    warp = cuda.threadIdx.x // WARP
    num_warps = (cuda.blockDim.x + WARP - 1) // WARP
    value = _warp_sum(value)
    cuda.syncthreads()
    if lane == 0:
        scratch[warp] = value
    cuda.syncthreads()
    value = scratch[lane] if lane < num_warps else float32(0.0)
    return _warp_sum(value)


# --8<-- [end:shuffle]


@cuda.jit(device=True, inline=True)
def _shuffle_block_max(value, scratch):
    lane = cuda.threadIdx.x % WARP
    warp = cuda.threadIdx.x // WARP
    num_warps = (cuda.blockDim.x + WARP - 1) // WARP
    value = _warp_max(value)
    cuda.syncthreads()
    if lane == 0:
        scratch[warp] = value
    cuda.syncthreads()
    value = scratch[lane] if lane < num_warps else float32(-math.inf)
    return _warp_max(value)


# --8<-- [start:tree]
@cuda.jit(device=True, inline=True)
def _tree_block_sum(value, scratch):
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    scratch[tid] = value
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            scratch[tid] += scratch[tid + stride]
        cuda.syncthreads()
        stride //= 2
    total = scratch[0]
    cuda.syncthreads()
    return total


# --8<-- [end:tree]


@cuda.jit(device=True, inline=True)
def _tree_block_max(value, scratch):
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    scratch[tid] = value
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            scratch[tid] = max(scratch[tid], scratch[tid + stride])
        cuda.syncthreads()
        stride //= 2
    total = scratch[0]
    cuda.syncthreads()
    return total


_NO_INDEX = np.int32(2**31 - 1)


@cuda.jit(device=True, inline=True)
def argmax_better(value, index, best_value, best_index):
    """Whether (value, index) wins over (best_value, best_index) in an argmax."""
    return value > best_value or (value == best_value and index < best_index)


@cuda.jit(device=True, inline=True)
def _warp_argmax(value, index):
    offset = WARP // 2
    while offset > 0:
        other_value = cuda.shfl_xor_sync(0xFFFFFFFF, value, offset)
        other_index = cuda.shfl_xor_sync(0xFFFFFFFF, index, offset)
        if argmax_better(other_value, other_index, value, index):
            value, index = other_value, other_index
        offset //= 2
    return value, index


@cuda.jit(device=True, inline=True)
def _shuffle_block_argmax(value, index, scratch, index_scratch):
    lane = cuda.threadIdx.x % WARP
    warp = cuda.threadIdx.x // WARP
    num_warps = (cuda.blockDim.x + WARP - 1) // WARP
    value, index = _warp_argmax(value, index)
    cuda.syncthreads()
    if lane == 0:
        scratch[warp] = value
        index_scratch[warp] = index
    cuda.syncthreads()
    value, index = float32(-math.inf), _NO_INDEX
    if lane < num_warps:
        value, index = scratch[lane], index_scratch[lane]
    return _warp_argmax(value, index)[1]


@cuda.jit(device=True, inline=True)
def _tree_block_argmax(value, index, scratch, index_scratch):
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    scratch[tid] = value
    index_scratch[tid] = index
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        other = tid + stride
        if tid < stride and argmax_better(scratch[other], index_scratch[other], scratch[tid], index_scratch[tid]):
            scratch[tid] = scratch[other]
            index_scratch[tid] = index_scratch[other]
        cuda.syncthreads()
        stride //= 2
    best = index_scratch[0]
    cuda.syncthreads()
    return best


if SIMULATOR:
    block_sum, block_max, block_argmax = _tree_block_sum, _tree_block_max, _tree_block_argmax
else:
    block_sum, block_max, block_argmax = _shuffle_block_sum, _shuffle_block_max, _shuffle_block_argmax


LANE_GROUP_WARP = 1 if SIMULATOR else WARP
"""What a block using `lane_group_sum` is a whole number of: warps on the GPU (a shuffle
names all 32 lanes), single threads under the simulator's shared-memory sum."""


def group_scratch_shape(threads: int, values: int) -> tuple[int, int]:
    """Shared float32 scratch for `lane_group_sum` of `values` numbers per thread."""
    return (threads, values) if SIMULATOR else (1, 1)


@cuda.jit(device=True, inline=True)
def _shuffle_group_sum(values, lanes, scratch):
    offset = lanes // 2
    while offset > 0:
        for i in range(values.shape[0]):
            values[i] += cuda.shfl_xor_sync(0xFFFFFFFF, values[i], offset)
        offset //= 2


@cuda.jit(device=True, inline=True)
def _shared_group_sum(values, lanes, scratch):
    if lanes == 1:
        return
    tid = cuda.threadIdx.x
    first = tid - tid % lanes
    cuda.syncthreads()
    for i in range(values.shape[0]):
        scratch[tid, i] = values[i]
    cuda.syncthreads()
    for i in range(values.shape[0]):
        total = float32(0.0)
        for lane in range(lanes):
            total += scratch[first + lane, i]
        values[i] = total


lane_group_sum = _shared_group_sum if SIMULATOR else _shuffle_group_sum
"""values[i] = sum of values[i] over the `lanes` adjacent threads of this thread's group (in place)."""
