"""The prefix cache in the block manager: a hypothesis state machine keeps owners, free
blocks and cached contents consistent (with an honest hash and with one that collides all
the time), and the scheduler serves shared prefixes from it without changing any token."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.scheduler_harness import VOCAB, assert_matches_reference, drain, make_scheduler, step
from tinyvllm.engine import prefix_cache
from tinyvllm.engine.block_manager import OutOfBlocks, blocks_needed
from tinyvllm.engine.prefix_cache import (
    ROOT_KEY,
    PrefixCachingAllocator,
    attach_prefix,
    block_hash,
    full_block_keys,
    register_computed_blocks,
)
from tinyvllm.engine.sequence import Sequence
from tinyvllm.sampling_params import SamplingParams

PREFIXES = ([1, 2, 3, 4, 5, 1, 2, 3], [2, 2, 2, 2, 3, 3, 3, 3], [1, 2, 3, 4, 4, 4, 4, 4])


def token_bytes(token_ids) -> bytes:
    """The prefix cache's form of token ids, made apart from the library's: int64 in machine order."""
    return np.asarray(list(token_ids), dtype=np.int64).tobytes()


def colliding_hash(parent_key: int, tokens: bytes) -> int:
    """A hash with three values: most different blocks share a key."""
    return block_hash(parent_key, tokens) % 3


class PrefixCacheMachine(RuleBasedStateMachine):
    """Requests built from a few shared prefixes are admitted (attaching their cached prefix),
    grow, finish, are preempted (and readmitted) or aborted, and a hog takes every free
    block to force eviction. `content` plays the K/V: what each block's owner wrote in it."""

    hash_function = staticmethod(block_hash)

    @initialize(block_size=st.sampled_from((1, 2, 4)), num_blocks=st.integers(1, 12))
    def setup(self, block_size, num_blocks):
        self._saved_hash = prefix_cache.block_hash
        prefix_cache.block_hash = self.hash_function
        self.block_size = block_size
        self.allocator = PrefixCachingAllocator(num_blocks)
        self.content = np.full((num_blocks, block_size), -1, dtype=np.int64)
        self.active: list[Sequence] = []
        self.count = 0

    def teardown(self):
        if hasattr(self, "allocator"):
            for seq in self.active:
                self.allocator.free(seq.block_table)
            assert self.allocator.num_free == self.allocator.num_blocks, "blocks leaked"
            assert not self.allocator.ref_counts.any()
            prefix_cache.block_hash = self._saved_hash

    def _admit(self, seq: Sequence) -> None:
        served = attach_prefix(self.allocator, seq, self.block_size)
        assert served <= seq.num_tokens - 1
        for index, block_id in enumerate(seq.block_table):  # a hit serves the right K/V
            expected = seq.token_ids[index * self.block_size : (index + 1) * self.block_size].tolist()
            assert self.content[block_id].tolist() == expected
        self.active.append(seq)

    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(0, 5), max_size=6), cut=st.integers(0, 8))
    def hit(self, prefix, suffix, cut):
        tokens = prefix[:cut] + suffix
        if tokens:
            self._admit(Sequence(f"r{self.count}", tokens, SamplingParams()))
            self.count += 1

    @rule(data=st.data(), num_new=st.integers(1, 6))
    def append(self, data, num_new):
        """Compute some of a request's tokens: grow its table, write them, register full blocks."""
        if not self.active:
            return
        seq = data.draw(st.sampled_from(self.active))
        end = min(seq.num_tokens, seq.num_computed_tokens + num_new)
        missing = blocks_needed(end, self.block_size) - len(seq.block_table)
        if not self.allocator.can_allocate(missing):
            return
        new_blocks = self.allocator.allocate(missing).tolist()
        self.content[new_blocks] = -1
        seq.block_table.extend(new_blocks)
        for position in range(seq.num_computed_tokens, end):
            block_id = seq.block_table[position // self.block_size]
            self.content[block_id, position % self.block_size] = seq.token_ids[position]
        seq.num_computed_tokens = end
        register_computed_blocks(self.allocator, seq, self.block_size)

    def _end(self, seq: Sequence) -> None:
        self.active.remove(seq)
        self.allocator.free(seq.block_table)

    @rule(data=st.data())
    def finish_or_abort(self, data):
        if self.active:
            self._end(data.draw(st.sampled_from(self.active)))

    @rule(data=st.data())
    def preempt(self, data):
        """Recompute: ownership goes, the request comes back and finds what stayed cached. As
        the scheduler's preemption, the same sequence keeps its block keys (hashed before)."""
        if self.active:
            seq = data.draw(st.sampled_from(self.active))
            self._end(seq)
            seq.block_table, seq.num_registered_blocks, seq.num_computed_tokens = [], 0, 0
            self._admit(seq)

    @invariant()
    def block_keys_are_the_chain_of_their_tokens(self):
        for seq in getattr(self, "active", ()):
            parent_key = ROOT_KEY
            for index, key in enumerate(seq.block_keys):
                tokens = token_bytes(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])
                parent_key = prefix_cache.block_hash(parent_key, tokens)
                assert key == parent_key

    @rule()
    def evict(self):
        hog = self.allocator.allocate(self.allocator.num_free)
        self.content[hog] = -1
        assert self.allocator.num_free == 0 and not self.allocator.unowned_cached_blocks()
        self.allocator.free(hog)

    @invariant()
    def owners_equal_reference_counts(self):
        if not hasattr(self, "allocator"):
            return
        owners = np.zeros(self.allocator.num_blocks, dtype=np.int64)
        for seq in self.active:
            np.add.at(owners, seq.block_table, 1)
        assert owners.tolist() == self.allocator.ref_counts.tolist()

    @invariant()
    def free_unowned_and_owned_are_disjoint(self):
        if not hasattr(self, "allocator"):
            return
        allocator = self.allocator
        on_stack = set(allocator._free_stack[: allocator._top].tolist())  # the allocator's own free list
        unowned = allocator.unowned_cached_blocks()
        owned = set(np.flatnonzero(allocator.ref_counts).tolist())
        assert len(unowned) == len(set(unowned))
        assert not on_stack & owned and not set(unowned) & owned and not on_stack & set(unowned)
        assert len(on_stack) + len(unowned) + len(owned) == allocator.num_blocks
        assert all(allocator.cached_block(b) is not None for b in unowned)
        assert not any(allocator.cached_block(b) is not None for b in on_stack)

    @invariant()
    def cached_blocks_hold_their_chain(self):
        if not hasattr(self, "allocator"):
            return
        for block_id in range(self.allocator.num_blocks):
            entry = self.allocator.cached_block(block_id)
            if entry is None:
                continue
            assert list(entry.token_ids) == self.content[block_id].tolist()
            if entry.parent_block < 0:
                assert entry.key == prefix_cache.block_hash(ROOT_KEY, token_bytes(entry.token_ids))
                continue
            parent = self.allocator.cached_block(entry.parent_block)
            if parent is not None and int(self.allocator._generation[entry.parent_block]) == entry.parent_generation:
                assert entry.key == prefix_cache.block_hash(parent.key, token_bytes(entry.token_ids))


