"""How to sample one request's tokens: the part of vLLM's `SamplingParams` tinyvllm supports.

Everything is checked here, at construction, so a bad request fails when it is made, with a
ValueError naming the parameter, and never inside a kernel. The one check that needs the
model, stop token ids beyond the vocabulary, is `validate_for_vocab`, which the engine calls.
After construction `stop` is a list of strings and `stop_token_ids` a list of ints (as in vLLM).
`n` completions of one request sample from seeds `seed`, `seed + 1`, ... (vLLM's derivation), or
from n random seeds without one.
"""

import math
from array import array
from dataclasses import dataclass
from functools import cached_property
from numbers import Integral, Real
from typing import TypeVar

# Like vLLM: temperatures below this sample greedily, so the sampler never divides by ~0.
GREEDY_TEMPERATURE = 1e-5
# Seeds must fit an int64 device array (the sampler keys its counter-based RNG on them).
SEED_LIMIT = 2**63
# vLLM's default max_logprobs: the most top tokens a request may ask for, per token.
MAX_LOGPROBS = 20


# --8<-- [start:fields]
@dataclass
class SamplingParams:
    """How one request's tokens are sampled and when it stops; every field is checked when built.

    Attributes:
        n: completions of the request, each sampled from its own seed stream (child i from the
            request's seed + i); the prompt is computed once.
        temperature: divides the logits before sampling; below 1e-5 (0 included) is greedy, the
            argmax, and top_k and top_p are then ignored.
        top_k: keep only the k most likely tokens (ties at the edge kept); -1 keeps all.
        top_p: keep the most likely tokens whose probabilities add up to at least top_p
            (nucleus sampling), in (0, 1]; 1 keeps all.
        max_tokens: the most tokens to generate (finish reason "length").
        stop: a string or a list of strings; generation stops at the first one found in the
            detokenized text, which is cut before it (finish reason "stop"). Stored as a list.
        stop_token_ids: token ids that stop generation besides the model's end-of-sequence ids;
            checked against the vocabulary by the engine. Stored as a list.
        ignore_eos: keep generating past the model's end-of-sequence tokens (for benchmarks).
        seed: makes the request's sampling reproducible, in any batch and after preemption;
            None draws one at random when the request is added. In [0, 2**63).
        presence_penalty: subtracted from the logit of every token the output holds, in [-2, 2]
            (OpenAI's definition).
        frequency_penalty: subtracted once for each time a token occurs in the output, in [-2, 2].
        repetition_penalty: over prompt and output tokens, a positive logit is divided by it and
            a negative one multiplied (vLLM's and transformers'); 1 is none, > 0.
        min_p: drop tokens whose probability, after temperature, is below min_p times the most
            likely token's; in [0, 1], 0 is none.
        min_tokens: the end-of-sequence tokens, stop_token_ids and stop strings stop nothing until
            this many tokens are generated; in [0, max_tokens].
        logprobs: return, for each generated token, the log-probabilities of the `logprobs` most
            likely tokens and of the sampled one, each with its rank (0: the sampled token's
            alone); None returns none. In [0, 20]. They are the raw model distribution, the
            log-softmax of the logits before temperature, penalties, min-p, top-k and top-p
            (vLLM's default `raw_logprobs` mode), so they do not depend on how a token is drawn.
        prompt_logprobs: the same for each prompt token given the tokens before it (the first
            has none), raw as `logprobs`; None returns none. In [0, 20]. A request that asks
            computes its whole prompt: it reads nothing from the prefix cache.
        skip_special_tokens: leave special tokens (BOS, EOS, chat markers) out of the text; the
            token ids keep them.
        include_stop_str_in_output: keep what stopped generation in the text: the stop string,
            or the text of the EOS or stop token id (vLLM's rule; by default neither is in it).
        truncate_prompt_tokens: keep only the prompt's last k tokens (left truncation); -1 keeps
            the last max_model_len; None keeps it whole. The output's prompt_token_ids are the kept ones.
    """

    n: int = 1  # completions per request, each sampled from its own seed stream
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None
    # --8<-- [end:fields]

    def __post_init__(self) -> None:
        self.n = _integer("n", self.n)
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        self.temperature = _real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        self.top_p = _real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.top_k = _integer("top_k", self.top_k)
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        self.max_tokens = _integer("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.stop = _stop_strings(self.stop)
        self.stop_token_ids = _stop_token_ids(self.stop_token_ids)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if not 0 <= self.seed < SEED_LIMIT:
                raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        self._check_penalties_and_min()
        self._check_logprobs()
        self.truncate_prompt_tokens = check_truncate_prompt_tokens(self.truncate_prompt_tokens)

    def _check_penalties_and_min(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = _real(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
            setattr(self, name, value)
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        self.min_p = _real("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        self.min_tokens = _integer("min_tokens", self.min_tokens)
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")

    def _check_logprobs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                value = _integer(name, value)
                if not 0 <= value <= MAX_LOGPROBS:
                    raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
                setattr(self, name, value)

    @cached_property
    def uses_token_state(self) -> bool:
        """Whether sampling reads the tokens seen so far: a penalty, or stop tokens masked by
        min_tokens. Asked of every sequence in every step, so computed once (the values are
        checked once too: a SamplingParams is not changed after construction)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1 or self.min_tokens)

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or below GREEDY_TEMPERATURE): take the argmax, ignore top_k/top_p."""
        return self.temperature < GREEDY_TEMPERATURE

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Raise ValueError naming stop_token_ids if any id is not a token of the model.

        Args:
            vocab_size: the model's vocabulary size.
        """
        unknown = [t for t in self.stop_token_ids if t >= vocab_size]
        if unknown:
            raise ValueError(f"stop_token_ids {unknown} are outside the model's vocabulary of {vocab_size} tokens")


def check_truncate_prompt_tokens(value) -> int | None:
    """truncate_prompt_tokens checked: None, -1 or a positive integer (ValueError naming it otherwise)."""
    if value is None:
        return None
    value = _integer("truncate_prompt_tokens", value)
    if value == 0 or value < -1:
        raise ValueError(f"truncate_prompt_tokens must be -1 (max_model_len) or >= 1, got {value}")
    return value


Ids = TypeVar("Ids", list[int], array)


def truncated_prompt(token_ids: Ids, truncate_prompt_tokens: int | None, max_model_len: int) -> Ids:
    """The prompt's ids that truncate_prompt_tokens keeps: its last k (max_model_len for -1), or all."""
    if truncate_prompt_tokens is None:
        return token_ids
    keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    return token_ids[-keep:]


def _integer(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    strings = [stop] if isinstance(stop, str) else stop
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) for s in strings):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    if "" in strings:
        raise ValueError("stop must not contain the empty string (it would match at once)")
    return list(strings)


def _stop_token_ids(ids) -> list[int]:
    if ids is None:
        return []
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"stop_token_ids must be a list of integers, got {type(ids).__name__}")
    ids = [_integer("stop_token_ids", t) for t in ids]
    negative = [t for t in ids if t < 0]
    if negative:
        raise ValueError(f"stop_token_ids must be >= 0, got {negative}")
    return ids
