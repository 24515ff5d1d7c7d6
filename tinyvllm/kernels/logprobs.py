"""Logprobs: a row's log-softmax at the sampled token and at its most likely tokens.

For one row of raw logits l[0..V) (before temperature, penalties and filters: vLLM's default
`raw_logprobs`), the sampled token s and a count n <= MAX_LOGPROBS (`reference.logprobs`):

    m       = max_i l_i
    lse     = m + log sum_i exp(l_i - m)          the log-softmax's normaliser
    logp_i  = l_i - lse
    rank_s  = 1 + #{i : l_i > l_s}                 1: the most likely token
    top_n   = the n largest l_i, largest first, ties to the lowest index (as a stable sort)

Subtracting m first keeps every exp in (0, 1], so the sum cannot overflow, and it holds at
least the 1 of the largest term. One block per row, two passes over it:

1. each thread reads its strided share of the row, keeping the running maximum and its own
   n largest (value, index) pairs in a sorted list in local memory: a logit enters only
   when it beats the list's last, which after the first few rounds is rare. The block
   reduces the maximum.
2. each thread adds its exp(l_i - m) and counts the logits above l_s; two block sums give
   lse and the rank.

The block's top n is then the top n of the threads' lists: n rounds of a block argmax over
the head of each thread's list, the winner popping its head. Every pair is compared by
value, then index, so the result does not depend on how the row was split among threads.

Rows with n < 0 (they asked for no logprobs) return at once, and a step in which no row
asks does not launch the kernel at all (`backends/sampler_options.py`).
"""

import math

import numpy as np
from numba import cuda, float32, int32

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import block_argmax, block_max, block_sum
from tinyvllm.kernels.device.simulator import gpu_or_simulator
from tinyvllm.sampling_params import MAX_LOGPROBS

THREADS = gpu_or_simulator(512, 8)
"""Threads per block (a power of two, as the block reductions need)."""

_NO_INDEX = np.int32(2**31 - 1)


# --8<-- [start:logprobs-kernel]
@cuda.jit
def _logprobs_kernel(logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks):
    """Block `row`: the module docstring's two passes, then the n rounds of the merge."""
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
    values = cuda.local.array(MAX_LOGPROBS, float32)
    indices = cuda.local.array(MAX_LOGPROBS, int32)
    kept = 0
    peak = float32(-math.inf)
    for i in range(tid, vocab, THREADS):
        value = logits[row, i]
        peak = max(peak, value)
        if count > 0 and (kept < count or value > values[count - 1]):
            slot = min(kept, count - 1)
            kept = min(kept + 1, count)
            while slot > 0 and values[slot - 1] < value:
                values[slot] = values[slot - 1]
                indices[slot] = indices[slot - 1]
                slot -= 1
            values[slot] = value
            indices[slot] = i
    peak = block_max(peak, scratch)
    token_logit = logits[row, sampled[row]]
    total = float32(0.0)
    above = float32(0.0)
    for i in range(tid, vocab, THREADS):
        value = logits[row, i]
        total += math.exp(value - peak)
        if value > token_logit:
            above += float32(1.0)
    total = block_sum(total, scratch)
    above = block_sum(above, scratch)
    normaliser = peak + math.log(total)
    if tid == 0:
        sampled_logprobs[row] = token_logit - normaliser
        sampled_ranks[row] = int32(above) + 1
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
        _logprobs_kernel[num_rows, THREADS, stream](
            logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks
        )
