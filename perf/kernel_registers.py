"""Registers, spills and shared memory of a decode step's kernels, for the H200, without a GPU.

    python -m perf.kernel_registers [--batch 1] [--context 512] [--model DIR]

A kernel that runs out of registers keeps values in local memory (*spills*), which
lives in device memory: a memory-bound kernel that spills loses bandwidth no launch
tuning wins back. On the H200, decode attention variants that spilled 48 to 64 bytes a
thread streamed 2.4 to 2.6 TB/s where the kernel that spills nothing streams 3.1
(docs/kernels-attention.md). ptxas reports the count when it assembles a kernel, and it
needs no GPU to do that; this script asks it before a GPU is booked.

It calls each launcher of one decode step (batch sequences of `context` tokens, Llama
3.2 1B's shapes or those of the model in --model) with host arrays of the step's shapes
and dtypes, cascade decode attention (`attention_cascade.py`, the step's attention when
its sequences share a cached prefix) among them. Where the launcher would launch a
kernel, the kernel's exact specialisation (the argument types the launch would compile
for, and its launch bounds) is compiled to PTX by Numba's NVVM for sm_90 and assembled
by `ptxas -v`. A stand-in H200 (compute capability 9.0, 132 SMs) answers the launchers'
and the kernels' questions about the device. Per launch it prints the grid, the block,
and from ptxas the registers a thread, the bytes of spill stores and loads, the stack
frame (local arrays the compiler kept in memory: a spill by another name) and the static
shared memory; then how many of its blocks an SM holds at once, by registers, warps and
shared memory.

Matrix products run on the Numba kernels (`linear_backend="numba"`): the GEMV up to 8
rows of x, which the engine uses on the GPU at batch 1, then the tiled GEMM (past one
row the engine's GPU default is cuBLAS, whose kernels ptxas never sees). Needs NVVM, NVRTC
and ptxas from a CUDA toolkit (the GPU machine has them; elsewhere the nvidia-cuda-nvcc and
nvidia-cuda-nvrtc wheels, with their lib folders on LD_LIBRARY_PATH and ptxas on PATH). Results go to
perf/results/kernel_registers.json. `tests/test_kernel_registers.py` asserts through
`compile_step` that no decode-step kernel keeps anything in local memory at batch 1 to 8.
"""

import argparse
import contextlib
import json
import re
import subprocess
import tempfile
import types as pytypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numba
import numpy as np
from numba import cuda
from numba.cuda import dispatcher as cuda_dispatcher

from perf.timing import result_header
from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.backends.variants import VariantTable, decode_shape
from tinyvllm.kernels import attention_cascade, attention_split, embedding, rope, sampling
from tinyvllm.kernels.attention_decode import REGISTER_FILE
from tinyvllm.kernels.device import multiprocessors
from tinyvllm.kernels.linear import linear, linear_rope_write_kv, linear_silu_mul
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.model.config import ModelConfig, load_config
from tinyvllm.model.rope import rope_inv_freq

H200 = pytypes.SimpleNamespace(
    name="NVIDIA H200 (stand-in: sm_90 compiled offline)",
    compute_capability=(9, 0),
    MULTIPROCESSOR_COUNT=multiprocessors.H200_SMS,
)
REGISTER_UNIT = 256
"""Registers are handed to a warp in units of 256 (8 a thread)."""
WARPS_PER_SM, BLOCKS_PER_SM = 64, 32
SHARED_PER_SM, SHARED_PER_BLOCK_RESERVED = 233472, 1024
BLOCK_SIZE = 16
COMPILE_OPTIONS = ("launch_bounds", "fastmath", "lineinfo", "opt")
RESULTS = Path(__file__).resolve().parent / "results" / "kernel_registers.json"


@dataclass
class Launch:
    kernel: str
    grid: int | tuple
    block: int | tuple
    signature: tuple
    py_func: Callable
    options: dict
    operator: str = ""


