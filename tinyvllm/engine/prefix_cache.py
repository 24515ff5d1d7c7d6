"""Automatic prefix caching: full KV blocks stay findable by their content after their owners go.

A full block is keyed by `block_hash(parent_key, its token ids)`, chained from the first
block of a sequence, so a key stands for the whole prefix up to the block's end. A lookup
walks a prompt's full blocks and stops at the first miss; each candidate is confirmed
against the token ids stored with it and against its parent (the block matched just before,
at the same registration generation), so a hash collision is a miss, never wrong K/V.

Cached blocks with no owner are neither free nor lost: they sit in a least-recently-freed
order and count as free, and `allocate` evicts the oldest of them only when the free stack
runs out. `acquire` gives a cached block one more owner (taking it off that list).
"""

from collections import OrderedDict
from collections.abc import Set
from typing import NamedTuple

import numpy as np

from tinyvllm.engine.block_manager import BlockAllocator
from tinyvllm.engine.sequence import PENDING_TOKEN, Sequence

ROOT_KEY = 0
"""The parent key of a sequence's first block."""


def block_hash(parent_key: int, token_ids: tuple[int, ...]) -> int:
    """The key of a full block: chained over its parent's key and its token ids."""
    return hash((parent_key, token_ids))


class CachedBlock(NamedTuple):
    """What a cached block holds: its key, its token ids, and the parent it was chained to."""

    key: int
    token_ids: tuple[int, ...]
    parent_block: int  # -1 for a first block
    parent_generation: int


