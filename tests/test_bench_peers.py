"""perf/bench_peers.py and the benchmark workloads it shares: what each engine is asked to do.

vLLM is not installed here: a stand-in `vllm` module records what the adapter hands it.
"""

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from perf import bench_peers
from tinyvllm.benchmark import decode_latency, prefill_throughput
from tinyvllm.sampling_params import SamplingParams

REPOSITORY = Path(__file__).resolve().parents[1]


class RecordingLLM:
    """Stands in for an LLM: each generate's prompts are recorded, and every request gets the
    number of tokens it asked for, 0.1 ms a token (`decode_latency` divides by the time more
    tokens take over one; instant calls could take exactly as long and divide by zero)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, ...]]] = []

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append([tuple(p) for p in prompts])
        time.sleep(1e-4 * sum(p.max_tokens for p in params))
        completion = types.SimpleNamespace
        return [types.SimpleNamespace(outputs=[completion(token_ids=[0] * p.max_tokens)]) for p in params]


def test_prefill_warm_up_prompts_are_not_the_timed_ones():
    llm = RecordingLLM()
    result = prefill_throughput(llm, num_prompts=8, prompt_len=32, vocab_size=1000)
    warm_up, timed = llm.calls
    assert len(timed) == 8 and all(len(p) == 32 for p in timed)
    assert not set(warm_up) & set(timed), "a prefix cache would find warm-up prompts in the timed run"
    assert result["prompts"] * result["prompt_len"] == 8 * 32


def test_each_decode_latency_run_has_a_prompt_of_its_own():
    llm = RecordingLLM()
    decode_latency(llm, prompt_len=16, new_tokens=4, repeats=3, vocab_size=1000)
    prompts = [call[0] for call in llm.calls]
    assert len(prompts) == 7 and all(len(p) == 16 for p in prompts)
    assert len(set(prompts)) == 7, "a repeated prompt would be a prefix-cache hit"


class SlowFirstTokenLLM(RecordingLLM):
    """A one-token run that takes longer than a whole run, as a busy machine can make it."""

    def generate(self, prompts, params, use_tqdm=False):
        outputs = super().generate(prompts, params, use_tqdm)
        if all(p.max_tokens == 1 for p in params):
            time.sleep(0.01)
        return outputs


def test_decode_latency_refuses_a_decode_no_slower_than_its_first_token():
    with pytest.raises(ValueError, match="below the timer's noise"):
        decode_latency(SlowFirstTokenLLM(), prompt_len=16, new_tokens=4, repeats=3, vocab_size=1000)


def test_decode_latency_needs_two_new_tokens():
    with pytest.raises(ValueError, match="new_tokens must be at least 2"):
        decode_latency(RecordingLLM(), prompt_len=16, new_tokens=1, vocab_size=1000)


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` module whose LLM records its settings and the generate calls it gets."""
    module = types.ModuleType("vllm")
    module.__version__ = "0.0-test"
    module.made = []

    class FakeSamplingParams:
        def __init__(self, **fields):
            self.fields = fields

    class FakeLLM:
        def __init__(self, model, **settings):
            module.made.append(self)
            self.model, self.settings, self.calls = model, settings, []
            config = types.SimpleNamespace(
                scheduler_config=types.SimpleNamespace(max_num_batched_tokens=8192),
                model_config=types.SimpleNamespace(enforce_eager=False, disable_cascade_attn=True),  # 0.26's default
            )
            self.llm_engine = types.SimpleNamespace(vllm_config=config)

        def generate(self, prompts, params, use_tqdm=True):
            self.calls.append((prompts, params, use_tqdm))
            return ["output"] * len(prompts)

    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_vllm_peer_gets_token_id_prompts_and_the_same_sampling(fake_vllm, tmp_path):
    peer = bench_peers.VllmPeer(tmp_path)
    made = fake_vllm.made[0]
    assert made.model == str(tmp_path)
    for name, value in bench_peers.SETTINGS.items():
        assert made.settings[name] == value
    assert made.settings["dtype"] == "bfloat16"
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 5)]
    assert peer.generate([[1, 2], [3]], params) == ["output", "output"]
    prompts, vllm_params, use_tqdm = made.calls[0]
    assert prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert [p.fields for p in vllm_params] == [
        {"temperature": 0.0, "max_tokens": n, "ignore_eos": True} for n in (3, 5)
    ]
    assert use_tqdm is False
    settings = peer.settings()
    assert settings["max_num_batched_tokens"] == 8192 and settings["vllm_version"] == "0.0-test"
    assert settings["disable_cascade_attn"] is True


def test_a_vllm_that_cannot_import_is_recorded_and_tinyvllm_still_runs(tmp_path):
    site = tmp_path / "site" / "vllm"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    out = tmp_path / "peers.json"
    command = [sys.executable, "-m", "perf.bench_peers", "--quick", "--models", "tiny"]
    command += ["--vllm-site", str(site.parent), "--out", str(out)]
    done = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]["tiny"]
    assert runs["vllm"]["failed"]["returncode"] != 0
    assert "libcudart.so.13" in runs["vllm"]["failed"]["stderr_tail"]
    assert set(runs["tinyvllm"]["results"]) == set(bench_peers.WORKLOADS["tiny"])
    assert runs["tinyvllm"]["results"]["decode"]["decode_tok_per_s"] > 0
