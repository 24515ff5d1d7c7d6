"""Logprobs: a row's log-softmax at the sampled token and at its most likely tokens.

For one row of raw logits l[0..V) (before temperature, penalties and filters: vLLM's default
`raw_logprobs`), the sampled token s and a count n <= MAX_LOGPROBS (`reference.logprobs`):

    m       = max_i l_i
    lse     = m + log sum_i exp(l_i - m)          the log-softmax's normaliser
    logp_i  = l_i - lse
    rank_s  = 1 + #{i : l_i > l_s}                 1: the most likely token
    top_n   = the n largest l_i, largest first, ties to the lowest index (as a stable sort)

One block per row, one pass over it in the common case:

1. each thread reads its strided share of the row once, keeping an online log-sum-exp (a
   running maximum m_t and s_t = sum exp(l_i - m_t), rescaled when m_t grows, as flash
   attention's online softmax does, so every exp stays in (0, 1]), the count of logits above
   l_s, and its own KEPT largest (value, index) pairs in registers. The block reduces
   m = max m_t and lse = m + log sum_t s_t exp(m_t - m).
2. the block's top n is the top n of the threads' lists: n rounds of a block argmax over
   the head of each thread's list, the winner popping its head. Every pair is compared by
   value, then index, so the result does not depend on how the row was split among threads.

A thread that holds more than KEPT of the row's top n has dropped one that belongs there.
That is seen exactly when a round finds a thread's list used up while the thread read more
than KEPT logits; then (rarely: the top n must cluster in one thread's share of the
vocabulary) the block makes a second pass in which each thread keeps its n largest in a
sorted list in local memory, and runs the rounds again over those.

Rows with n < 0 (they asked for no logprobs) return at once, and a step in which no row
asks does not launch the kernel at all (`backends/sampler_options.py`).
"""

import math

import numpy as np
from numba import cuda, float32, int32

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import argmax_better, block_argmax, block_max, block_sum
from tinyvllm.kernels.device.rows import four_logits
from tinyvllm.kernels.device.simulator import gpu_or_simulator
from tinyvllm.sampling_params import MAX_LOGPROBS

THREADS = gpu_or_simulator(512, 8)
"""Threads per block (a power of two, as the block reductions need)."""
KEPT = 4
"""(value, index) pairs each thread keeps in registers in the one pass."""
UNROLL = 4
"""Logits a thread loads before it uses the first of them (`four_logits`)."""

_NO_INDEX = np.int32(2**31 - 1)


@cuda.jit(device=True, inline=True)
def _take(value, i, token_logit, peak, total, above, v0, v1, v2, v3, i0, i1, i2, i3):
    """One logit into a thread's running state: the online log-sum-exp (peak, total), the
    count above the sampled token's logit, and the sorted four largest (v, i)."""
    if value > peak:
        total = total * math.exp(peak - value) + float32(1.0)  # exp(-inf) = 0 at the first
        peak = value
    elif value > float32(-math.inf):
        total += math.exp(value - peak)
    if value > token_logit:
        above += float32(1.0)
    if argmax_better(value, i, v3, i3):  # into the sorted four, from the bottom
        v3, i3 = value, i
        if argmax_better(v3, i3, v2, i2):
            v2, v3, i2, i3 = v3, v2, i3, i2
            if argmax_better(v2, i2, v1, i1):
                v1, v2, i1, i2 = v2, v1, i2, i1
                if argmax_better(v1, i1, v0, i0):
                    v0, v1, i0, i1 = v1, v0, i1, i0
    return peak, total, above, v0, v1, v2, v3, i0, i1, i2, i3


@cuda.jit(device=True, inline=True)
def _head(head, v0, v1, v2, v3, i0, i1, i2, i3):
    """Entry `head` of a thread's kept list ((-inf, no index) past its end)."""
    if head == 0:
        return v0, i0
    if head == 1:
        return v1, i1
    if head == 2:
        return v2, i2
    if head == 3:
        return v3, i3
    return float32(-math.inf), _NO_INDEX


@cuda.jit(device=True, inline=True)
def _sorted_top(logits, row, count, values, indices):
    """The thread's `count` largest (value, index) pairs of its share, sorted, in local
    arrays; returns how many (fewer when its share is shorter)."""
    kept = 0
    for i in range(cuda.threadIdx.x, logits.shape[1], THREADS):
        value = logits[row, i]
        if kept < count or value > values[count - 1]:
            slot = min(kept, count - 1)
            kept = min(kept + 1, count)
            while slot > 0 and values[slot - 1] < value:
                values[slot] = values[slot - 1]
                indices[slot] = indices[slot - 1]
                slot -= 1
            values[slot] = value
            indices[slot] = i
    return kept