@contextlib.contextmanager
def stand_in_h200(launches: list[Launch]) -> Iterator[None]:
    """Launchers see an H200 and their launches are recorded in `launches` instead of run;
    a host array a launcher copies to the device stays where it is."""

    def configure(dispatcher, config):
        grid, block = config[0], config[1]
        options = {k: v for k, v in dispatcher.targetoptions.items() if k in COMPILE_OPTIONS}

        def launch(*args):
            signature = tuple(numba.typeof(arg) for arg in args)
            name = dispatcher.py_func.__qualname__.replace(".<locals>", "")
            launches.append(Launch(name, grid, block, signature, dispatcher.py_func, options))

        return launch

    device = mock.Mock(return_value=H200)
    with contextlib.ExitStack() as stack:
        for module in (cuda, cuda_dispatcher, numba.cuda.api):
            stack.enter_context(mock.patch.object(module, "get_current_device", device))
        stack.enter_context(mock.patch.object(cuda_dispatcher.CUDADispatcher, "__getitem__", configure))
        stack.enter_context(mock.patch.object(cuda, "to_device", lambda array, stream=0: array))
        multiprocessors.multiprocessor_count.cache_clear()
        yield
    multiprocessors.multiprocessor_count.cache_clear()


def decode_step(config: ModelConfig, batch: int, context: int) -> Iterator[tuple[str, Callable[[], None]]]:
    """(operator, call) for one layer's and the step's ends' launchers, host arrays of the step's shapes."""
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim, vocab = config.head_dim, config.vocab_size

    def bf16(*shape):
        return np.empty(shape, np.uint16)

    def int32(*shape):
        return np.zeros(shape, np.int32)

    residual, normed = bf16(batch, hidden), bf16(batch, hidden)
    qkv, q = bf16(batch, config.q_size + 2 * config.kv_size), bf16(batch, heads, head_dim)
    attn = bf16(batch, heads, head_dim)
    gate_up, act = bf16(batch, 2 * config.intermediate_size), bf16(batch, config.intermediate_size)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    k_cache = bf16(batch * blocks_per_seq, BLOCK_SIZE, kv_heads, head_dim)
    v_cache = bf16(*k_cache.shape)
    tables = np.arange(batch * blocks_per_seq, dtype=np.int32).reshape(batch, blocks_per_seq)
    lens = np.full(batch, context, np.int32)
    inv_freq = rope_inv_freq(head_dim, config.rope_theta, config.rope_scaling)
    workspace = np.empty(
        attention_split.decode_workspace_shape(heads, kv_heads, head_dim, H200.MULTIPROCESSOR_COUNT), np.float32
    )
    max_grid = attention_split.BLOCKS_PER_SM * H200.MULTIPROCESSOR_COUNT
    shared_parts = attention_cascade.cascade_shared_partitions(batch, kv_heads, heads // kv_heads, head_dim, max_grid)
    cascade_rows = attention_cascade.cascade_workspace_rows(batch, heads, 1, shared_parts)
    cascade_workspace = np.empty((cascade_rows, workspace.shape[1]), np.float32)
    logits = np.empty((batch, vocab), np.float32)
    parts = sampling.sample_workspace_shape(batch, vocab)
    norm = RMSNorm(bf16(hidden), config.rms_norm_eps, normed)
    variants = VariantTable("numba", H200.MULTIPROCESSOR_COUNT, cublas_available=False)
    kernel = variants.product(batch)
    partitions = variants.decode_partitions(*decode_shape(q, k_cache, tables))
    params = (
        np.ones(batch, np.float32),
        np.full(batch, -1, np.int32),
        np.ones(batch, np.float32),
        np.zeros(batch, np.uint64),
        np.zeros(batch, np.int64),
    )
    yield "embedding", lambda: embedding.embedding(int32(batch), bf16(vocab, hidden), residual)
    yield (
        "linear_rope_write_kv",
        lambda: linear_rope_write_kv(
            residual,
            bf16(qkv.shape[1], hidden),
            qkv,
            int32(batch),
            inv_freq,
            int32(batch),
            q,
            k_cache,
            v_cache,
            norm=norm,
            kernel=kernel,
        ),
    )
    yield "rope_write_kv", lambda: rope.rope_write_kv(qkv, int32(batch), inv_freq, int32(batch), q, k_cache, v_cache)
    yield (
        "decode_attention",
        lambda: attention_split.decode_attention(q, k_cache, v_cache, tables, lens, attn, workspace, partitions),
    )
    yield (
        "cascade_decode_attention",
        lambda: attention_cascade.cascade_decode_attention(
            q, k_cache, v_cache, tables, lens, int32(1), attn, cascade_workspace, 1, shared_parts
        ),
    )
    yield (
        "linear (o)",
        lambda: linear(attn.reshape(batch, -1), bf16(hidden, config.q_size), residual, accumulate=True, kernel=kernel),
    )
    yield (
        "linear_silu_mul",
        lambda: linear_silu_mul(residual, bf16(gate_up.shape[1], hidden), gate_up, act, norm=norm, kernel=kernel),
    )
    yield (
        "linear (down)",
        lambda: linear(act, bf16(hidden, config.intermediate_size), residual, accumulate=True, kernel=kernel),
    )
    yield "linear (lm head)", lambda: linear(residual, bf16(vocab, hidden), logits, norm=norm, kernel=kernel)
    yield (
        "sample",
        lambda: sampling.sample(logits, *params, int32(batch), np.empty(parts, np.float32), np.empty(parts, np.int32)),
    )


def launch_ptx(launch: Launch) -> str:
    """NVVM's PTX of the launch's kernel for sm_90 (the H200's compute capability)."""
    ptx, _ = cuda.compile_ptx(launch.py_func, launch.signature, cc=H200.compute_capability, **launch.options)
    return ptx


def assemble_ptx(ptx: str, folder: Path) -> tuple[str, Path]:
    """(ptxas -v's text, the cubin it writes in folder) of PTX for sm_90."""
    source, cubin = folder / "kernel.ptx", folder / "kernel.cubin"
    source.write_text(ptx)
    arch = "-arch=sm_{}{}".format(*H200.compute_capability)
    done = subprocess.run(["ptxas", arch, "-v", str(source), "-o", str(cubin)], capture_output=True, text=True)
    done.check_returncode()
    return done.stderr, cubin


def assemble(launch: Launch) -> dict:
    """ptxas -v's report on the launch's kernel, compiled for sm_90 (`ptxas_report`)."""
    with tempfile.TemporaryDirectory() as folder:
        report, _ = assemble_ptx(launch_ptx(launch), Path(folder))
    return ptxas_report(report)


def ptxas_report(report: str) -> dict:
    """Registers, spills, stack and shared memory a block, read from the text of ptxas -v."""

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        return int(found.group(1)) if found else 0

    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_store_bytes": number(r"(\d+) bytes spill stores"),
        "spill_load_bytes": number(r"(\d+) bytes spill loads"),
        "stack_bytes": number(r"(\d+) bytes stack frame"),
        "shared_bytes": number(r"(\d+) bytes smem"),
    }


