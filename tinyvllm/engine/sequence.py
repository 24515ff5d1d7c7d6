"""One request's state as the scheduler sees it, and what the engine hands back for it.

A `Sequence` is an array of token ids (the prompt, then each sampled token), of which the first
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

A request with `n > 1` is n sequences (`new_sequences`), one per completion: they share the
request id and the prompt, each has its `index` (0 .. n-1), its own seed (the request's seed
+ index, as vLLM derives them, so a seeded request is reproducible; random ones otherwise)
and the same `group`, the list of all n. The scheduler lets them share the prompt's KV blocks.

`RequestOutput` and `CompletionOutput` are vLLM's output shape: one RequestOutput per request,
with one CompletionOutput per sequence in `outputs`. A sequence whose request asks for
`logprobs` keeps one {token id: Logprob} dict per generated token in `output_logprobs`, filled
when the token reaches the host (so a recomputed sequence, which samples no token twice,
adds no entry twice).
"""

import enum
import itertools
import secrets
from array import array
from collections.abc import Iterable
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

TOKEN_BYTES = 8
"""Bytes a token id takes in `token_bytes`."""


def token_bytes(token_ids: array, start: int = 0, end: int | None = None) -> bytes:
    """Ids start:end of an int64 array (a sequence's `token_ids`) as bytes, machine order: how the
    prefix cache stores and compares a block's ids, two byte strings compared at once where a
    tuple of ints compared int by int. One copy, out of a memoryview: slicing the array and
    converting the slice made three (0.7 against 1.6 us for 2,096 ids)."""
    return memoryview(token_ids)[start:end].tobytes()


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        sampling_params: SamplingParams,
        prompt: str | None = None,
        index: int = 0,
    ) -> None:
        """One completion of a request (the `index`-th); a lone sequence is its own group.
        `prompt_token_ids` are copied (from an array("q"), as LLMEngine's tokenizing makes them,
        one memcpy)."""
        # An int64 array, not a list: the collector never visits it. A young list of 2,112 ids is
        # 2,112 visits in every collection until it is old, and admitting 256 such prompts paid
        # 16 to 23 ms of collections (perf/LOG.md, 2026-12-06).
        token_ids = array("q", prompt_token_ids)
        if not token_ids:
            raise ValueError("prompt_token_ids must hold at least one token")
        self.request_id = request_id
        self.index = index
        self.group: list[Sequence] = [self]  # the request's sequences, by index (new_sequences sets it)
        self.prompt = prompt
        self.token_ids = token_ids
        self.num_prompt_tokens = len(token_ids)
        self._prompt_token_ids: list[int] | None = None
        self.num_computed_tokens = 0
        self.pending_sample_row = -1
        self.block_table: list[int] = []
        # Prefix-cache keys of its first full blocks of known tokens, as far as hashed (kept
        # across preemption: a key depends only on tokens, which stay), and how many blocks at
        # the start of block_table the cache holds (registered, or found there).
        self.block_keys: list[int] = []
        self.num_registered_blocks = 0
        # Prompt tokens it did not compute at first admission (found cached, or forked from a
        # sibling); None until then.
        self.num_cached_tokens: int | None = None
        self.sampling_params = sampling_params
        seed = sampling_params.seed
        self.seed = (seed + index) % SEED_LIMIT if seed is not None else secrets.randbelow(SEED_LIMIT)
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.arrival = next(_arrivals)
        self.output_logprobs: list[dict[int, Logprob]] = []
        # vLLM's prompt_logprobs, entry 0 None; one list for all of a request's sequences
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            None if sampling_params.prompt_logprobs is None else [None] * len(token_ids)
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt, copied once and then shared by every output of the request, as in vLLM: a
        copy per streamed output of 256 requests with 2,112-token prompts cost 0.7 ms a step."""
        if self._prompt_token_ids is None:
            self._prompt_token_ids = self.token_ids[: self.num_prompt_tokens].tolist()
        return self._prompt_token_ids

    @property
    def num_known_tokens(self) -> int:
        """len(token_ids) without the placeholders of tokens still on the GPU."""
        end = len(self.token_ids)
        while self.token_ids[end - 1] == PENDING_TOKEN:
            end -= 1
        return end

    @property
    def known_token_ids(self) -> list[int]:
        """token_ids without the placeholders of tokens still on the GPU."""
        return self.token_ids[: self.num_known_tokens].tolist()

    @property
    def completion_token_ids(self) -> list[int]:
        """The sampled tokens the host has (a copy of those alone, not of the prompt before them)."""
        return self.token_ids[self.num_prompt_tokens : self.num_known_tokens].tolist()

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def set_finished(self, reason: str, stop_reason: int | str | None = None) -> None:
        """Mark finished with a vLLM finish reason: "stop", "length" or "abort", and for a
        stop by a stop token id or a stop string, that id or string (vLLM's stop_reason)."""
        if reason not in _FINISHED_STATUS:
            raise ValueError(f"finish reason must be one of {sorted(_FINISHED_STATUS)}, got {reason!r}")
        self.status = _FINISHED_STATUS[reason]
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def __repr__(self) -> str:
        index = f"[{self.index}]" if len(self.group) > 1 else ""
        return (
            f"Sequence({self.request_id!r}{index}, {self.status.name}, tokens={self.num_tokens}, "
            f"prompt={self.num_prompt_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_table})"
        )


def new_sequences(
    request_id: str,
    prompt_token_ids: Iterable[int],
    sampling_params: SamplingParams,
    prompt: str | None = None,
) -> list[Sequence]:
    """The `sampling_params.n` sequences of one request, indices 0 .. n-1, sharing one group."""
    group = [
        Sequence(request_id, prompt_token_ids, sampling_params, prompt=prompt, index=index)
        for index in range(sampling_params.n)
    ]
    for seq in group:
        seq.group = group
        seq.prompt_logprobs = group[0].prompt_logprobs
    return group


# --8<-- [start:outputs]
@dataclass
class Logprob:
    """One token's log-probability under the model, vLLM's shape.

    Attributes:
        logprob: the natural log of the token's probability, from the raw logits (before
            temperature, penalties and the filters).
        rank: 1 + the number of tokens of the vocabulary with a larger logit (1: the most likely).
        decoded_token: the token's text, decoded on its own.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One completion of a request, with vLLM's fields; `finished()` once it has a finish reason.

    Attributes:
        index: which of the request's `n` completions this is, from 0.
        text: the detokenized text generated so far (cumulative), a stop string cut off.
        token_ids: the token ids generated so far (cumulative).
        cumulative_logprob: the sum of the generated tokens' logprobs; None when the request
            did not ask for `logprobs` (as vLLM).
        logprobs: with `SamplingParams.logprobs`, one dict per generated token (cumulative, like
            token_ids), mapping token ids to `Logprob`: the sampled token and the `logprobs` most
            likely ones; None otherwise.
        finish_reason: None while it runs, then "stop", "length" or "abort".
        stop_reason: the stop token id or stop string that ended it; None for an end-of-sequence
            token, a length cap or an abort.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def from_sequence(cls, seq: Sequence, text: str) -> "CompletionOutput":
        """The sequence's state now; `text` is its detokenized completion, made by the engine."""
        token_ids = seq.completion_token_ids
        logprobs = cumulative = None
        if seq.sampling_params.logprobs is not None:
            logprobs = seq.output_logprobs[: len(token_ids)]
            cumulative = sum(entry[token].logprob for entry, token in zip(logprobs, token_ids))
        return cls(
            index=seq.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=cumulative,
            logprobs=logprobs,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )


@dataclass
class RequestOutput:
    """What generate() returns and streaming yields for one request, with vLLM's fields.

    Attributes:
        request_id: the id the request was added with (or the engine gave it).
        prompt: the prompt's text; None for a prompt given as token ids.
        prompt_token_ids: the prompt as the model sees it.
        prompt_logprobs: with `SamplingParams.prompt_logprobs`, one entry per prompt token: None
            for the first, then a dict like `CompletionOutput.logprobs`' (the prompt token and
            the most likely ones at its position); None otherwise.
        outputs: one CompletionOutput per completion (`SamplingParams.n` of them, by index).
        finished: True once every completion has finished.
        num_cached_tokens: prompt tokens whose K/V came from the prefix cache when the prompt
            was first computed (the first completion's; the others share that prompt's blocks).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0

    @classmethod
    def from_sequences(cls, seqs: list[Sequence], texts: list[str]) -> "RequestOutput":
        """A request's state now from its sequences (by index) and their detokenized texts."""
        first = seqs[0]
        return cls(
            request_id=first.request_id,
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            prompt_logprobs=None if first.prompt_logprobs is None else list(first.prompt_logprobs),
            outputs=[CompletionOutput.from_sequence(seq, text) for seq, text in zip(seqs, texts)],
            finished=all(seq.is_finished for seq in seqs),
            num_cached_tokens=first.num_cached_tokens or 0,
        )


# --8<-- [end:outputs]