# --8<-- [start:logprobs-kernel]
@cuda.jit
def _logprobs_kernel(logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks):
    """Block `row`: the module docstring's pass, its rounds, and the second pass if one is needed."""
    allow_dependent_launch()
    wait_for_prior_grid()
    row = cuda.blockIdx.x
    count = num_logprobs[row]
    if count < 0:
        return
    tid = cuda.threadIdx.x
    vocab = logits.shape[1]
    count = min(count, top_ids.shape[1], vocab)
    scratch = cuda.shared.array(THREADS, float32)
    index_scratch = cuda.shared.array(THREADS, int32)
    token_logit = logits[row, sampled[row]]
    peak = float32(-math.inf)
    total = float32(0.0)
    above = float32(0.0)
    v0 = v1 = v2 = v3 = float32(-math.inf)
    i0 = i1 = i2 = i3 = _NO_INDEX
    for start in range(tid, vocab, THREADS * UNROLL):
        a, b, c, d = four_logits(logits, row, start, THREADS)  # four loads in flight (device/rows.py)
        for value, i in ((a, start), (b, start + THREADS), (c, start + 2 * THREADS), (d, start + 3 * THREADS)):
            peak, total, above, v0, v1, v2, v3, i0, i1, i2, i3 = _take(
                value, i, token_logit, peak, total, above, v0, v1, v2, v3, i0, i1, i2, i3
            )
    block_peak = block_max(peak, scratch)
    share = total * math.exp(peak - block_peak) if total > 0 else float32(0.0)
    total = block_sum(share, scratch)
    above = block_sum(above, scratch)
    normaliser = block_peak + math.log(total)
    if tid == 0:
        sampled_logprobs[row] = token_logit - normaliser
        sampled_ranks[row] = int32(above) + 1
    read = (vocab - tid + THREADS - 1) // THREADS  # logits this thread read
    kept = min(read, KEPT)
    head = 0
    lost = float32(0.0)
    for k in range(count):
        if head == KEPT and read > KEPT:
            lost = float32(1.0)  # its next largest, dropped, may be the k-th
        value, index = _head(head, v0, v1, v2, v3, i0, i1, i2, i3)
        best = block_argmax(value, index, scratch, index_scratch)
        if head < kept and index == best:
            top_ids[row, k] = index
            top_logprobs[row, k] = value - normaliser
            head += 1
    if block_max(lost, scratch) == 0:
        return
    values = cuda.local.array(MAX_LOGPROBS, float32)
    indices = cuda.local.array(MAX_LOGPROBS, int32)
    kept = _sorted_top(logits, row, count, values, indices)
    head = 0
    for k in range(count):
        value, index = float32(-math.inf), _NO_INDEX
        if head < kept:
            value, index = values[head], indices[head]
        best = block_argmax(value, index, scratch, index_scratch)
        if head < kept and index == best:
            top_ids[row, k] = index
            top_logprobs[row, k] = value - normaliser
            head += 1


# --8<-- [end:logprobs-kernel]


def compute_logprobs(
    logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks, *, stream=0
) -> None:
    """The module docstring's logprobs of each row s with num_logprobs[s] = n >= 0: the
    sampled token's in sampled_logprobs[s] and sampled_ranks[s], the top n in
    top_ids[s, :n] and top_logprobs[s, :n]. Other rows and columns are not written.

    logits float32[S, V]; num_logprobs int32[S] (-1: none; at most top_ids' width, and V);
    sampled int32[S]; top_ids int32[S, W] and top_logprobs float32[S, W], W <= MAX_LOGPROBS;
    sampled_logprobs float32[S]; sampled_ranks int32[S].
    """
    num_rows, _ = check_array("logits", logits, np.float32, (None, None))
    _, width = check_array("top_ids", top_ids, np.int32, (num_rows, None))
    if width > MAX_LOGPROBS:
        raise ValueError(f"top_ids: {width} columns, at most {MAX_LOGPROBS}")
    check_array("top_logprobs", top_logprobs, np.float32, (num_rows, width))
    for name, array, dtype in (
        ("num_logprobs", num_logprobs, np.int32),
        ("sampled", sampled, np.int32),
        ("sampled_logprobs", sampled_logprobs, np.float32),
        ("sampled_ranks", sampled_ranks, np.int32),
    ):
        check_array(name, array, dtype, (num_rows,))
    if num_rows:
        outputs = (top_ids, top_logprobs, sampled_logprobs, sampled_ranks)
        launch_kernel(_logprobs_kernel, num_rows, THREADS, stream, logits, num_logprobs, sampled, *outputs)
