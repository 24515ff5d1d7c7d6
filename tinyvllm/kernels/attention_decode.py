"""PagedAttention decode: one new query token per sequence against its whole cached context.

    out[s, h] = softmax(q[s, h] . K_s^T / sqrt(D)) V_s       (the context_lens[s] cached tokens)

Decode is memory-bound: every cached K and V row is read once and used for a handful of
multiply-adds, so the kernel is built around reading the cache at full bandwidth.

One block per (KV head, sequence, partition). The block serves the G = Hq / Hkv query
heads that share its KV head, so each K and V row crosses the bus once for all of them.
A token's K row is D contiguous bf16 (128 bytes at D = 64). A *group* of D / 8 adjacent
lanes takes one token: each lane loads 8 elements of the K row and 8 of the V row, one
16-byte load each, dots its K slice with the G query slices it keeps in registers, and
the group adds the partial dots with shuffles (`lane_group_sum`). The block's groups take
consecutive tokens, so a warp reads whole rows of neighbouring tokens, and every group
loads TOKENS_PER_STEP tokens before it uses any, to keep many bytes in flight. Registers
hold one step's K and V, not two (a second set spills), so once a step's loads are out,
the group looks up the next step's rows and *prefetches* them into L2
(`prefetch.global.L2`: nothing comes back to a register, nothing waits for it). Device
memory keeps streaming while the block computes, and the next step's loads find their
rows in L2 (at batch 64 x 2048 paged decode streams 3.20 TB/s with it, 2.96 without). Each group
runs its own online softmax (per head: running max, sum, and its lanes' slice of the
output), rescaled once per step to the step's largest score; at the end the groups merge
through shared memory (`attention_common`), all G heads at once.

The kernel also runs one *partition* of each context (the grid's z dimension), for
split-K decoding (`attention_split.py`): block z cuts its sequence's context, from the
length it finds in `context_lens`, into gridDim.z parts of whole loop steps
(`partition_tokens`), runs the part it owns, and writes its unnormalised state to a
float32 workspace instead of the normalised output (a part past the context's end
writes nothing). For cascade attention (`attention_cascade.py`) the split runs only a
sequence's own tokens, from the shared prefix's length (a device array) to its context's end.
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import (
    LOG2_E,
    block_shift,
    check_paged_cache,
    check_sequences,
    rescale,
)
from tinyvllm.kernels.device.bf16 import f32_to_bf16
from tinyvllm.kernels.device.fast_exp import exp2_ftz
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import group_scratch_shape, lane_group_sum
from tinyvllm.kernels.device.simulator import launch_bounds
from tinyvllm.kernels.device.vector_io import (
    VECTOR,
    high_half,
    load_words,
    low_half,
    prefetch_l2,
)

DECODE_THREADS = 128
TOKENS_PER_STEP = 4
"""Tokens each lane group loads before using them: 64 bytes in flight per lane."""
SPLIT_TOKENS_PER_STEP = 2
"""The same for one partition of a split context (`attention_split.py`). A partition is
short, and with few sequences the kernel's time is its own instruction path (under two
warps a scheduler), which shortens with the tokens a step (1 to 2 µs a layer on the
H200 at batch 1); the merge then combines twice the partitions."""
REGISTER_FILE = 65536
"""32-bit registers per SM."""
MAX_GROUP = 8
"""Query heads per KV head: a block keeps G query and accumulator slices in registers
and merges G heads' states in shared memory at once (4 KB of it per head)."""
WORKSPACE_EXTRA = 2
"""A workspace row is a partition's output slice [0, D), then its max [D] and sum [D + 1]."""


# --8<-- [start:partition]
@cuda.jit(device=True, inline=True)
def partition_tokens(context_len, num_partitions, step):
    """The length of each of num_partitions parts of a context, in whole loop steps.

    Partition p covers [p * length, (p + 1) * length) of the context; the parts past its
    end are empty, and ceil(context_len / length) of them are not.
    """
    steps = (context_len + num_partitions * step - 1) // (num_partitions * step)
    return steps * step


# --8<-- [end:partition]


