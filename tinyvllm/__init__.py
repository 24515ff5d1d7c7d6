"""tinyvllm: a small, fast, readable LLM inference engine on Numba CUDA kernels.

    from tinyvllm import LLM, SamplingParams
    llm = LLM()                                   # the embedded SmolLM2-135M-Instruct
    print(llm.generate(["The capital of France is"], SamplingParams(max_tokens=16))[0].outputs[0].text)

The names are imported on first use, so `import tinyvllm` stays cheap and decides
nothing about the GPU (the test run and the CLI decide that first).
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "tinyvllm.llm",
    "LLMEngine": "tinyvllm.engine.llm_engine",
    "SamplingParams": "tinyvllm.sampling_params",
    "RequestOutput": "tinyvllm.engine.sequence",
    "CompletionOutput": "tinyvllm.engine.sequence",
    "Logprob": "tinyvllm.engine.sequence",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tinyvllm' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
