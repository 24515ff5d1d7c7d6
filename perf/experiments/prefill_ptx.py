"""The flash prefill kernel in each P precision as the H200 would run it, without a GPU.

    LD_LIBRARY_PATH=$NVVM_AND_NVRTC_LIBS python -m perf.experiments.prefill_ptx [--out DIR] [--modes bf16x2 fp16]

For D = 64 and 128 at Llama 3.2 1B's heads (32 query, 8 KV), `prefill_attention`'s launch is
recorded on a stand-in H200 (`perf/kernel_registers.py`), compiled to PTX for sm_90 by Numba's
NVVM and assembled by `ptxas -v`: registers, spills, stack and shared memory a block, and the
mma instructions of each operand type in the PTX. `--out DIR` writes each kernel's PTX as
prefill_d{D}_{mode}.ptx with Numba's per-process counters blanked (the "B3v45" ABI tag in a
mangled name and the N of a shared array's `_cudapy_smem_N` count what was compiled before in
that process, so they change with unrelated code) and the unused `.common` environment symbols
sorted: `diff` of two such folders then shows only changes in what the kernel does. With
`--modes bf16x2` it runs on trees whose `prefill_attention` has no p_precision argument, so a
tree from before can be compared with one after (`git archive`, PYTHONPATH at it).

`--sass` (needs `nvdisasm` on PATH too) also counts the key-tile loop in the kernel's SASS: the
backward branch whose span holds the most HMMA (`tile_loop`), its instructions in all, its HMMA,
its MUFU.EX2 and its 64-bit integer compares (`ISETP` with `.EX`). The count is of the loop's
text: a tile that skips a branch inside it (the mask, a rescale, the bf16 fall-back) runs fewer.
"""

import argparse
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from perf.experiments.mma_sass import disassemble, sass_loops
from perf.kernel_registers import assemble_ptx, launch_ptx, ptxas_report, stand_in_h200
from tinyvllm.kernels.attention_prefill import prefill_attention

Q_HEADS, KV_HEADS, BLOCK_SIZE, TOKENS = 32, 8, 16, 64
HEAD_DIMS = (64, 128)
MMA_TYPES = ("bf16", "f16")
COMPARE_64BIT = re.compile(r"ISETP\.\S*\.EX\b")  # the high word's compare of a 64-bit one
FUNCTION_UID = re.compile(r"B\d+v\d+B")
SHARED_ARRAY = re.compile(r"_cudapy_smem_\d+")


def prefill_launch(head_dim: int, mode: str):
    """The recorded launch of one prefill in this P precision."""
    launches = []
    q = np.empty((TOKENS, Q_HEADS, head_dim), np.uint16)
    cache = np.empty((TOKENS // BLOCK_SIZE, BLOCK_SIZE, KV_HEADS, head_dim), np.uint16)
    tables = np.arange(TOKENS // BLOCK_SIZE, dtype=np.int32)[None, :]
    lengths = np.array([0, TOKENS], np.int32), np.array([TOKENS], np.int32)
    options = {} if mode == "bf16x2" else {"p_precision": mode}
    with stand_in_h200(launches):
        prefill_attention(q, cache, cache, tables, *lengths, np.empty_like(q), **options)
    (launch,) = launches
    return launch


def tile_loop(sass: str) -> dict:
    """The key-tile loop of nvdisasm's SASS of a flash kernel: of the loops (a branch back to a
    label at or before it), the one whose span holds the most HMMA; its instruction counts."""
    loops = [body for _, _, body in sass_loops(sass)]
    if not loops:
        raise ValueError("no loop in the SASS")
    body = max(loops, key=lambda loop: sum("HMMA" in op for op in loop))
    return {"instructions": len(body), "hmma": sum("HMMA" in op for op in body),
            "mufu_ex2": sum("MUFU.EX2" in op for op in body),
            "compares_64bit": sum(bool(COMPARE_64BIT.search(op)) for op in body)}  # fmt: skip


def normalised(ptx: str) -> str:
    """The PTX without what differs between processes compiling the same kernel."""
    shared = {name: f"_cudapy_smem_{k}" for k, name in enumerate(dict.fromkeys(SHARED_ARRAY.findall(ptx)))}
    ptx = SHARED_ARRAY.sub(lambda found: shared[found.group()], FUNCTION_UID.sub("BvB", ptx))
    lines = ptx.splitlines()
    common = sorted(line for line in lines if line.startswith(".common"))
    rest = iter(common)
    return "\n".join(next(rest) if line.startswith(".common") else line for line in lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write each kernel's normalised PTX here")
    parser.add_argument("--modes", nargs="+", default=["bf16x2", "fp16"], help="P precisions to compile")
    parser.add_argument("--sass", action="store_true", help="count the tile loop's SASS (needs nvdisasm)")
    args = parser.parse_args()
    if args.sass and shutil.which("nvdisasm") is None:
        raise SystemExit("--sass needs nvdisasm on PATH (the nvidia-cuda-nvdisasm wheel)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    columns = f"{'regs':>4} {'spill st/ld':>11} {'stack':>5} {'smem':>6} {'mma bf16':>8} {'mma f16':>7}"
    if args.sass:
        columns += f" {'loop':>5} {'HMMA':>5} {'EX2':>4} {'cmp64':>5}"
    print(f"{'D':>4} {'p_precision':>11} {columns}")
    for head_dim in HEAD_DIMS:
        for mode in args.modes:
            launch = prefill_launch(head_dim, mode)
            with stand_in_h200([]):
                ptx = launch_ptx(launch)
            with tempfile.TemporaryDirectory() as folder:  # one ptxas run for the report and the SASS
                ptxas_text, cubin = assemble_ptx(ptx, Path(folder))
                report = ptxas_report(ptxas_text)
                sass = disassemble(cubin) if args.sass else ""
            mmas = [ptx.count(f"row.col.f32.{kind}.{kind}.f32") for kind in MMA_TYPES]
            spills = f"{report['spill_store_bytes']}/{report['spill_load_bytes']}"
            row = (f"{head_dim:>4} {mode:>11} {report['registers']:>4} {spills:>11} {report['stack_bytes']:>5} "
                   f"{report['shared_bytes']:>6} {mmas[0]:>8} {mmas[1]:>7}")  # fmt: skip
            if args.sass:
                loop = tile_loop(sass)
                row += f" {loop['instructions']:>5} {loop['hmma']:>5} {loop['mufu_ex2']:>4} {loop['compares_64bit']:>5}"
            print(row)
            if args.out:
                (args.out / f"prefill_d{head_dim}_{mode}.ptx").write_text(normalised(ptx))


if __name__ == "__main__":
    main()
