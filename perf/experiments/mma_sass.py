"""The tensor-core kernels (tests/test_mma*.py, mma_gemm.py, kernels/gemm.py) as the H200 would run them, without a GPU.

    PATH=$CUDA/bin:$PATH LD_LIBRARY_PATH=$CUDA/lib python -m perf.experiments.mma_sass

Numba's NVVM compiles each kernel to PTX for sm_90, `ptxas -v` assembles it (registers,
spills, shared memory), and `nvdisasm` (from the nvidia-cuda-nvdisasm wheel, if on PATH)
prints the SASS lines that show the tensor-core path: HMMA.16816.F32.BF16 (mma.sync),
LDSM.16.M88.4 (ldmatrix .x4), LDGSTS (cp.async) and its DEPBAR. Run it without
NUMBA_ENABLE_CUDASIM: under the simulator `mma.py` hands out the Python stand-ins, and there
is no PTX. Without a GPU, Numba's questions to the driver for the current device's compute
capability (when it compiles a device function, and in `pdl.py`) are answered with sm_90's.
It shows what the instructions compile to; only a GPU shows that they compute.
"""

import contextlib
import re
import shutil
import subprocess
import tempfile
import types as namespaces
from pathlib import Path
from unittest import mock

import numba.cuda.api
import numba.cuda.dispatcher
from numba import cuda, types

from perf.experiments.mma_gemm import mma_gemm_kernel
from perf.kernel_registers import assemble_ptx
from tests.test_mma import mma_kernel, staged_kernel
from tests.test_mma_f16 import chained_f16_kernel
from tinyvllm.kernels.device.simulator import SIMULATOR
from tinyvllm.kernels.gemm import gemm_kernel
from tinyvllm.kernels.gemm_copies import stage_chunk_async
from tinyvllm.kernels.gemm_stores import store_bf16

COMPUTE_CAPABILITY = (9, 0)
TILE = types.uint16[:, ::1]
KERNELS = {
    "mma_kernel": (mma_kernel, (TILE, TILE, types.float32[:, ::1], types.float32[:, ::1])),
    "staged_kernel": (staged_kernel, (types.uint16[::1], types.uint16[::1], types.float32[:, ::1])),
    "mma_gemm_kernel": (mma_gemm_kernel, (TILE, TILE, types.float32[:, ::1])),
    "gemm_kernel": (gemm_kernel(stage_chunk_async, store_bf16), (TILE, TILE, TILE)),
    "chained_f16_kernel": (chained_f16_kernel, (*[types.uint16[::1]] * 3, types.float32[:, ::1])),
}
SASS_OF_INTEREST = re.compile(r"HMMA|LDSM|LDGSTS|DEPBAR")
SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
SASS_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
SASS_BRANCH = re.compile(r"BRA `\((\.L_x_\d+)\)")
PTX_OF_INTEREST = re.compile(r"mma\.sync|ldmatrix|cp\.async")


@contextlib.contextmanager
def _sm90_without_a_gpu():
    if cuda.is_available():
        yield
        return
    device = namespaces.SimpleNamespace(compute_capability=COMPUTE_CAPABILITY)
    with contextlib.ExitStack() as patches:
        for module in (numba.cuda, numba.cuda.api, numba.cuda.dispatcher):
            patches.enter_context(mock.patch.object(module, "get_current_device", lambda: device))
        yield


def ptx_for_sm90(kernel, signature) -> str:
    """NVVM's PTX of one kernel for sm_90, under its launch bounds if it has them."""
    bounds = {k: v for k, v in kernel.targetoptions.items() if k == "launch_bounds"}
    with _sm90_without_a_gpu():
        ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=COMPUTE_CAPABILITY, **bounds)
    return ptx


def compile_for_sm90(kernel, signature, folder: Path) -> tuple[str, str, Path]:
    """(PTX, ptxas -v's report, the cubin) of one kernel, under its launch bounds if it has them."""
    ptx = ptx_for_sm90(kernel, signature)
    return ptx, *assemble_ptx(ptx, folder)


def disassemble(cubin: Path) -> str:
    """nvdisasm's SASS of a cubin."""
    return subprocess.run(["nvdisasm", "-c", str(cubin)], capture_output=True, text=True, check=True).stdout


def sass_loops(sass: str) -> list[tuple[int, int, list[str]]]:
    """The loops of nvdisasm's SASS: for each branch back to a label at or before it, the
    (first, last) instruction indices of its span and the instructions in it."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        label = SASS_LABEL.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
        elif found := SASS_INSTRUCTION.search(line):
            instructions.append(found.group(2))
    loops = []
    for end, text in enumerate(instructions):
        target = SASS_BRANCH.search(text)
        if target and labels.get(target.group(1), end + 1) <= end:
            start = labels[target.group(1)]
            loops.append((start, end, instructions[start : end + 1]))
    return loops


def main() -> None:
    if SIMULATOR:
        raise SystemExit("run without NUMBA_ENABLE_CUDASIM: the simulator has no PTX")
    print(subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1])
    for name, (kernel, signature) in KERNELS.items():
        with tempfile.TemporaryDirectory() as folder:
            ptx, report, cubin = compile_for_sm90(kernel, signature, Path(folder))
            print(f"\n== {name}: PTX")
            print("\n".join(line.strip() for line in ptx.splitlines() if PTX_OF_INTEREST.search(line)))
            print(f"== {name}: ptxas -v")
            print("\n".join(line for line in report.splitlines() if "Used" in line or "spill" in line))
            if shutil.which("nvdisasm") is None:
                print("(nvdisasm not on PATH: no SASS)")
                continue
            sass = disassemble(cubin)
            print(f"== {name}: SASS")
            print("\n".join(line.strip() for line in sass.splitlines() if SASS_OF_INTEREST.search(line)))


if __name__ == "__main__":
    main()
