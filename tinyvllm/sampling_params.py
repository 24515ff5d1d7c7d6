"""How to sample one request's tokens: the part of vLLM's `SamplingParams` tinyvllm supports.

Everything is checked here, at construction, so a bad request fails when it is made, with a
ValueError naming the parameter, and never inside a kernel. The one check that needs the
model, stop token ids beyond the vocabulary, is `validate_for_vocab`, which the engine calls.
After construction `stop` is a list of strings and `stop_token_ids` a list of ints (as in vLLM).
`n` completions of one request sample from seeds `seed`, `seed + 1`, ... (vLLM's derivation), or
from n random seeds without one.
"""

import math
from dataclasses import dataclass
from numbers import Integral, Real

# Like vLLM: temperatures below this sample greedily, so the sampler never divides by ~0.
GREEDY_TEMPERATURE = 1e-5
# Seeds must fit an int64 device array (the sampler keys its counter-based RNG on them).
SEED_LIMIT = 2**63


# --8<-- [start:fields]
@dataclass
class SamplingParams:
    n: int = 1  # completions per request, each sampled from its own seed stream
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
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
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if not 0 <= self.seed < SEED_LIMIT:
                raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or below GREEDY_TEMPERATURE): take the argmax, ignore top_k/top_p."""
        return self.temperature < GREEDY_TEMPERATURE

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Raise ValueError naming stop_token_ids if any id is not a token of the model."""
        unknown = [t for t in self.stop_token_ids if t >= vocab_size]
        if unknown:
            raise ValueError(f"stop_token_ids {unknown} are outside the model's vocabulary of {vocab_size} tokens")


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
