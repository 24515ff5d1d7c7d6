"""Penalties, min_tokens and min-p: changing a row of logits before the sampler draws from it.

vLLM's order, on each sampled row (`reference.apply_penalties`, `reference.min_p_filter`):

    l_t = -inf                                 t a stop token, fewer than min_tokens generated
    l_t = l_t / r  if l_t > 0  else  l_t * r   t in the prompt or the output (repetition_penalty r)
    l_t -= frequency * c_t + presence * [c_t > 0]            c_t: t's count in the output
    then, after temperature T, min-p: drop t when p_t < min_p * max p, that is when
    l_t < max l + T ln(min_p): a threshold on the logit, so the sampler's top-k and top-p
    (thresholds too) compose with it in either order.

Where the counts live. Each running sequence that uses a penalty or min_tokens owns a slot:
a row of `token_state[slots, V]` in device memory, one packed int32 word per token
(`token_state.py`: output count, in-prompt bit, stop bit). The host writes a slot's row
once, when the sequence samples its first token after admission (after a preemption it is
written again, from the tokens the host has); from then on `count_sampled_tokens`, the
last kernel of the step, adds 1 to the word of each token the step sampled. So the state
is updated on the device and a replayed CUDA graph, which reads the slot of each row from
the step's inputs, keeps it current without the host. Dense rows cost V words per slot
(64 MB for 128 slots of Llama 3's 128,256 tokens) and make every lookup one load; a
penalized row is then one pass over logits and words, spread over many blocks.

Which kernels run is decided per step (`backends/sampler_options.py`): a step with no
penalized row launches neither the penalty kernel nor the count update, and one with no
min-p row no min-p kernel, so a plain step launches what it launched before.

`min_p` needs the row's maximum, so it runs one block per row, two passes: the maximum,
then the mask, each thread with four loads in flight. Rows it does not apply to (greedy,
min_p 0) return at once.
"""

import math

import numpy as np
from numba import cuda, float32, int32

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import block_max
from tinyvllm.kernels.device.rows import four_logits
from tinyvllm.kernels.device.simulator import gpu_or_simulator
from tinyvllm.kernels.token_state import COUNT_MASK, PROMPT_BIT, STOP_BIT

THREADS = gpu_or_simulator(256, 8)
"""Threads per block of every kernel here."""
TOKENS_PER_THREAD = gpu_or_simulator(8, 2)
"""Logits one thread of the penalty kernel handles: a block covers THREADS * this many."""

_COUNT_MASK, _PROMPT_BIT, _STOP_BIT = int32(COUNT_MASK), int32(PROMPT_BIT), int32(STOP_BIT)
_SEEN_MASK = int32(COUNT_MASK | PROMPT_BIT)


# --8<-- [start:penalty-kernel]
@cuda.jit
def _penalty_kernel(logits, token_state, slots, presence, frequency, repetition, mask_stop_tokens):
    """Block (row, part): the penalties of the module docstring on the part's tokens."""
    allow_dependent_launch()
    wait_for_prior_grid()
    row = cuda.blockIdx.x
    slot = slots[row]
    if slot < 0:
        return
    vocab = logits.shape[1]
    mask_stops = mask_stop_tokens[row] != 0
    begin = cuda.blockIdx.y * THREADS * TOKENS_PER_THREAD
    end = min(begin + THREADS * TOKENS_PER_THREAD, vocab)
    for token in range(begin + cuda.threadIdx.x, end, THREADS):
        state = token_state[slot, token]
        if mask_stops and state & _STOP_BIT:
            logits[row, token] = float32(-math.inf)
        elif state & _SEEN_MASK:
            logit = logits[row, token]
            logit = logit / repetition[row] if logit > 0 else logit * repetition[row]
            count = state & _COUNT_MASK
            if count:
                logit -= frequency[row] * float32(count) + presence[row]
            logits[row, token] = logit


# --8<-- [end:penalty-kernel]


