"""ModelRunner: turns a scheduled batch into one forward pass and one sampled token per
sampling sequence.

The runner owns everything on the device: the model's weights, the KV arena, the
activation workspace and the step metadata (`step_inputs.py`). For each step it builds the
metadata on the host with NumPy, uploads it into persistent buffers, and queues the
forward and the sampler (`launch`), without waiting for them. `collect` waits for that
step alone and reads its sampled tokens back: one host synchronisation per step, which
the engine makes after it has launched the next step, so the GPU never waits for the
host in between. Decode-only steps replay a captured CUDA graph when the backend can
capture (`cuda_graphs.py`).
"""

from dataclasses import dataclass

import numpy as np

from tinyvllm.backends.base import Backend
from tinyvllm.backends.sampler_options import PLAIN_SAMPLER, SamplerOptions, sampler_options
from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.block_manager import blocks_needed
from tinyvllm.engine.cuda_graphs import DecodeGraphs, graph_buckets, pad_decode_step
from tinyvllm.engine.logprobs import LogprobBuffers, StepLogprobs
from tinyvllm.engine.prompt_logprobs import PromptLogprobs, PromptRows
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import Sequence
from tinyvllm.engine.step_inputs import StepBuffers, build_step
from tinyvllm.engine.token_slots import TokenSlots
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.llama import LlamaModel, Workspace
from tinyvllm.model.step_fields import StepInputs
from tinyvllm.sampling_params import SamplingParams


