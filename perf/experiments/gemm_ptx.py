"""A fingerprint of the library GEMM's sm_90 PTX, to tell whether a change to its source changes the kernel.

    PATH=$CUDA/bin:$PATH LD_LIBRARY_PATH=$CUDA/lib python -m perf.experiments.gemm_ptx [--shapes lib,wide3]

Numba's NVVM compiles `gemm_kernel` for each of its five (staging, store) pairs and each shape
asked for, offline (perf/experiments/mma_sass.py's way), and this prints a SHA-256 of each PTX
with what differs between identical kernels taken out: the counters of compilations in the
process that Numba writes into a function's name and a shared array's symbol, and the order
of the unused environment globals. Run it at two revisions: equal hashes mean the GPU would be handed
the same program, so a refactor of the kernel's Python that keeps them needs no GPU run to be
known harmless. Different hashes say nothing about speed: that is for the GPU.

`--sass` (needs `ptxas` and `nvdisasm` on PATH) also assembles each kernel and prints its
registers and spills (`ptxas -v`) and, for each loop of its SASS that issues mmas (`mma_loops`),
the loop's instructions, HMMA, LDSM (ldmatrix) and LDGSTS (cp.async): the count of one pass
through the loop's text, a K slice for the interior and general loops, 16 of K for the checked
path's inner loop (the general loop's count includes that inner loop's text).
"""

import argparse
import hashlib
import re
import shutil
import tempfile
from pathlib import Path

from numba import types

from perf.experiments.gemm_variants import VARIANTS
from perf.experiments.mma_sass import disassemble, ptx_for_sm90, sass_loops
from perf.kernel_registers import assemble_ptx, ptxas_report
from tinyvllm.kernels.device.simulator import SIMULATOR
from tinyvllm.kernels.gemm import gemm_kernel
from tinyvllm.kernels.gemm_copies import stage_chunk_async, stage_chunk_ragged
from tinyvllm.kernels.gemm_stores import add_bf16, store_bf16, store_bf16x2, store_f32
from tinyvllm.kernels.gemm_tiles import GEMM_SHAPE

TILE, ANY = types.uint16[:, ::1], types.uint16[:, :]
KERNELS = {
    "async, packed bf16": (stage_chunk_async, store_bf16x2, (TILE, TILE, types.uint32[:, ::1])),
    "async, bf16": (stage_chunk_async, store_bf16, (TILE, TILE, TILE)),
    "async, float32": (stage_chunk_async, store_f32, (TILE, TILE, types.float32[:, ::1])),
    "async, accumulate": (stage_chunk_async, add_bf16, (TILE, TILE, TILE)),
    "ragged, bf16": (stage_chunk_ragged, store_bf16, (ANY, ANY, TILE)),
}
"""The library's kernels for one shape: cp.async or element-wise staging, and each store (the
packed one where the shape has it; any shape falls back to plain bf16 on odd N)."""
SHAPES = {"lib": GEMM_SHAPE} | VARIANTS
PER_PROCESS_COUNTERS = ((re.compile(r"B\d+v\d+B"), "BvB"), (re.compile(r"(_cudapy_[a-z]+_)\d+"), r"\1N"))
"""Numba's counters of compilations in the process: the version it mangles into a function's
name, and the number of a shared or local array's symbol."""


def fingerprint(ptx: str) -> str:
    """SHA-256 of the PTX without Numba's per-process counters, its environment globals sorted."""
    for pattern, replacement in PER_PROCESS_COUNTERS:
        ptx = pattern.sub(replacement, ptx)
    lines = ptx.splitlines()
    kept = [line for line in lines if "NumbaEnv" not in line] + sorted(line for line in lines if "NumbaEnv" in line)
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def mma_loops(sass: str) -> list[dict]:
    """Each loop of a kernel's SASS that holds an HMMA, in the order of its branch back: its
    instructions, HMMA, LDSM and LDGSTS."""
    counted = ("HMMA", "LDSM", "LDGSTS")
    return [
        {"instructions": len(body)} | {op.lower(): sum(op in line for line in body) for op in counted}
        for _, _, body in sass_loops(sass)
        if any("HMMA" in line for line in body)
    ]


def sass_summary(ptx: str) -> str:
    """Registers, spills and each mma loop's counts (`mma_loops`) of sm_90 PTX, on one line."""
    with tempfile.TemporaryDirectory() as folder:
        text, cubin = assemble_ptx(ptx, Path(folder))
        report, sass = ptxas_report(text), disassemble(cubin)
    loops = " ".join("{instructions}/{hmma}/{ldsm}/{ldgsts}".format(**loop) for loop in mma_loops(sass))
    spills = f"{report['spill_store_bytes']}/{report['spill_load_bytes']}"
    return f"{report['registers']:>3} regs, spills {spills}, loops {loops}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="lib", help=f"comma-separated, of: {', '.join(SHAPES)}")
    parser.add_argument("--sass", action="store_true", help="registers and each mma loop's instruction counts")
    args = parser.parse_args()
    if SIMULATOR:
        raise SystemExit("run without NUMBA_ENABLE_CUDASIM: the simulator has no PTX")
    if args.sass and not (shutil.which("ptxas") and shutil.which("nvdisasm")):
        raise SystemExit("--sass needs ptxas and nvdisasm on PATH (the nvidia-cuda-nvcc and nvdisasm wheels)")
    names = args.shapes.split(",")
    unknown = [name for name in names if name not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    for name in names:
        for label, (stage_chunk, store, signature) in KERNELS.items():
            if store is store_bf16x2 and not SHAPES[name].packed:
                continue
            ptx = ptx_for_sm90(gemm_kernel(stage_chunk, store, SHAPES[name]), signature)
            print(f"{name:<34} {label:<18} {fingerprint(ptx)}")
            if args.sass:
                print(f"{'':<34} {'':<18} {sass_summary(ptx)}  (loop: instructions/HMMA/LDSM/LDGSTS)")


if __name__ == "__main__":
    main()