def resident_blocks(registers: int, threads: int, shared: int) -> int:
    """Blocks of the kernel one SM holds at once: the least of what registers, warps and shared memory allow."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_shared = SHARED_PER_SM // (shared + SHARED_PER_BLOCK_RESERVED)
    return min(REGISTER_FILE // (per_warp * warps), WARPS_PER_SM // warps, by_shared, BLOCKS_PER_SM)


def compile_step(config: ModelConfig, batch: int, context: int) -> list[dict]:
    """One row per kernel launch of the decode step: operator, kernel, grid, block, ptxas's
    report (`assemble`) and the blocks an SM holds."""
    launches = []
    with stand_in_h200(launches):
        for operator, call in decode_step(config, batch, context):
            first = len(launches)
            call()
            for launch in launches[first:]:
                launch.operator = operator
        rows = []
        for launch in launches:
            report = assemble(launch)
            threads = int(np.prod(launch.block))
            rows.append(
                {
                    "operator": launch.operator,
                    "kernel": launch.kernel,
                    "grid": launch.grid,
                    "block": launch.block,
                    **report,
                    "blocks_per_sm": resident_blocks(report["registers"], threads, report["shared_bytes"]),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--model", help="a model directory (config.json); default Llama 3.2 1B's shapes")
    args = parser.parse_args()
    config = load_config(args.model) if args.model else ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)
    rows = compile_step(config, args.batch, args.context)
    with stand_in_h200([]):
        header = result_header()
    print(
        f"{'operator':<20} {'kernel':<34} {'grid':>14} {'block':>5} {'regs':>4} {'spill st/ld':>11} "
        f"{'stack':>5} {'smem':>6} {'blocks/SM':>9}"
    )
    for row in rows:
        grid = "x".join(str(g) for g in np.atleast_1d(row["grid"]))
        spills = f"{row['spill_store_bytes']}/{row['spill_load_bytes']}"
        print(
            f"{row['operator']:<20} {row['kernel'][:34]:<34} {grid:>14} {str(row['block']):>5} {row['registers']:>4} "
            f"{spills:>11} {row['stack_bytes']:>5} {row['shared_bytes']:>6} {row['blocks_per_sm']:>9}"
        )
    toolchain = subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    payload = {
        **header,
        "toolchain": toolchain,
        "model": args.model or "llama-3.2-1b shapes",
        "batch": args.batch,
        "context": args.context,
        "launches": rows,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
