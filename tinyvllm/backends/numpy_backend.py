"""Backends: where the model's arrays live and which code runs its operators.

The model (`model/llama.py`) is written once, as a sequence of operator calls on a
backend. Both backends implement the Backend protocol (`base.py`: the operators with the
kernels' signatures, inputs then preallocated outputs), so the forward pass and the
engine above it do not know which one they run on:

- `CudaBackend`: arrays are Numba device arrays; each operator is a `@cuda.jit` kernel
  (or cuBLAS) launched on one stream, which the runner can capture into a CUDA graph.
- `NumpyBackend`: arrays are NumPy arrays; each operator is the NumPy reference from
  `kernels/reference.py`. Activations are stored as bf16 bits like on the GPU
  (`activation_dtype="bf16"`, rounding at the same points as the kernels) or as float32
  (`"float32"`, the closest to the real-valued model, used as the oracle against
  transformers). Weights are widened to float32 once, at load.

Both store the KV cache as one arena `[layers, 2, num_blocks, block_size, kv_heads,
head_dim]`; a layer's K (or V) is the contiguous view `arena[layer, 0]` (or 1).
"""

import numpy as np

from tinyvllm.config import ACTIVATION_DTYPES
from tinyvllm.kernels import reference
from tinyvllm.kernels import token_state as _tokens
from tinyvllm.kernels.reference import from_bf16, gumbel_noise, to_bf16


