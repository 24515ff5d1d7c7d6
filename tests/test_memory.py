"""BlockAllocator against a plain-Python model of who owns which block."""

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tinyvllm.engine.block_manager import BlockAllocator, OutOfBlocks, blocks_needed


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_blocks_needed_is_ceil(num_tokens, block_size):
    assert blocks_needed(num_tokens, block_size) == math.ceil(num_tokens / block_size)


def test_fresh_allocator_hands_out_distinct_int32_ids():
    allocator = BlockAllocator(5)
    ids = allocator.allocate(5)
    assert ids.dtype == np.int32
    assert sorted(ids.tolist()) == [0, 1, 2, 3, 4]
    assert allocator.num_free == 0 and allocator.num_used == 5


def test_out_of_blocks_is_an_exception_and_changes_nothing():
    allocator = BlockAllocator(4)
    held = allocator.allocate(3)
    assert issubclass(OutOfBlocks, Exception)
    with pytest.raises(OutOfBlocks) as error:
        allocator.allocate(2)
    assert (error.value.requested, error.value.available) == (2, 1)
    assert allocator.num_free == 1 and not allocator.can_allocate(2) and allocator.can_allocate(1)
    allocator.free(held)
    assert allocator.num_free == 4


def test_double_free_raises_and_changes_nothing():
    allocator = BlockAllocator(4)
    ids = allocator.allocate(2)
    allocator.free(ids[:1])
    counts = allocator.ref_counts.copy()
    with pytest.raises(ValueError, match="double free"):
        allocator.free(ids)
    np.testing.assert_array_equal(allocator.ref_counts, counts)
    assert allocator.num_free == 3


def test_freeing_a_block_twice_in_one_call_is_a_double_free():
    allocator = BlockAllocator(2)
    ids = allocator.allocate(1)
    with pytest.raises(ValueError, match="double free"):
        allocator.free([ids[0], ids[0]])
    assert allocator.num_used == 1


def test_ids_outside_the_arena_are_refused():
    allocator = BlockAllocator(3)
    for bad in ([3], [-1]):
        with pytest.raises(ValueError, match="outside"):
            allocator.free(bad)
        with pytest.raises(ValueError, match="outside"):
            allocator.share(bad)


def test_shared_block_returns_after_its_last_owner_frees_it():
    allocator = BlockAllocator(2)
    ids = allocator.allocate(1)
    allocator.share(ids)
    allocator.free(ids)
    assert allocator.num_free == 1
    allocator.free(ids)
    assert allocator.num_free == 2
    with pytest.raises(ValueError, match="cannot share free"):
        allocator.share(ids)


def test_ref_counts_view_is_read_only():
    allocator = BlockAllocator(2)
    with pytest.raises(ValueError):
        allocator.ref_counts[0] = 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(0)
    with pytest.raises(ValueError):
        BlockAllocator(2).allocate(-1)


class AllocatorMachine(RuleBasedStateMachine):
    """Owners take, share and free blocks; the allocator's books must match theirs."""

    @initialize(num_blocks=st.integers(1, 24))
    def setup(self, num_blocks):
        self.allocator = BlockAllocator(num_blocks)
        self.owners: list[list[int]] = []  # each owner's blocks (one reference each)

    def _refs(self) -> Counter:
        return Counter(block for owned in self.owners for block in owned)

    @rule(n=st.integers(0, 8))
    def allocate(self, n):
        free_before = self.allocator.num_free
        if n > free_before:
            with pytest.raises(OutOfBlocks):
                self.allocator.allocate(n)
            return
        ids = self.allocator.allocate(n).tolist()
        assert len(set(ids)) == n and not set(ids) & set(self._refs())
        self.owners.append(ids)

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def share(self, data):
        owned = data.draw(st.sampled_from(self.owners))
        self.allocator.share(owned)
        self.owners.append(list(owned))

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def free(self, data):
        owned = self.owners.pop(data.draw(st.integers(0, len(self.owners) - 1)))
        self.allocator.free(owned)

    @precondition(lambda self: any(self.allocator.ref_counts == 0))
    @rule(data=st.data())
    def free_a_free_block(self, data):
        block = data.draw(st.sampled_from(np.flatnonzero(self.allocator.ref_counts == 0).tolist()))
        with pytest.raises(ValueError, match="double free"):
            self.allocator.free([block])

    @invariant()
    def books_balance(self):
        refs = self._refs()
        expected = np.zeros(self.allocator.num_blocks, np.int32)
        for block, count in refs.items():
            expected[block] = count
        np.testing.assert_array_equal(self.allocator.ref_counts, expected)
        assert self.allocator.num_used == len(refs)
        assert self.allocator.num_free + self.allocator.num_used == self.allocator.num_blocks

    def teardown(self):
        while self.owners:
            self.allocator.free(self.owners.pop())
        assert self.allocator.num_free == self.allocator.num_blocks
        assert sorted(self.allocator.allocate(self.allocator.num_blocks).tolist()) == list(
            range(self.allocator.num_blocks)
        )


AllocatorMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40)
TestAllocatorMachine = AllocatorMachine.TestCase
