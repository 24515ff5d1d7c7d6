"""Top-k and top-p thresholds by radix select, one block streaming one row of logits.

Flipping a float32's bits (all of them when negative, the sign bit when not) gives a
uint32 key in the same order as the values (`ordered_key`), so a threshold on the logits
is a key, found one digit of RADIX_BITS bits at a time from the top (`radix_select`): one
pass over the row histograms the keys that share the digits found so far, weighting each
by 1 (top-k) or by its w_i = exp((l_i - max l) / T) (top-p), and a walk down the
histogram finds the highest digit whose bins, with everything above them, reach the
target: k, or top_p times the total weight. 32 bits take three passes of 11 bits.

The weights are integers, so they add up to the same sum in any order and the threshold
does not depend on how the threads were scheduled: w_i in fixed point, units of
2**-MASS_BITS (the largest w_i is 1; a token below half a unit weighs nothing, and all of
those together weigh less than V * 2**-41 of the top token). Shared-memory atomics are
native for 32 bits only (a 64-bit add compiles to a compare-and-swap loop), so each bin's
64-bit sum is two 32-bit words, and the thread whose add wraps the low word carries one.

Every pass streams the row with `load_chunk`, UNROLL elements per thread read before any
is used, so that enough loads are in flight to keep memory busy; BLOCK threads per row.
"""

import math

import numpy as np
from numba import cuda, float32, float64, uint32, uint64

from tinyvllm.kernels.device.simulator import gpu_or_simulator

# The simulator runs a Python thread per CUDA thread; 9-bit digits still leave a short last one.
BLOCK, UNROLL, RADIX_BITS = gpu_or_simulator((512, 4, 11), (4, 2, 9))
RADIX_LEVELS = (32 + RADIX_BITS - 1) // RADIX_BITS
RADIX_BINS = 1 << RADIX_BITS
MASS_BITS = 40
MAX_VOCAB = 1 << (63 - MASS_BITS)
"""Vocabularies are below this, so no bin's mass overflows (its high word stays below 2**31)."""

_MASS_SCALE = float32(2.0**MASS_BITS)
_LOW32 = np.uint64(0xFFFFFFFF)
_U32_MAX = np.uint32(0xFFFFFFFF)
_SIGN = np.uint64(0x80000000)


# --8<-- [start:ordered-key]
@cuda.jit(device=True, inline=True)
def ordered_key(value):
    """float32 -> uint32 key (held in a uint64) in the same order; -0.0 and +0.0 share one."""
    bits = uint64(np.float32(value).view(np.uint32))
    if bits == _SIGN:
        bits = uint64(0)
    if bits & _SIGN:
        return bits ^ _LOW32
    return bits | _SIGN


# --8<-- [end:ordered-key]


@cuda.jit(device=True, inline=True)
def load_chunk(logits, row, start, chunk):
    """chunk[j] = logits[row, start + j * BLOCK]: all loads issued before any value is used.

    Past the row's end a chunk holds -inf, a logit that changes no argmax (its index is
    larger than every real one), no maximum, no k-th largest (k < V) and no mass, so the
    passes need no bounds checks.
    """
    vocab = logits.shape[1]
    for j in range(UNROLL):
        i = start + j * BLOCK
        value = logits[row, min(i, vocab - 1)]
        chunk[j] = value if i < vocab else float32(-math.inf)


@cuda.jit(device=True, inline=True)
def _add_mass(hist_high, hist_low, b, logit, max_logit, inv_temperature):
    """Bin b += w in units of 2**-MASS_BITS, its 64-bit sum kept as two 32-bit words."""
    mass = uint64(math.exp((logit - max_logit) * inv_temperature) * _MASS_SCALE + float32(0.5))
    low_word = uint32(mass & _LOW32)
    high_word = uint32(mass >> uint64(32))
    if low_word:
        old = cuda.atomic.add(hist_low, b, low_word)
        if low_word > _U32_MAX - old:  # this add wrapped the low word: carry one
            high_word = uint32(high_word + uint32(1))
    if high_word:
        cuda.atomic.add(hist_high, b, high_word)


