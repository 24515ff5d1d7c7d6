"""Attention on the GPU: naive vs flash prefill, paged decode vs split-K (flash-decoding).

    python -m perf.bench_attention [--repeats 30] [--sweep] [--prefill-only] [--p-precision]

Llama 3.2 1B heads (32 query, 8 KV, D 64), 16-token cache blocks in shuffled order, random
bf16 values (no zeros). Times are medians of CUDA-event timings with a cold L2
(perf/timing.py).

Decode at batch 1, 64 and 256, every sequence at context 128 ... 8192: the plain paged
kernel (one block per sequence and KV head), split-K at the partition count that
`decode_attention` would pick (at least 2), and `decode_attention` itself. Effective
bandwidth is the K and V bytes read over the time; TFLOP/s counts 4 * Hq * D per cached
token (QK^T and PV).

Prefill of whole prompts, 1 x 4096 and 16 x 1024 tokens: naive (three kernels through a
2 GB float32 score buffer) against flash prefill; plus a chunked prefill (4 x 512 new
tokens behind 1536 cached ones), flash only, P V as the engine takes it (the variant table's
PREFILL_P_PRECISION; `--sweep` too). TFLOP/s counts the causal half. `--p-precision` times
flash prefill with P V in one float16 pass (`p_precision="fp16"`) beside two bf16 passes at
those shapes, on the same inputs: their ratio, and the fp16 output's relative difference from
the bf16x2 one (which is P-exact to about 2^-16).

Cascade decode at batch 256, 192, 128 and 64, context 2112 of which the first 2048 tokens are the same
blocks in every table: the engine's plain decode (`decode_attention`) against cascade
attention (`cascade_decode_attention`), and the relative difference of their outputs.

Bars on the H200: flash prefill >= 10x naive at 1 x 4096; paged decode >= 3.0 TB/s at
batch 64, context 2048; split-K >= 3x paged decode at batch 1, context 8192. `--sweep`
also times other work splits of both kernels (their module constants) at those shapes.
Every variant is checked too: decode against a float64 reference of the batch's first
sequence ("err" columns), flash prefill against naive. Results go to
perf/results/bench_attention.json.
"""

import argparse
import json
from pathlib import Path

import numpy as np
from numba import config, cuda

from perf.attention_naive import naive_attention, naive_scratch_shape
from perf.timing import copy_tbps, median_ms, random_bf16, result_header
from tinyvllm.backends.variants import PREFILL_P_PRECISION, decode_partitions, decode_shape
from tinyvllm.kernels import attention_decode, attention_tiles
from tinyvllm.kernels.attention_cascade import (
    cascade_decode_attention,
    cascade_shared_partitions,
    cascade_workspace_rows,
)
from tinyvllm.kernels.attention_decode import paged_decode_attention
from tinyvllm.kernels.attention_prefill import prefill_attention
from tinyvllm.kernels.attention_split import (
    BLOCKS_PER_SM,
    decode_attention,
    decode_workspace_shape,
    split_decode_attention,
)
from tinyvllm.kernels.attention_tiles import P_PRECISIONS
from tinyvllm.kernels.device.multiprocessors import multiprocessor_count
from tinyvllm.kernels.reference import causal_attention, from_bf16

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 64, 16
DECODE_BATCHES = (1, 64, 256)
DECODE_CONTEXTS = (128, 512, 2048, 8192)
PREFILLS = ((1, 4096, 0), (16, 1024, 0), (4, 512, 1536))
"""(sequences, new tokens each, cached tokens before them)."""
CASCADE_SEQS = (256, 192, 128, 64)
"""Decode batches of cascade_case, each sharing 2,048 of 2,112 tokens."""
PREFILL_SWEEP = ((8, 64), (8, 32), (4, 32), (4, 64), (2, 64))
"""(attention_tiles.WARPS, attention_tiles.MAX_KEYS) variants; the first is the default."""
DECODE_SWEEP = ((128, 4), (128, 2), (64, 4), (256, 4), (256, 2))
"""(DECODE_THREADS, TOKENS_PER_STEP) variants; the first is the default."""
RESULTS = Path(__file__).resolve().parent / "results" / "bench_attention.json"


