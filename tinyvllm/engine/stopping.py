"""When a sequence stops: at EOS, a stop token id, max_tokens or max_model_len, as in vLLM.

Stop strings are matched on the detokenized text (`detokenizer.py`), not here.
"""

from collections.abc import Set

from tinyvllm.engine.sequence import Sequence


def check_stop(
    seq: Sequence, token: int, num_tokens: int, eos_token_ids: Set[int], max_model_len: int
) -> tuple[str, int | None] | None:
    """Why seq stops at its token `token`, the num_tokens-th of its list, if it does: the
    finish reason and vLLM's stop_reason (the token for a stop token id, None for EOS)."""
    params = seq.sampling_params
    if num_tokens - seq.num_prompt_tokens >= params.min_tokens:  # before min_tokens, nothing stops it
        if token in eos_token_ids and not params.ignore_eos:
            return "stop", None
        if token in params.stop_token_ids:
            return "stop", token
    if reached_length(seq, num_tokens, max_model_len):
        return "length", None
    return None


def reached_length(seq: Sequence, num_tokens: int, max_model_len: int) -> bool:
    """A list of num_tokens tokens is as long as seq may grow."""
    completion = num_tokens - seq.num_prompt_tokens
    return completion >= seq.sampling_params.max_tokens or num_tokens >= max_model_len
