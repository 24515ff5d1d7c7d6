"""What the scheduler tests run on: a fake paged model, a plain generation loop, and helpers.

The fake model plays the runner: for each scheduled token it writes the token id into a
paged "KV cache" (one int per slot) through the sequence's block table, then reads every
sequence's whole context back through its table. A block owned twice, a table that misses a
computed token or a recompute that skips one shows up as a context that differs from the
sequence's token_ids. Its next token is a hash of that context, so the tokens a request
gets do not depend on batching, chunking or preemption, and a plain loop over one request
(no scheduler, no cache) is the oracle for the whole run.
"""

import zlib

import numpy as np

from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.block_manager import BlockAllocator, blocks_needed
from tinyvllm.engine.prefix_cache import PrefixCachingAllocator
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.scheduler import Scheduler
from tinyvllm.engine.sequence import Sequence, SequenceStatus, new_sequences
from tinyvllm.sampling_params import SamplingParams

VOCAB = 7
EOS = VOCAB - 1  # not 0: hypothesis draws 0 most often, and most sequences would stop at once
MAX_MODEL_LEN = 4096


def next_token(context) -> int:
    return zlib.crc32(np.asarray(context, dtype=np.int64).tobytes()) % VOCAB


# --8<-- [start:fake-model]
class FakePagedModel:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.cache = np.full((num_blocks, block_size), -1, dtype=np.int64)

    def _slots(self, seq: Sequence, positions: np.ndarray):
        table = np.asarray(seq.block_table, dtype=np.int64)
        return table[positions // self.block_size], positions % self.block_size

    def forward(self, batch: ScheduledBatch) -> list[list[int]]:
        """Write every scheduled token, then return each sequence's context read back."""
        for seq, num_new in zip(batch.seqs, batch.num_scheduled_tokens.tolist()):
            start = seq.num_computed_tokens
            positions = np.arange(start, start + num_new)
            self.cache[self._slots(seq, positions)] = seq.token_ids[start : start + num_new]
        contexts = []
        for seq, num_new in zip(batch.seqs, batch.num_scheduled_tokens.tolist()):
            end = seq.num_computed_tokens + num_new
            context = self.cache[self._slots(seq, np.arange(end))].tolist()
            assert context == seq.token_ids[:end].tolist(), f"cache does not hold {seq!r}'s tokens"
            contexts.append(context)
        return contexts

    def step(self, batch: ScheduledBatch) -> np.ndarray:
        contexts = self.forward(batch)
        return np.array([next_token(c) for c, s in zip(contexts, batch.samples) if s], dtype=np.int64)


# --8<-- [end:fake-model]


def reference_generation(prompt: list[int], params: SamplingParams, max_model_len: int):
    tokens = list(prompt)
    while True:
        token = next_token(tokens)
        tokens.append(token)
        if (token == EOS and not params.ignore_eos) or token in params.stop_token_ids:
            return tokens, "stop"
        if len(tokens) - len(prompt) >= params.max_tokens or len(tokens) >= max_model_len:
            return tokens, "length"


def fits(config: ResolvedEngineConfig, prompt_len: int, max_tokens: int) -> bool:
    """The add() contract: the prompt fits max_model_len and the longest sequence fits the cache."""
    longest = min(prompt_len + max_tokens, max(config.max_model_len, prompt_len + 1))
    needed = blocks_needed(longest - 1, config.block_size)
    return prompt_len <= config.max_model_len and needed <= config.num_blocks


def check_batch(scheduler: Scheduler, batch: ScheduledBatch) -> None:
    config = scheduler.config
    counts = batch.num_scheduled_tokens.tolist()
    assert batch.num_scheduled_tokens.dtype == np.int32
    assert 0 < batch.num_tokens <= config.max_num_batched_tokens
    assert len(batch.seqs) <= config.max_num_seqs and len({id(s) for s in batch.seqs}) == len(batch.seqs)
    for i, (seq, num_new) in enumerate(zip(batch.seqs, counts)):
        assert seq.status is SequenceStatus.RUNNING and num_new >= 1
        assert seq.num_computed_tokens + num_new <= seq.num_tokens
        assert batch.samples[i] == (seq.num_computed_tokens + num_new == seq.num_tokens)
        assert len(seq.block_table) == blocks_needed(seq.num_computed_tokens + num_new, config.block_size)
        assert (i < batch.num_decodes) == (num_new == 1 and bool(batch.samples[i]))


def make_config(**options) -> ResolvedEngineConfig:
    """A resolved engine config, with the limits these tests assume unless they set them."""
    return ResolvedEngineConfig(**{"max_num_batched_tokens": 8192, "max_model_len": MAX_MODEL_LEN, **options})


def make_scheduler(*, prefix_caching: bool = False, **options) -> tuple[Scheduler, FakePagedModel]:
    """A scheduler over options["num_blocks"] blocks whose model stops at EOS, and its fake
    model; with prefix_caching, its allocator is a PrefixCachingAllocator."""
    config = make_config(**options)
    model = FakePagedModel(config.num_blocks, config.block_size)
    allocator = (PrefixCachingAllocator if prefix_caching else BlockAllocator)(config.num_blocks)
    return Scheduler(config, allocator, eos_token_ids=(EOS,)), model


def step(scheduler: Scheduler, model: FakePagedModel) -> ScheduledBatch | None:
    batch = scheduler.schedule()
    if batch is not None:
        check_batch(scheduler, batch)
        sampled = model.step(batch)
        scheduler.launched(batch)
        scheduler.postprocess(batch, sampled)
    return batch


def drain(scheduler: Scheduler, model: FakePagedModel, max_steps: int = 10_000) -> None:
    for _ in range(max_steps):
        if step(scheduler, model) is None:
            assert not scheduler.has_unfinished()
            return
    raise AssertionError("the scheduler made no progress")


def assert_matches_reference(seq: Sequence, max_model_len: int = MAX_MODEL_LEN) -> None:
    expected = reference_generation(seq.prompt_token_ids, seq.sampling_params, max_model_len)
    assert (seq.token_ids.tolist(), seq.finish_reason) == expected


def add(scheduler: Scheduler, name: str, prompt_len: int, max_tokens: int, **params) -> Sequence:
    prompt = [1 + i % (VOCAB - 2) for i in range(prompt_len)]
    seq = Sequence(name, prompt, SamplingParams(max_tokens=max_tokens, **params))
    scheduler.add(seq)
    return seq


def add_group(scheduler: Scheduler, name: str, prompt_len: int, max_tokens: int, n: int, **params) -> list[Sequence]:
    """A request of n sequences (SamplingParams.n), queued."""
    prompt = [1 + i % (VOCAB - 2) for i in range(prompt_len)]
    seqs = new_sequences(name, prompt, SamplingParams(n=n, max_tokens=max_tokens, **params))
    scheduler.add(seqs)
    return seqs
