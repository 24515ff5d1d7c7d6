"""Automatic prefix caching: full KV blocks stay findable by their content after their owners go.

A full block is keyed by `block_hash(parent_key, its token ids)`, chained from the first
block of a sequence, so a key stands for the whole prefix up to the block's end. A key
depends on nothing but those tokens, which never change once known, so a sequence hashes
each of its blocks once (`full_block_keys`) and its admission, the step computing the
block and its registration all read that key. A lookup walks a prompt's keys and stops at
the first miss; each candidate is confirmed against the token ids stored with it and
against its parent (the block matched just before, at the same registration generation),
so a hash collision is a miss, never wrong K/V. Stored ids are int64 bytes (`token_bytes`):
a run of blocks is confirmed by comparing two byte strings, where a tuple of Python ints per
block cost a comparison per token. The last run confirmed is kept, and found again by its ids
alone while no block has been evicted (a burst of requests sharing a system prompt).

Cached blocks with no owner are neither free nor lost: they sit in a least-recently-freed
order and count as free, and `allocate` evicts the oldest of them only when the free stack
runs out. `acquire` gives a cached block one more owner (taking it off that list).
"""

from array import array
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from tinyvllm.engine.block_manager import BlockAllocator
from tinyvllm.engine.sequence import TOKEN_BYTES, Sequence, token_bytes

ROOT_KEY = 0
"""The parent key of a sequence's first block."""


