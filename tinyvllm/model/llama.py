"""The Llama forward pass, written as operator calls on a backend.

One step runs a packed batch of T tokens from S sequences: first the decode tokens (one
per decoding sequence), then the prefill chunks. The embeddings start the residual
stream, and each layer adds its two sublayers' outputs to it:

    [q | k | v] = rmsnorm(residual) [Wq | Wk | Wv]^T  (q, k and v as one GEMM)
    q = rope(q);  cache[slot] = rope(k), v           (rotary embedding + paged KV write, fused;
                                                      in the GEMV's store when it runs)
    a = attention(q, cache)                          (paged decode | flash prefill)
    residual += a Wo^T                               (the add in the product's store)
    h = rmsnorm(residual)
    residual += (silu(h Wg^T) * h Wu^T) Wd^T         (gate and up as one GEMM, rows interleaved)

Each norm travels with the product that reads it (`RMSNorm`): the GEMV applies it as it
multiplies, the other kernels read rows the norm's own kernel wrote to `normed`. At the
end only the rows that sample are gathered, normed and projected to float32 logits.
All intermediate buffers are allocated once (`Workspace`) for the largest step
and sliced per step, so a step allocates no device memory and can be graph-captured.
"""

from dataclasses import dataclass

import numpy as np

from tinyvllm.backends.base import Backend, DeviceArray
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.rope import rope_inv_freq
from tinyvllm.model.step_fields import StepInputs


@dataclass
class LayerWeights:
    input_norm: DeviceArray
    qkv_proj: DeviceArray
    o_proj: DeviceArray
    post_attention_norm: DeviceArray
    gate_up_proj: DeviceArray
    down_proj: DeviceArray


# --8<-- [start:workspace]
class Workspace:
    """The activation buffers of the largest step, allocated once (with `cascade`, decode
    attention's scratch holds cascade attention's states too)."""

    def __init__(self, backend: Backend, config: ModelConfig, max_tokens: int, max_sampled: int, cascade: bool = False):
        dtype = backend.activation_dtype
        hidden = config.hidden_size
        self.residual = backend.empty((max_tokens, hidden), dtype)
        self.normed = backend.empty((max_tokens, hidden), dtype)
        qkv_heads = config.num_attention_heads + 2 * config.num_key_value_heads
        self.qkv = backend.empty((max_tokens, qkv_heads * config.head_dim), dtype)
        self.q = backend.empty((max_tokens, config.num_attention_heads, config.head_dim), dtype)
        self.attn = backend.empty((max_tokens, config.num_attention_heads, config.head_dim), dtype)
        self.gate_up = backend.empty((max_tokens, 2 * config.intermediate_size), dtype)
        self.act = backend.empty((max_tokens, config.intermediate_size), dtype)
        self.sampled_residual = backend.empty((max_sampled, hidden), dtype)
        self.sampled_normed = backend.empty((max_sampled, hidden), dtype)
        self.logits = backend.empty((max_sampled, config.vocab_size), np.float32)
        self.decode_scratch = backend.decode_scratch(max_sampled, config, cascade)  # a decode row samples
        self.sample_scratch = backend.sample_scratch(max_sampled, config.vocab_size)


