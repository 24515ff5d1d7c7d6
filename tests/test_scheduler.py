"""The scheduler's policies on hand-made workloads: preemption, chunked prefill, static batches,
finishing, aborts and refusals (`scheduler_harness.py` has the fake model and the oracle)."""

import numpy as np
import pytest

from tests.scheduler_harness import (
    EOS,
    VOCAB,
    add,
    add_group,
    assert_matches_reference,
    drain,
    make_config,
    make_scheduler,
    next_token,
    step,
)
from tinyvllm.config import MODES
from tinyvllm.engine.block_manager import BlockAllocator
from tinyvllm.engine.scheduler import Scheduler
from tinyvllm.engine.sequence import Sequence, SequenceStatus, new_sequences
from tinyvllm.sampling_params import SamplingParams


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
    assert second.block_table == [] and second.token_ids.tolist() == tokens_before
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
    scheduler, model = make_scheduler(mode=mode, block_size=2, num_blocks=12, max_num_seqs=4, max_num_batched_tokens=5)
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
    assert stopped.status is SequenceStatus.FINISHED_STOPPED and stopped.stop_reason == stop_token
    assert capped_by_model.stop_reason is None and at_model_len.stop_reason is None
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
    assert stops.stop_reason is None, "vLLM's stop_reason: None for EOS"
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


# -- n > 1: one request, several sequences ---------------------------------------------------
@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_a_group_computes_its_prompt_once(prefix_caching, mode):
    scheduler, model = make_scheduler(prefix_caching=prefix_caching, mode=mode, block_size=4, num_blocks=32)
    group = add_group(scheduler, "r", 10, 5, n=3, ignore_eos=True)
    other = add(scheduler, "other", 3, 5, ignore_eos=True)
    first = step(scheduler, model)
    if prefix_caching:  # the others find the blocks the first registers in the same step
        assert first.seqs == [group[0], group[1], group[2], other]
        # Each computes only the prompt's last partial block (tokens 8 and 9) on the shared full blocks.
        assert first.num_scheduled_tokens.tolist() == [10, 2, 2, 3]
    else:
        assert first.seqs == [group[0]] and first.num_scheduled_tokens.tolist() == [10], "the others wait, in order"
        second = step(scheduler, model)
        assert second.seqs == [group[0], group[1], group[2], other]
        assert second.num_scheduled_tokens.tolist() == [1, 2, 2, 3]
    assert group[1].block_table[:2] == group[2].block_table[:2] == group[0].block_table[:2]
    assert len({group[0].block_table[2], group[1].block_table[2], group[2].block_table[2]}) == 3
    assert [seq.num_cached_tokens for seq in group] == [0, 8, 8]
    drain(scheduler, model)
    for seq in [*group, other]:
        assert_matches_reference(seq)
    assert scheduler.allocator.num_free == 32
    assert scheduler.prefix_cache_hits == (16 if prefix_caching else 0)


def test_a_group_whose_prompt_is_one_partial_block_shares_nothing_and_never_waits():
    scheduler, model = make_scheduler(block_size=4, num_blocks=8)
    group = add_group(scheduler, "r", 4, 3, n=2, ignore_eos=True)  # the last token is always computed
    assert step(scheduler, model).seqs == group
    drain(scheduler, model)
    for seq in group:
        assert_matches_reference(seq)


def test_aborting_a_group_aborts_every_sequence_and_frees_its_blocks():
    scheduler, model = make_scheduler(block_size=2, num_blocks=16)
    group = add_group(scheduler, "r", 7, 20, n=3, ignore_eos=True)
    step(scheduler, model)  # the first computes the prompt, the others wait
    assert scheduler.num_running == 1 and scheduler.num_waiting == 2
    step(scheduler, model)
    assert scheduler.abort("r")
    assert all(seq.status is SequenceStatus.FINISHED_ABORTED and not seq.block_table for seq in group)
    assert scheduler.num_free_blocks == 16 and not scheduler.has_unfinished()
    assert not scheduler.abort("r")


def test_a_group_is_added_whole_and_keeps_its_id_until_every_sequence_ends():
    scheduler, model = make_scheduler(block_size=2, num_blocks=16)
    prompt = [1, 2, 3]
    seqs = new_sequences("r", prompt, SamplingParams(n=2, max_tokens=4, ignore_eos=True))
    with pytest.raises(ValueError, match="whole group"):
        scheduler.add(seqs[1])
    scheduler.add(seqs)
    step(scheduler, model)
    scheduler.finish(seqs[0], "stop", "a stop string")
    assert seqs[0].stop_reason == "a stop string"
    with pytest.raises(ValueError, match="already in use"):
        add(scheduler, "r", 1, 1)
    drain(scheduler, model)
    add(scheduler, "r", 1, 1)


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_preempted_groups_still_get_the_plain_loops_tokens(prefix_caching, mode):
    scheduler, model = make_scheduler(prefix_caching=prefix_caching, mode=mode, block_size=2, num_blocks=12,
                                      max_num_seqs=6, max_num_batched_tokens=8)  # fmt: skip
    groups = [add_group(scheduler, f"r{i}", 5 + i, 10, n=3, ignore_eos=True) for i in range(3)]
    drain(scheduler, model)
    assert scheduler.num_preemptions > 0
    for seq in (seq for group in groups for seq in group):
        assert_matches_reference(seq)
    assert scheduler.allocator.num_free == 12


def test_config_is_validated():
    with pytest.raises(ValueError, match="mode"):
        make_config(num_blocks=4, mode="eager")
    with pytest.raises(ValueError, match="max_num_seqs"):
        make_config(num_blocks=4, max_num_seqs=0)
    with pytest.raises(ValueError, match="num_blocks"):
        Scheduler(make_config(num_blocks=4), BlockAllocator(5))
