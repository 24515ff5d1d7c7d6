"""Split-K decode (flash-decoding): long contexts over many blocks, merged afterwards.

With few sequences, S * Hkv decode blocks cannot fill the GPU and each streams a long
context alone. `split_decode_attention` cuts every context into `num_partitions` parts,
one block of the decode kernel each (`attention_decode.py`, the grid's z dimension), which
write their unnormalised state (output slice, max, sum) to a float32 workspace;
`_merge_partitions_kernel` then merges them with the rule in `attention_common`.
Each block cuts its sequence's context itself, from the length it finds in
`context_lens`, into parts of whole loop steps: a 512-token context of a sequence whose
block table could hold 2048 is spread over all the blocks too, not left to the first
few, and a captured CUDA graph (whose grid is fixed) still splits every context evenly.
Blocks past the end of a short context find their part empty and return at once; the
merge reads only the parts that hold tokens, which it works out from the context length
the same way.
`decode_attention` is the one entry the CUDA backend calls, with the number of partitions
that the variant table picks (backends/variants.py `decode_partitions`): one runs the
kernel over whole contexts, more the split and its merge.
"""

import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import rescale
from tinyvllm.kernels.attention_decode import (
    WORKSPACE_EXTRA,
    check_decode,
    launch_decode,
    paged_decode_attention,
    partition_tokens,
)
from tinyvllm.kernels.device.bf16 import f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.fast_exp import exp2_ftz
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid

BLOCKS_PER_SM = 4
"""Decode blocks of DECODE_THREADS that one SM holds at once (the launch bounds see to it)."""
MAX_PARTITIONS = 64
"""Partitions are the grid's z dimension, which CUDA caps at 64."""
MERGE_THREADS = 128
"""The merge's threads per head: one per output element, up to this many."""
MERGE_BATCH = 16
"""Partitions whose states a merge thread loads at once, before it combines any."""


# --8<-- [start:merge]
@cuda.jit(device=True, inline=True)
def merge_states(workspace, first, filled, head_dim, d, running_max, running_sum, total, maxes, sums, values):
    """Element d of the states in rows first .. first + filled - 1 folded into the running
    state (max, sum, output element d), which it returns. MERGE_BATCH states are loaded at
    once and added as a batch: their largest max first, then each partition's weight
    exp2(m_p - M), all independent, so the running state is rescaled once a batch, not
    once a partition."""
    for batch in range(0, filled, MERGE_BATCH):
        # Slots past the last partition load it again: the batch's max stays the same.
        batch_max = float32(-math.inf)
        for i in range(MERGE_BATCH):
            row = first + min(batch + i, filled - 1)
            maxes[i] = workspace[row, head_dim]
            sums[i] = workspace[row, head_dim + 1]
            values[i] = workspace[row, d]
            batch_max = max(batch_max, maxes[i])
        merged_max = max(running_max, batch_max)
        old = rescale(running_max, merged_max)
        running_sum *= old
        total *= old
        for i in range(MERGE_BATCH):
            if batch + i < filled:
                weight = exp2_ftz(maxes[i] - merged_max)
                running_sum += sums[i] * weight
                total += values[i] * weight
        running_max = merged_max
    return running_max, running_sum, total


@cuda.jit
def _merge_partitions_kernel(workspace, context_lens, num_partitions, step, out):
    """One block per (query head, sequence), one thread per output element: the non-empty
    partitions' states merged with the online-softmax rule (no barrier, no shared memory)."""
    allow_dependent_launch()
    head = cuda.blockIdx.x
    seq = cuda.blockIdx.y
    head_dim = out.shape[2]
    first = (seq * out.shape[1] + head) * num_partitions
    # The lengths come from the host: read before the wait for the decode blocks (`pdl`).
    context_len = context_lens[seq]
    length = partition_tokens(context_len, num_partitions, step)
    filled = (context_len + length - 1) // length
    wait_for_prior_grid()
    maxes = cuda.local.array(MERGE_BATCH, float32)
    sums = cuda.local.array(MERGE_BATCH, float32)
    values = cuda.local.array(MERGE_BATCH, float32)
    for d in range(cuda.threadIdx.x, head_dim, cuda.blockDim.x):
        _, merged_sum, total = merge_states(
            workspace, first, filled, head_dim, d, float32(-math.inf), float32(0.0), float32(0.0), maxes, sums, values
        )
        out[seq, head, d] = f32_to_bf16(total / merged_sum)


# --8<-- [end:merge]


def split_decode_attention(
    q, k_cache, v_cache, block_tables, context_lens, out, workspace, num_partitions: int, *, stream=0
) -> None:
    """Flash-decoding: each context in `num_partitions` parts computed in parallel, then merged.

    workspace: float32[rows, D + 2] with rows >= S * Hq * num_partitions (see
    `decode_workspace_shape`). Other arguments as in `paged_decode_attention`.
    """
    num_seqs, num_heads, *_ = check_decode(q, k_cache, v_cache, block_tables, context_lens, out)
    head_dim = q.shape[2]
    rows, _ = check_array("workspace", workspace, np.float32, (None, head_dim + WORKSPACE_EXTRA))
    if not 1 <= num_partitions <= MAX_PARTITIONS:
        raise ValueError(f"num_partitions must be 1 to {MAX_PARTITIONS}, got {num_partitions}")
    if rows < num_seqs * num_heads * num_partitions:
        needed = num_seqs * num_heads * num_partitions
        raise ValueError(f"workspace: {rows} rows, needs S * Hq * num_partitions = {needed}")
    if num_seqs == 0:
        return
    step = launch_decode(q, k_cache, v_cache, block_tables, context_lens, workspace, num_partitions, True, stream)
    merge_partitions(workspace, context_lens, num_partitions, step, out, stream=stream)


def merge_partitions(workspace, context_lens, num_partitions: int, step: int, out, *, stream=0) -> None:
    """out[S, Hq, D] (bf16) from the partition states the decode kernel left in workspace, its
    loop step `step` (the caller has checked the shapes, as `split_decode_attention` does)."""
    num_seqs, num_heads, head_dim = out.shape
    threads = min(MERGE_THREADS, head_dim)
    launch_kernel(_merge_partitions_kernel, (num_heads, num_seqs), threads, stream,
                  workspace, context_lens, num_partitions, step, out)  # fmt: skip


def decode_workspace_shape(num_heads: int, num_kv_heads: int, head_dim: int, num_sms: int) -> tuple[int, int]:
    """The float32 workspace of `decode_attention` on a GPU with num_sms SMs, for any batch.

    Split-K keeps S * Hkv * partitions <= BLOCKS_PER_SM * num_sms, one row per query head.
    """
    return (BLOCKS_PER_SM * num_sms * (num_heads // num_kv_heads), head_dim + WORKSPACE_EXTRA)


def decode_attention(
    q, k_cache, v_cache, block_tables, context_lens, out, workspace, num_partitions: int, *, stream=0
) -> None:
    """Decode attention with each context in `num_partitions` parts: 1 runs
    `paged_decode_attention`, more `split_decode_attention`.

    workspace: float32 of `decode_workspace_shape(Hq, Hkv, D, multiprocessor_count())`, which
    holds the partitions of any batch that the variant table splits.
    """
    head_dim = check_decode(q, k_cache, v_cache, block_tables, context_lens, out)[3]
    check_array("workspace", workspace, np.float32, (None, head_dim + WORKSPACE_EXTRA))
    if num_partitions == 1:
        paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, out, stream=stream)
    else:
        split_decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, out, workspace, num_partitions, stream=stream
        )
