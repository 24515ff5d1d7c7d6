"""The engine end to end on a tiny random Llama: batching policies and preemption never
change greedy tokens, bad requests fail alone, and no KV block leaks.

The NumPy backend runs everywhere; the CUDA backend runs the real kernels (under the
simulator here, on the GPU on the H200) and must agree with it token for token.
"""

import numpy as np
import pytest

from tests.helpers import SIMULATOR, assert_no_leak, assert_parts_only_at_near_ties
from tests.operator_check import all_outputs, within_tolerance, worst_operator_errors
from tests.random_llama import (
    BYTES_SPECIAL_TOKENS,
    TINY_OVERRIDES,
    make_random_llama_dir,
    save_bytes_tokenizer,
)
from tinyvllm import LLM, SamplingParams
from tinyvllm.engine.sequence import token_bytes


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


def _prompts(count: int, seed: int, max_len: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(rng.integers(1, max_len))).tolist() for _ in range(count)]


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params)]


def _one_at_a_time(llm: LLM, prompts, params) -> list[list[int]]:
    return [llm.generate([prompt], param)[0].outputs[0].token_ids for prompt, param in zip(prompts, params)]


# --8<-- [start:policies]
def test_batching_policies_and_preemption_give_identical_greedy_tokens(tiny_model):
    prompts = _prompts(12, seed=1)
    params = [_greedy(int(n)) for n in np.random.default_rng(2).integers(1, 24, size=12)]
    expected = _one_at_a_time(LLM(tiny_model, backend="numpy", block_size=4), prompts, params)
    for mode in ("continuous", "static"):
        llm = LLM(tiny_model, backend="numpy", mode=mode, block_size=4, max_num_seqs=8)
        assert _tokens(llm, prompts, params) == expected, mode
        assert_no_leak(llm)
    # An arena of 16 four-token blocks holds about two sequences: preemption must happen.
    small = LLM(tiny_model, backend="numpy", block_size=4, num_blocks=16, max_num_seqs=8)
    assert _tokens(small, prompts, params) == expected
    assert small.engine.scheduler.num_preemptions > 0
    assert_no_leak(small)


# --8<-- [end:policies]


SIMULATOR_OVERRIDES = {
    **TINY_OVERRIDES,
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
    "vocab_size": 264,
}
"""Smaller still for the simulator, which runs a Python thread per CUDA thread."""


ENGINE_SIMULATOR_OVERRIDES = {**SIMULATOR_OVERRIDES, "hidden_size": 16, "intermediate_size": 16, "vocab_size": 128}
"""Smaller again for the engine test under the simulator, where a step costs about what its
tiled GEMMs' 256-thread blocks do, one K step of 16 and one 128-wide N tile at a time: one
K step for each product but the attention output's (two, at two 16-wide query heads over
one KV head), and a one-tile LM head. The kernels at SIMULATOR_OVERRIDES' sizes (two to
four K steps, a ragged three-tile LM head) are compared operator by operator in the next
test."""


