"""Prompt logprobs: the logprob of each prompt token given the tokens before it.

The forward computes the LM head only for the rows that sample. For a sequence that asks for
`SamplingParams.prompt_logprobs`, the logprob of prompt token t + 1 is read from the logits at
position t, for every prompt position the step computes (a chunked prefill gives a few of them
each step; the last prompt position, which samples, has no prompt token after it). After the
forward, while the residual stream still holds those rows, `PromptLogprobs.compute` runs the
final norm, the LM head and the logprobs kernel over them, `ROWS_PER_SLICE` rows at a time, so
that the logits it holds are ROWS_PER_SLICE x vocab however long the prompt, and reads each
slice back at once (a prefill step is never a CUDA graph; steps where nobody asks skip it).

A recomputed sequence (after preemption) computes its prompt again; entries already filled are
kept. Such a sequence never reads its prompt from the prefix cache (the scheduler skips it), as
a cached position has no logits.
"""

from dataclasses import dataclass

import numpy as np

from tinyvllm.backends.base import Backend
from tinyvllm.engine.logprobs import LogprobBuffers, StepLogprobs, logprob_entry
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import Sequence
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.model.llama import LlamaModel
from tinyvllm.model.tokenizer import Tokenizer

ROWS_PER_SLICE = 64
"""Prompt positions whose logits one LM-head product computes."""


@dataclass
class PromptRows:
    """A step's prompt positions with logprobs, on the host: each row's sequence and position."""

    targets: list[tuple[Sequence, int]]
    values: StepLogprobs


class PromptLogprobs:
    """The slice buffers (the normed rows and the logits of ROWS_PER_SLICE positions, and the
    logprobs kernel's outputs) and the pass over a step's prompt positions."""

    def __init__(self, backend: Backend, model: LlamaModel, eps: float):
        hidden, vocab = model.config.hidden_size, model.config.vocab_size
        self.backend, self.model, self.eps = backend, model, eps
        self.rows = backend.empty((ROWS_PER_SLICE, hidden), backend.activation_dtype)
        self.normed = backend.empty((ROWS_PER_SLICE, hidden), backend.activation_dtype)
        self.buffers = LogprobBuffers(backend, ROWS_PER_SLICE, vocab)

    def compute(self, batch: ScheduledBatch, positions: np.ndarray, residual) -> PromptRows | None:
        """The logprobs of the prompt tokens after the step's positions of sequences that ask,
        from `residual` (the forward's rows, in step order); None when none asks. Only the
        prefill sequences are looked at: a decode row is never a prompt position with a prompt
        token after it."""
        targets, rows = [], []
        row = batch.num_decodes
        prefills = batch.seqs[batch.num_decodes :]
        for seq, count in zip(prefills, batch.num_scheduled_tokens[batch.num_decodes :].tolist()):
            if seq.sampling_params.prompt_logprobs is not None:
                for offset, position in enumerate(positions[row : row + count].tolist()):
                    if position + 1 < seq.num_prompt_tokens:
                        targets.append((seq, position))
                        rows.append(row + offset)
            row += count
        if not targets:
            return None
        parts = [self._slice(targets[i : i + ROWS_PER_SLICE], rows[i : i + ROWS_PER_SLICE], residual)
                 for i in range(0, len(targets), ROWS_PER_SLICE)]  # fmt: skip
        return PromptRows(
            targets, StepLogprobs(*(np.concatenate(arrays) for arrays in zip(*(p.arrays() for p in parts))))
        )

    def _slice(self, targets: list[tuple[Sequence, int]], rows: list[int], residual) -> StepLogprobs:
        ops, count = self.backend, len(rows)
        next_tokens = np.array([seq.token_ids[position + 1] for seq, position in targets], np.int32)
        counts = np.array([seq.sampling_params.prompt_logprobs for seq, _ in targets], np.int32)
        gathered, normed = ops.prefix(self.rows, count), ops.prefix(self.normed, count)
        logits, out = ops.prefix(self.buffers.raw_logits, count), self.buffers.device
        ops.gather_rows(ops.constant(np.array(rows, np.int32)), residual, gathered)
        ops.linear(gathered, self.model.lm_head, logits, RMSNorm(self.model.norm, self.eps, normed))
        ops.compute_logprobs(
            logits,
            ops.constant(counts),
            ops.constant(next_tokens),
            ops.prefix(out.top_ids, count),
            ops.prefix(out.top_logprobs, count),
            ops.prefix(out.sampled_logprobs, count),
            ops.prefix(out.sampled_ranks, count),
        )
        host = self.buffers.download(0, count)
        ops.synchronize()
        return StepLogprobs(*(array.copy() for array in host.arrays()))


def record_prompt_logprobs(tokenizer: Tokenizer, prompt_rows: PromptRows) -> None:
    """Fill each target's entry (position + 1 of its request's prompt_logprobs) once."""
    for row, (seq, position) in enumerate(prompt_rows.targets):
        if seq.prompt_logprobs[position + 1] is None:
            token, count = seq.token_ids[position + 1], seq.sampling_params.prompt_logprobs
            seq.prompt_logprobs[position + 1] = logprob_entry(tokenizer, prompt_rows.values, row, token, count)
