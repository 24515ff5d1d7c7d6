"""perf/bench_prefix.py's workloads are issue 30's: their shapes, checked against its definitions;
and the garbage collector's count it keeps beside them (`perf/latency.py`)."""

import gc
from types import SimpleNamespace

from perf.bench_prefix import FULL, multi_turn_conversations, run_conversations, shared_prefix_workload
from perf.latency import CollectorTime

VOCAB = 128256


def test_shared_prefix_is_256_prompts_of_one_2048_token_prefix_and_a_unique_64_token_suffix():
    workload = shared_prefix_workload(FULL, VOCAB)
    assert len(workload.prompts) == 256
    assert all(len(prompt) == 2048 + 64 for prompt in workload.prompts)
    prefix = workload.prompts[0][:2048]
    assert all(prompt[:2048] == prefix for prompt in workload.prompts)
    suffixes = {tuple(prompt[2048:]) for prompt in workload.prompts}
    assert len(suffixes) == 256
    assert workload.output_lens == [128] * 256
    assert all(p.ignore_eos and p.max_tokens == 128 for p in workload.params())


class EchoEngine:
    """Stands in for LLMEngine: each request finishes in the step after it was added, its
    answer `output_len` copies of its prompt's length; records every prompt and when it came."""

    def __init__(self, output_len: int) -> None:
        self.output_len = output_len
        self.queued: list[tuple[str, list[int]]] = []
        self.prompts: list[list[int]] = []
        self.steps = 0
        self.added_at: list[int] = []

    def add_request(self, prompt, params, final_only=False):
        assert params.max_tokens == self.output_len and params.ignore_eos and final_only
        request_id = str(len(self.prompts))
        self.prompts.append(list(prompt))
        self.added_at.append(self.steps)
        self.queued.append((request_id, list(prompt)))
        return request_id

    def has_unfinished_requests(self):
        return bool(self.queued)

    def step(self):
        self.steps += 1
        done, self.queued = self.queued, []
        return [
            SimpleNamespace(
                request_id=rid, finished=True, outputs=[SimpleNamespace(token_ids=[len(prompt)] * self.output_len)]
            )
            for rid, prompt in done
        ]


def test_each_turn_is_the_whole_history_plus_64_new_tokens_submitted_after_the_turn_before():
    chats = multi_turn_conversations(FULL, VOCAB)
    assert len(chats.new_tokens) == 64 and all(len(turns) == 8 for turns in chats.new_tokens)
    assert all(len(tokens) == 64 for turns in chats.new_tokens for tokens in turns)
    engine = EchoEngine(output_len=64)
    result = run_conversations(engine, chats)
    assert result["output_tokens"] == 64 * 8 * 64
    assert len(engine.prompts) == 64 * 8
    first_turns = engine.prompts[:64]
    assert first_turns == [turns[0] for turns in chats.new_tokens]
    assert engine.added_at[:64] == [0] * 64, "every conversation starts at once"
    # Request i > 63 is turn k + 1 of the conversation whose turn k was request i - 64 (all
    # turns take one step here), its prompt that turn's prompt, its answer and the new tokens.
    for i in range(64, 64 * 8):
        previous = engine.prompts[i - 64]
        conversation, turn = i % 64, i // 64
        expected = previous + [len(previous)] * 64 + chats.new_tokens[conversation][turn]
        assert engine.prompts[i] == expected
        assert len(expected) == turn * (64 + 64) + 64
        assert engine.added_at[i] == turn, "a turn waits for the one before to finish"


def test_collector_time_counts_the_collections_made_inside_it_and_only_those():
    """gc.collect(g) runs one collection of generation g, which the block counts, with its time
    (automatic collections paused, so the counts are exact); after the block its callback is gone
    and counts nothing more."""
    callbacks = list(gc.callbacks)
    gc.disable()
    try:
        with CollectorTime() as collector:
            gc.collect(2)
            gc.collect(0)
            gc.collect(0)
        gc.collect(1)
    finally:
        gc.enable()
    assert gc.callbacks == callbacks
    assert collector.summary()["collections"] == [2, 0, 1]
    assert collector.summary()["ms"] > 0
