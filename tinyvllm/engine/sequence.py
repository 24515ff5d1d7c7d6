"""One request's state as the scheduler sees it, and what the engine hands back for it.

A `Sequence` is a list of token ids (the prompt, then each sampled token), of which the first
`num_computed_tokens` have their K/V in the paged cache, in the blocks named by `block_table`
(block i holds positions i*block_size .. (i+1)*block_size - 1). The scheduler moves it
WAITING -> RUNNING -> FINISHED_*, and back to WAITING when it is preempted by recompute
(blocks freed, num_computed_tokens = 0, sampled tokens kept).

While the engine runs a step ahead, a token that has been sampled on the GPU but not yet
read back is held by a placeholder, `PENDING_TOKEN`, at the end of `token_ids` (it counts
as a token for positions and lengths; `known_token_ids` leaves it out), and
`pending_sample_row` says which row of that step's sampled tokens it is.

`seed` is fixed at creation (drawn at random when the request gives none): the sampler draws
the token at position p from (seed, p), so a sequence recomputed after preemption samples
exactly what it would have sampled without it.
"""

import enum
import itertools
import secrets
from dataclasses import dataclass

from tinyvllm.sampling_params import SEED_LIMIT, SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        # A tuple test compares by identity first; a dict lookup would hash the enum in Python.
        return self in _FINISHED


# vLLM / OpenAI finish reasons.
_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
}
_FINISHED_STATUS = {reason: status for status, reason in _FINISH_REASONS.items()}
_FINISHED = tuple(_FINISH_REASONS)

_arrivals = itertools.count()

PENDING_TOKEN = -1


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        prompt: str | None = None,
    ) -> None:
        token_ids = [int(t) for t in prompt_token_ids]
        if not token_ids:
            raise ValueError("prompt_token_ids must hold at least one token")
        self.request_id = request_id
        self.prompt = prompt
        self.token_ids = token_ids
        self.num_prompt_tokens = len(token_ids)
        self.num_computed_tokens = 0
        self.pending_sample_row = -1
        self.block_table: list[int] = []
        self.block_keys: list[int] = []  # prefix-cache keys of the first blocks of block_table
        self.num_cached_tokens: int | None = None  # prompt tokens found cached at first admission
        self.sampling_params = sampling_params
        seed = sampling_params.seed
        self.seed = seed if seed is not None else secrets.randbelow(SEED_LIMIT)
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.arrival = next(_arrivals)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def known_token_ids(self) -> list[int]:
        """token_ids without the placeholders of tokens still on the GPU."""
        end = len(self.token_ids)
        while self.token_ids[end - 1] == PENDING_TOKEN:
            end -= 1
        return self.token_ids[:end]

    @property
    def completion_token_ids(self) -> list[int]:
        """The sampled tokens the host has."""
        return self.known_token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def set_finished(self, reason: str) -> None:
        """Mark finished with a vLLM finish reason: "stop", "length" or "abort"."""
        if reason not in _FINISHED_STATUS:
            raise ValueError(f"finish reason must be one of {sorted(_FINISHED_STATUS)}, got {reason!r}")
        self.status = _FINISHED_STATUS[reason]
        self.finish_reason = reason

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"prompt={self.num_prompt_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_table})"
        )


@dataclass
class RequestOutput:
    """What generate() returns and streaming yields for one request (vLLM's fields, flattened)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    finished: bool
    num_cached_tokens: int = 0
    """Prompt tokens whose K/V came from the prefix cache (vLLM's name)."""

    @classmethod
    def from_sequence(cls, seq: Sequence, text: str) -> "RequestOutput":
        """The sequence's state now; `text` is the detokenized completion, made by the engine."""
        return cls(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            text=text,
            token_ids=seq.completion_token_ids,
            finish_reason=seq.finish_reason,
            finished=seq.is_finished,
            num_cached_tokens=seq.num_cached_tokens or 0,
        )