@functools.cache
def _decode_kernel(head_dim, group, threads, tokens_per_step, split, cascade=False):
    lanes = head_dim // VECTOR
    groups = threads // lanes
    words = VECTOR // 2
    step = groups * tokens_per_step
    step_scores = tokens_per_step * group
    scale = float32(LOG2_E / math.sqrt(head_dim))
    scratch_shape = group_scratch_shape(threads, step_scores)
    # A query and an accumulator slice per head stay in registers: up to G = 4 they fit
    # in 128 a thread, past that they need the 255 maximum (and fewer resident blocks).
    registers = 128 if group <= 4 else 255
    resident = max(1, REGISTER_FILE // (threads * registers))
    bounds = launch_bounds(threads, resident)

    @cuda.jit(device=True, inline=True)
    def locate(table, base, end, token_group, shift, row_mask, row_stride, block_stride, head_offset, offsets):
        """Where this lane's slice of K and V sits for each token of the loop step at `base`
        (tokens past `end` read the last one again)."""
        for u in range(tokens_per_step):
            token = np.uint32(min(base + u * groups + token_group, end - 1))
            block = np.uint64(table[token >> shift])
            offsets[u] = block * block_stride + np.uint64((token & row_mask) * row_stride) + head_offset

    @cuda.jit(device=True, inline=True)
    def prefetch_step(k_flat, v_flat, offsets):
        """Start the loop step's K and V slices on their way into L2, with no register to
        wait on: device memory keeps streaming while the block computes."""
        for u in range(tokens_per_step):
            prefetch_l2(k_flat, offsets[u])
            prefetch_l2(v_flat, offsets[u])

    @cuda.jit(device=True, inline=True)
    def block_max(group_max, g):
        """Head g's maximum over the block's groups."""
        merged = float32(-math.inf)
        for other in range(groups):
            merged = max(merged, group_max[other, g])
        return merged

    @cuda.jit(device=True, inline=True)
    def attend(q, k_flat, v_flat, block_tables, context_lens, first, log2_block_size, result):
        """The kernel over positions [first, context_len) of each context."""
        allow_dependent_launch()
        kv_head = cuda.blockIdx.x
        seq = cuda.blockIdx.y
        partition = cuda.blockIdx.z
        # Unsigned cache arithmetic: Python's floor division and negative-index wraparound
        # would otherwise cost a dozen 64-bit instructions per token.
        shift = np.uint32(log2_block_size)
        row_mask = (np.uint32(1) << shift) - np.uint32(1)
        row_stride = np.uint32(cuda.gridDim.x * head_dim)
        block_stride = np.uint64(row_stride) << np.uint64(shift)
        lane = cuda.threadIdx.x % lanes
        token_group = cuda.threadIdx.x // lanes
        column = lane * VECTOR
        context_len = context_lens[seq]
        length = partition_tokens(context_len - first, cuda.gridDim.z, step)
        start = first + partition * length
        end = min(context_len, start + length)
        if split and start >= end:
            return  # a part past the context's end: the merge reads only parts with tokens

        # The lengths and block tables come from the host, never from a kernel: the first
        # step's cache offsets are worked out before the wait for the kernel ahead (`pdl`),
        # and each step looks up the next one's while its own loads are in flight.
        table = block_tables[seq]
        head_offset = np.uint64(kv_head * head_dim + column)
        offsets = cuda.local.array(tokens_per_step, np.uint64)
        if start < end:
            locate(table, start, end, token_group, shift, row_mask, row_stride, block_stride, head_offset, offsets)
        wait_for_prior_grid()

        query = cuda.local.array((group, VECTOR), float32)
        acc = cuda.local.array((group, VECTOR), float32)
        running_max = cuda.local.array(group, float32)
        running_sum = cuda.local.array(group, float32)
        for g in range(group):
            q_words = load_words(q[seq, kv_head * group + g], column)
            for w in range(words):
                query[g, 2 * w] = low_half(q_words[w]) * scale
                query[g, 2 * w + 1] = high_half(q_words[w]) * scale
            for e in range(VECTOR):
                acc[g, e] = float32(0.0)
            running_max[g] = -math.inf
            running_sum[g] = float32(0.0)

        k_words = cuda.local.array((tokens_per_step, words), np.uint32)
        v_words = cuda.local.array((tokens_per_step, words), np.uint32)
        scores = cuda.local.array(step_scores, float32)
        values = cuda.local.array(VECTOR, float32)
        scratch = cuda.shared.array(scratch_shape, float32)
        # --8<-- [start:token-loop]
        for base in range(start, end, step):
            for u in range(tokens_per_step):
                k_loaded = load_words(k_flat, offsets[u])
                v_loaded = load_words(v_flat, offsets[u])
                for w in range(words):
                    k_words[u, w] = k_loaded[w]
                    v_words[u, w] = v_loaded[w]
            if base + step < end:
                locate(
                    table,
                    base + step,
                    end,
                    token_group,
                    shift,
                    row_mask,
                    row_stride,
                    block_stride,
                    head_offset,
                    offsets,
                )
                prefetch_step(k_flat, v_flat, offsets)
            for u in range(tokens_per_step):
                for g in range(group):
                    dot = float32(0.0)
                    for w in range(words):
                        dot += query[g, 2 * w] * low_half(k_words[u, w])
                        dot += query[g, 2 * w + 1] * high_half(k_words[u, w])
                    scores[u * group + g] = dot
            lane_group_sum(scores, lanes, scratch)
            # One rescale per head and step, to the step's new maximum (not one per token).
            for g in range(group):
                step_max = running_max[g]
                for u in range(tokens_per_step):
                    if base + u * groups + token_group < end:
                        step_max = max(step_max, scores[u * group + g])
                factor = rescale(running_max[g], step_max)
                running_sum[g] *= factor
                for e in range(VECTOR):
                    acc[g, e] *= factor
                running_max[g] = step_max
            for u in range(tokens_per_step):
                if base + u * groups + token_group < end:
                    for w in range(words):
                        values[2 * w] = low_half(v_words[u, w])
                        values[2 * w + 1] = high_half(v_words[u, w])
                    for g in range(group):
                        weight = exp2_ftz(scores[u * group + g] - running_max[g])
                        running_sum[g] += weight
                        for e in range(VECTOR):
                            acc[g, e] += weight * values[e]
        # --8<-- [end:token-loop]

        # The groups' states merge in shared memory, all G heads at once: each group
        # rescales its state to the block's maximum, then thread t sums element t.
        group_max = cuda.shared.array((groups, group), float32)
        group_sum = cuda.shared.array((groups, group), float32)
        group_acc = cuda.shared.array((groups, group, head_dim), float32)
        if lane == 0:
            for g in range(group):
                group_max[token_group, g] = running_max[g]
        cuda.syncthreads()
        for g in range(group):
            factor = rescale(running_max[g], block_max(group_max, g))
            for e in range(VECTOR):
                group_acc[token_group, g, column + e] = acc[g, e] * factor
            if lane == 0:
                group_sum[token_group, g] = running_sum[g] * factor
        cuda.syncthreads()
        for element in range(cuda.threadIdx.x, group * head_dim, threads):
            g = element // head_dim
            d = element % head_dim
            head = kv_head * group + g
            total = float32(0.0)
            merged_sum = float32(0.0)
            for other in range(groups):
                total += group_acc[other, g, d]
                merged_sum += group_sum[other, g]
            if split:
                slot = (seq * cuda.gridDim.x * group + head) * cuda.gridDim.z + partition
                result[slot, d] = total
                if d == 0:
                    result[slot, head_dim] = block_max(group_max, g)
                    result[slot, head_dim + 1] = merged_sum
            else:
                result[seq, head, d] = f32_to_bf16(total / merged_sum)

    if cascade:

        @cuda.jit(**bounds)
        def decode(q, k_flat, v_flat, block_tables, context_lens, shared_len, log2_block_size, result):
            # A context no longer than the prefix (a padding row) has no tokens of its own.
            first = min(shared_len[0], context_lens[cuda.blockIdx.y])
            attend(q, k_flat, v_flat, block_tables, context_lens, first, log2_block_size, result)

    else:

        @cuda.jit(**bounds)
        def decode(q, k_flat, v_flat, block_tables, context_lens, log2_block_size, result):
            attend(q, k_flat, v_flat, block_tables, context_lens, 0, log2_block_size, result)

    return decode


def check_decode(q, k_cache, v_cache, block_tables, context_lens, out) -> tuple[int, int, int, int, int, int]:
    """Check a decode batch; return (S, Hq, Hkv, D, block_size, max_blocks_per_seq)."""
    num_seqs, num_heads, num_kv_heads, head_dim, block_size = check_paged_cache(q, k_cache, v_cache, out)
    _, max_blocks = check_sequences(block_tables, context_lens, num_seqs)
    if head_dim // VECTOR > 32 or (head_dim // VECTOR) & (head_dim // VECTOR - 1):
        raise ValueError(f"head_dim {head_dim}: decode needs D / {VECTOR} to be a power of two up to 32")
    if num_heads // num_kv_heads > MAX_GROUP:
        raise ValueError(
            f"q: {num_heads} query heads over {num_kv_heads} KV heads; decode serves at most {MAX_GROUP} per KV head"
        )
    return num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_blocks


def launch_decode(
    q, k_cache, v_cache, block_tables, context_lens, result, partitions, split, stream, shared_len=None
) -> int:
    """result: out (bf16, normalised) for the whole context, or with `split` the float32
    workspace of a split into `partitions` parts; with `shared_len` (int32[1] on the device,
    split only) the split covers each context from that position on.

    Returns the kernel's loop step (tokens per block per iteration), which cuts partitions.
    """
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    threads = max(DECODE_THREADS, head_dim // VECTOR)
    group = num_heads // num_kv_heads
    tokens_per_step = SPLIT_TOKENS_PER_STEP if split else TOKENS_PER_STEP
    kernel = _decode_kernel(head_dim, group, threads, tokens_per_step, split, shared_len is not None)
    grid = (num_kv_heads, num_seqs, partitions)
    k_flat, v_flat = k_cache.reshape(-1), v_cache.reshape(-1)
    shift = block_shift(block_size)
    lengths = (context_lens,) if shared_len is None else (context_lens, shared_len)
    launch_kernel(kernel, grid, threads, stream, q, k_flat, v_flat, block_tables, *lengths, shift, result)
    return threads // (head_dim // VECTOR) * tokens_per_step


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, out, *, stream=0) -> None:
    """One block per (sequence, KV head) over the whole context: out[S, Hq, D] bf16.

    q: uint16[S, Hq, D] (one token per sequence, already in the cache); k_cache, v_cache:
    uint16[num_blocks, block_size, Hkv, D]; block_tables: int32[S, max_blocks];
    context_lens: int32[S], each at least 1 and at most max_blocks * block_size.
    """
    num_seqs = check_decode(q, k_cache, v_cache, block_tables, context_lens, out)[0]
    if num_seqs == 0:
        return
    launch_decode(q, k_cache, v_cache, block_tables, context_lens, out, 1, False, stream)