def widen(values) -> np.ndarray:
    """Device or host bf16 bits -> float64; float arrays pass through."""
    values = values.copy_to_host() if hasattr(values, "copy_to_host") else np.asarray(values)
    return from_bf16(values).astype(np.float64) if values.dtype == np.uint16 else values.astype(np.float64)


def relative_error(actual, expected) -> float:
    actual, expected = widen(actual), widen(expected)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


class Cache:
    """One K and one V cache big enough for the largest case; each case takes random blocks."""

    def __init__(self, tokens: int):
        self.num_blocks = tokens // BLOCK_SIZE
        self.k = random_bf16(self.num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        self.v = random_bf16(self.num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        self.rng = np.random.default_rng(0)

    def block_tables(self, num_seqs: int, context: int) -> np.ndarray:
        blocks = -(-context // BLOCK_SIZE)
        return self.rng.permutation(self.num_blocks)[: num_seqs * blocks].reshape(num_seqs, blocks).astype(np.int32)

    def decode_reference(self, q, tables: np.ndarray, context: int) -> np.ndarray:
        """float64 decode attention of sequence 0, its K and V copied back block by block."""
        keys = np.concatenate([self.k[block].copy_to_host() for block in tables[0]])[:context]
        values = np.concatenate([self.v[block].copy_to_host() for block in tables[0]])[:context]
        return causal_attention(widen(q[0:1]), widen(keys), widen(values))


def upload_blocks(cache_half, rows, slots: np.ndarray) -> None:
    """cache_half[slot] = rows[token] for whole blocks of BLOCK_SIZE tokens (every prefill case
    starts and ends on a block boundary), through the host: one copy per block."""
    host = rows.copy_to_host()
    for token in range(0, len(slots), BLOCK_SIZE):
        cache_half[slots[token] // BLOCK_SIZE].copy_to_device(host[token : token + BLOCK_SIZE])


def decode_case(cache: Cache, num_seqs: int, context: int, repeats: int) -> dict:
    tables = cache.block_tables(num_seqs, context)
    args = (random_bf16(num_seqs, Q_HEADS, HEAD_DIM), cache.k, cache.v, cuda.to_device(tables))
    args += (cuda.to_device(np.full(num_seqs, context, np.int32)),)
    max_grid = BLOCKS_PER_SM * multiprocessor_count()
    partitions = max(2, decode_partitions(num_seqs, KV_HEADS, context, max_grid))
    workspace = cuda.device_array((num_seqs * Q_HEADS * partitions, HEAD_DIM + 2), np.float32)
    auto_shape = decode_workspace_shape(Q_HEADS, KV_HEADS, HEAD_DIM, multiprocessor_count())
    auto_workspace = cuda.device_array(auto_shape, np.float32)
    auto_partitions = decode_partitions(*decode_shape(args[0], cache.k, tables), max_grid)
    plain_out, split_out, auto_out = (random_bf16(num_seqs, Q_HEADS, HEAD_DIM) for _ in range(3))
    plain = median_ms(lambda: paged_decode_attention(*args, plain_out), repeats=repeats)
    split = median_ms(lambda: split_decode_attention(*args, split_out, workspace, partitions), repeats=repeats)
    auto = median_ms(lambda: decode_attention(*args, auto_out, auto_workspace, auto_partitions), repeats=repeats)
    kv_bytes = num_seqs * context * KV_HEADS * HEAD_DIM * 2 * 2
    flops = 4 * num_seqs * context * Q_HEADS * HEAD_DIM
    expected = cache.decode_reference(args[0], tables, context)
    return {
        "batch": num_seqs,
        "context": context,
        "kv_bytes": kv_bytes,
        "paged_ms": plain,
        "paged_tbps": kv_bytes / plain / 1e9,
        "paged_tflops": flops / plain / 1e9,
        "split_partitions": partitions,
        "split_ms": split,
        "split_tbps": kv_bytes / split / 1e9,
        "auto_ms": auto,
        "auto_tbps": kv_bytes / auto / 1e9,
        "split_vs_paged_error": relative_error(split_out, plain_out),
        "auto_vs_paged_error": relative_error(auto_out, plain_out),
        "paged_vs_reference_error": relative_error(plain_out[0:1], expected),
        "split_vs_reference_error": relative_error(split_out[0:1], expected),
    }


def cascade_case(cache: Cache, num_seqs: int, context: int, shared: int, repeats: int) -> dict:
    """Decode of num_seqs sequences whose first `shared` tokens are the same blocks: the
    engine's plain decode (`decode_attention`) against cascade attention, and their outputs."""
    tables = cache.block_tables(num_seqs, context)
    tables[:, : shared // BLOCK_SIZE] = tables[0, : shared // BLOCK_SIZE]
    args = (random_bf16(num_seqs, Q_HEADS, HEAD_DIM), cache.k, cache.v, cuda.to_device(tables))
    args += (cuda.to_device(np.full(num_seqs, context, np.int32)),)
    max_grid = BLOCKS_PER_SM * multiprocessor_count()
    plain_partitions = decode_partitions(*decode_shape(args[0], cache.k, tables), max_grid)
    plain_workspace = cuda.device_array(
        decode_workspace_shape(Q_HEADS, KV_HEADS, HEAD_DIM, multiprocessor_count()), np.float32
    )
    shared_parts = cascade_shared_partitions(num_seqs, KV_HEADS, Q_HEADS // KV_HEADS, HEAD_DIM, max_grid)
    rows = cascade_workspace_rows(num_seqs, Q_HEADS, plain_partitions, shared_parts)
    workspace = cuda.device_array((rows, HEAD_DIM + 2), np.float32)
    shared_len = cuda.to_device(np.array([shared], np.int32))
    plain_out, cascade_out = random_bf16(num_seqs, Q_HEADS, HEAD_DIM), random_bf16(num_seqs, Q_HEADS, HEAD_DIM)
    plain = median_ms(lambda: decode_attention(*args, plain_out, plain_workspace, plain_partitions), repeats=repeats)
    cascade = median_ms(
        lambda: cascade_decode_attention(*args, shared_len, cascade_out, workspace, plain_partitions, shared_parts),
        repeats=repeats,
    )
    return {
        "shape": f"{num_seqs}x{context} ({shared} shared)",
        "plain_ms": plain,
        "cascade_ms": cascade,
        "speedup": plain / cascade,
        "shared_partitions": shared_parts,
        "cascade_vs_plain_error": relative_error(cascade_out, plain_out),
    }


def prefill_inputs(cache: Cache, num_seqs: int, new: int, cached: int) -> tuple:
    """(q, k, v, (k cache, v cache, tables, cu_seqlens, context lens), flops) of a prefill case whose new
    tokens' K and V are in the cache."""
    tokens = num_seqs * new
    context = cached + new
    tables = cache.block_tables(num_seqs, context)
    q = random_bf16(tokens, Q_HEADS, HEAD_DIM)
    k, v = random_bf16(tokens, KV_HEADS, HEAD_DIM), random_bf16(tokens, KV_HEADS, HEAD_DIM)
    positions = np.tile(np.arange(cached, context), num_seqs)
    sequence = np.repeat(np.arange(num_seqs), new)
    slots = tables[sequence, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    if cached % BLOCK_SIZE or new % BLOCK_SIZE:
        raise ValueError(f"prefill {num_seqs}x{new}+{cached}: cached and new must be multiples of {BLOCK_SIZE}")
    upload_blocks(cache.k, k, slots)
    upload_blocks(cache.v, v, slots)
    cu_seqlens = cuda.to_device(np.arange(0, tokens + 1, new, dtype=np.int32))
    paged = (cache.k, cache.v, cuda.to_device(tables), cu_seqlens, cuda.to_device(np.full(num_seqs, context, np.int32)))
    visible_keys = num_seqs * (new * cached + new * (new + 1) // 2)
    return q, k, v, paged, 4 * visible_keys * Q_HEADS * HEAD_DIM


def prefill_case(cache: Cache, num_seqs: int, new: int, cached: int, repeats: int, with_naive: bool) -> dict:
    q, k, v, paged, flops = prefill_inputs(cache, num_seqs, new, cached)
    tokens, cu_seqlens = q.shape[0], paged[3]
    out = random_bf16(tokens, Q_HEADS, HEAD_DIM)
    flash = median_ms(lambda: prefill_attention(q, *paged, out, p_precision=PREFILL_P_PRECISION), repeats=repeats)
    row = {"shape": f"{num_seqs}x{new}+{cached}", "p_precision": PREFILL_P_PRECISION, "flash_ms": flash,
           "flash_tflops": flops / flash / 1e9}  # fmt: skip
    if with_naive:
        scores = cuda.device_array(naive_scratch_shape(tokens, Q_HEADS, new), np.float32)
        naive_out = random_bf16(tokens, Q_HEADS, HEAD_DIM)
        naive = median_ms(
            lambda: naive_attention(q, k, v, cu_seqlens, scores, naive_out), repeats=max(3, repeats // 10)
        )
        del scores
        row.update(
            naive_ms=naive,
            naive_tflops=flops / naive / 1e9,
            speedup=naive / flash,
            flash_vs_naive_error=relative_error(out, naive_out),
        )
    return row


def precision_case(cache: Cache, num_seqs: int, new: int, cached: int, repeats: int) -> dict:
    """Flash prefill with P V in two bf16 passes and in one float16 pass, on the same inputs."""
    q, _, _, paged, flops = prefill_inputs(cache, num_seqs, new, cached)
    outs = {mode: random_bf16(*q.shape) for mode in P_PRECISIONS}

    def timed(mode: str) -> float:
        return median_ms(lambda: prefill_attention(q, *paged, outs[mode], p_precision=mode), repeats=repeats)

    row = {"shape": f"{num_seqs}x{new}+{cached}"}
    for mode in P_PRECISIONS:
        ms = timed(mode)
        row.update({f"{mode}_ms": ms, f"{mode}_tflops": flops / ms / 1e9})
    row["fp16_speedup"] = row["bf16x2_ms"] / row["fp16_ms"]
    row["fp16_vs_bf16x2_error"] = relative_error(outs["fp16"], outs["bf16x2"])
    return row


def sweep(cache: Cache, repeats: int, prefill_only: bool) -> list[dict]:
    rows = []
    for warps, keys in PREFILL_SWEEP:
        attention_tiles.WARPS, attention_tiles.MAX_KEYS = warps, keys
        for num_seqs, new in ((1, 4096), (16, 1024)):
            row = prefill_case(cache, num_seqs, new, 0, repeats, with_naive=False)
            rows.append({"kernel": "prefill", "variant": f"warps {warps} keys {keys}"} | row)
    attention_tiles.WARPS, attention_tiles.MAX_KEYS = PREFILL_SWEEP[0]
    if prefill_only:
        return rows
    for threads, tokens_per_step in DECODE_SWEEP:
        attention_decode.DECODE_THREADS = threads
        attention_decode.TOKENS_PER_STEP = tokens_per_step
        for num_seqs, context in ((64, 2048), (1, 8192)):
            row = decode_case(cache, num_seqs, context, repeats)
            rows.append({"kernel": "decode", "variant": f"threads {threads} tokens/step {tokens_per_step}"} | row)
    attention_decode.DECODE_THREADS, attention_decode.TOKENS_PER_STEP = DECODE_SWEEP[0]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sweep", action="store_true", help="also time other work splits at the bar shapes")
    parser.add_argument("--prefill-only", action="store_true", help="time the prefill cases alone")
    parser.add_argument(
        "--p-precision",
        action="store_true",
        help="also time flash prefill with P V in one float16 pass against the two bf16 passes, side by side",
    )
    args = parser.parse_args()
    if config.ENABLE_CUDASIM:
        raise SystemExit("bench_attention times real kernels: it needs a CUDA GPU, not the simulator")
    cache = Cache(max(DECODE_BATCHES) * max(DECODE_CONTEXTS))
    copy = copy_tbps(1 << 29, args.repeats)

    decode = (
        []
        if args.prefill_only
        else [decode_case(cache, s, c, args.repeats) for s in DECODE_BATCHES for c in DECODE_CONTEXTS]
    )
    prefill = [prefill_case(cache, s, n, c, args.repeats, with_naive=c == 0) for s, n, c in PREFILLS]
    cascade = [cascade_case(cache, seqs, 2112, 2048, args.repeats) for seqs in CASCADE_SEQS]
    variants = sweep(cache, args.repeats, args.prefill_only) if args.sweep else []
    precision = [precision_case(cache, s, n, c, args.repeats) for s, n, c in PREFILLS] if args.p_precision else []

    print(f"device copy (read+write): {copy:.2f} TB/s")
    print(
        f"\n{'decode':>12} {'paged ms':>9} {'TB/s':>6} {'TFLOP/s':>8} {'P':>3} {'split ms':>9} {'TB/s':>6} "
        f"{'auto ms':>8} {'TB/s':>6} {'err paged':>9} {'err split':>9}"
    )
    for r in decode:
        print(
            f"{r['batch']:>5} x {r['context']:>4} {r['paged_ms']:9.4f} {r['paged_tbps']:6.2f} {r['paged_tflops']:8.2f} "
            f"{r['split_partitions']:>3} {r['split_ms']:9.4f} {r['split_tbps']:6.2f} {r['auto_ms']:8.4f} "
            f"{r['auto_tbps']:6.2f} {r['paged_vs_reference_error']:9.1e} {r['split_vs_reference_error']:9.1e}"
        )
    print(f"\n{'prefill':>14} {'flash ms':>9} {'TFLOP/s':>8} {'naive ms':>9} {'TFLOP/s':>8} {'speedup':>8} {'err':>8}")
    for r in prefill:
        naive = (
            f"{r['naive_ms']:9.3f} {r['naive_tflops']:8.2f} {r['speedup']:7.1f}x {r['flash_vs_naive_error']:8.1e}"
            if "naive_ms" in r
            else f"{'-':>9} {'-':>8} {'-':>8} {'-':>8}"
        )
        print(f"{r['shape']:>14} {r['flash_ms']:9.3f} {r['flash_tflops']:8.2f} {naive}")
    print(f"\n{'cascade decode':>24} {'plain ms':>9} {'cascade ms':>11} {'speedup':>8} {'err':>8}")
    for r in cascade:
        print(
            f"{r['shape']:>24} {r['plain_ms']:9.4f} {r['cascade_ms']:11.4f} {r['speedup']:7.2f}x "
            f"{r['cascade_vs_plain_error']:8.1e}"
        )
    if precision:
        columns = f"{'bf16x2 ms':>10} {'TFLOP/s':>8} {'fp16 ms':>8} {'TFLOP/s':>8} {'speedup':>8} {'diff':>8}"
        print(f"\n{'P precision':>14} {columns}")
    for r in precision:
        print(
            f"{r['shape']:>14} {r['bf16x2_ms']:10.3f} {r['bf16x2_tflops']:8.2f} {r['fp16_ms']:8.3f} "
            f"{r['fp16_tflops']:8.2f} {r['fp16_speedup']:7.2f}x {r['fp16_vs_bf16x2_error']:8.1e}"
        )
    for r in variants:
        if r["kernel"] == "prefill":
            shape, variant = r["shape"], r["variant"]
            print(f"sweep prefill {shape:>10} {variant:>22}: {r['flash_ms']:.3f} ms {r['flash_tflops']:.2f} TFLOP/s")
        else:
            print(
                f"sweep decode {r['batch']}x{r['context']} {r['variant']:>28}: paged {r['paged_tbps']:.2f} TB/s, "
                f"split {r['split_ms']:.4f} ms (P {r['split_partitions']})"
            )

    bars = {"flash_vs_naive_1x4096": prefill[0]["speedup"]}
    if decode:
        bars["paged_decode_tbps_64x2048"] = next(
            r["paged_tbps"] for r in decode if (r["batch"], r["context"]) == (64, 2048)
        )
        bars["split_vs_paged_1x8192"] = next(
            r["paged_ms"] / r["split_ms"] for r in decode if (r["batch"], r["context"]) == (1, 8192)
        )
    print("\nbars (need >= 10, >= 3.0, >= 3):", {k: round(v, 2) for k, v in bars.items()})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            result_header()
            | {
                "copy_tbps": copy,
                "bars": bars,
                "decode": decode,
                "prefill": prefill,
                "cascade": cascade,
                "sweep": variants,
                "p_precision": precision,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