class PrefixCachingAllocator(BlockAllocator):
    """A BlockAllocator whose full blocks can be registered by content and found again."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._by_key: dict[int, int] = {}
        self._cached: dict[int, CachedBlock] = {}
        self._unowned: OrderedDict[int, None] = OrderedDict()  # cached, no owner: oldest first
        self._generation = [0] * num_blocks  # bumped when a block is registered (a list: read per block)
        self._registered_at: dict[int, int] = {}  # cached block -> registration order
        self._num_registered = 0

    @property
    def num_free(self) -> int:
        return self._top + len(self._unowned)

    @property
    def num_cached(self) -> int:
        """Blocks findable by content, owned or not."""
        return len(self._cached)

    def cached_block(self, block_id: int) -> CachedBlock | None:
        """What block_id holds if it is cached, else None."""
        return self._cached.get(block_id)

    def unowned_cached_blocks(self) -> list[int]:
        """Cached blocks no one owns, the next to be evicted first."""
        return list(self._unowned)

    # --8<-- [start:allocate]
    def allocate(self, n: int) -> np.ndarray:
        """n block ids, each with one owner: free ones, and when they run out, unowned cached
        ones, evicted oldest first onto the free stack."""
        if n <= self.num_free:  # otherwise super() refuses it before anything is evicted
            evicted = [self._unowned.popitem(last=False)[0] for _ in range(max(n - self._top, 0))]
            for block_id in evicted:
                self._evict(block_id)
            super()._release(np.array(evicted, dtype=np.int32))
        return super().allocate(n)

    # --8<-- [end:allocate]

    def acquire(self, block_ids: list[int]) -> None:
        """One more owner for each cached block (an unowned one stops being evictable)."""
        for block_id in block_ids:
            if block_id not in self._cached:
                raise ValueError(f"block {block_id} is not cached")
            self._unowned.pop(block_id, None)
            self._ref_counts[block_id] += 1

    # --8<-- [start:lookup]
    def lookup(self, token_ids: list[int], block_size: int) -> tuple[list[int], list[int]]:
        """The longest cached prefix of token_ids in full blocks: (block ids, their keys)."""
        blocks: list[int] = []
        keys: list[int] = []
        parent_key, parent_block, parent_generation = ROOT_KEY, -1, 0
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            tokens = tuple(token_ids[start : start + block_size])
            key = block_hash(parent_key, tokens)
            block_id = self._by_key.get(key)
            entry = self._cached.get(block_id) if block_id is not None else None
            if entry is None or entry.token_ids != tokens or entry.parent_block != parent_block:
                break
            if entry.parent_generation != parent_generation:
                break
            blocks.append(block_id)
            keys.append(key)
            parent_key, parent_block = key, block_id
            parent_generation = self._generation[block_id]
        return blocks, keys

    # --8<-- [end:lookup]

    def register(self, block_id: int, parent_key: int, token_ids: tuple[int, ...], parent_block: int) -> int:
        """Make an owned full block, which follows parent_block (-1 for none) keyed parent_key,
        findable by content; returns its key. Nothing changes when the key or the block is
        cached already (the same prefix computed twice, or a collision)."""
        if self._ref_counts[block_id] == 0:
            raise ValueError(f"cannot register free block {block_id}")
        key = block_hash(parent_key, token_ids)
        if key in self._by_key or block_id in self._cached:
            return key
        parent_generation = self._generation[parent_block] if parent_block >= 0 else 0
        self._generation[block_id] += 1
        self._cached[block_id] = CachedBlock(key, token_ids, parent_block, parent_generation)
        self._by_key[key] = block_id
        self._registered_at[block_id] = self._num_registered
        self._num_registered += 1
        return key

    def _release(self, released: np.ndarray) -> None:
        """Cached blocks wait, unowned, to be found or evicted, the latest registered of one
        release first (a sequence's tail goes before the prefix it extends); others go free."""
        cached, uncached = [], []
        for block_id in released.tolist():
            (cached if block_id in self._cached else uncached).append(block_id)
        cached.sort(key=lambda b: -self._registered_at[b])
        for block_id in cached:
            self._unowned[block_id] = None
        super()._release(np.array(uncached, dtype=np.int32))

    def _evict(self, block_id: int) -> None:
        entry = self._cached.pop(block_id)
        del self._by_key[entry.key]
        del self._registered_at[block_id]


def cached_prefix(cache: PrefixCachingAllocator, seq: Sequence, block_size: int) -> tuple[list[int], list[int]]:
    """The cached blocks (and keys) of seq's longest cached prefix of known tokens but the
    last, which is always computed so that the next token is sampled."""
    tokens = seq.token_ids[: seq.num_tokens - 1]
    if PENDING_TOKEN in tokens:
        tokens = tokens[: tokens.index(PENDING_TOKEN)]
    return cache.lookup(tokens, block_size)


# --8<-- [start:attach-register]
def attach_prefix(
    cache: PrefixCachingAllocator, seq: Sequence, block_size: int, computing: Set[int] = frozenset()
) -> int | None:
    """Give a waiting seq its cached prefix (one more owner per block), counted computed;
    returns its length in tokens. None, attaching nothing, when the block after that prefix
    is one that another sequence completes in this step (its key is in `computing`): seq
    had better wait a step and find it cached than compute it a second time."""
    blocks, keys = cached_prefix(cache, seq, block_size)
    if computing and _next_block_key(seq, keys, block_size) in computing:
        return None
    cache.acquire(blocks)
    seq.block_table = blocks
    seq.block_keys = keys
    seq.num_computed_tokens = len(blocks) * block_size
    return seq.num_computed_tokens


def register_computed_blocks(cache: PrefixCachingAllocator, seq: Sequence, block_size: int) -> None:
    """Register seq's blocks that are full of computed, known tokens (a block holding the
    placeholder of a token still on the device waits until the token is known)."""
    for index, tokens in _unkeyed_full_blocks(seq, seq.num_computed_tokens, block_size):
        parent_key = seq.block_keys[-1] if seq.block_keys else ROOT_KEY
        parent_block = seq.block_table[index - 1] if index else -1
        seq.block_keys.append(cache.register(seq.block_table[index], parent_key, tokens, parent_block))


# --8<-- [end:attach-register]


def _unkeyed_full_blocks(seq: Sequence, num_tokens: int, block_size: int):
    """(index, token ids) of seq's blocks past those it has keys for, full within its first
    num_tokens tokens, up to the first that holds a token still on the device."""
    for index in range(len(seq.block_keys), num_tokens // block_size):
        tokens = tuple(seq.token_ids[index * block_size : (index + 1) * block_size])
        if PENDING_TOKEN in tokens:
            return
        yield index, tokens


# --8<-- [start:in-flight]
def computing_keys(seq: Sequence, num_new: int, block_size: int) -> list[int]:
    """The keys of the full blocks that seq's next num_new tokens complete: the blocks
    `register_computed_blocks` will register once the step computing them is launched."""
    keys = []
    parent_key = seq.block_keys[-1] if seq.block_keys else ROOT_KEY
    for _, tokens in _unkeyed_full_blocks(seq, seq.num_computed_tokens + num_new, block_size):
        parent_key = block_hash(parent_key, tokens)
        keys.append(parent_key)
    return keys


def _next_block_key(seq: Sequence, found_keys: list[int], block_size: int) -> int | None:
    """The key of the first full block of seq's tokens past its cached prefix (whose keys are
    `found_keys`), the one its prefill would compute first; None when no full block follows."""
    start = len(found_keys) * block_size
    tokens = tuple(seq.token_ids[start : start + block_size])
    if start + block_size > seq.num_tokens - 1 or PENDING_TOKEN in tokens:
        return None
    return block_hash(found_keys[-1] if found_keys else ROOT_KEY, tokens)


# --8<-- [end:in-flight]
