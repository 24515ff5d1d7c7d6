"""Kernel launches that skip Numba's per-call argument handling: `launch_kernel(kernel, grid, block, stream, *args)`.

Each `kernel[grid, block, stream](*args)` makes numba-cuda 0.30 type every argument, wrap each
array in a strided memory view, look up the CUDA context and build a `cuda.core.LaunchConfig`:
tens of microseconds, more with more arrays. A decode step is a replayed graph and pays none
of it, but a prefill step launches about 90 kernels besides its cuBLAS calls.

So the first launch of a kernel with arguments of given Numba types goes through Numba,
which compiles it, and records a *plan*: the compiled kernel and, for each parameter, how
Numba flattens it (an array is meminfo, parent, size, itemsize, data pointer, shape and
strides; a scalar one C value of its type). Later launches with the same types flatten the
arguments by the plan and call `cuda.core.launch` directly. A plan is kept only if, on
the arguments it was made from, it flattens them exactly as Numba's own code does; a kernel
with a parameter it does not flatten (a boolean, a tuple, a record) always launches through
Numba, and so does any launch inside `pdl.programmatic_launches` (graph captures, where
launch time does not matter), and everything under the simulator. On the H200 the host's
launch of an 8,192-token prefill step of Llama 3.2 1B went from 18.8 to 8.0 ms (2026-12-04,
perf/profile_prefill.py).
"""

import ctypes
import threading
from typing import Any, NamedTuple

import numpy as np
from numba import cuda

from tinyvllm.kernels.device.simulator import SIMULATOR
from tinyvllm.kernels.device.vector_io import data_address

if not SIMULATOR:
    from cuda.core import LaunchConfig
    from cuda.core import launch as core_launch
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv.driver import _to_core_stream
    from numba.cuda.types import Array


class Plan(NamedTuple):
    kernel: Any  # the compiled kernel's cuda.core Kernel
    packers: tuple  # one per argument: appends its flattened values to a list


_plans: dict[tuple, Plan | None] = {}  # (dispatcher, argument keys) -> plan; None: always through Numba
# (grid, block, shared bytes) -> LaunchConfig: grids follow token counts, so at most a few per
# count the token budget allows
_configs: dict[tuple, Any] = {}
_streams: dict[Any, Any] = {}  # a Numba stream (or 0) -> its cuda.core Stream: one per backend made
_thread = threading.local()  # whether this thread's CUDA context is current

_SCALARS = {
    int: ctypes.c_int64,
    float: ctypes.c_double,
    np.int32: ctypes.c_int32,
    np.uint32: ctypes.c_uint32,
    np.int64: ctypes.c_int64,
    np.uint64: ctypes.c_uint64,
    np.float32: ctypes.c_float,
    np.float64: ctypes.c_double,
}
"""The scalar Python and NumPy types a plan flattens, and the C type Numba gives each."""


def _argument_key(value) -> Any:
    """What Numba's choice of compiled kernel depends on: for a device array its class, dtype,
    rank and layout (what its Numba type is made of, without building the type), else the type."""
    if hasattr(value, "gpu_data"):
        broadcast = value.size != 0 and 0 in value.strides
        return type(value), value.dtype, value.ndim, value.is_c_contiguous(), value.is_f_contiguous(), broadcast
    return type(value)


def _pack_array(array, out: list) -> None:
    out += (0, 0, array.size, array.dtype.itemsize, data_address(array), *array.shape, *array.strides)


def _scalar_packer(c_type):
    def pack(value, out: list) -> None:
        out.append(c_type(value))

    return pack


def _comparable(values: list, shape: tuple | None) -> list:
    """(type, value) of each flattened parameter of one argument. Numba gives an empty array's
    pointer as None, and may give a C-contiguous array's canonical strides: the stride of a
    dimension of extent 1 never moves an address, so it is left out."""
    values = [(type(v), v.value) if isinstance(v, ctypes._SimpleCData) else (int, v or 0) for v in values]
    if shape is not None:
        strides = values[len(values) - len(shape) :]
        values[len(values) - len(shape) :] = [None if n == 1 else v for n, v in zip(shape, strides)]
    return values


def _make_plan(kernel, args: tuple, stream) -> Plan | None:
    """The plan of kernel's compiled overload for args, or None where one cannot be trusted."""
    argtypes = tuple(kernel.typeof_pyval(value) for value in args)
    compiled = kernel.overloads.get(argtypes)
    if compiled is None or compiled.extensions or compiled.cooperative or compiled.debug:
        return None
    packers = []
    for numba_type, value in zip(compiled.argument_types, args):
        is_array = isinstance(numba_type, Array) and hasattr(value, "gpu_data")
        if is_array:
            pack = _pack_array
        elif type(value) in _SCALARS and str(numba_type) == np.dtype(_SCALARS[type(value)]).name:
            pack = _scalar_packer(_SCALARS[type(value)])
        else:
            return None
        ours, numbas = [], []
        pack(value, ours)
        compiled._prepare_args(numba_type, value, stream, [], numbas)
        shape = tuple(value.shape) if is_array else None
        if _comparable(ours, shape) != _comparable(numbas, shape):
            return None
        packers.append(pack)
    return Plan(compiled._codelibrary.get_cufunc().kernel, tuple(packers))


def _config(grid, block, shared_bytes: int):
    key = grid, block, shared_bytes
    config = _configs.get(key)
    if config is None:
        dims = [tuple(map(int, d)) if isinstance(d, tuple | list) else int(d) for d in (grid, block)]
        config = _configs[key] = LaunchConfig(grid=dims[0], block=dims[1], shmem_size=int(shared_bytes))
    return config


def _core_stream(stream):
    core = _streams.get(stream)
    if core is None:
        core = _streams[stream] = _to_core_stream(stream)
    return core


def _numba_launch_config_is_plain() -> bool:
    """False inside pdl.programmatic_launches, which swaps Numba's LaunchConfig for its own."""
    return dispatcher.LaunchConfig is LaunchConfig


def launch_kernel(kernel, grid, block, stream, *args, shared_bytes: int = 0) -> None:
    """kernel[grid, block, stream, shared_bytes](*args), through a plan where there is one."""
    if SIMULATOR:
        kernel[grid, block, stream, shared_bytes](*args)
        return
    key = (kernel, *map(_argument_key, args))
    plan = _plans.get(key, False)
    if plan is False or plan is None or not _numba_launch_config_is_plain():
        kernel[grid, block, stream, shared_bytes](*args)  # compiles on first use, and sets the context
        if plan is False:
            _plans[key] = _make_plan(kernel, args, stream)
        _thread.context_current = True
        return
    if not getattr(_thread, "context_current", False):
        cuda.current_context()  # a thread's first launch makes the CUDA context current in it
        _thread.context_current = True
    values: list = []
    for pack, value in zip(plan.packers, args):
        pack(value, values)
    core_launch(_core_stream(stream), _config(grid, block, shared_bytes), plan.kernel, *values)


def unplanned_kernels() -> set[str]:
    """The names of the kernels launched so far that always go through Numba (for some argument types)."""
    return {key[0].py_func.__name__ for key, plan in _plans.items() if plan is None}