def test_cuda_kernels_agree_with_numpy_backend_in_every_policy(tiny_model, tmp_path):
    """The real kernels (simulated here, on the GPU on the H200) against the NumPy backend
    storing activations as bf16 like the kernels do: the same greedy tokens as one request
    at a time, in continuous and static batches and under preemption, but where a quarter
    of the runs at most part at near-ties (on the GPU the random model has such ties:
    two of the twelve part, at reference gaps of 0.005 and 0.010 where the engines'
    logits differ by 0.018 and 0.017, as the bf16 and float32 references do by 0.013
    and 0.015, before and after the batched merge alike). The GPU takes twelve
    requests on the tiny model. The simulator gets a one-layer model barely large enough
    for GQA (ENGINE_SIMULATOR_OVERRIDES), the tiled GEMM (the GEMV's 256-thread blocks
    cost more there), and two requests of one full block and two tokens each: a batched
    prefill and a batched decode, seven forward passes for the three engines. In the
    two-block arena the decode must preempt (each request needs a second block), and the
    preempted request's recompute spans two blocks. max_model_len 128 keeps decode
    attention split (two partitions; eight at the default 512, each a block of 128
    threads)."""
    if SIMULATOR:
        overrides = ENGINE_SIMULATOR_OVERRIDES
        tokenizer = save_bytes_tokenizer(
            tmp_path / "tokenizer.json", overrides["vocab_size"] - len(BYTES_SPECIAL_TOKENS)
        )
        model = make_random_llama_dir(tmp_path / "sim", tokenizer=tokenizer, config_overrides=overrides)
        prompts, params = [[3, 1, 4, 1], [9, 2, 6, 5]], [_greedy(2), _greedy(2)]
        limits = {"block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 128}
        cramped_blocks = 2
    else:
        model, prompts = tiny_model, _prompts(12, seed=5)
        params = [_greedy(int(n)) for n in np.random.default_rng(6).integers(1, 25, size=12)]
        limits = {"block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 64}
        cramped_blocks = 16
    cuda_args = {"backend": "cuda", "linear_backend": "tiled" if SIMULATOR else "auto", **limits}
    reference = LLM(model, backend="numpy", activation_dtype="bf16", num_blocks=256, **limits)
    expected = _one_at_a_time(reference, prompts, params)

    def assert_agrees(llm, actual):
        assert_parts_only_at_near_ties(reference, llm, prompts, actual, expected, max_partings=len(prompts) // 4)

    roomy = LLM(model, num_blocks=256, **cuda_args)
    assert_agrees(roomy, _tokens(roomy, prompts, params))
    static = LLM(model, num_blocks=256, mode="static", **cuda_args)
    assert_agrees(static, _tokens(static, prompts, params))
    cramped = LLM(model, num_blocks=cramped_blocks, **cuda_args)
    assert_agrees(cramped, _tokens(cramped, prompts, params))
    assert cramped.engine.scheduler.num_preemptions > 0
    if not SIMULATOR:
        assert_agrees(roomy, _one_at_a_time(roomy, prompts, params))
    for llm in (roomy, static, cramped):
        assert_no_leak(llm)


def test_every_kernel_matches_the_bf16_reference_on_its_own_inputs(tiny_model, tmp_path):
    """Each operator of the forward, prefill and decode, fed the kernels' own inputs
    (tests/operator_check.py): the simulator on a one-layer model with the tiled GEMM,
    the GPU on the tiny model with cuBLAS and the GEMV. (SmolLM2: test_gpu_engine.py.)"""
    if SIMULATOR:
        model = make_random_llama_dir(tmp_path / "sim", tokenizer="bytes", config_overrides=SIMULATOR_OVERRIDES)
        prompts, limits = [[3, 1, 4], [9, 2]], {"max_num_batched_tokens": 16, "linear_backend": "tiled"}
    else:
        model, prompts, limits = tiny_model, _prompts(4, seed=7), {}
    llm = LLM(model, backend="cuda", block_size=4, num_blocks=64, enforce_eager=True, **limits)
    worst = worst_operator_errors(llm, prompts, max_tokens=2)
    assert set(worst) == all_outputs()
    assert within_tolerance(worst), worst


def test_chunked_prefill_matches_whole_prefill(tiny_model):
    prompts = _prompts(6, seed=3, max_len=120)
    params = _greedy(12)
    whole = LLM(tiny_model, backend="numpy", block_size=8)
    chunked = LLM(tiny_model, backend="numpy", block_size=8, max_num_batched_tokens=16)
    assert _tokens(chunked, prompts, params) == _tokens(whole, prompts, params)
    assert_no_leak(chunked)


def test_seeded_sampling_is_reproducible_and_survives_preemption(tiny_model):
    prompts = _prompts(6, seed=4)
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=16, seed=i, ignore_eos=True) for i in range(6)
    ]
    roomy = LLM(tiny_model, backend="numpy", block_size=4)
    cramped = LLM(tiny_model, backend="numpy", block_size=4, num_blocks=16)
    expected = _tokens(roomy, prompts, params)
    assert _tokens(roomy, prompts, params) == expected
    assert _tokens(cramped, prompts, params) == expected
    assert cramped.engine.scheduler.num_preemptions > 0


BAD_REQUESTS = [
    ("", {}, "prompt"),
    ([], {}, "prompt"),
    ([7] * 600, {}, "max_model_len"),
    ([1, 2, 3], {"max_tokens": 0}, "max_tokens"),
    ([1, 2, 3], {"temperature": -0.5}, "temperature"),
    ([1, 2, 3], {"top_p": 0.0}, "top_p"),
    ([1, 2, 3], {"top_p": 1.5}, "top_p"),
    ([1, 2, 3], {"top_k": 0}, "top_k"),
    ([1, 2, 3], {"top_k": -2}, "top_k"),
    ([1, 2, 3], {"stop_token_ids": [10**6]}, "stop_token_ids"),
    ([1, 10**6], {}, "prompt"),
    ([-1, 2], {}, "prompt"),
    ([1, 2.5], {}, "prompt"),
    ([1, "2"], {}, "prompt"),
    ([[1, 2]], {}, "prompt"),
    ([1, 2**70], {}, "prompt"),
    ([True, False], {}, "prompt"),  # bools alone are not token ids (with an int they read 1 and 0)
    ([np.uint64(2**63)], {}, "prompt"),
    (b"\x01\x02", {}, "prompt"),  # bytes are a sequence of integers, not of token ids
    (bytearray(16), {}, "prompt"),
    ((1, None), {}, "prompt"),
]


@pytest.mark.parametrize("prompt, overrides, parameter", BAD_REQUESTS)
def test_bad_request_is_rejected_alone(tiny_model, prompt, overrides, parameter):
    llm = LLM(tiny_model, backend="numpy", block_size=4)
    engine = llm.engine
    good = engine.add_request([5, 6, 7], _greedy(4))
    with pytest.raises(ValueError, match=parameter):
        engine.add_request(prompt, SamplingParams(**{"temperature": 0.0, **overrides}))
    finished = []
    while engine.has_unfinished_requests():
        finished += [output for output in engine.step() if output.finished]
    assert [output.request_id for output in finished] == [good]
    assert len(finished[0].outputs[0].token_ids) == 4
    assert_no_leak(llm)


def test_token_ids_of_any_integer_type_become_python_ints(tiny_model):
    """NumPy integers, bools beside ints and a tuple are token ids; the engine keeps them as
    int64 (whose bytes the prefix cache compares) and reports plain ints of the same values."""
    engine = LLM(tiny_model, backend="numpy", block_size=4).engine
    prompts = ([np.int64(5), True, np.uint8(7)], [True, np.int64(6), 7], (5, 1, 7), np.arange(5, 8).tolist())
    for prompt in prompts:
        request_id = engine.add_request(prompt, _greedy(1))
        (seq,) = engine.scheduler._unfinished[request_id]
        expected = [int(token) for token in prompt]
        assert seq.token_ids.typecode == "q" and seq.token_ids.tolist() == expected
        assert seq.prompt_token_ids == expected and {type(token) for token in seq.prompt_token_ids} == {int}
        assert token_bytes(seq.token_ids) == np.array(expected, dtype=np.int64).tobytes()
        engine.abort(request_id)


def test_abort_frees_blocks_and_others_finish(tiny_model):
    llm = LLM(tiny_model, backend="numpy", block_size=4)
    engine = llm.engine
    keep = engine.add_request([1, 2, 3, 4, 5], _greedy(8))
    drop = engine.add_request(list(range(30)), _greedy(50))
    engine.step()
    engine.step()
    used_before = engine.scheduler.allocator.num_used
    assert engine.abort(drop)
    assert engine.scheduler.allocator.num_used < used_before
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert {output.request_id for output in outputs} == {keep}
    assert_no_leak(llm)


def test_stop_string_truncates_text(tiny_model):
    llm = LLM(tiny_model, backend="numpy", block_size=4)
    free_run = llm.generate([[72, 101, 108]], _greedy(24))[0].outputs[0]
    stop = free_run.text[5:7]
    assert stop, "the tiny model produced too little text for this test"
    stopped = llm.generate(
        [[72, 101, 108]], SamplingParams(temperature=0.0, max_tokens=24, stop=stop, ignore_eos=True)
    )[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert stopped.text == free_run.text[: free_run.text.index(stop)]
    assert_no_leak(llm)
