"""Parallel sampling (`SamplingParams.n`): the n sequences of a request compute its prompt once.

A request with n > 1 completions is a group of n sequences (`sequence.new_sequences`) whose
prompt is computed once. With the prefix cache on, the siblings admitted after the first find
its prompt blocks cached in the very step that computes them (`scheduler.py`). With it off, a
sequence of the group that has never run waits (without letting later requests pass) while a
sibling is computing the prompt, and once one has computed the prompt's full blocks it starts
from them, forked from that sibling (owners up, `allocator.share`). A shared block is never written:
only the prompt's full blocks before its last token are shared, and each sequence computes
the rest of the prompt itself, the last partial block's tokens (between 1 and block_size
tokens), which is simpler than copying that block and costs about as little. A sibling gone
(finished, preempted) leaves the others to compute the prompt themselves; aborting the
request aborts them all.
"""

from tinyvllm.engine.block_manager import BlockAllocator
from tinyvllm.engine.sequence import Sequence, SequenceStatus

WAIT = object()
"""prompt_source's answer: not yet, a sibling is computing the shared prompt."""


# --8<-- [start:share-prompt]
def shared_prompt_blocks(seq: Sequence, block_size: int) -> int:
    """How many of the prompt's blocks a request's sequences share: the full blocks before
    the prompt's last token (which each computes, to sample its first token)."""
    return (seq.num_prompt_tokens - 1) // block_size if len(seq.group) > 1 else 0


def prompt_source(seq: Sequence, block_size: int) -> Sequence | object | None:
    """For a sequence about to be admitted: the running sibling that holds the shared
    prompt blocks, computed; else WAIT while a sibling computes them and seq has never
    run (it would compute them a second time); else None (seq computes them itself)."""
    shared = shared_prompt_blocks(seq, block_size) * block_size
    if not shared:
        return None
    computing = False
    for sibling in seq.group:
        if sibling is not seq and sibling.status is SequenceStatus.RUNNING:
            if sibling.num_computed_tokens >= shared:
                return sibling
            computing = True
    return WAIT if computing and seq.num_cached_tokens is None else None


def fork_prompt(allocator: BlockAllocator, seq: Sequence, source: Sequence, block_size: int) -> int:
    """Give seq the shared prompt blocks of its running sibling `source` (one more owner
    each), counted computed: the prefix cache's sharing, without the cache."""
    blocks = source.block_table[: shared_prompt_blocks(seq, block_size)]
    allocator.share(blocks)
    seq.block_table = list(blocks)
    seq.num_computed_tokens = len(blocks) * block_size
    return seq.num_computed_tokens


# --8<-- [end:share-prompt]
