"""Block-wide sum and max: every thread of a block contributes a value and gets the total.

On the GPU a warp adds its 32 values with butterfly shuffles (`shfl_xor`), each warp
leaves its partial in shared memory, and the first warp reduces those. The CUDA
simulator has no shuffles, so there the same contract is met with a shared-memory tree.
The choice is made once, at import, from Numba's simulator switch.

`scratch` is a shared float32 array with one slot per thread of the block (the GPU path
uses only the first 32); the block size must be a power of two no larger than 1024.
"""

import math

from numba import config, cuda, float32

WARP = 32


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


if config.ENABLE_CUDASIM:
    block_sum, block_max = _tree_block_sum, _tree_block_max
else:
    block_sum, block_max = _shuffle_block_sum, _shuffle_block_max
