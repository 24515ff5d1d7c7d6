"""The scheduler against a fake paged model and a plain generation loop.

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
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tinyvllm.engine.block_manager import BlockAllocator, blocks_needed
from tinyvllm.engine.scheduler import MODES, ScheduledBatch, Scheduler, SchedulerConfig
from tinyvllm.engine.sequence import Sequence, SequenceStatus
from tinyvllm.sampling_params import SamplingParams

VOCAB = 7
EOS = VOCAB - 1  # not 0: hypothesis draws 0 most often, and most sequences would stop at once


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
            assert context == seq.token_ids[:end], f"cache does not hold {seq!r}'s tokens"
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


def fits(config: SchedulerConfig, prompt_len: int, max_tokens: int) -> bool:
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


def make_scheduler(**config) -> tuple[Scheduler, FakePagedModel]:
    config = SchedulerConfig(eos_token_ids=(EOS,), **config)
    model = FakePagedModel(config.num_blocks, config.block_size)
    return Scheduler(config, BlockAllocator(config.num_blocks)), model


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


class SchedulerMachine(RuleBasedStateMachine):
    """Requests arrive, steps run with arbitrary sampled tokens, requests are aborted or
    stopped by a stop string; the blocks must always balance."""

    @initialize(
        mode=st.sampled_from(MODES),
        block_size=st.integers(1, 4),
        max_num_seqs=st.integers(1, 4),
        max_num_batched_tokens=st.integers(1, 16),
        max_model_len=st.integers(1, 24),
        spare_blocks=st.integers(-2, 4),  # below 0 the longest requests do not fit
    )
    def setup(self, block_size, max_model_len, spare_blocks, **config):
        num_blocks = max(1, blocks_needed(max_model_len, block_size) + spare_blocks)
        self.scheduler, self.model = make_scheduler(
            block_size=block_size, max_model_len=max_model_len, num_blocks=num_blocks, **config
        )
        self.config = self.scheduler.config
        self.seqs: list[Sequence] = []
        self.batch_waiting: set[str] = set()  # static mode: who may run in the current batch
        self.batch_members: set[str] = set()

    @rule(data=st.data(), count=st.integers(1, 4))
    def add_requests(self, data, count):
        for _ in range(count):
            # Mostly prompts that fit max_model_len, sometimes one token too long.
            max_size = self.config.max_model_len + 1
            prompt = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=max_size))
            params = SamplingParams(
                max_tokens=data.draw(st.integers(1, 2 * self.config.max_model_len)),
                ignore_eos=data.draw(st.booleans()),
                stop_token_ids=data.draw(st.lists(st.integers(1, VOCAB - 2), max_size=1)),
            )
            seq = Sequence(f"request-{len(self.seqs)}", prompt, params)
            if fits(self.config, len(prompt), params.max_tokens):
                self.scheduler.add(seq)
                self.seqs.append(seq)
            else:
                with pytest.raises(ValueError):
                    self.scheduler.add(seq)

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=4, max_size=4))
    def step(self, tokens):
        if self.scheduler.num_running == 0:  # a static batch can only begin here
            self.batch_waiting = {s.request_id for s in self.scheduler.waiting}
            self.batch_members = set()
        batch = self.scheduler.schedule()
        assert (batch is None) == (not self.scheduler.has_unfinished())
        if batch is None:
            return
        check_batch(self.scheduler, batch)
        if self.config.mode == "static":
            ids = {s.request_id for s in batch.seqs}
            assert ids <= self.batch_waiting, "a request joined a static batch mid-batch"
            self.batch_members |= ids
            assert len(self.batch_members) <= self.config.max_num_seqs
        self.model.forward(batch)
        self.scheduler.launched(batch)
        finished = self.scheduler.postprocess(batch, np.array(tokens[: batch.num_samples]))
        for seq in finished:
            assert seq.is_finished and seq.block_table == [] and seq.finish_reason in ("stop", "length")

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def abort(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        was_unfinished = not seq.is_finished
        assert self.scheduler.abort(seq.request_id) == was_unfinished
        assert seq.is_finished and seq.block_table == []
        if was_unfinished:
            assert seq.status is SequenceStatus.FINISHED_ABORTED and seq.finish_reason == "abort"
        assert not self.scheduler.abort("no-such-request")

    @precondition(lambda self: self.scheduler.running)
    @rule(data=st.data())
    def stop_string(self, data):
        seq = data.draw(st.sampled_from(self.scheduler.running))
        self.scheduler.finish(seq, "stop")
        assert seq.status is SequenceStatus.FINISHED_STOPPED and seq.block_table == []
        self.scheduler.finish(seq, "length")
        assert seq.finish_reason == "stop"

    @invariant()
    def blocks_balance(self):
        allocator, scheduler = self.scheduler.allocator, self.scheduler
        tables = [b for seq in scheduler.running for b in seq.block_table]
        assert len(tables) == len(set(tables)), "a block is owned twice"
        assert set(tables) == set(np.flatnonzero(allocator.ref_counts).tolist()), "a block leaked"
        assert allocator.num_free + allocator.num_used == allocator.num_blocks
        assert scheduler.num_free_blocks == allocator.num_free

    @invariant()
    def sequences_are_consistent(self):
        scheduler = self.scheduler
        assert scheduler.num_running <= self.config.max_num_seqs
        for seq in scheduler.running:
            assert seq.status is SequenceStatus.RUNNING
            assert 0 < seq.num_computed_tokens < seq.num_tokens
            assert len(seq.block_table) == blocks_needed(seq.num_computed_tokens, self.config.block_size)
        for seq in scheduler.waiting:
            assert seq.status is SequenceStatus.WAITING
            assert seq.num_computed_tokens == 0 and not seq.block_table
        unfinished = [s for s in self.seqs if not s.is_finished]
        assert len(unfinished) == scheduler.num_running + scheduler.num_waiting
        assert scheduler.has_unfinished() == bool(unfinished)
        for seq in self.seqs:
            if seq.is_finished:
                assert not seq.block_table
            if seq.finish_reason == "length":
                assert seq.num_completion_tokens == seq.sampling_params.max_tokens or (
                    seq.num_tokens >= self.config.max_model_len
                )
            assert seq.num_completion_tokens <= seq.sampling_params.max_tokens

    def teardown(self):
        if not hasattr(self, "scheduler"):
            return
        drain(self.scheduler, self.model)
        event(f"{self.config.mode}, preempted: {self.scheduler.num_preemptions > 0}")
        assert self.scheduler.allocator.num_free == self.config.num_blocks
        assert all(seq.is_finished for seq in self.seqs)


SchedulerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50)
TestSchedulerMachine = SchedulerMachine.TestCase


@given(
    mode=st.sampled_from(MODES),
    block_size=st.integers(1, 4),
    max_num_seqs=st.integers(1, 5),
    max_num_batched_tokens=st.integers(1, 24),
    max_model_len=st.integers(2, 24),
    spare_blocks=st.integers(0, 3),
    requests=st.lists(
        st.tuples(
            st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),  # prompt
            st.integers(1, 16),  # max_tokens
            st.booleans(),  # ignore_eos
            st.integers(0, 6),  # step at which it arrives
        ),
        min_size=1,
        max_size=10,
    ),
)
@settings(max_examples=150)
def test_every_request_gets_the_tokens_of_a_plain_generation_loop(
    mode, block_size, max_num_seqs, max_num_batched_tokens, max_model_len, spare_blocks, requests
):
    num_blocks = blocks_needed(max_model_len, block_size) + spare_blocks  # every request fits alone
    scheduler, model = make_scheduler(
        mode=mode,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
    )
    seqs = []
    for step_index in range(7):
        for prompt, max_tokens, ignore_eos, arrival in requests:
            if arrival == step_index:
                params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
                seqs.append(Sequence(f"request-{len(seqs)}", prompt[:max_model_len], params))
                scheduler.add(seqs[-1])
        step(scheduler, model)
    drain(scheduler, model)
    event(f"preempted: {scheduler.num_preemptions > 0}")
    for seq in seqs:
        assert_matches_reference(seq, max_model_len)
    assert scheduler.allocator.num_free == num_blocks


def assert_matches_reference(seq: Sequence, max_model_len: int = 4096) -> None:
    expected = reference_generation(seq.prompt_token_ids, seq.sampling_params, max_model_len)
    assert (seq.token_ids, seq.finish_reason) == expected


def add(scheduler: Scheduler, name: str, prompt_len: int, max_tokens: int, **params) -> Sequence:
    prompt = [1 + i % (VOCAB - 2) for i in range(prompt_len)]
    seq = Sequence(name, prompt, SamplingParams(max_tokens=max_tokens, **params))
    scheduler.add(seq)
    return seq


def test_preemption_takes_the_newest_and_puts_it_at_the_front_of_the_queue():
    scheduler, model = make_scheduler(block_size=2, num_blocks=4, max_num_seqs=3)
    first = add(scheduler, "first", 3, 6, ignore_eos=True)
    second = add(scheduler, "second", 3, 6, ignore_eos=True)
    third = add(scheduler, "third", 1, 6, ignore_eos=True)
    assert step(scheduler, model).seqs == [first, second]  # third: no block left
    assert step(scheduler, model).seqs == [first, second]  # position 3 still fits 2 blocks each
    tokens_before = list(second.token_ids)
    batch = step(scheduler, model)  # position 4 needs a third block: second must go
    assert batch.seqs == [first]
    assert scheduler.num_preemptions == 1
    assert second.status is SequenceStatus.WAITING and second.num_computed_tokens == 0
    assert second.block_table == [] and second.token_ids == tokens_before
    assert list(scheduler.waiting) == [second, third]
    assert len(first.block_table) == 3 and scheduler.num_free_blocks == 1


def test_a_recomputed_sequence_does_not_resample_its_tokens():
    scheduler, model = make_scheduler(block_size=2, num_blocks=4, max_num_seqs=2)
    first = add(scheduler, "first", 3, 4, ignore_eos=True)
    second = add(scheduler, "second", 3, 4, ignore_eos=True)
    for _ in range(3):
        step(scheduler, model)
    assert second.num_completion_tokens == 2 and second.status is SequenceStatus.WAITING
    while second.status is not SequenceStatus.RUNNING:
        batch = step(scheduler, model)
    index = batch.seqs.index(second)
    assert batch.num_scheduled_tokens[index] == second.num_tokens - 1  # its whole token list, recomputed
    assert second.num_completion_tokens == 3  # and one new token: none sampled twice
    drain(scheduler, model)
    for seq in (first, second):
        assert_matches_reference(seq)


@pytest.mark.parametrize("mode", MODES)
def test_heavy_preemption_leaves_every_output_unchanged(mode):
    scheduler, model = make_scheduler(
        mode=mode, block_size=2, num_blocks=12, max_num_seqs=4, max_num_batched_tokens=5
    )
    seqs = [add(scheduler, f"request-{i}", 4 + i, 14, ignore_eos=True) for i in range(6)]
    drain(scheduler, model)
    assert scheduler.num_preemptions > 0
    for seq in seqs:
        assert_matches_reference(seq)


def test_a_long_prompt_is_prefilled_in_chunks_and_samples_only_at_its_end():
    scheduler, model = make_scheduler(block_size=4, num_blocks=8, max_num_batched_tokens=4)
    seq = add(scheduler, "long", 10, 2, ignore_eos=True)
    chunks = []
    while seq.num_completion_tokens == 0:
        batch = step(scheduler, model)
        chunks.append((int(batch.num_scheduled_tokens[0]), bool(batch.samples[0])))
    assert chunks == [(4, False), (4, False), (2, True)]


def test_decodes_come_first_and_share_the_budget_with_a_chunk():
    scheduler, model = make_scheduler(block_size=4, num_blocks=16, max_num_batched_tokens=6)
    early = [add(scheduler, f"early-{i}", 2, 8, ignore_eos=True) for i in range(2)]
    step(scheduler, model)
    late = add(scheduler, "late", 9, 8, ignore_eos=True)
    batch = step(scheduler, model)
    assert batch.seqs == [*early, late] and batch.num_decodes == 2
    assert batch.num_scheduled_tokens.tolist() == [1, 1, 4] and batch.samples.tolist() == [True, True, False]


def test_static_batch_admits_nothing_until_it_ends():
    scheduler, model = make_scheduler(mode="static", block_size=4, num_blocks=16, max_num_seqs=2)
    a, b, c = (add(scheduler, name, 3, n, ignore_eos=True) for name, n in (("a", 2), ("b", 5), ("c", 3)))
    assert step(scheduler, model).seqs == [a, b]
    d = add(scheduler, "d", 2, 3, ignore_eos=True)
    while not b.is_finished:
        assert set(step(scheduler, model).seqs) <= {a, b}  # a finished early: its slot stays empty
    assert a.is_finished and scheduler.num_running == 0
    assert step(scheduler, model).seqs == [c, d]


def test_static_batch_takes_back_its_preempted_member_before_newcomers():
    scheduler, model = make_scheduler(mode="static", block_size=2, num_blocks=4, max_num_seqs=3)
    a = add(scheduler, "a", 3, 4, ignore_eos=True)
    b = add(scheduler, "b", 3, 4, ignore_eos=True)
    c = add(scheduler, "c", 1, 1)  # fits the free blocks, but is not in the batch
    assert step(scheduler, model).seqs == [a, b]
    step(scheduler, model)
    step(scheduler, model)  # a needs a third block: b is preempted
    assert b.status is SequenceStatus.WAITING and list(scheduler.waiting) == [b, c]
    while not b.is_finished:
        assert c not in step(scheduler, model).seqs
    assert step(scheduler, model).seqs == [c]


def test_finishing_reasons():
    stop_token = next_token([1, 2, 3])
    scheduler, model = make_scheduler(num_blocks=8, block_size=4, max_model_len=6)
    stopped = Sequence("stopped", [1, 2, 3], SamplingParams(max_tokens=9, stop_token_ids=[stop_token]))
    capped_by_model = Sequence("model-len", [1, 2, 3, 4], SamplingParams(max_tokens=9, ignore_eos=True))
    at_model_len = Sequence("full", [1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=9, ignore_eos=True))
    for seq in (stopped, capped_by_model, at_model_len):
        scheduler.add(seq)
    drain(scheduler, model)
    assert (stopped.finish_reason, stopped.num_completion_tokens) == ("stop", 1)
    assert stopped.status is SequenceStatus.FINISHED_STOPPED
    assert (capped_by_model.finish_reason, capped_by_model.num_tokens) == ("length", 6)
    assert capped_by_model.status is SequenceStatus.FINISHED_LENGTH_CAPPED
    assert (at_model_len.finish_reason, at_model_len.num_tokens) == ("length", 7)


def test_eos_stops_unless_ignored():
    pairs = ([i, j] for i in range(VOCAB - 1) for j in range(VOCAB - 1))
    prompt = next(p for p in pairs if next_token(p) == EOS)
    scheduler, model = make_scheduler(num_blocks=8)
    stops = Sequence("stops", prompt, SamplingParams(max_tokens=3))
    ignores = Sequence("ignores", prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    scheduler.add(stops)
    scheduler.add(ignores)
    drain(scheduler, model)
    assert stops.completion_token_ids == [EOS] and stops.finish_reason == "stop"
    assert ignores.completion_token_ids[0] == EOS and ignores.num_completion_tokens == 3


def test_abort_frees_blocks_at_once_whether_waiting_or_running():
    scheduler, model = make_scheduler(block_size=2, num_blocks=4, max_num_seqs=1)
    running = add(scheduler, "running", 3, 4, ignore_eos=True)
    waiting = add(scheduler, "waiting", 3, 4, ignore_eos=True)
    step(scheduler, model)
    assert scheduler.num_free_blocks == 2 and scheduler.num_waiting == 1
    assert scheduler.abort("waiting") and waiting.status is SequenceStatus.FINISHED_ABORTED
    assert scheduler.abort("running") and running.block_table == []
    assert scheduler.num_free_blocks == 4 and not scheduler.has_unfinished()
    assert not scheduler.abort("running")
    assert scheduler.schedule() is None


def test_abort_while_the_step_runs_is_skipped_by_postprocess():
    scheduler, model = make_scheduler(num_blocks=4)
    kept, aborted = add(scheduler, "kept", 2, 4), add(scheduler, "aborted", 2, 4)
    batch = scheduler.schedule()
    sampled = model.step(batch)
    scheduler.launched(batch)
    scheduler.abort("aborted")
    scheduler.postprocess(batch, sampled)
    assert kept.num_completion_tokens == 1 and aborted.num_completion_tokens == 0


def test_add_refuses_what_could_never_run():
    scheduler, _ = make_scheduler(block_size=4, num_blocks=3)
    with pytest.raises(ValueError, match="blocks"):
        add(scheduler, "too-big", 8, 6)  # 13 tokens of K/V need 4 blocks
    add(scheduler, "just-fits", 8, 5)  # 12 tokens of K/V
    with pytest.raises(ValueError, match="already in use"):
        add(scheduler, "just-fits", 1, 1)
    assert scheduler.num_waiting == 1

    scheduler, _ = make_scheduler(block_size=4, num_blocks=3, max_model_len=12)
    with pytest.raises(ValueError, match="max_model_len"):
        add(scheduler, "too-long", 13, 1)
    add(scheduler, "capped-by-max-model-len", 10, 1000)  # 12 tokens at most: 11 of K/V
    add(scheduler, "prompt-of-max-model-len", 12, 1000)  # samples 1 token: 12 of K/V
    assert scheduler.num_waiting == 2


def test_postprocess_wants_one_token_per_sampling_sequence():
    scheduler, _ = make_scheduler(num_blocks=4)
    add(scheduler, "a", 2, 4)
    batch = scheduler.schedule()
    scheduler.launched(batch)
    with pytest.raises(ValueError, match="sampled_token_ids"):
        scheduler.postprocess(batch, np.array([1, 2]))


def test_finish_refuses_a_bad_reason_and_a_stranger():
    scheduler, _ = make_scheduler(num_blocks=4)
    seq = add(scheduler, "a", 2, 4)
    with pytest.raises(ValueError, match="finish reason"):
        scheduler.finish(seq, "bored")
    stranger = Sequence("b", [1], SamplingParams())
    with pytest.raises(ValueError, match="does not belong"):
        scheduler.finish(stranger, "stop")


def test_config_is_validated():
    with pytest.raises(ValueError, match="mode"):
        SchedulerConfig(num_blocks=4, mode="eager")
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(num_blocks=4, max_num_seqs=0)
    with pytest.raises(ValueError, match="num_blocks"):
        Scheduler(SchedulerConfig(num_blocks=4), BlockAllocator(5))