def block_hash(parent_key: int, tokens: bytes) -> int:
    """The key of a full block: chained over its parent's key and its token ids (as
    `token_bytes`, whose hash reads one buffer where a tuple's read an int object per id)."""
    return hash((parent_key, tokens))


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
        self._by_key: dict[int, int] = {}  # key -> the cached block
        self._unowned: OrderedDict[int, None] = OrderedDict()  # cached, no owner: oldest first
        # A cached block's CachedBlock fields, in lists indexed by block id: read per block, and
        # an object per block would cost a Python constructor (0.2 us) and one more object for
        # the cyclic GC to walk. _tokens holds a block's ids as `token_bytes`, None for a block
        # that is not cached.
        self._tokens: list[bytes | None] = [None] * num_blocks
        self._key = [0] * num_blocks
        self._parent = [-1] * num_blocks
        self._parent_generation = [0] * num_blocks
        # A block's generation is the number of its latest registration (0: never), so a
        # parent evicted and registered again has a new one, and generations order registrations.
        self._generation = [0] * num_blocks
        self._num_registrations = 0
        # The last run `lookup` found, its blocks' ids as token_bytes and the evictions before it:
        # a burst of requests that share a prefix looks the same run up again and again.
        self._last_run: tuple[list[int], bytes, int] = ([], b"", 0)
        self._num_evictions = 0
        # The sequence attached last (`attach_prefix`): requests that arrive together often share
        # a prefix (a system prompt), and a new one takes the keys of the blocks they share.
        self.last_attached: Sequence | None = None

    @property
    def num_free(self) -> int:
        return self._top + len(self._unowned)

    @property
    def num_cached(self) -> int:
        """Blocks findable by content, owned or not."""
        return len(self._by_key)

    def cached_block(self, block_id: int) -> CachedBlock | None:
        """What block_id holds if it is cached, else None."""
        tokens = self._tokens[block_id]
        if tokens is None:
            return None
        token_ids = tuple(array("q", tokens))
        return CachedBlock(self._key[block_id], token_ids, self._parent[block_id], self._parent_generation[block_id])

    def unowned_cached_blocks(self) -> list[int]:
        """Cached blocks no one owns, the next to be evicted first."""
        return list(self._unowned)

    # --8<-- [start:allocate]
    def allocate(self, n: int) -> np.ndarray:
        """n block ids, each with one owner: free ones, and when they run out, unowned cached
        ones, evicted oldest first onto the free stack."""
        if self._top < n <= self.num_free:  # past num_free super() refuses it before anything is evicted
            evicted = [self._unowned.popitem(last=False)[0] for _ in range(n - self._top)]
            for block_id in evicted:
                self._evict(block_id)
            super()._release(np.array(evicted, dtype=np.int32))
        return super().allocate(n)

    # --8<-- [end:allocate]

    def acquire(self, block_ids: list[int]) -> None:
        """One more owner for each cached block (an unowned one stops being evictable); the
        blocks are distinct, as a run that `lookup` found is."""
        if None in map(self._tokens.__getitem__, block_ids):
            uncached = [block_id for block_id in block_ids if self._tokens[block_id] is None]
            raise ValueError(f"block {uncached[0]} is not cached")
        if not block_ids:  # a miss, the common case
            return
        ids = np.fromiter(block_ids, np.intp, len(block_ids))
        owners = self._ref_counts[ids]
        if self._unowned and not owners.all():  # only a cached block with no owner waits there
            for block_id in ids[owners == 0].tolist():
                del self._unowned[block_id]
        # distinct blocks, so an indexed store counts each once; np.add.at, which counts
        # repeats, is several times slower (perf/LOG.md, 2026-12-07)
        self._ref_counts[ids] = owners + 1

    # --8<-- [start:lookup]
    def lookup(self, tokens: bytes, keys: list[int], block_size: int) -> list[int]:
        """The cached blocks of the longest prefix of the full blocks of `tokens` (token ids as
        `token_bytes`), whose keys (chained, see `full_block_keys`) are `keys`: one block id per
        key matched."""
        run, run_tokens, evictions = self._last_run
        # The last run again, while no block has been evicted since: its blocks still hold what
        # was confirmed then, chained as they were, and these tokens begin with the same ids.
        if run and evictions == self._num_evictions and len(keys) >= len(run) and tokens.startswith(run_tokens):
            if len(keys) == len(run) or keys[len(run)] not in self._by_key:  # else the run may go on: look it all up
                return run[:]
        # Each check runs over the whole run of candidates at once, as list and byte-string
        # comparisons in C: a Python loop over a 2,048-token prefix's 128 blocks cost ~50 us a request.
        found = list(map(self._by_key.get, keys))
        if None in found:
            del found[found.index(None) :]
        if not found:
            return found
        found_tokens = b"".join(map(self._tokens.__getitem__, found))
        chained = (
            list(map(self._parent.__getitem__, found)) == [-1, *found[:-1]]
            and list(map(self._parent_generation.__getitem__, found))
            == [0, *map(self._generation.__getitem__, found[:-1])]
            and tokens.startswith(found_tokens)
        )
        if not chained:
            found = found[: self._confirmed_length(found, tokens, block_size)]
            found_tokens = found_tokens[: len(found) * block_size * TOKEN_BYTES]
        self._last_run = (found, found_tokens, self._num_evictions)
        return found[:]

    def _confirmed_length(self, found: list[int], tokens: bytes, block_size: int) -> int:
        """How many of the candidate blocks `found` chain from the first, each to the one before
        (at its registration generation) and holding its ids of `tokens`; a hash collision or
        a parent evicted and registered again ends the run."""
        width = block_size * TOKEN_BYTES
        parent_block, parent_generation = -1, 0
        for index, block_id in enumerate(found):
            if self._parent[block_id] != parent_block or self._parent_generation[block_id] != parent_generation:
                return index
            if self._tokens[block_id] != tokens[index * width : (index + 1) * width]:
                return index  # a collision
            parent_block, parent_generation = block_id, self._generation[block_id]
        return len(found)

    # --8<-- [end:lookup]

    def register(
        self, block_ids: list[int], keys: list[int], tokens: bytes, block_size: int, parent_block: int
    ) -> None:
        """Make owned full blocks findable by content: block_ids[i] holds the ids of `tokens`
        (as `token_bytes`) i * block_size to (i + 1) * block_size, keyed keys[i], and follows
        block_ids[i - 1] (the first follows parent_block, -1 for none). A block stays as it is
        when its key or the block is cached already (the same prefix computed twice, or a
        collision); nothing changes on error."""
        owners = self._ref_counts[block_ids]
        if not owners.all():
            raise ValueError(f"cannot register free block {block_ids[int(owners.argmin())]}")
        by_key, cached_tokens, generation = self._by_key, self._tokens, self._generation  # read once, not per block
        registration = self._num_registrations
        width = block_size * TOKEN_BYTES
        for index, (block_id, key) in enumerate(zip(block_ids, keys)):
            if key not in by_key and cached_tokens[block_id] is None:
                self._parent_generation[block_id] = generation[parent_block] if parent_block >= 0 else 0
                self._parent[block_id] = parent_block
                self._key[block_id] = key
                cached_tokens[block_id] = tokens[index * width : (index + 1) * width]
                registration += 1
                generation[block_id] = registration
                by_key[key] = block_id
            parent_block = block_id
        self._num_registrations = registration

    def _release(self, released: np.ndarray) -> None:
        """Cached blocks wait, unowned, to be found or evicted, the latest registered of one
        release first (a sequence's tail goes before the prefix it extends); others go free."""
        block_ids = released.tolist()
        cached = [block_id for block_id in block_ids if self._tokens[block_id] is not None]
        cached.sort(key=self._generation.__getitem__, reverse=True)  # a C key function, no lambda
        self._unowned.update(dict.fromkeys(cached))
        uncached = [block_id for block_id in block_ids if self._tokens[block_id] is None]
        super()._release(np.array(uncached, dtype=np.int32))

    def _evict(self, block_id: int) -> None:
        self._tokens[block_id] = None
        del self._by_key[self._key[block_id]]
        self._num_evictions += 1