@cuda.jit
def _count_kernel(token_state, slots, sampled):
    allow_dependent_launch()
    wait_for_prior_grid()
    row = cuda.grid(1)
    if row >= slots.shape[0] or slots[row] < 0:
        return
    token_state[slots[row], sampled[row]] += 1


# --8<-- [start:min-p-kernel]
@cuda.jit
def _min_p_kernel(logits, temperature, min_p):
    """Block per row: -inf for every logit below max l + T ln(min_p)."""
    allow_dependent_launch()
    wait_for_prior_grid()
    row = cuda.blockIdx.x
    if temperature[row] <= 0 or min_p[row] <= 0:
        return
    scratch = cuda.shared.array(THREADS, float32)
    vocab = logits.shape[1]
    best = float32(-math.inf)
    # four loads in flight a thread before the first is used (device/rows.py): one block a
    # row holds too few threads to stream the row one load at a time
    for start in range(cuda.threadIdx.x, vocab, THREADS * 4):
        a, b, c, d = four_logits(logits, row, start, THREADS)
        best = max(best, max(max(a, b), max(c, d)))
    threshold = block_max(best, scratch) + temperature[row] * float32(math.log(min_p[row]))
    for start in range(cuda.threadIdx.x, vocab, THREADS * 4):
        a, b, c, d = four_logits(logits, row, start, THREADS)
        for value, token in ((a, start), (b, start + THREADS), (c, start + 2 * THREADS), (d, start + 3 * THREADS)):
            if value < threshold and token < vocab:
                logits[row, token] = float32(-math.inf)


# --8<-- [end:min-p-kernel]


def _check_rows(logits, arrays) -> int:
    num_rows, _ = check_array("logits", logits, np.float32, (None, None))
    for name, array, dtype in arrays:
        check_array(name, array, dtype, (num_rows,))
    return num_rows


def apply_penalties(logits, token_state, slots, presence, frequency, repetition, mask_stop_tokens, *, stream=0) -> None:
    """Penalize logits float32[S, V] in place: row s by the state of slot slots[s] of
    token_state int32[slots, V] (-1: leave the row), with its float32 presence, frequency
    and repetition penalties, stop tokens to -inf where mask_stop_tokens int32[s] != 0."""
    num_rows = _check_rows(
        logits,
        (
            ("slots", slots, np.int32),
            ("presence", presence, np.float32),
            ("frequency", frequency, np.float32),
            ("repetition", repetition, np.float32),
            ("mask_stop_tokens", mask_stop_tokens, np.int32),
        ),
    )
    check_array("token_state", token_state, np.int32, (None, logits.shape[1]))
    if num_rows:
        parts = -(-logits.shape[1] // (THREADS * TOKENS_PER_THREAD))
        launch_kernel(_penalty_kernel, (num_rows, parts), THREADS, stream,
                      logits, token_state, slots, presence, frequency, repetition, mask_stop_tokens)  # fmt: skip


def count_sampled_tokens(token_state, slots, sampled, *, stream=0) -> None:
    """token_state[slots[s], sampled[s]] += 1 for every row s with slots[s] >= 0."""
    (num_rows,) = check_array("slots", slots, np.int32, (None,))
    check_array("sampled", sampled, np.int32, (num_rows,))
    check_array("token_state", token_state, np.int32, (None, None))
    if num_rows:
        launch_kernel(_count_kernel, -(-num_rows // THREADS), THREADS, stream, token_state, slots, sampled)


def apply_min_p(logits, temperature, min_p, *, stream=0) -> None:
    """Min-p on logits float32[S, V] in place, row s with its temperature and min_p (float32[S])."""
    num_rows = _check_rows(logits, (("temperature", temperature, np.float32), ("min_p", min_p, np.float32)))
    if num_rows:
        launch_kernel(_min_p_kernel, num_rows, THREADS, stream, logits, temperature, min_p)
