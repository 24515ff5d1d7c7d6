"""KV-cache memory: which blocks of the arena are in use, and by how many owners.

The KV cache is cut into `num_blocks` blocks of `block_size` tokens each (K and V of every
layer), so a sequence's K/V live in the blocks its block table names. The allocator hands
out block ids and takes them back; it never touches the device. Free block ids sit on a
stack (a NumPy array and a top index): allocate pops, free pushes, both O(n) in the blocks
moved and never O(num_blocks). Each block has a reference count so one block can have
several owners (prefix sharing); it returns to the stack when its last owner frees it.
"""

import numpy as np


class OutOfBlocks(Exception):
    """More blocks were asked for than are free; the caller decides (preempt, wait, refuse)."""

    def __init__(self, requested: int, available: int) -> None:
        super().__init__(f"asked for {requested} KV-cache blocks, {available} are free")
        self.requested = requested
        self.available = available


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold num_tokens tokens (num_tokens >= 0): ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        # Reversed so that a fresh allocator hands out 0, 1, 2, ... in order.
        self._free_stack = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)
        self._top = num_blocks  # _free_stack[:_top] are the free blocks
        self._ref_counts = np.zeros(num_blocks, dtype=np.int32)

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def ref_counts(self) -> np.ndarray:
        """Owners per block (0 = free), as a read-only view."""
        view = self._ref_counts.view()
        view.flags.writeable = False
        return view

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    # --8<-- [start:allocate-free]
    def allocate(self, n: int) -> np.ndarray:
        """n free block ids (int32), each now with one owner; OutOfBlocks if fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > self.num_free:
            raise OutOfBlocks(n, self.num_free)
        block_ids = self._free_stack[self._top - n : self._top][::-1].copy()
        self._top -= n
        self._ref_counts[block_ids] = 1
        return block_ids

    def share(self, block_ids) -> None:
        """Give allocated blocks one more owner each (who must free them too)."""
        block_ids = self._checked(block_ids)
        free = block_ids[self._ref_counts[block_ids] == 0]
        if free.size:
            raise ValueError(f"cannot share free blocks {free.tolist()}")
        np.add.at(self._ref_counts, block_ids, 1)

    def free(self, block_ids) -> None:
        """Drop one owner of each block; blocks left with none become free. Nothing changes on error."""
        ids, counts = np.unique(self._checked(block_ids), return_counts=True)
        over = ids[self._ref_counts[ids] < counts]
        if over.size:
            raise ValueError(f"double free of KV-cache blocks {over.tolist()}")
        self._ref_counts[ids] -= counts.astype(np.int32)
        self._release(ids[self._ref_counts[ids] == 0])

    # --8<-- [end:allocate-free]

    def _release(self, released: np.ndarray) -> None:
        """Blocks whose last owner just freed them go back on the free stack."""
        self._free_stack[self._top : self._top + released.size] = released
        self._top += released.size

    def _checked(self, block_ids) -> np.ndarray:
        block_ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
        outside = block_ids[(block_ids < 0) | (block_ids >= self.num_blocks)]
        if outside.size:
            raise ValueError(f"block ids {outside.tolist()} are outside [0, {self.num_blocks})")
        return block_ids