class CollidingPrefixCacheMachine(PrefixCacheMachine):
    hash_function = staticmethod(colliding_hash)


TestPrefixCache = PrefixCacheMachine.TestCase
TestPrefixCache.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCollidingPrefixCache = CollidingPrefixCacheMachine.TestCase
TestCollidingPrefixCache.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def _shared_prefix_requests(count: int, seed: int, max_len: int) -> list[tuple[list[int], SamplingParams]]:
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, VOCAB, size=int(rng.integers(4, max_len // 2))).tolist() for _ in range(3)]
    requests = []
    for _ in range(count):
        prefix = prefixes[int(rng.integers(len(prefixes)))]
        suffix = rng.integers(0, VOCAB, size=int(rng.integers(0, 6))).tolist()
        prompt = (prefix + suffix)[: max_len - 1]
        requests.append((prompt, SamplingParams(max_tokens=int(rng.integers(1, 12)), ignore_eos=True)))
    return requests


@pytest.mark.parametrize("mode", ["continuous", "static"])
@pytest.mark.parametrize("colliding", [False, True])
def test_many_shared_prefix_requests_on_a_tiny_arena(monkeypatch, mode, colliding):
    """500 requests over 3 prefixes, chunked, on an arena that forces eviction and
    preemption: every request gets the plain loop's tokens and no block leaks."""
    if colliding:
        monkeypatch.setattr(prefix_cache, "block_hash", colliding_hash)
    max_len = 40
    options = dict(mode=mode, block_size=4, max_num_seqs=6, max_num_batched_tokens=24, max_model_len=max_len)
    scheduler, model = make_scheduler(prefix_caching=True, num_blocks=14, **options)
    seqs = []
    for index, (prompt, params) in enumerate(_shared_prefix_requests(500, seed=3, max_len=max_len)):
        seqs.append(Sequence(f"request-{index}", prompt, params))
        scheduler.add(seqs[-1])
        if index % 7 == 0:
            step(scheduler, model)
    drain(scheduler, model, max_steps=100_000)
    for seq in seqs:
        assert_matches_reference(seq, max_len)
    assert scheduler.num_preemptions > 0
    assert scheduler.prefix_cache_hits > 0
    assert scheduler.allocator.num_free == scheduler.allocator.num_blocks
    assert not scheduler.allocator.ref_counts.any()


def test_second_request_reuses_the_first_ones_prefix():
    scheduler, model = make_scheduler(prefix_caching=True, block_size=4, num_blocks=16)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    first = Sequence("first", prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    scheduler.add(first)
    drain(scheduler, model)
    second = Sequence("second", prompt + [2], SamplingParams(max_tokens=3, ignore_eos=True))
    scheduler.add(second)
    batch = step(scheduler, model)
    assert batch.num_scheduled_tokens.tolist() == [3]  # 8 of its 11 tokens were cached
    drain(scheduler, model)
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 8)
    assert (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) == (21, 8)
    assert_matches_reference(second)


def test_the_last_prompt_token_is_always_computed():
    scheduler, model = make_scheduler(prefix_caching=True, block_size=4, num_blocks=16)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    for name in ("first", "second"):
        seq = Sequence(name, prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        scheduler.add(seq)
        drain(scheduler, model)
        assert_matches_reference(seq)
    assert seq.num_cached_tokens == 4  # the second block holds the last prompt token


def test_register_refuses_a_free_block():
    allocator = PrefixCachingAllocator(2)
    with pytest.raises(ValueError, match="free block 0"):
        allocator.register([0], [block_hash(ROOT_KEY, token_bytes([1, 2]))], token_bytes([1, 2]), 2, -1)


def test_allocating_more_than_is_free_evicts_nothing():
    allocator = PrefixCachingAllocator(3)
    (block,) = allocator.allocate(1)
    key = block_hash(ROOT_KEY, token_bytes([1, 2]))
    allocator.register([int(block)], [key], token_bytes([1, 2]), 2, -1)
    allocator.free([block])  # cached, unowned: counted free, evictable
    with pytest.raises(OutOfBlocks):
        allocator.allocate(4)
    assert allocator.unowned_cached_blocks() == [block]
    assert allocator.lookup(token_bytes([1, 2]), [key], 2) == [block]
    assert sorted(allocator.allocate(3).tolist()) == [0, 1, 2]  # now it is evicted, and used
    assert allocator.num_cached == 0


@pytest.mark.parametrize("prefix_cached", [False, True])
def test_a_static_batch_counts_each_members_blocks_in_full(prefix_cached):
    """Ten requests sharing an 8-token prefix, 3 blocks each, on 24 blocks: the batch is the
    queue's front whose full counts fit (8), never short of blocks. The members share the
    prefix's blocks: cached already, or computed by the first in the step that all join."""
    block_size, num_blocks, prefix = 4, 24, [1, 2, 3, 4, 5, 1, 2, 3]
    options = dict(mode="static", block_size=block_size, max_num_batched_tokens=128)
    scheduler, model = make_scheduler(prefix_caching=True, num_blocks=num_blocks, **options)
    if prefix_cached:
        scheduler.add(Sequence("warm", prefix + [9], SamplingParams(max_tokens=1, ignore_eos=True)))
        drain(scheduler, model)
    seqs = [Sequence(f"r{i}", prefix + [6, 7, i], SamplingParams(max_tokens=2, ignore_eos=True)) for i in range(10)]
    for seq in seqs:
        scheduler.add(seq)
    counts = [blocks_needed(seq.num_tokens, block_size) for seq in seqs]
    members = max(k for k in range(len(seqs) + 1) if sum(counts[:k]) <= num_blocks)
    batch = step(scheduler, model)
    assert [seq.request_id for seq in batch.seqs] == [seq.request_id for seq in seqs[:members]] and members == 8
    shared = len(prefix) // block_size
    expected_cached = [len(prefix) if prefix_cached else 0] + [len(prefix)] * (members - 1)
    assert [seq.num_cached_tokens for seq in seqs[:members]] == expected_cached
    unfinished = [count for seq, count in zip(seqs[:members], counts) if not seq.is_finished]  # r0 may be done
    assert len(unfinished) >= members - 1
    assert scheduler.allocator.num_used == shared + sum(count - shared for count in unfinished)
    drain(scheduler, model)
    assert scheduler.num_preemptions == 0
    for seq in seqs:
        assert_matches_reference(seq)


@pytest.mark.parametrize("budget", [64, 6])
def test_a_prefix_is_computed_once_and_shared_in_the_step_that_computes_it(budget):
    """B shares A's 8-token prefix (two blocks of 4), which nothing has cached yet. With a
    budget of 64, B and C (unrelated, queued behind B) join A's first step, B attaching the
    prefix blocks A computes in it. With a budget of 6, A computes the prefix over two steps
    and B waits (no budget is left while A's prompt is cut), then attaches both blocks in the
    step that completes them. Nobody computes a prefix block twice."""
    block_size, prefix = 4, [1, 2, 3, 4, 5, 1, 2, 3]
    options = dict(block_size=block_size, max_num_batched_tokens=budget, num_blocks=32)
    scheduler, model = make_scheduler(prefix_caching=True, **options)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    a, b, c = (Sequence(name, prompt, params) for name, prompt in
               (("a", prefix + [6, 7]), ("b", prefix + [8, 9]), ("c", [3, 3, 3, 3, 3])))  # fmt: skip
    for seq in (a, b, c):
        scheduler.add(seq)
    first = step(scheduler, model)
    if budget == 64:
        assert first.seqs == [a, b, c] and first.num_scheduled_tokens.tolist() == [10, 2, 5]
    else:
        assert first.seqs == [a] and first.num_scheduled_tokens.tolist() == [6]
        second = step(scheduler, model)
        assert second.seqs == [a, b] and second.num_scheduled_tokens.tolist() == [4, 2]
    assert b.num_cached_tokens == len(prefix) and b.block_table[:2] == a.block_table[:2]
    assert scheduler.prefix_cache_hits == len(prefix)
    drain(scheduler, model)
    for seq in (a, b, c):
        assert_matches_reference(seq)
    assert scheduler.allocator.num_used == 0


def test_each_block_of_a_sequence_is_hashed_once(monkeypatch):
    """Admission, the steps computing a block and its registration read one key per block
    (`full_block_keys`), which a preempted sequence keeps: no block is hashed twice."""
    hashed = []

    def counting_hash(parent_key: int, tokens: bytes) -> int:
        hashed.append(tokens)
        return block_hash(parent_key, tokens)

    monkeypatch.setattr(prefix_cache, "block_hash", counting_hash)
    options = dict(block_size=4, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    scheduler, model = make_scheduler(prefix_caching=True, num_blocks=12, **options)
    seqs = [
        Sequence(f"r{index}", [1 + index % 2] * 8 + [index] * 9, SamplingParams(max_tokens=12, ignore_eos=True))
        for index in range(8)
    ]
    for seq in seqs:
        scheduler.add(seq)
    drain(scheduler, model)
    assert scheduler.num_preemptions > 0 and scheduler.prefix_cache_hits > 0
    assert len(hashed) == sum(len(seq.block_keys) for seq in seqs)
    for seq in seqs:
        assert_matches_reference(seq)


def test_a_prefix_shared_by_requests_attached_in_a_row_is_hashed_once(monkeypatch):
    """B takes the keys of the two blocks it shares with A, attached just before it, and
    hashes only its own third block; its keys are still the chain of its tokens."""
    hashed = []

    def counting_hash(parent_key: int, tokens: bytes) -> int:
        hashed.append(tokens)
        return block_hash(parent_key, tokens)

    prefix, params = [1, 2, 3, 4, 5, 6, 7, 8], SamplingParams()
    alone = Sequence("alone", prefix + [7, 7, 7, 7, 2], params)
    expected = full_block_keys(alone, 3, 4)
    monkeypatch.setattr(prefix_cache, "block_hash", counting_hash)
    cache = PrefixCachingAllocator(16)
    a, b = Sequence("a", prefix + [9, 9, 9, 9, 1], params), Sequence("b", prefix + [7, 7, 7, 7, 2], params)
    attach_prefix(cache, a, 4)
    attach_prefix(cache, b, 4)
    assert len(hashed) == 3 + 1  # A's three full blocks before its last token, then B's third
    assert b.block_keys == expected and b.block_keys[:2] == a.block_keys[:2]


def _computed(cache: PrefixCachingAllocator, seq: Sequence, block_size: int) -> None:
    """seq's prompt computed past its attached prefix: blocks for the rest, full ones registered."""
    missing = blocks_needed(seq.num_tokens, block_size) - len(seq.block_table)
    seq.block_table.extend(cache.allocate(missing).tolist())
    seq.num_computed_tokens = seq.num_tokens
    register_computed_blocks(cache, seq, block_size)


def test_a_run_found_again_is_looked_up_anew_after_an_eviction():
    """Requests in a row that share a prefix find the run the one before found without
    checking it again, but not once a block has been evicted: then the prefix is gone."""
    cache, params, prompt = PrefixCachingAllocator(8), SamplingParams(), [1, 2, 3, 4, 5, 6, 7, 8, 9]
    first = Sequence("first", prompt, params)
    attach_prefix(cache, first, 4)
    _computed(cache, first, 4)
    second, third = Sequence("second", prompt, params), Sequence("third", prompt[:8] + [5], params)
    assert attach_prefix(cache, second, 4) == attach_prefix(cache, third, 4) == 8
    assert second.block_table == third.block_table == first.block_table[:2]
    third.block_table.extend(cache.allocate(1).tolist())  # a found run is the sequence's own list
    fourth = Sequence("fourth", prompt + [1, 2, 3, 4], params)  # three full blocks to look up
    assert attach_prefix(cache, fourth, 4) == 8 and fourth.block_table == first.block_table[:2]
    for seq in (first, second, third, fourth):
        cache.free(seq.block_table)
    cache.free(cache.allocate(cache.num_free))  # every unowned cached block evicted
    fifth = Sequence("fifth", prompt, params)
    assert attach_prefix(cache, fifth, 4) == 0 and fifth.block_table == []
