"""Which tokens the model computes next: continuous or static batching over the paged KV cache.

One engine step is `schedule()`, one forward of the model over the batch queued on the
device (`launched()`), and, once its sampled tokens are back, `postprocess()`. The engine
runs a step ahead: it schedules and launches step n before it postprocesses step n-1, so
a sequence sampled in step n-1 carries a placeholder for that token (see `sequence.py`)
while step n is scheduled, and a sequence whose placeholder will be its last token
(max_tokens or max_model_len reached) is not scheduled again.
As in vLLM v1 there are no prefill and decode phases: each step gives every scheduled
sequence a number of tokens to compute, from `num_computed_tokens` toward `len(token_ids)`.
A decode computes 1 token; a prefill computes its prompt, or only a chunk of it when the
step's token budget `max_num_batched_tokens` runs out (chunked prefill). A sequence samples
a new token only in the step whose chunk reaches the end of its token_ids.

With a PrefixCachingAllocator (`enable_prefix_caching`), a sequence joining the running
set first attaches the longest cached prefix of its tokens but the last (owners up, counted
computed), so its prefill computes only the rest, the way a chunked prefill continues; the
blocks a step fills are registered in the cache as the step is scheduled, so that requests
sharing a prefix that none has computed yet attach it in the very step that computes it.
The n sequences of a
request with n > 1 completions compute its prompt once (`prompt_sharing.py`).

Blocks are allocated as tokens are scheduled: between steps a sequence's block table holds
exactly blocks_needed(num_computed_tokens) blocks. When a running sequence needs a block
and none is free, the most recently admitted running sequence is preempted by recompute:
its blocks are freed (cached ones stay cached), num_computed_tokens goes back to 0 and it
waits at the FRONT of the queue, keeping its sampled tokens. Readmitted, its whole token
list is its "prompt" and its next sample is the one it would have drawn anyway (the
sampler draws from (seed, position)). `add` refuses a request whose longest possible
sequence does not fit the whole cache, so the oldest running sequence can always grow (by
preempting all the others) and the queue never deadlocks: schedule() returns None only when
no request is unfinished or every running one is only waiting for its last token.

Policies (EngineConfig.mode):
- continuous: running sequences first, in admission order; then waiting ones join in queue
  order while max_num_seqs, the token budget and free blocks allow. Nothing joins in a step
  that preempted (the blocks just proved short).
- static: when no batch is active, the front of the queue becomes the batch: up to
  max_num_seqs sequences whose token lists fit the free blocks together. Requests arriving
  later wait until every member has finished. Members start computing as the token budget
  allows (a long prompt is chunked over several steps, members join running as budget
  frees), and a member preempted mid-batch rejoins as soon as blocks free up, before the
  batch ends: it is still a member, never a newcomer.
"""

from collections import deque
from collections.abc import Iterable

import numpy as np

from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.block_manager import BlockAllocator, blocks_needed
from tinyvllm.engine.prefix_cache import PrefixCachingAllocator, attach_prefix, register_computed_blocks
from tinyvllm.engine.prompt_sharing import WAIT, fork_prompt, prompt_source, shared_prompt_blocks
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import PENDING_TOKEN, Sequence, SequenceStatus
from tinyvllm.engine.stopping import check_stop, reached_length