def full_block_keys(seq: Sequence, num_blocks: int, block_size: int) -> list[int]:
    """seq.block_keys, extended to hold at least the keys of its first num_blocks blocks, which
    must be full of known tokens. Each key is hashed once in seq's life: it depends only on
    the tokens up to its block's end, which never change (preemption keeps them)."""
    keys = seq.block_keys
    if len(keys) < num_blocks:
        parent_key = keys[-1] if keys else ROOT_KEY
        span = token_bytes(seq.token_ids, len(keys) * block_size, num_blocks * block_size)
        width = block_size * TOKEN_BYTES
        for start in range(0, len(span), width):
            parent_key = block_hash(parent_key, span[start : start + width])
            keys.append(parent_key)
    return keys


def lookup_keys(seq: Sequence, block_size: int, recent: Sequence | None = None) -> list[int]:
    """The keys of the full blocks a lookup may find for seq: of its known tokens but the
    last, which is always computed so that the next token is sampled. A seq with no keys yet
    first takes `recent`'s keys of the whole blocks both begin with (a key depends on nothing
    but those tokens), so a prefix that many requests share is hashed once, not once each."""
    num_blocks = _full_known_blocks(seq, seq.num_tokens - 1, block_size)
    if recent is not None and not seq.block_keys:
        span = min(num_blocks, len(recent.block_keys)) * block_size
        ours, theirs = token_bytes(seq.token_ids, 0, span), token_bytes(recent.token_ids, 0, span)
        seq.block_keys = recent.block_keys[: _common_blocks(ours, theirs, block_size * TOKEN_BYTES)]
    return full_block_keys(seq, num_blocks, block_size)[:num_blocks]


def _common_blocks(ours: bytes, theirs: bytes, width: int) -> int:
    """How many whole blocks of `width` bytes two equally long byte strings begin with in
    common: a binary search, each probe one comparison in C over a view (no copy)."""
    view = memoryview(theirs)
    low, high = 0, len(ours) // width
    while low < high:
        middle = (low + high + 1) // 2
        if ours.startswith(view[: middle * width]):
            low = middle
        else:
            high = middle - 1
    return low


# --8<-- [start:attach-register]
def attach_prefix(cache: PrefixCachingAllocator, seq: Sequence, block_size: int) -> int:
    """Give a waiting seq its longest cached prefix (one more owner per block), counted
    computed; returns its length in tokens."""
    keys = lookup_keys(seq, block_size, cache.last_attached)
    cache.last_attached = seq
    blocks = cache.lookup(token_bytes(seq.token_ids, 0, len(keys) * block_size), keys, block_size)
    cache.acquire(blocks)
    seq.block_table = blocks
    seq.num_registered_blocks = len(blocks)
    seq.num_computed_tokens = len(blocks) * block_size
    return seq.num_computed_tokens


def register_computed_blocks(
    cache: PrefixCachingAllocator, seq: Sequence, block_size: int, num_computed: int | None = None
) -> None:
    """Register seq's blocks that are full of computed, known tokens, all at once (a block
    holding the placeholder of a token still on the device waits until the token is known).
    num_computed: the tokens counted computed, seq.num_computed_tokens unless given (the
    scheduler registers a step's blocks as it schedules them)."""
    start = seq.num_registered_blocks
    end = _full_known_blocks(seq, seq.num_computed_tokens if num_computed is None else num_computed, block_size)
    if end <= start:
        return
    keys = full_block_keys(seq, end, block_size)[start:end]
    tokens = token_bytes(seq.token_ids, start * block_size, end * block_size)
    parent_block = seq.block_table[start - 1] if start else -1
    cache.register(seq.block_table[start:end], keys, tokens, block_size, parent_block)
    seq.num_registered_blocks = end


# --8<-- [end:attach-register]


def _full_known_blocks(seq: Sequence, num_tokens: int, block_size: int) -> int:
    """How many of seq's blocks are full within its first num_tokens tokens and hold no
    placeholder (those are at the end of token_ids, so the first such block ends the run)."""
    return min(num_tokens, seq.num_known_tokens) // block_size