# --8<-- [end:workspace]


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray], backend: Backend):
        self.config = config
        self.backend = backend
        self.embed_tokens = backend.weight(weights["model.embed_tokens.weight"])
        self.lm_head = self.embed_tokens if config.tie_word_embeddings else backend.weight(weights["lm_head.weight"])
        self.norm = backend.weight(weights["model.norm.weight"])
        self.inv_freq = backend.constant(rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling))
        self.layers = [self._layer(weights, f"model.layers.{i}.", backend) for i in range(config.num_hidden_layers)]

    @staticmethod
    def _layer(weights: dict[str, np.ndarray], prefix: str, backend: Backend) -> LayerWeights:
        attention = prefix + "self_attn."
        qkv = np.concatenate([weights[attention + name + "_proj.weight"] for name in ("q", "k", "v")])
        gate_up = interleave_rows(weights[prefix + "mlp.gate_proj.weight"], weights[prefix + "mlp.up_proj.weight"])
        return LayerWeights(
            input_norm=backend.weight(weights[prefix + "input_layernorm.weight"]),
            qkv_proj=backend.weight(qkv),
            o_proj=backend.weight(weights[attention + "o_proj.weight"]),
            post_attention_norm=backend.weight(weights[prefix + "post_attention_layernorm.weight"]),
            gate_up_proj=backend.weight(gate_up),
            down_proj=backend.weight(weights[prefix + "mlp.down_proj.weight"]),
        )

    # --8<-- [start:forward]
    def forward(self, step: StepInputs, kv_caches: list[tuple], ws: Workspace):
        """Run one step over the per-layer (K, V) caches; returns the float32 logits of the
        sampled rows (a workspace view)."""
        ops, eps = self.backend, self.config.rms_norm_eps
        tokens, num_decode = step.num_tokens, step.num_decode
        num_sampled = step.sample_rows.shape[0]
        # Views are made once per step, outside the layer loop: on the GPU each costs tens
        # of microseconds of Python, as much as a kernel launch.
        rows = ops.prefix
        residual, normed = rows(ws.residual, tokens), rows(ws.normed, tokens)
        qkv, q, attn = rows(ws.qkv, tokens), rows(ws.q, tokens), rows(ws.attn, tokens)
        gate_up, act = rows(ws.gate_up, tokens), rows(ws.act, tokens)
        flat_attn = attn.reshape(tokens, -1)
        if num_decode:
            decode_q, decode_attn = rows(q, num_decode), rows(attn, num_decode)
            decode_tables, decode_lens = rows(step.block_tables, num_decode), rows(step.context_lens, num_decode)
            shared = step.shared_prefix_len if step.num_shared_tokens else None  # cascade attention
        if step.num_prefill_seqs:
            sequences = slice(num_decode, num_decode + step.num_prefill_seqs)
            prefill_q, prefill_attn = q[num_decode:], attn[num_decode:]
            prefill_tables, prefill_lens = step.block_tables[sequences], step.context_lens[sequences]

        ops.embedding(step.token_ids, self.embed_tokens, residual)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            ops.linear_rope_write_kv(
                residual,
                layer.qkv_proj,
                qkv,
                step.positions,
                self.inv_freq,
                step.slot_mapping,
                q,
                k_cache,
                v_cache,
                RMSNorm(layer.input_norm, eps, normed),
            )
            if num_decode:
                ops.decode_attention(
                    decode_q, k_cache, v_cache, decode_tables, decode_lens, decode_attn, ws.decode_scratch, shared
                )
            if step.num_prefill_seqs:
                ops.prefill_attention(
                    prefill_q, k_cache, v_cache, prefill_tables, step.prefill_cu_seqlens, prefill_lens, prefill_attn
                )
            ops.linear(flat_attn, layer.o_proj, residual, accumulate=True)
            ops.linear_silu_mul(
                residual, layer.gate_up_proj, gate_up, act, RMSNorm(layer.post_attention_norm, eps, normed)
            )
            ops.linear(act, layer.down_proj, residual, accumulate=True)

        sampled_residual, logits = rows(ws.sampled_residual, num_sampled), rows(ws.logits, num_sampled)
        ops.gather_rows(step.sample_rows, residual, sampled_residual)
        sampled_normed = rows(ws.sampled_normed, num_sampled)
        ops.linear(sampled_residual, self.lm_head, logits, RMSNorm(self.norm, eps, sampled_normed))
        return logits

    # --8<-- [end:forward]


def interleave_rows(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """[gate row 0, up row 0, gate row 1, ...]: the layout of a layer's gate|up weight, which
    lets the batch-1 GEMV fuse SwiGLU's activation into its store (`kernels.activation`)."""
    return np.stack([gate, up], axis=1).reshape(2 * gate.shape[0], *gate.shape[1:])