class Scheduler:
    def __init__(
        self, config: ResolvedEngineConfig, allocator: BlockAllocator, eos_token_ids: Iterable[int] = ()
    ) -> None:
        """`allocator` holds the KV cache's blocks (config.num_blocks of them when that is set);
        `eos_token_ids` are the model's, which a request's ignore_eos turns off."""
        if config.num_blocks is not None and allocator.num_blocks != config.num_blocks:
            raise ValueError(
                f"num_blocks: the allocator has {allocator.num_blocks} blocks, config.num_blocks is {config.num_blocks}"
            )
        self.config = config
        self.allocator = allocator
        self.waiting: deque[Sequence] = deque()  # read-only outside: queue order
        self.running: list[Sequence] = []  # read-only outside: admission order, last preempted first
        self.num_preemptions = 0
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found cached
        self._cache = allocator if isinstance(allocator, PrefixCachingAllocator) else None
        self._eos = frozenset(int(t) for t in eos_token_ids)
        self._unfinished: dict[str, list[Sequence]] = {}  # request id -> its unfinished sequences
        self._static_batch: set[Sequence] = set()  # the active static batch's unfinished members

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def has_unfinished(self) -> bool:
        return bool(self._unfinished)

    # --8<-- [start:add]
    def add(self, seqs: Sequence | list[Sequence]) -> None:
        """Queue a new request: a sequence, or the whole group of an n > 1 request; ValueError
        if it could never run to completion."""
        group = [seqs] if isinstance(seqs, Sequence) else list(seqs)
        seq = group[0]
        if seq.request_id in self._unfinished:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        if group != seq.group or [s.index for s in group] != list(range(len(group))):
            raise ValueError(f"add takes a request's whole group of sequences, in index order, got {group!r}")
        for member in group:
            if member.status is not SequenceStatus.WAITING or member.num_computed_tokens or member.block_table:
                raise ValueError(f"only new sequences can be added, got {member!r}")
        self.check_fits(seq.num_prompt_tokens, seq.sampling_params.max_tokens)
        self.waiting.extend(group)
        self._unfinished[seq.request_id] = list(group)

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """ValueError unless such a request could run to completion; reads constants only (any thread)."""
        max_model_len = self.config.max_model_len
        if prompt_len > max_model_len:
            raise ValueError(f"prompt of {prompt_len} tokens is longer than max_model_len {max_model_len}")
        # The longest token list it can reach; the last sampled token is never computed.
        longest = min(prompt_len + max_tokens, max(max_model_len, prompt_len + 1))
        needed = blocks_needed(longest - 1, self.config.block_size)
        if needed > self.allocator.num_blocks:
            raise ValueError(
                f"prompt of {prompt_len} tokens with max_tokens {max_tokens} "
                f"needs {needed} KV-cache blocks, the cache has {self.allocator.num_blocks}"
            )

    # --8<-- [end:add]

    def abort(self, request_id: str) -> bool:
        """Finish a waiting or running request (all its sequences) now, freeing their blocks;
        False if not unfinished."""
        seqs = self._unfinished.get(request_id)
        if seqs is None:
            return False
        for seq in list(seqs):
            self.finish(seq, "abort")
        return True

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Finish an unfinished sequence ("stop", "length" or "abort"; for a stop, the stop
        token id or string, if one did it), freeing its blocks. A sequence that has finished
        already keeps its first reason."""
        if seq.is_finished:
            return
        siblings = self._unfinished.get(seq.request_id, ())
        if not any(member is seq for member in siblings):
            raise ValueError(f"{seq!r} does not belong to this scheduler")
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.set_finished(reason, stop_reason)
        del seq.token_ids[seq.num_known_tokens :]  # tokens still on the GPU are not its
        self.allocator.free(seq.block_table)
        seq.block_table = []
        seq.num_registered_blocks = 0
        siblings.remove(seq)
        if not siblings:
            del self._unfinished[seq.request_id]
        self._static_batch.discard(seq)

    # --8<-- [start:schedule]
    def schedule(self) -> ScheduledBatch | None:
        """Pick this step's sequences and token counts, allocating their blocks; None when
        no request is unfinished."""
        budget = self.config.max_num_batched_tokens
        decodes: list[tuple[Sequence, int]] = []
        prefills: list[tuple[Sequence, int]] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            if seq.token_ids[-1] == PENDING_TOKEN and reached_length(seq, seq.num_tokens, self.config.max_model_len):
                index += 1  # its pending token is its last
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self._grow(seq, seq.num_computed_tokens + num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is SequenceStatus.WAITING:  # it had to preempt itself
                break
            self._place(seq, num_new, decodes, prefills)
            budget -= num_new
            index += 1
        if not preempted:
            self._admit(budget, decodes, prefills)
        scheduled = decodes + prefills
        if not scheduled:
            return None
        return ScheduledBatch(
            seqs=[seq for seq, _ in scheduled],
            num_scheduled_tokens=np.array([n for _, n in scheduled], dtype=np.int32),
            samples=np.array([seq.num_computed_tokens + n == seq.num_tokens for seq, n in scheduled]),
            num_decodes=len(decodes),
        )

    # --8<-- [end:schedule]

    # --8<-- [start:launched]
    def launched(self, batch: ScheduledBatch) -> None:
        """The batch is queued on the device: its tokens count as computed, and each
        sampling sequence holds a placeholder for the token it samples (row j of the
        step's sampled tokens for the j-th sampling sequence) until `postprocess`."""
        counts, sampling = batch.num_scheduled_tokens.tolist(), batch.samples.tolist()
        batch.pending_indices = []
        for seq, num_new, samples in zip(batch.seqs, counts, sampling):
            seq.num_computed_tokens += num_new
            if samples:
                seq.pending_sample_row = len(batch.pending_indices)
                batch.pending_indices.append(seq.num_tokens)
                seq.append_token(PENDING_TOKEN)

    # --8<-- [end:launched]

    def postprocess(self, batch: ScheduledBatch, sampled_token_ids: np.ndarray) -> list[Sequence]:
        """Record a launched step's samples: each placeholder becomes its sampled token
        (sampled_token_ids holds them in batch order, batch.num_samples of them), and a
        sequence finishes on EOS, stop_token_ids, max_tokens or max_model_len (a
        placeholder of a later step then goes). Returns the sequences finished here, their
        blocks already freed. Sequences finished while the step ran (aborted, or stopped
        by the step before) are skipped."""
        sampled = np.asarray(sampled_token_ids)
        if sampled.shape != (batch.num_samples,):
            raise ValueError(f"sampled_token_ids must have shape ({batch.num_samples},), got {sampled.shape}")
        sampling = batch.sampling_seqs
        finished = []
        block_size = self.config.block_size
        for seq, index, token in zip(sampling, batch.pending_indices, sampled.tolist()):
            if seq.is_finished:
                continue
            seq.token_ids[index] = token
            # a block computed while this token was pending is full now
            if self._cache is not None and seq.num_computed_tokens // block_size > seq.num_registered_blocks:
                register_computed_blocks(self._cache, seq, block_size)
            reason = check_stop(seq, token, index + 1, self._eos, self.config.max_model_len)
            if reason is not None:
                self.finish(seq, *reason)
                finished.append(seq)
        return finished

    # --8<-- [start:grow]
    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Extend seq's block table to hold num_tokens tokens; False if blocks are short."""
        missing = blocks_needed(num_tokens, self.config.block_size) - len(seq.block_table)
        if missing <= 0:
            return True
        if not self.allocator.can_allocate(missing):
            return False
        seq.block_table.extend(self.allocator.allocate(missing).tolist())
        return True

    # --8<-- [end:grow]

    # --8<-- [start:preempt]
    def _preempt(self, seq: Sequence) -> None:
        self._drop_blocks(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _drop_blocks(self, seq: Sequence) -> None:
        """Free seq's blocks and count nothing computed (cached blocks stay cached, unowned)."""
        self.allocator.free(seq.block_table)
        seq.block_table = []
        seq.num_registered_blocks = 0
        seq.num_computed_tokens = 0

    # --8<-- [end:preempt]

    # --8<-- [start:admit]
    def _admit(self, budget: int, decodes: list, prefills: list) -> None:
        """Move waiting sequences (from the front, in order) to running as limits allow. With
        the prefix cache, one finds cached the blocks this step computes for the sequences
        placed before it (`_place`), so a prefix that many waiting requests share is computed
        once, in the step that admits them. (A prefill whose prompt the budget cuts leaves no
        budget to admit anyone, so no request ever computes a block another is still computing.)"""
        static = self.config.mode == "static"
        if static and not self._static_batch:
            self._choose_static_batch()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if static and seq not in self._static_batch:
                break
            if self._cache is not None and seq.prompt_logprobs is None:  # cached positions have no logits
                num_cached = attach_prefix(self._cache, seq, self.config.block_size)
            else:
                source = prompt_source(seq, self.config.block_size)
                if source is WAIT:
                    break
                num_cached = 0 if source is None else fork_prompt(self.allocator, seq, source, self.config.block_size)
            num_new = min(seq.num_tokens - num_cached, budget)
            if not self._grow(seq, num_cached + num_new):
                self._drop_blocks(seq)
                break
            if self._cache is not None:  # the prefix-cache lookup, counted in tokens
                self.prefix_cache_queries += seq.num_tokens
                self.prefix_cache_hits += num_cached
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = num_cached
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._place(seq, num_new, decodes, prefills)
            budget -= num_new

    def _choose_static_batch(self) -> None:
        """The queue's front whose token lists fit the free blocks, each counted in full: with the
        prefix cache conservative, never short. Nothing is owned here (the last batch ended), and
        a cached block costs one free block as a new one does (unowned cached blocks count free).
        A member finds the blocks of a prefix shared with one admitted before it in the cache
        (at the latest in the step that computes them), so counting the prefix for each is
        conservative."""
        free = self.allocator.num_free
        for seq in self.waiting:
            need = blocks_needed(seq.num_tokens, self.config.block_size)
            if any(sibling in self._static_batch for sibling in seq.group):
                need -= shared_prompt_blocks(seq, self.config.block_size)  # it will share a sibling's
            if len(self._static_batch) == self.config.max_num_seqs or need > free:
                break
            free -= need
            self._static_batch.add(seq)

    # --8<-- [end:admit]

    # --8<-- [start:place]
    def _place(self, seq: Sequence, num_new: int, decodes: list, prefills: list) -> None:
        """Schedule num_new of seq's tokens. With the prefix cache, the blocks they fill are
        registered now, not when the step has run: a request admitted later in this step
        attaches them, since every layer writes the whole step's K/V before any of its
        attention reads the cache."""
        block_size = self.config.block_size
        computed = seq.num_computed_tokens + num_new
        # the guard spares a call per sequence and step (30 us a step at batch 256)
        if self._cache is not None and computed // block_size > seq.num_registered_blocks:
            register_computed_blocks(self._cache, seq, block_size, computed)
        (decodes if num_new == 1 and computed == seq.num_tokens else prefills).append((seq, num_new))

    # --8<-- [end:place]