class NumpyBackend:
    """The NumPy reference operators behind the kernel signatures (host memory)."""

    name = "numpy"
    has_device_memory = False
    can_capture_graphs = False

    def __init__(self, activation_dtype: str = "float32"):
        if activation_dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"activation_dtype: expected one of {ACTIVATION_DTYPES}, got {activation_dtype!r}")
        self.activation_dtype = np.dtype(np.uint16 if activation_dtype == "bf16" else np.float32)

    # -- memory -----------------------------------------------------------------
    def weight(self, bits: np.ndarray) -> np.ndarray:
        """A bf16 weight, widened once to float32 for NumPy's matrix products."""
        return from_bf16(bits)

    def constant(self, array: np.ndarray) -> np.ndarray:
        return array

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def zeros(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def pinned_empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def prefix(self, array: np.ndarray, rows: int) -> np.ndarray:
        return array[:rows]

    def upload_bytes(self, host: np.ndarray, device: np.ndarray, nbytes: int) -> None:
        device[:nbytes] = host[:nbytes]

    def upload_row(self, host: np.ndarray, device: np.ndarray, row: int) -> None:
        device[row] = host

    def download_async(self, device: np.ndarray, host: np.ndarray, count: int) -> None:
        host[:count] = device[:count]

    def new_event(self) -> None:
        """Nothing runs asynchronously on the host: there is nothing to wait for."""

    def record(self, event: None) -> None:
        """Nothing to mark."""

    def wait(self, event: None) -> None:
        """The work before `event` is done already."""

    def synchronize(self) -> None:
        """Nothing runs asynchronously on the host."""

    def memory_info(self) -> tuple[int, int]:
        raise NotImplementedError("memory_info: the NumPy backend holds host memory (has_device_memory is False)")

    # -- graphs: none on the host ---------------------------------------------------
    def begin_capture(self) -> None:
        raise NotImplementedError("begin_capture: the NumPy backend cannot capture graphs")

    def end_capture(self) -> None:
        raise NotImplementedError("end_capture: the NumPy backend cannot capture graphs")

    def launch_graph(self, graph: None) -> None:
        raise NotImplementedError("launch_graph: the NumPy backend cannot capture graphs")

    # -- activations in and out ----------------------------------------------------
    @staticmethod
    def _read(array: np.ndarray) -> np.ndarray:
        return from_bf16(array) if array.dtype == np.uint16 else array

    @staticmethod
    def _write(out: np.ndarray, values: np.ndarray) -> None:
        out[...] = to_bf16(values) if out.dtype == np.uint16 else values

    # -- operators ---------------------------------------------------------------
    def embedding(self, token_ids, table, out) -> None:
        self._write(out, reference.embedding(token_ids, self._read(table)))

    def feed_sampled_tokens(self, token_ids, token_sources, sampled) -> None:
        token_ids[...] = reference.feed_sampled_tokens(token_ids, token_sources, sampled)

    def gather_rows(self, indices, source, out) -> None:
        out[...] = source[indices]

    def _normed_rows(self, x, norm):
        """x, or with `norm` its rows normed into norm.normed (rounded as stored)."""
        if norm is None:
            return self._read(x)
        self._write(norm.normed, reference.rmsnorm(self._read(x), norm.weight, norm.eps))
        return self._read(norm.normed)

    def linear(self, x, weight, out, norm=None, accumulate=False) -> None:
        product = reference.linear(self._normed_rows(x, norm), weight)
        self._write(out, self._read(out) + product if accumulate else product)

    def linear_rope_write_kv(
        self, x, weight, qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache, norm=None
    ) -> None:
        self.linear(x, weight, qkv, norm)
        self._rope_write_kv(qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache)

    def _rope_write_kv(self, qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache) -> None:
        """reference.rope_write_kv, rounding the rotated q and k heads once, as the kernel
        stores them; the value heads go to the cache as they are."""
        num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
        heads = qkv.reshape(q.shape[0], -1, q.shape[2])
        queries_and_keys = heads[:, : num_q_heads + num_kv_heads]
        rotated = np.empty_like(queries_and_keys)
        self._write(rotated, reference.rope(self._read(queries_and_keys), positions, inv_freq))
        q[...] = rotated[:, :num_q_heads]
        values = heads[:, num_q_heads + num_kv_heads :]
        reference.write_kv(rotated[:, num_q_heads:], values, k_cache, v_cache, slot_mapping)

    def linear_silu_mul(self, x, weight, gate_up, out, norm=None) -> None:
        self.linear(x, weight, gate_up, norm)
        self._write(out, reference.silu_mul(self._read(gate_up)))

    def prefill_attention(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out) -> None:
        self._write(
            out,
            reference.paged_attention(
                self._read(q), self._read(k_cache), self._read(v_cache), block_tables, cu_seqlens_q, context_lens
            ),
        )

    def decode_scratch(self, max_seqs: int, config, cascade: bool = False) -> None:
        """The NumPy decode needs no split-K scratch."""

    def decode_attention(
        self, q, k_cache, v_cache, block_tables, context_lens, out, scratch, shared_prefix_len=None
    ) -> None:
        cu_seqlens_q = np.arange(q.shape[0] + 1, dtype=np.int32)
        self.prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out)

    def decode_reads_shared_prefix(self, num_seqs: int, shared_tokens: int) -> bool:
        """Never: a shared prefix read once would save the NumPy decode nothing it spends."""
        return False

    def sample_scratch(self, max_rows: int, vocab: int) -> None:
        """The NumPy sampler needs no per-part scratch."""

    def sample(self, logits, temperature, top_k, top_p, seeds, positions, out, scratch) -> None:
        """Greedy rows take the argmax; the others the Gumbel-max draw over the filtered
        distribution, with the kernel's noise for (seed, position): the same token the GPU
        draws (up to float rounding), and the same again when a sequence is recomputed."""
        for row in range(logits.shape[0]):
            if temperature[row] == 0:
                out[row] = reference.argmax(logits[row])
                continue
            probs = reference.sampling_probs(logits[row], temperature[row], top_k[row], top_p[row])
            noise = gumbel_noise(int(seeds[row]), int(positions[row]), probs.size)
            out[row] = np.argmax(np.where(probs > 0, logits[row] / temperature[row] + noise, -np.inf))

    def apply_penalties(self, logits, token_state, slots, presence, frequency, repetition, mask_stop_tokens) -> None:
        for row in np.flatnonzero(slots >= 0):
            state = token_state[slots[row]]
            penalized = reference.apply_penalties(
                logits[row],
                _tokens.output_counts(state),
                _tokens.seen(state),
                presence[row],
                frequency[row],
                repetition[row],
            )
            if mask_stop_tokens[row]:
                penalized[_tokens.stop_tokens(state)] = -np.inf
            logits[row] = penalized

    def apply_min_p(self, logits, temperature, min_p) -> None:
        for row in range(logits.shape[0]):
            logits[row] = reference.min_p_filter(logits[row], temperature[row], min_p[row])

    def compute_logprobs(
        self, logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks
    ) -> None:
        for row in np.flatnonzero(num_logprobs >= 0):
            count = num_logprobs[row]
            logprob, rank, ids, values = reference.logprobs(logits[row], sampled[row], count)
            sampled_logprobs[row], sampled_ranks[row] = logprob, rank
            top_ids[row, :count], top_logprobs[row, :count] = ids, values

    def copy(self, source, out) -> None:
        out[...] = source

    def count_sampled_tokens(self, token_state, slots, sampled) -> None:
        rows = slots >= 0
        token_state[slots[rows], sampled[rows]] += 1
