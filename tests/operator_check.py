"""Every operator of a real forward pass, checked on its own inputs.

End to end, a bf16 model's logits wander: each operator rounds its outputs to bf16, two
correct implementations that sum in different orders round a few elements the other way,
and those one-ulp differences compound over the layers into logit differences of about
1e-2 (as large as the bf16 reference's own distance from float32). That makes end-to-end
logits a coarse oracle. `OperatorCheck` is the fine one: wrapped around the GPU backend
of a running engine, it copies each operator's inputs to the host before the kernel runs,
runs the bf16 NumPy operator on those copies, and records how far the kernel's outputs
are from the reference's. Each comparison starts from identical inputs, so nothing
compounds: a correct kernel differs by rare one-ulp roundings, a wrong one by far more.
"""

import numpy as np

from tests.helpers import relative_error
from tinyvllm.backend import NumpyBackend
from tinyvllm.kernels.bf16 import from_bf16
from tinyvllm.sampling_params import SamplingParams

OUTPUTS = {
    "embedding": ("out",),
    "gather_rows": ("out",),
    "rmsnorm": ("out", "residual"),
    "linear": ("out",),
    "linear_rope_write_kv": ("q", "k_cache", "v_cache"),
    "linear_silu_mul": ("out",),
    "prefill_attention": ("out",),
    "decode_attention": ("out",),
}
"""The operators of the forward pass and the arguments they write."""
PARAMETERS = {
    "embedding": ("token_ids", "table", "out"),
    "gather_rows": ("indices", "source", "out"),
    "rmsnorm": ("x", "weight", "eps", "out", "residual"),
    "linear": ("x", "weight", "out"),
    "linear_rope_write_kv": (
        "x", "weight", "qkv", "positions", "inv_freq", "slot_mapping", "q", "k_cache", "v_cache"
    ),
    "linear_silu_mul": ("x", "weight", "gate_up", "out"),
    "prefill_attention": ("q", "k_cache", "v_cache", "block_tables", "cu_seqlens_q", "context_lens", "out"),
    "decode_attention": ("q", "k_cache", "v_cache", "block_tables", "context_lens", "out", "scratch"),
}
WEIGHTS = ("table", "weight")
"""Arguments that the GPU holds as bf16 bits and the NumPy backend as float32."""


def _host(value):
    """A host copy of an array (device or host); scalars and None as they are."""
    if hasattr(value, "copy_to_host"):
        return value.copy_to_host()
    return value.copy() if isinstance(value, np.ndarray) else value


def _widen(array: np.ndarray) -> np.ndarray:
    return from_bf16(array).astype(np.float64) if array.dtype == np.uint16 else array.astype(np.float64)


# --8<-- [start:check]
class OperatorCheck:
    """A stand-in for a CudaBackend: runs each operator on it and on the bf16 NumPy backend."""

    def __init__(self, backend):
        self.backend = backend
        self.reference = NumpyBackend("bf16")
        self.worst: dict[tuple[str, str], float] = {}
        """(operator, output) -> the largest relative error seen."""

    def __getattr__(self, name: str):
        operator = getattr(self.backend, name)
        if name not in OUTPUTS:
            return operator

        def checked(*args, **kwargs):
            arguments = dict(zip(PARAMETERS[name], args)) | kwargs
            self.backend.synchronize()
            inputs = {key: _host(value) for key, value in arguments.items()}
            for key in WEIGHTS:
                if key in inputs and inputs[key].dtype == np.uint16:
                    inputs[key] = from_bf16(inputs[key])
            if name == "decode_attention":
                inputs["scratch"] = None
            operator(*args, **kwargs)
            self.backend.synchronize()
            getattr(self.reference, name)(**inputs)
            for output in OUTPUTS[name]:
                if arguments.get(output) is None:
                    continue
                error = relative_error(_widen(_host(arguments[output])), _widen(inputs[output]))
                key = (name, output)
                self.worst[key] = max(self.worst.get(key, 0.0), error)

        return checked
# --8<-- [end:check]


OPERATOR_TOLERANCE = 2e-3
"""A correct kernel differs from the bf16 reference by rare one-ulp roundings (a bf16 ulp
is 2^-8 of the value, 3.9e-3): on SmolLM2 the H200 measured 6.3e-4 at most. An error of
half an ulp in norm means many elements came out wrong."""


def worst_operator_errors(llm, prompts: list[list[int]], max_tokens: int) -> dict[tuple[str, str], float]:
    """Generate greedily for the batch of prompts, then for the first prompt alone (a batch
    of one: the GEMV path), with every operator checked; the worst error of each output."""
    if llm.engine.runner.graphs is not None:
        raise ValueError("llm: build it with enforce_eager=True, graph replays bypass the check")
    model = llm.engine.runner.model
    check = OperatorCheck(model.backend)
    model.backend = check
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    try:
        llm.generate(prompts, params)
        llm.generate(prompts[:1], params)
    finally:
        model.backend = check.backend
    return check.worst


def all_outputs() -> set[tuple[str, str]]:
    return {(name, output) for name, outputs in OUTPUTS.items() for output in outputs}
