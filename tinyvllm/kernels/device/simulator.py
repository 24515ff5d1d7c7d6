"""What Numba's CUDA simulator runs instead of each GPU primitive: the list, and the switch.

With `NUMBA_ENABLE_CUDASIM=1` Numba runs the kernels' Python source on the CPU, one Python
thread per CUDA thread, so the tests of the real kernels run on a machine without a GPU.
Some GPU primitives do not exist there. Each has a stand-in with the same contract, chosen
once at import, mostly by a module of `tinyvllm.kernels.device`, so the kernels import the
primitive and do not ask which world they are in. `SIMULATOR` below is the one reading of
Numba's switch, and this table is the whole list of what it changes:

--8<-- [start:table]
| On the GPU | Under the simulator | Why | Chosen in |
|---|---|---|---|
| warp shuffles in `block_sum`, `block_max`, `block_argmax` | a shared-memory tree | the simulator has no shuffles | `device/reduce.py` |
| shuffles in `lane_group_sum`, blocks of whole warps | shared-memory scratch (`group_scratch_shape`), blocks of any size (`LANE_GROUP_WARP`) | no shuffles | `device/reduce.py` |
| `load_words`, `store_words`: one 16-byte access (LLVM intrinsics) | eight scalar accesses | no LLVM runs there | `device/vector_io.py` |
| `flat_view`: a new array struct over the same memory (an intrinsic) | `reshape` | Numba's reshape calls a C helper no CUDA module links | `device/vector_io.py` |
| `prefetch_l2`: `prefetch.global.L2` | nothing | no inline PTX | `device/vector_io.py` |
| PDL's `griddepcontrol` instructions and launch attribute | nothing; `pdl.supported()` is false | no inline PTX, no launch attributes | `device/pdl.py` |
| `mma.sync` m16n8k16 bf16 and f16, `ldmatrix` x4 (and `.trans`), `cvt.rn.bf16x2` and `cvt.rn.f16x2` (inline PTX), quad shuffles | Python: the warp's fragments meet in a per-warp slot list and `threading.Barrier`, the same layout | no inline PTX, no shuffles or `syncwarp` | `device/mma.py` |
| `exp2_ftz`: `ex2.approx.ftz.f32` (inline PTX) | float64 exp2 of the float32 argument, subnormal arguments and results flushed to 0 | no inline PTX | `device/fast_exp.py` |
| `cp.async` 16 bytes (or zero-filled), `commit_group`, `wait_group` | a copy (or zeros) at once; nothing | no inline PTX | `device/mma.py` |
| the GPU's SM count | the H200's 132 | the simulator reports none | `device/multiprocessors.py` |
| 16-byte aligned shared arrays | no alignment | the simulator refuses the argument | `device/simulator.py` (`SHARED_ALIGNMENT`) |
| `cuda.jit`'s `launch_bounds` | none | the simulator refuses the argument | `device/simulator.py` (`launch_bounds`) |
| cuBLAS | the tiled GEMM | no cuBLAS on the CPU | `kernels/cublas.py` (`available`) |
| radix select: 512 threads, 4 loads each, 11-bit digits | 4 threads, 2 loads, 9-bit digits | a Python thread per CUDA thread is slow | `kernels/radix_select.py` (`gpu_or_simulator`) |
| copies on the stream (driver `host_to_device`, `device_to_host`), array views | `copy_to_device`, `copy_to_host`, slicing | the simulator's driver has neither | `backends/cuda_backend.py` (`SIMULATOR`) |
| CUDA graphs, external (CuPy) streams | eager launches on a Numba stream | the simulator has neither | `backends/cuda_backend.py` (`SIMULATOR`) |
--8<-- [end:table]
"""

from numba import config

SIMULATOR = config.ENABLE_CUDASIM
"""Whether the kernels run in Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""

SHARED_ALIGNMENT = None if SIMULATOR else 16
"""`alignment` of shared arrays read 16 bytes at a time: aligned tiles let NVVM merge four
float32 reads into one ld.shared.v4; the simulator refuses any alignment."""


def launch_bounds(threads: int, blocks_per_sm: int) -> dict:
    """`cuda.jit` keyword arguments promising at most `threads` a block and asking for
    `blocks_per_sm` resident blocks (a register cap); none under the simulator."""
    return {} if SIMULATOR else {"launch_bounds": (threads, blocks_per_sm)}


def gpu_or_simulator(gpu_value, simulator_value):
    """A size for the GPU, and a smaller one for the simulator's Python threads."""
    return simulator_value if SIMULATOR else gpu_value
