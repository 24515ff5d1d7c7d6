"""Reading a row of logits past its end, so that loops over it in groups need no bounds checks.

A kernel streaming a row keeps several loads in flight per thread (a thread that waits out
each load's latency alone streams at a fraction of the bandwidth), so it loads a group of
elements before it uses the first. The last group runs past the row's end: there the load
is clamped to the last element (always issued, so no branch splits the group) and the
value replaced by -inf, which changes no maximum, no sum of exps and no top-n.
"""

import math

from numba import cuda, float32


@cuda.jit(device=True, inline=True)
def logit_or_minus_inf(logits, row, i):
    """logits[row, i], or -inf where i is past the row's end."""
    vocab = logits.shape[1]
    value = logits[row, min(i, vocab - 1)]
    return value if i < vocab else float32(-math.inf)


@cuda.jit(device=True, inline=True)
def four_logits(logits, row, start, stride):
    """The logits at start + k * stride for k = 0 to 3 (-inf past the row's end), all four
    loads issued before any is used."""
    return (
        logit_or_minus_inf(logits, row, start),
        logit_or_minus_inf(logits, row, start + stride),
        logit_or_minus_inf(logits, row, start + 2 * stride),
        logit_or_minus_inf(logits, row, start + 3 * stride),
    )
