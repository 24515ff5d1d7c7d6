"""LLMEngine: requests in, tokens and text out.

`LLMEngine` is the streaming interface (vLLM's names): `add_request`, then `step()` until
`has_unfinished_requests()` is False, each step returning the requests that progressed;
`abort` drops one at any time. `LLM` wraps it for offline batches: `generate` and `chat`.

One step is: the scheduler picks tokens to compute, the runner queues one forward and
sampling on the device, and then, for the step queued by the call before, the scheduler
records the sampled tokens (finishing on EOS, stop ids, length) and the engine
detokenizes incrementally and checks stop strings: the engine runs a step ahead.

A request with `SamplingParams.n > 1` runs as n sequences (their prompt computed once, see
`scheduler.py`); its RequestOutput holds one CompletionOutput per sequence and is finished
when all are. Outputs are cumulative, as vLLM's CUMULATIVE kind: each holds every
completion's text and token ids so far (vLLM lists only the completions that progressed in
that step; here each output is the whole state, so a reader that skips one loses nothing).
"""

import dataclasses
import itertools
import random
import struct
import sys
from array import array
from collections.abc import Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyvllm.config import EngineConfig
from tinyvllm.engine.block_manager import BlockAllocator
from tinyvllm.engine.detokenizer import IncrementalDetokenizer, find_stop_string
from tinyvllm.engine.logprobs import record_logprobs
from tinyvllm.engine.model_runner import LaunchedStep
from tinyvllm.engine.prefix_cache import PrefixCachingAllocator
from tinyvllm.engine.prompt_logprobs import record_prompt_logprobs
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.scheduler import Scheduler
from tinyvllm.engine.sequence import RequestOutput, Sequence, new_sequences
from tinyvllm.engine.setup import build_runner
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.model.weights import load_weights
from tinyvllm.sampling_params import SEED_LIMIT, SamplingParams, truncated_prompt

Prompt = str | list[int] | Mapping
"""Text, token ids, or vLLM's dict prompts: {"prompt": text} or {"prompt_token_ids": ids}."""


@dataclass
class _Request:
    """One request's engine-side state: its sequences (by index) and their detokenizers."""

    seqs: list[Sequence]
    detokenizers: list[IncrementalDetokenizer]
    final_only: bool
    done: list[bool]  # the sequence has finished and its text is complete

    def output(self) -> RequestOutput:
        return RequestOutput.from_sequences(self.seqs, [detokenizer.text for detokenizer in self.detokenizers])


