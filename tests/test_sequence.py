"""Sequence bookkeeping, a request's n sequences, and RequestOutput / CompletionOutput."""

import pytest

from tinyvllm.engine.sequence import CompletionOutput, RequestOutput, Sequence, SequenceStatus, new_sequences
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


def test_prompt_token_ids_are_copied():
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


def test_request_output_from_sequences():
    (seq,) = new_sequences("r", [1, 2], SamplingParams(), prompt="ab")
    seq.append_token(7)
    output = RequestOutput.from_sequences([seq], ["x"])
    completion = CompletionOutput(0, "x", [7], None, None, None, None)
    assert output == RequestOutput("r", "ab", [1, 2], None, [completion], False, 0)
    assert not completion.finished()
    seq.set_finished("stop", stop_reason="x!")
    output = RequestOutput.from_sequences([seq], ["x"])
    assert output.finished and output.outputs[0].finished()
    assert (output.outputs[0].finish_reason, output.outputs[0].stop_reason) == ("stop", "x!")


def test_a_request_of_n_completions_is_n_sequences_of_one_group():
    seqs = new_sequences("r", [1, 2, 3], SamplingParams(n=3, seed=40), prompt="abc")
    assert [seq.index for seq in seqs] == [0, 1, 2]
    assert all(seq.group is seqs and seq.request_id == "r" and seq.prompt == "abc" for seq in seqs)
    assert [seq.seed for seq in seqs] == [40, 41, 42], "vLLM's child seeds: the request's seed + index"
    assert new_sequences("r", [1], SamplingParams(n=2, seed=SEED_LIMIT - 1))[1].seed == 0
    unseeded = new_sequences("r", [1], SamplingParams(n=4))
    assert len({seq.seed for seq in unseeded}) == 4


def test_a_request_finishes_when_all_its_completions_have():
    seqs = new_sequences("r", [1, 2], SamplingParams(n=2), prompt="ab")
    seqs[1].append_token(5)
    seqs[1].set_finished("stop", stop_reason=5)
    output = RequestOutput.from_sequences(seqs, ["", "y"])
    assert not output.finished
    assert [(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in output.outputs] == [
        (0, "", [], None, None),
        (1, "y", [5], "stop", 5),
    ]
    seqs[0].set_finished("length")
    assert RequestOutput.from_sequences(seqs, ["", "y"]).finished
