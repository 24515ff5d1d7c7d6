"""What the penalties read about one sequence: a packed int32 word per vocabulary token.

A running sequence that uses a penalty or min_tokens owns a slot, a row of the runner's
`token_state[slots, V]`, whose word for token t packs

    bits 0..27   how many times t appears among the sequence's output tokens
    bit 28       t appears in the prompt            (repetition_penalty reads it)
    bit 29       t is a stop token of the sequence  (min_tokens masks it)

One load per token gives a penalty kernel all it needs, and the step's count update is a
plain `+= 1` on the word (no count reaches 2**28: max_model_len is far below). The host
fills a slot's row when the sequence samples its first token after admission
(`token_state_row`); the kernels then keep it current on the device. Nothing here
imports Numba: the NumPy backend reads the same words.
"""

import numpy as np

COUNT_MASK = (1 << 28) - 1
PROMPT_BIT = 1 << 28
STOP_BIT = 1 << 29


def token_state_row(vocab: int, prompt_ids, output_ids, stop_ids) -> np.ndarray:
    """The int32 words of one sequence: its output tokens' counts, prompt and stop bits."""
    row = np.bincount(np.asarray(output_ids, np.int64), minlength=vocab).astype(np.int32)
    row[np.asarray(prompt_ids, np.int64)] |= PROMPT_BIT
    row[np.asarray(stop_ids, np.int64)] |= STOP_BIT
    return row


def output_counts(state: np.ndarray) -> np.ndarray:
    return state & COUNT_MASK


def seen(state: np.ndarray) -> np.ndarray:
    """Tokens of the prompt or the output so far: those repetition_penalty applies to."""
    return (state & (COUNT_MASK | PROMPT_BIT)) != 0


def stop_tokens(state: np.ndarray) -> np.ndarray:
    return (state & STOP_BIT) != 0