class LLMEngine:
    """The engine: requests in, cumulative `RequestOutput`s out, one scheduled step at a time.

    `add_request` queues a prompt, `step` runs one step of the scheduler and the model and
    returns the output of every request that got a token, `abort` frees a request's KV blocks,
    `has_unfinished_requests` says when to stop stepping. Not thread-safe: the server gives it a
    thread of its own (`tinyvllm.engine.async_engine.AsyncEngine`).

    Args:
        model: a Hugging Face model directory; None runs the embedded SmolLM2-135M-Instruct.
        engine_config: the engine options as a `tinyvllm.config.EngineConfig`.
        **kwargs: the same options as keyword arguments named after EngineConfig's fields
            (`LLMEngine(model, max_num_seqs=8)`); not together with `engine_config`.
    """

    def __init__(self, model: str | Path | None = None, engine_config: EngineConfig | None = None, **kwargs):
        """Load `model` (a Hugging Face directory; None: the embedded SmolLM2) and size its KV cache.

        The engine options are `engine_config`, or `kwargs` naming EngineConfig's fields
        (`LLMEngine(model, max_num_seqs=8)`), never both: all are checked before any weight loads.
        """
        if engine_config is not None and kwargs:
            raise TypeError(f"LLMEngine: pass engine_config or engine options, not both (got {sorted(kwargs)})")
        options = engine_config if engine_config is not None else EngineConfig(**kwargs)
        model_dir = Path(model) if model is not None else _default_model_dir()
        self.model_dir = model_dir
        self.config = ModelConfig.from_dir(model_dir)
        self.engine_config = options.resolve(self.config)
        self.tokenizer = Tokenizer.from_dir(model_dir)
        self.runner = build_runner(self.config, load_weights(model_dir, self.config), self.engine_config)
        allocator_class = PrefixCachingAllocator if self.engine_config.enable_prefix_caching else BlockAllocator
        self.scheduler = Scheduler(
            self.engine_config, allocator_class(self.runner.num_blocks), eos_token_ids=self.config.stop_token_ids
        )
        self._requests: dict[str, _Request] = {}
        self._request_ids = itertools.count()
        # With an engine seed, a request without one gets the next seed of this stream (vLLM's `seed`).
        self._seeds = random.Random(options.seed) if options.seed is not None else None
        self._in_flight: tuple[ScheduledBatch, LaunchedStep] | None = None

    @property
    def max_model_len(self) -> int:
        return self.engine_config.max_model_len

    # -- requests ------------------------------------------------------------------
    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        final_only: bool = False,
    ) -> str:
        """Queue a prompt; returns its request id. A bad request raises ValueError naming
        the problem and leaves the engine as it was.

        Args:
            prompt: text (no chat template is applied), a list of token ids, or a dict prompt
                ({"prompt": text} or {"prompt_token_ids": ids}).
            params: the request's sampling; None takes the model's `generation_config.json`
                defaults (`default_sampling_params`).
            request_id: the id its outputs carry; None numbers the requests "0", "1", ... in order.
            final_only: vLLM's RequestOutputKind.FINAL_ONLY: `step()` reports the request
                only when it finishes, and its text is decoded once, at the end, instead of
                token by token (unless stop strings need the text as it grows).
        """
        params = params if params is not None else self.default_sampling_params()
        text, token_ids = self._checked(prompt, params)
        if params.seed is None and self._seeds is not None:
            params = dataclasses.replace(params, seed=self._seeds.randrange(SEED_LIMIT))
        request_id = request_id if request_id is not None else str(next(self._request_ids))
        seqs = new_sequences(request_id, token_ids, params, prompt=text)
        self.scheduler.add(seqs)
        detokenizers = [IncrementalDetokenizer(self.tokenizer, token_ids, params.skip_special_tokens) for _ in seqs]
        self._requests[request_id] = _Request(seqs, detokenizers, final_only, [False] * len(seqs))
        return request_id

    def check_request(self, prompt: Prompt, params: SamplingParams) -> None:
        """Every check of add_request that does not depend on the engine's state: ValueError
        naming the problem. It reads only the configuration and the tokenizer, so a server's
        thread may call it while the engine's thread steps.

        Args:
            prompt: as for `add_request`.
            params: the request's sampling, as `add_request` will take it.
        """
        self._checked(prompt, params)

    def _checked(self, prompt: Prompt, params: SamplingParams) -> tuple[str | None, array]:
        """The prompt's text (None for token ids) and the token ids it keeps (an int64 array),
        once check_request's checks have passed."""
        params.validate_for_vocab(self.config.vocab_size)
        text, token_ids = self._tokenize(prompt)
        kept = truncated_prompt(token_ids, params.truncate_prompt_tokens, self.max_model_len)
        self.scheduler.check_fits(len(kept), params.max_tokens)
        return text, kept

    def abort(self, request_id: str) -> bool:
        """Stop a request (all its completions) now and free its KV blocks; False if it was
        not running or waiting.

        Args:
            request_id: the id `add_request` returned.
        """
        aborted = self.scheduler.abort(request_id)
        self._forget(request_id)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def default_sampling_params(self) -> SamplingParams:
        """The model's generation_config.json defaults, like vLLM's."""
        defaults = self.config.generation
        return SamplingParams(
            temperature=1.0 if defaults.temperature is None else defaults.temperature,
            top_p=1.0 if defaults.top_p is None else defaults.top_p,
            top_k=-1 if not defaults.top_k else defaults.top_k,
        )

    # -- stepping ------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Launch the next scheduled batch, then finish the one launched by the call
        before; return the state of every request that got a token from it (of a
        `final_only` request: only once it has finished).

        Running a step ahead keeps the GPU busy while the host works: step n is queued
        before the host waits for step n-1's tokens, and their bookkeeping (stop checks,
        detokenizing, the next schedule) overlaps step n on the device. The first call
        launches and returns nothing; a request's last token comes one call after the
        device sampled it.
        """
        batch = self.scheduler.schedule()
        launched = None
        if batch is not None:
            launched = (batch, self.runner.launch(batch))
            self.scheduler.launched(batch)
        previous, self._in_flight = self._in_flight, launched
        if previous is None:
            return []
        batch, step = previous
        self.scheduler.postprocess(batch, self.runner.collect(step))
        if step.logprobs is not None:
            record_logprobs(self.tokenizer, batch.sampling_seqs, batch.pending_indices, step.logprobs)
        if step.prompt_rows is not None:
            record_prompt_logprobs(self.tokenizer, step.prompt_rows)
        progressed: dict[str, _Request] = {}
        for seq, samples in zip(batch.seqs, batch.samples.tolist()):
            request = self._requests.get(seq.request_id)
            if not samples or request is None or request.seqs[seq.index] is not seq or request.done[seq.index]:
                continue  # no token, or of a request aborted (its id maybe reused) or finished
            if request.final_only and not seq.is_finished and not seq.sampling_params.stop:
                continue  # its text waits for the end
            self._progress(request, seq)
            progressed[seq.request_id] = request
        outputs = []
        for request_id, request in progressed.items():
            if all(request.done):
                self._forget(request_id)
            elif request.final_only:
                continue
            outputs.append(request.output())
        return outputs

    def _progress(self, request: _Request, seq: Sequence) -> None:
        """Detokenize seq's new tokens and apply its stop strings."""
        detokenizer = request.detokenizers[seq.index]
        params = seq.sampling_params
        before = len(detokenizer.text)
        new_ids = seq.token_ids[detokenizer.num_tokens : seq.num_known_tokens]
        if seq.finish_reason == "stop" and not params.include_stop_str_in_output:
            new_ids = new_ids[:-1]  # an EOS or stop token id ended it (a stop string ends it below)
        detokenizer.step(new_ids)
        if seq.is_finished:
            detokenizer.finish()
        new_chars = len(detokenizer.text) - before
        stop = find_stop_string(detokenizer.text, params.stop, new_chars)
        if stop is not None and len(seq.completion_token_ids) >= params.min_tokens:
            start, stop_string = stop
            end = start + len(stop_string) if params.include_stop_str_in_output else start
            detokenizer.text = detokenizer.text[:end]
            self.scheduler.finish(seq, "stop", stop_string)
        request.done[seq.index] = seq.is_finished

    def _forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, array]:
        """The prompt's text (None for token ids) and token ids (an int64 array)."""
        if isinstance(prompt, Mapping):
            return self._tokenize(_dict_prompt(prompt))
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt: must not be empty")
            return prompt, array("q", self.tokenizer.encode(prompt))
        # bytes are a sequence of integers too, but not of token ids
        is_ids = isinstance(prompt, SequenceABC) and not isinstance(prompt, bytes | bytearray)
        ids = _integer_array(prompt) if is_ids else None
        if ids is None:
            raise ValueError(
                f"prompt: expected a string, a list of token ids or a dict prompt, got {type(prompt).__name__}"
            )
        if not ids.size:
            raise ValueError("prompt: must not be empty")
        bad = ids[(ids < 0) | (ids >= self.config.vocab_size)]
        if bad.size:
            raise ValueError(
                f"prompt: token ids {bad[:5].tolist()} are outside the vocabulary of {self.config.vocab_size}"
            )
        # every id is in [0, vocab_size), so int64 holds it whatever NumPy chose
        return None, array("q", ids.astype(np.int64, copy=False).tobytes())


