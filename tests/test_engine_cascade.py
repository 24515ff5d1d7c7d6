"""Cascade attention in the engine: decode sequences that the prefix cache gave the same
leading blocks read them once for all, and their greedy tokens are those of the NumPy
engine (the kernel itself: tests/test_attention_cascade.py).

The engine runs with its default configuration, which allows cascade attention, and the
variant table's thresholds are lowered so that a tiny batch takes the cascade path; under
the simulator the kernels run eagerly, on the GPU through the decode graphs too.
"""

import numpy as np
import pytest

from tests.helpers import SIMULATOR, assert_no_leak, assert_parts_only_at_near_ties
from tests.random_llama import BYTES_SPECIAL_TOKENS, TINY_OVERRIDES, make_random_llama_dir, save_bytes_tokenizer
from tests.test_engine import ENGINE_SIMULATOR_OVERRIDES
from tinyvllm import LLM, SamplingParams
from tinyvllm.backends import variants
from tinyvllm.kernels import attention_cascade


@pytest.fixture
def cascade_calls(monkeypatch):
    """The variant table's thresholds lowered to a tiny batch's, and the rows of each call
    of the cascade kernels (the step's shared-prefix length stays on the device)."""
    monkeypatch.setattr(variants, "CASCADE_MIN_SEQS", 2)
    monkeypatch.setattr(variants, "CASCADE_MIN_TOKENS", 4)
    calls = []
    launch = attention_cascade.cascade_decode_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return launch(*args, **kwargs)

    monkeypatch.setattr(attention_cascade, "cascade_decode_attention", counted)
    return calls


def test_sequences_sharing_cached_blocks_decode_through_cascade_attention_as_without(tmp_path, cascade_calls):
    if SIMULATOR:
        overrides = ENGINE_SIMULATOR_OVERRIDES
        tokenizer = save_bytes_tokenizer(
            tmp_path / "tokenizer.json", overrides["vocab_size"] - len(BYTES_SPECIAL_TOKENS)
        )
        model = make_random_llama_dir(tmp_path / "sim", tokenizer=tokenizer, config_overrides=overrides)
        prefix_len, count, max_tokens, eager = 8, 3, 2, True
        limits = {"block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 32}
        cuda_limits = {"linear_backend": "tiled"}  # the GEMV's 256-thread blocks cost more in the simulator
    else:
        model = make_random_llama_dir(tmp_path / "tiny", tokenizer="bytes", config_overrides=TINY_OVERRIDES)
        prefix_len, count, max_tokens, eager = 64, 12, 12, False
        limits = {"block_size": 16, "max_num_seqs": 16, "max_model_len": 256}
        cuda_limits = {}
    rng = np.random.default_rng(3)
    prefix = rng.integers(0, 100, prefix_len).tolist()
    prompts = [prefix + rng.integers(0, 100, int(rng.integers(1, 6))).tolist() for _ in range(count)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    reference = LLM(model, backend="numpy", activation_dtype="bf16", num_blocks=256, **limits)
    expected = [output.outputs[0].token_ids for output in reference.generate(prompts, params)]
    llm = LLM(model, backend="cuda", num_blocks=256, enforce_eager=eager, **limits, **cuda_limits)  # cascade allowed
    cascade_calls.clear()  # the warm-up's
    llm.generate(prompts[:1], params)  # caches the prefix: the others' prompts find it
    actual = [output.outputs[0].token_ids for output in llm.generate(prompts[1:], params)]
    assert_parts_only_at_near_ties(reference, llm, prompts[1:], actual, expected[1:], max_partings=count // 4)
    # every decoding sequence took part (a graph's first step also has its padding rows)
    assert cascade_calls and max(cascade_calls) >= count - 1
    assert_no_leak(llm)
