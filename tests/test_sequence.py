"""Sequence bookkeeping and RequestOutput."""

import pytest

from tinyvllm.engine.sequence import RequestOutput, Sequence, SequenceStatus
from tinyvllm.sampling_params import SEED_LIMIT, SamplingParams


def test_a_new_sequence_waits_with_its_prompt_and_no_blocks():
    seq = Sequence("r", [5, 6, 7], SamplingParams(seed=11), prompt="hi")
    assert (seq.status, seq.num_tokens, seq.num_prompt_tokens, seq.num_computed_tokens) == (
        SequenceStatus.WAITING,
        3,
        3,
        0,
    )
    assert seq.block_table == [] and seq.finish_reason is None and not seq.is_finished
    assert seq.seed == 11


def test_unseeded_sequences_get_their_own_seed_once():
    params = SamplingParams()
    seeds = {Sequence(str(i), [1], params).seed for i in range(8)}
    assert len(seeds) == 8 and all(0 <= s < SEED_LIMIT for s in seeds)
    assert params.seed is None


def test_arrival_order_increases():
    first, second = Sequence("a", [1], SamplingParams()), Sequence("b", [1], SamplingParams())
    assert first.arrival < second.arrival


def test_completion_tokens_follow_the_prompt():
    seq = Sequence("r", [1, 2], SamplingParams())
    seq.append_token(9)
    seq.append_token(8)
    assert seq.prompt_token_ids == [1, 2] and seq.completion_token_ids == [9, 8]
    assert seq.num_completion_tokens == 2


def test_prompt_token_ids_are_copied_to_python_ints():
    prompt = [1, 2]
    seq = Sequence("r", prompt, SamplingParams())
    seq.append_token(3)
    assert prompt == [1, 2]


def test_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Sequence("r", [], SamplingParams())


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("stop", SequenceStatus.FINISHED_STOPPED),
        ("length", SequenceStatus.FINISHED_LENGTH_CAPPED),
        ("abort", SequenceStatus.FINISHED_ABORTED),
    ],
)
def test_finish_reasons_map_to_statuses(reason, status):
    seq = Sequence("r", [1], SamplingParams())
    seq.set_finished(reason)
    assert seq.status is status and seq.finish_reason == reason and seq.is_finished


def test_request_output_from_sequence():
    seq = Sequence("r", [1, 2], SamplingParams(), prompt="ab")
    seq.append_token(7)
    output = RequestOutput.from_sequence(seq, "x")
    assert output == RequestOutput("r", "ab", [1, 2], "x", [7], None, False)
    seq.set_finished("length")
    assert RequestOutput.from_sequence(seq, "x").finished