def _integer_array(prompt: SequenceABC) -> np.ndarray | None:
    """The ids of a token-id prompt as a 1-D integer array (empty for an empty prompt), or None
    if they are not all integers. struct packs them as int64 in C, raising on a float, a string
    or None, and NumPy reads the bytes: NumPy's own conversion first finds a dtype for the whole
    list, and array("q") converts an item at a time at twice struct's cost (perf/LOG.md,
    2026-12-06). What struct refuses, and a prompt of bools, which it would take, NumPy decides."""
    try:
        packed = struct.pack(f"{len(prompt)}q", *prompt)
    except struct.error:  # not integers, or beyond int64: NumPy says which
        packed = None
    if packed is not None and not (prompt and isinstance(prompt[0], bool)):
        return np.frombuffer(packed, dtype=np.int64)
    ids = np.asarray(prompt)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        return None
    return ids


def _dict_prompt(prompt: Mapping) -> str | list[int]:
    """vLLM's TextPrompt {"prompt": text} or TokensPrompt {"prompt_token_ids": ids}, unwrapped."""
    keys = set(prompt)
    if keys == {"prompt"}:
        if not isinstance(prompt["prompt"], str):
            raise ValueError(f'prompt: "prompt" must be a string, got {type(prompt["prompt"]).__name__}')
        return prompt["prompt"]
    if keys == {"prompt_token_ids"}:
        ids = prompt["prompt_token_ids"]
        if isinstance(ids, str) or not isinstance(ids, SequenceABC):
            raise ValueError(f'prompt: "prompt_token_ids" must be a list of token ids, got {type(ids).__name__}')
        return list(ids)
    raise ValueError(
        f'prompt: a dict prompt holds "prompt" (text) or "prompt_token_ids" (a list of ids), one of them, '
        f"got the keys {sorted(map(str, keys))}"
    )


def _default_model_dir() -> Path:
    from tinyvllm.model.default_model import default_model_dir

    print("tinyvllm: no model given, using the embedded SmolLM2-135M-Instruct", file=sys.stderr)
    return default_model_dir()