@cuda.jit(device=True, inline=True)
def _bin_weight(hist_high, hist_low, b):
    return (uint64(hist_high[b]) << uint64(32)) + uint64(hist_low[b])


@cuda.jit(device=True, inline=True)
def _select_bin(hist_high, hist_low, num_bins, target, fraction, scan, choice):
    """The highest bin b whose weight, with the bins above it, reaches the target.

    The target is raised to ceil(fraction * total weight) first. Returns (b, the weight of
    the bins above b, the target). Each thread owns a run of bins; a suffix scan over the
    threads' totals finds the one thread whose run holds b, which walks down it.
    """
    tid = cuda.threadIdx.x
    per_thread = (num_bins + BLOCK - 1) // BLOCK
    first = min(tid * per_thread, num_bins)
    last = min(first + per_thread, num_bins)
    own = uint64(0)
    for b in range(first, last):
        own += _bin_weight(hist_high, hist_low, b)
    scan[tid] = own
    cuda.syncthreads()
    stride = 1
    while stride < BLOCK:
        addend = scan[tid + stride] if tid + stride < BLOCK else uint64(0)
        cuda.syncthreads()
        scan[tid] += addend
        cuda.syncthreads()
        stride *= 2
    target = max(target, uint64(math.ceil(fraction * float64(scan[0]))))
    running = scan[tid] - own
    if running < target <= scan[tid]:
        for b in range(last - 1, first - 1, -1):
            weight = _bin_weight(hist_high, hist_low, b)
            if running + weight >= target:
                choice[0] = b
                choice[1] = running
                break
            running += weight
    cuda.syncthreads()
    digit, above = choice[0], choice[1]
    cuda.syncthreads()
    return digit, above, target


@cuda.jit(device=True, inline=True)
def radix_select(
    logits,
    row,
    floor_key,
    target,
    fraction,
    by_mass,
    max_logit,
    inv_temperature,
    hist_high,
    hist_low,
    scan,
    choice,
):
    """The largest key t with weight{i : key_i >= t, key_i >= floor_key} >= target.

    Over row `row` of `logits`. The weight is a count, or with by_mass the fixed-point w_i
    (for max_logit and 1/T); at the first digit the target is raised to ceil(fraction *
    total weight). Scratch in shared memory: hist_high and hist_low uint32[RADIX_BINS],
    scan uint64[BLOCK], choice uint64[2].
    """
    vocab = logits.shape[1]
    chunk = cuda.local.array(UNROLL, float32)
    prefix = uint64(0)
    for level in range(RADIX_LEVELS):
        top = 32 - RADIX_BITS * level
        shift = max(top - RADIX_BITS, 0)
        num_bins = 1 << (top - shift)
        for b in range(cuda.threadIdx.x, num_bins, BLOCK):
            hist_high[b] = uint32(0)
            hist_low[b] = uint32(0)
        cuda.syncthreads()
        for start in range(cuda.threadIdx.x, vocab, BLOCK * UNROLL):
            load_chunk(logits, row, start, chunk)
            for j in range(UNROLL):
                key = ordered_key(chunk[j])
                if key >= floor_key and key >> uint64(top) == prefix:
                    b = (key >> uint64(shift)) & uint64(num_bins - 1)
                    if by_mass:
                        _add_mass(hist_high, hist_low, b, chunk[j], max_logit, inv_temperature)
                    else:
                        cuda.atomic.add(hist_low, b, uint32(1))
        cuda.syncthreads()
        fraction_now = fraction if level == 0 else 0.0
        digit, above, target = _select_bin(hist_high, hist_low, num_bins, target, fraction_now, scan, choice)
        prefix = (prefix << uint64(top - shift)) | digit
        target -= above
    return prefix
