"""Elementwise kernels on the GPU: effective bandwidth against the copy ceiling.

    python -m perf.bench_elementwise [--repeats 50]

For each kernel and token count (1 and 64 for decode, 4096 for prefill) this times the
launcher (perf/timing.py: CUDA events, cold L2, median) and reports the effective
bandwidth: the bytes the operation must move (every input read once, every output
written once) over the time. The ceiling is a device-to-device copy, 4.25 TB/s read+write
on the H200; the copy is timed in the same run too.

Shapes: RMSNorm (the residual add now goes into the store of the product before it:
`gemv.py`) and SiLU*up at hidden 8192 (the
bar); RoPE + KV write at Llama 3.2 1B's 32 query and 8 KV heads of 64, from the fused qkv
projection into q and a 16-token-block cache at shuffled slots; embedding from a 128256 x
2048 table. Bars on the H200: RMSNorm and SiLU*up at least 3 TB/s at 4096 tokens.
Results go to perf/results/bench_elementwise.json.
"""

import argparse
import functools
import json
from pathlib import Path

import numpy as np
from numba import config, cuda

from perf.timing import copy_tbps, median_ms, random_bf16, result_header
from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.kernels.activation import silu_mul
from tinyvllm.kernels.embedding import embedding
from tinyvllm.kernels.rmsnorm import rmsnorm
from tinyvllm.kernels.rope import rope_write_kv
from tinyvllm.model.rope import rope_inv_freq

COPY_CEILING_TBPS = 4.25
BAR_TBPS = 3.0
BAR_OPS = ("rmsnorm", "silu_mul")
BAR_TOKENS = 4096
TOKEN_COUNTS = (1, 64, 4096)
HIDDEN = 8192
VOCAB, EMBED_HIDDEN = 128256, 2048
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 64
BLOCK_SIZE = 16
LLAMA_3_2_SCALING = LLAMA_3_2_1B_CONFIG["rope_scaling"]
RESULTS = Path(__file__).resolve().parent / "results" / "bench_elementwise.json"

rng = np.random.default_rng(0)


def cases(tokens: int):
    """(op, shape, bytes moved, call) for one token count."""
    x, out = random_bf16(tokens, HIDDEN), random_bf16(tokens, HIDDEN)
    weight = random_bf16(HIDDEN)
    row_bytes = tokens * HIDDEN * 2
    yield "rmsnorm", f"{tokens}x{HIDDEN}", 2 * row_bytes + HIDDEN * 2, lambda: rmsnorm(x, weight, 1e-5, out)

    gate_up, activated = random_bf16(tokens, 2 * HIDDEN), random_bf16(tokens, HIDDEN)
    yield "silu_mul", f"{tokens}x2x{HIDDEN}", 3 * row_bytes, lambda: silu_mul(gate_up, activated)

    qkv_heads = Q_HEADS + 2 * KV_HEADS
    qkv, q = random_bf16(tokens, qkv_heads * HEAD_DIM), random_bf16(tokens, Q_HEADS, HEAD_DIM)
    positions = cuda.to_device(rng.integers(0, 131072, tokens, dtype=np.int32))
    inv_freq = cuda.to_device(rope_inv_freq(HEAD_DIM, 500000.0, LLAMA_3_2_SCALING))
    num_blocks = 2 * -(-tokens // BLOCK_SIZE)
    k_cache = random_bf16(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    v_cache = random_bf16(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    slots = cuda.to_device(rng.permutation(num_blocks * BLOCK_SIZE)[:tokens].astype(np.int32))
    # qkv read once, q and the cache rows written once, plus positions, slots and inv_freq.
    rope_bytes = 2 * tokens * qkv_heads * HEAD_DIM * 2 + 2 * tokens * 4 + HEAD_DIM * 2
    yield (
        "rope_write_kv",
        f"{tokens}x({Q_HEADS}+2x{KV_HEADS})x{HEAD_DIM}",
        rope_bytes,
        lambda: rope_write_kv(qkv, positions, inv_freq, slots, q, k_cache, v_cache),
    )

    table, embedded = embedding_table(), random_bf16(tokens, EMBED_HIDDEN)
    token_ids = cuda.to_device(rng.integers(0, VOCAB, tokens, dtype=np.int32))
    embed_bytes = 2 * tokens * EMBED_HIDDEN * 2 + tokens * 4
    yield "embedding", f"{tokens}x{EMBED_HIDDEN}", embed_bytes, lambda: embedding(token_ids, table, embedded)


@functools.cache
def embedding_table():
    """One 525 MB table for every token count."""
    return random_bf16(VOCAB, EMBED_HIDDEN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if config.ENABLE_CUDASIM:
        raise SystemExit("bench_elementwise times real kernels: it needs a CUDA GPU, not the simulator")

    rows = []
    print(f"{'op':<13} {'tokens':>6} {'shape':<20} {'MB':>9} {'us':>9} {'TB/s':>6} {'% ceiling':>9}")
    for tokens in TOKEN_COUNTS:
        for op, shape, moved, call in cases(tokens):
            milliseconds = median_ms(call, repeats=args.repeats)
            tbps = moved / (milliseconds * 1e-3) / 1e12
            percent = 100 * tbps / COPY_CEILING_TBPS
            print(
                f"{op:<13} {tokens:>6} {shape:<20} {moved / 1e6:>9.3f} "
                f"{milliseconds * 1e3:>9.2f} {tbps:>6.2f} {percent:>8.1f}%"
            )
            rows.append(
                {
                    "op": op,
                    "tokens": tokens,
                    "shape": shape,
                    "bytes": moved,
                    "median_us": milliseconds * 1e3,
                    "effective_tbps": tbps,
                    "percent_of_copy_ceiling": percent,
                }
            )
    measured_copy = copy_tbps(BAR_TOKENS * HIDDEN, args.repeats)
    print(f"device-to-device copy, {BAR_TOKENS}x{HIDDEN} bf16: {measured_copy:.2f} TB/s (ceiling: {COPY_CEILING_TBPS})")
    bars = {
        f"{row['op']}@{BAR_TOKENS}": row["effective_tbps"] >= BAR_TBPS
        for row in rows
        if row["op"] in BAR_OPS and row["tokens"] == BAR_TOKENS
    }
    for name, met in bars.items():
        print(f"bar {name} >= {BAR_TBPS} TB/s: {'met' if met else 'MISSED'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        **result_header(),
        "copy_ceiling_tbps": COPY_CEILING_TBPS,
        "measured_copy_tbps": measured_copy,
        "bar_tbps": BAR_TBPS,
        "bars_met": bars,
        "results": rows,
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