class ModelRunner:
    def __init__(
        self, config: ModelConfig, weights: dict[str, np.ndarray], backend: Backend, limits: ResolvedEngineConfig
    ):
        self.config = config
        self.backend = backend
        self.limits = limits
        self.model = LlamaModel(config, weights, backend)
        cascade = not limits.disable_cascade_attn
        self.workspace = Workspace(backend, config, limits.max_num_batched_tokens, limits.max_num_seqs, cascade)
        self.buffers = StepBuffers(backend, limits)
        self.token_slots = TokenSlots(backend, limits.max_num_seqs, config.vocab_size, config.stop_token_ids)
        self.logprob_buffers = LogprobBuffers(backend, limits.max_num_seqs, config.vocab_size)
        self.prompt_logprobs = PromptLogprobs(backend, self.model, config.rms_norm_eps)
        self.num_blocks = 0
        self.kv_arena = None
        self.kv_caches: list[tuple] = []
        self.graphs: DecodeGraphs | None = None
        # Where graphs can be captured, a decode step runs padded to its bucket whether it is
        # replayed or (enforce_eager) launched kernel by kernel: every kernel choice (split-K
        # parts, which product) then follows the padded batch, so a replay equals eager bit for bit.
        self.decode_buckets = graph_buckets(limits.max_num_seqs) if backend.can_capture_graphs else []
        # Cascade attention, where the backend has it: decode reads a shared prefix once.
        self.reads_shared_prefix = backend.decode_reads_shared_prefix if cascade else None

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """The arena, zeroed: padding rows of a graph replay read block 0 and must find numbers there."""
        self.num_blocks = num_blocks
        self.kv_arena = self.backend.zeros(
            kv_arena_shape(self.config, num_blocks, self.limits.block_size), self.backend.activation_dtype
        )
        arena = self.kv_arena
        self.kv_caches = [(arena[layer, 0], arena[layer, 1]) for layer in range(arena.shape[0])]

    def capture_decode_graphs(self) -> None:
        """Capture the decode step for every batch-size bucket (after the arena exists)."""
        graphs = DecodeGraphs(self.decode_buckets)
        graphs.capture(self)
        self.graphs = graphs

    # --8<-- [start:warm-up]
    def warm_up(self) -> None:
        """One largest prefill and one decode on a scratch arena: compiles every kernel and
        touches every buffer, so what memory is free afterwards is free for KV blocks."""
        num_tokens = min(self.limits.max_num_batched_tokens, self.limits.max_model_len - 1)
        seq = Sequence("warm-up", [0] * num_tokens, SamplingParams(temperature=0.0, max_tokens=1))
        self.allocate_kv_cache(blocks_needed(num_tokens + 1, self.limits.block_size))
        seq.block_table = list(range(self.num_blocks))
        self.execute(_single(seq, num_tokens))
        seq.num_computed_tokens = num_tokens
        seq.append_token(0)
        self.execute(_single(seq, 1))
        if self.reads_shared_prefix is not None:
            # Two rows of one sequence share its full blocks: the cascade kernels compile too.
            twice = ScheduledBatch([seq, seq], np.array([1, 1], np.int32), np.array([True, True]), num_decodes=2)
            self.execute(twice, reads_shared_prefix=lambda *_: True)
        self.kv_arena = None
        self.kv_caches = []
        self.num_blocks = 0

    # --8<-- [end:warm-up]

    # --8<-- [start:execute]
    def launch(self, batch: ScheduledBatch, reads_shared_prefix=None) -> "LaunchedStep":
        """Queue one scheduled batch on the device; `collect` gives its sampled tokens.
        reads_shared_prefix: `build_step`'s, in place of the backend's."""
        slots = self.token_slots.assign(batch)
        limits = self.limits
        step = build_step(
            batch, limits.block_size, limits.max_blocks_per_seq, slots, reads_shared_prefix or self.reads_shared_prefix
        )
        options = sampler_options(step.penalty_slots, step.temperature, step.min_p, step.num_logprobs)
        decode_only = step.num_decode == step.context_lens.shape[0]
        prompt_rows = None
        bucket = next((size for size in self.decode_buckets if size >= step.num_decode), None)
        if decode_only and bucket is not None:
            padded = pad_decode_step(step, bucket)
            if self.graphs is not None:
                self.graphs.replay(self, padded, options)
            else:
                self.forward_and_sample(self.buffers.upload(padded), options)
        else:
            inputs = self.buffers.upload(step)
            self.forward_and_sample(inputs, options)
            if not decode_only:
                residual = self.backend.prefix(self.workspace.residual, inputs.num_tokens)
                prompt_rows = self.prompt_logprobs.compute(batch, step.positions, residual)
        num_sampled, turn = step.sample_rows.shape[0], self.buffers.turn
        host, done = self.buffers.sampled_host[turn], self.buffers.sampled_ready[turn]
        self.backend.download_async(self.buffers.sampled, host, num_sampled)
        logprobs = self.logprob_buffers.download(turn, num_sampled) if options.logprobs else None
        self.backend.record(done)
        return LaunchedStep(host, num_sampled, done, logprobs, prompt_rows)

    def collect(self, launched: "LaunchedStep") -> np.ndarray:
        """Wait for a launched step; return the sampled token of each sampling sequence."""
        self.backend.wait(launched.done)
        return launched.host[: launched.num_sampled].copy()

    def execute(self, batch: ScheduledBatch, reads_shared_prefix=None) -> np.ndarray:
        """`launch`, then `collect`: one step, start to finish."""
        return self.collect(self.launch(batch, reads_shared_prefix))

    def forward_and_sample(self, inputs: StepInputs, options: SamplerOptions = PLAIN_SAMPLER) -> None:
        """The device work of a step (what a graph captures): the tokens sampled by the
        previous step go into the rows that wait for them, and this step's sampled tokens
        to the leading rows of `buffers.sampled`; the `options` kernels change the logits
        before the draw, and the penalties' counts take the drawn tokens after it. Logprobs
        are of the raw logits: a copy of them when the penalties or min-p change the row."""
        ops, state = self.backend, self.token_slots.state
        ops.feed_sampled_tokens(inputs.token_ids, inputs.token_sources, self.buffers.sampled)
        logits = self.model.forward(inputs, self.kv_caches, self.workspace)
        num_sampled = inputs.sample_rows.shape[0]
        sampled = ops.prefix(self.buffers.sampled, num_sampled)
        raw_logits = logits
        if options.logprobs and (options.penalties or options.min_p):
            raw_logits = ops.prefix(self.logprob_buffers.raw_logits, num_sampled)
            ops.copy(logits, raw_logits)
        if options.penalties:
            ops.apply_penalties(
                logits,
                state,
                inputs.penalty_slots,
                inputs.presence_penalty,
                inputs.frequency_penalty,
                inputs.repetition_penalty,
                inputs.mask_stop_tokens,
            )
        if options.min_p:
            ops.apply_min_p(logits, inputs.temperature, inputs.min_p)
        ops.sample(
            logits,
            inputs.temperature,
            inputs.top_k,
            inputs.top_p,
            inputs.seeds,
            inputs.sample_positions,
            sampled,
            self.workspace.sample_scratch,
        )
        if options.penalties:
            ops.count_sampled_tokens(state, inputs.penalty_slots, sampled)
        if options.logprobs:
            out = self.logprob_buffers.device
            ops.compute_logprobs(
                raw_logits,
                inputs.num_logprobs,
                sampled,
                ops.prefix(out.top_ids, num_sampled),
                ops.prefix(out.top_logprobs, num_sampled),
                ops.prefix(out.sampled_logprobs, num_sampled),
                ops.prefix(out.sampled_ranks, num_sampled),
            )

    # --8<-- [end:execute]


@dataclass
class LaunchedStep:
    """A step queued on the device: where its sampled tokens (and, when a row asked, its
    logprobs) will land, how many, and the event that marks them there."""

    host: np.ndarray
    num_sampled: int
    done: object
    logprobs: StepLogprobs | None = None
    prompt_rows: PromptRows | None = None


def _single(seq: Sequence, num_tokens: int) -> ScheduledBatch:
    return ScheduledBatch(
        seqs=[seq],
        num_scheduled_tokens=np.array([num_tokens], dtype=np.int32),
        samples=np.array([True]),
        num_decodes=int(num_tokens == 1),
    )


# --8<-- [start:arena-shape]
def kv_arena_shape(config: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """[layers, K|V, blocks, block_size, kv_heads, head_dim]: one block id serves every layer."""
    return (config.num_hidden_layers, 2, num_blocks, block_size, config.num_key_value_heads, config.head_dim)


def kv_block_bytes(config: ModelConfig, block_size: int, dtype) -> int:
    return int(np.prod(kv_arena_shape(config, 1, block_size))) * np.dtype(dtype).itemsize


# --8<-- [end:arena-shape]
