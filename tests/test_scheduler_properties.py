"""The scheduler under random workloads: a hypothesis state machine keeps the blocks balanced,
and every request gets the tokens of a plain generation loop (`scheduler_harness.py`). Requests
ask for n = 1 to 3 sequences, which share their prompt's blocks: the fake model reads every
context back through the block tables, so a shared block that someone wrote shows."""

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

from tests.scheduler_harness import (
    VOCAB,
    assert_matches_reference,
    check_batch,
    drain,
    fits,
    make_scheduler,
    step,
)
from tinyvllm.config import MODES
from tinyvllm.engine.block_manager import blocks_needed
from tinyvllm.engine.sequence import Sequence, SequenceStatus, new_sequences
from tinyvllm.sampling_params import SamplingParams

BLOCK_SIZES = st.sampled_from((1, 2, 4))  # EngineConfig takes powers of two only


class SchedulerMachine(RuleBasedStateMachine):
    """Requests arrive, steps run with arbitrary sampled tokens, requests are aborted or
    stopped by a stop string; the blocks must always balance."""

    prefix_caching = False

    @initialize(
        mode=st.sampled_from(MODES),
        block_size=BLOCK_SIZES,
        max_num_seqs=st.integers(1, 4),
        max_num_batched_tokens=st.integers(1, 16),
        max_model_len=st.integers(1, 24),
        spare_blocks=st.integers(-2, 4),  # below 0 the longest requests do not fit
    )
    def setup(self, block_size, max_model_len, spare_blocks, **config):
        num_blocks = max(1, blocks_needed(max_model_len, block_size) + spare_blocks)
        self.scheduler, self.model = make_scheduler(
            prefix_caching=self.prefix_caching,
            block_size=block_size,
            max_model_len=max_model_len,
            num_blocks=num_blocks,
            **config,
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
                n=data.draw(st.integers(1, 3)),
                max_tokens=data.draw(st.integers(1, 2 * self.config.max_model_len)),
                ignore_eos=data.draw(st.booleans()),
                stop_token_ids=data.draw(st.lists(st.integers(1, VOCAB - 2), max_size=1)),
            )
            seqs = new_sequences(f"request-{len(self.seqs)}", prompt, params)
            if fits(self.config, len(prompt), params.max_tokens):
                self.scheduler.add(seqs)
                self.seqs.extend(seqs)
            else:
                with pytest.raises(ValueError):
                    self.scheduler.add(seqs)

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
        unfinished = [sibling for sibling in seq.group if not sibling.is_finished]
        assert self.scheduler.abort(seq.request_id) == bool(unfinished)
        assert all(sibling.is_finished and sibling.block_table == [] for sibling in seq.group)
        for sibling in unfinished:
            assert sibling.status is SequenceStatus.FINISHED_ABORTED and sibling.finish_reason == "abort"
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
        owner: dict[int, str] = {}
        for seq in scheduler.running:
            assert len(seq.block_table) == len(set(seq.block_table)), "a block is twice in one table"
            for block in seq.block_table:  # without the cache only a request's own sequences share
                request = owner.setdefault(block, seq.request_id)
                assert self.prefix_caching or request == seq.request_id, "two requests own a block"
        owners = np.bincount(np.asarray(tables, dtype=np.int64), minlength=allocator.num_blocks)
        assert owners.tolist() == allocator.ref_counts.tolist(), "a block leaked"
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


class PrefixCachingSchedulerMachine(SchedulerMachine):
    """The same workloads with the prefix cache on: blocks may have several owners."""

    prefix_caching = True


TestPrefixCachingSchedulerMachine = PrefixCachingSchedulerMachine.TestCase
TestPrefixCachingSchedulerMachine.settings = settings(max_examples=200, stateful_step_count=50)


@pytest.mark.parametrize("prefix_caching", [False, True])
@given(
    mode=st.sampled_from(MODES),
    block_size=BLOCK_SIZES,
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
            st.integers(1, 3),  # n
        ),
        min_size=1,
        max_size=10,
    ),
)
@settings(max_examples=150)
def test_every_request_gets_the_tokens_of_a_plain_generation_loop(
    prefix_caching, mode, block_size, max_num_seqs, max_num_batched_tokens, max_model_len, spare_blocks, requests
):
    num_blocks = blocks_needed(max_model_len, block_size) + spare_blocks  # every request fits alone
    scheduler, model = make_scheduler(
        prefix_caching=prefix_caching,
        mode=mode,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
    )
    seqs = []
    for step_index in range(7):
        for prompt, max_tokens, ignore_eos, arrival, n in requests:
            if arrival == step_index:
                params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=ignore_eos)
                group = new_sequences(f"request-{len(seqs)}", prompt[:max_model_len], params)
                scheduler.add(group)
                seqs.extend(group)
        step(scheduler, model)
    drain(scheduler, model)
    event(f"preempted: {scheduler.num_preemptions > 0}")
    for seq in seqs:
        assert_matches_reference(seq, max_model_len)
    assert scheduler.allocator.num_free == num_blocks
