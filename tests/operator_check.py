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
from tinyvllm.backends.base import ModelOperators, Role, methods, parameters_in_role
from tinyvllm.backends.numpy_backend import NumpyBackend
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.kernels.reference import from_bf16
from tinyvllm.sampling_params import SamplingParams

PARAMETERS = {name: tuple(signature.parameters) for name, signature in methods(ModelOperators).items()}
"""The operators of the forward pass and their parameters, from the Backend protocol."""
OUTPUTS = {name: parameters_in_role(ModelOperators, name, Role.OUTPUT) for name in PARAMETERS}
"""The arguments each operator writes its results to."""
WEIGHTS = {name: parameters_in_role(ModelOperators, name, Role.WEIGHT) for name in PARAMETERS}
"""Arguments that the GPU holds as bf16 bits and the NumPy backend as float32."""
SCRATCH = {name: parameters_in_role(ModelOperators, name, Role.SCRATCH) for name in PARAMETERS}
"""A backend's own workspace: the NumPy reference needs none."""
NORMED = " (normed)"
"""Appended to an operator's name in the errors when it applies the RMSNorm before its product."""
ACCUMULATED = " (+=)"
"""Appended when it adds its product to the residual stream."""
ALWAYS_NORMED = ("linear_rope_write_kv", "linear_silu_mul")


def _host(value):
    """A host copy of an array (device or host) or of a norm's arrays, its gain widened
    as the NumPy backend holds weights; scalars and None as they are."""
    if isinstance(value, RMSNorm):
        return RMSNorm(from_bf16(_host(value.weight)), value.eps, _host(value.normed))
    if hasattr(value, "copy_to_host"):
        return value.copy_to_host()
    return value.copy() if isinstance(value, np.ndarray) else value


def _normed_in_float32(inputs: dict, outputs: tuple[str, ...]) -> dict:
    """A normed product's host inputs again, its outputs copied and its normed rows kept in
    float32: a kernel that applies the norm itself (the GEMV) multiplies by those, where the
    norm's own kernel rounds them to bf16 before cuBLAS or the tiled GEMM. Both are right;
    on SmolLM2 a few large channels set them apart by more than an ulp of the product."""
    copied = inputs | {key: inputs[key].copy() for key in outputs if inputs.get(key) is not None}
    copied["norm"] = inputs["norm"]._replace(normed=np.empty(inputs["norm"].normed.shape, np.float32))
    return copied


def _widen(array: np.ndarray) -> np.ndarray:
    return from_bf16(array).astype(np.float64) if array.dtype == np.uint16 else array.astype(np.float64)


# --8<-- [start:check]
class OperatorCheck:
    """A stand-in for a CudaBackend: runs each operator on it and on the bf16 NumPy backend."""

    def __init__(self, backend):
        self.backend = backend
        self.reference = NumpyBackend("bf16")
        self.worst: dict[tuple[str, str], float] = {}
        """(operator, output) -> the largest relative error seen; "linear (normed)" for a
        product that applies the norm before it, "linear (+=)" for one added to out."""

    def __getattr__(self, name: str):
        operator = getattr(self.backend, name)
        if name not in OUTPUTS:
            return operator

        def checked(*args, **kwargs):
            arguments = dict(zip(PARAMETERS[name], args)) | kwargs
            self.backend.synchronize()
            inputs = {key: _host(value) for key, value in arguments.items()}
            for key in WEIGHTS[name]:
                if inputs[key].dtype == np.uint16:
                    inputs[key] = from_bf16(inputs[key])
            for key in SCRATCH[name]:
                inputs[key] = None
            references = [inputs]
            if inputs.get("norm") is not None:
                references.append(_normed_in_float32(inputs, OUTPUTS[name]))
            operator(*args, **kwargs)
            self.backend.synchronize()
            for reference_inputs in references:
                getattr(self.reference, name)(**reference_inputs)
            for output in OUTPUTS[name]:
                if arguments.get(output) is None:
                    continue
                actual = _widen(_host(arguments[output]))
                error = min(relative_error(actual, _widen(expected[output])) for expected in references)
                label = name + (NORMED if arguments.get("norm") is not None else "")
                key = (label + (ACCUMULATED if arguments.get("accumulate") else ""), output)
                self.worst[key] = max(self.worst.get(key, 0.0), error)

        return checked


# --8<-- [end:check]


FUSED_TOLERANCE = 1e-2
"""For the products that apply the norm or add to the residual. A normed product is judged
by the nearer of the normed row's two roundings (`_normed_in_float32`): against the bf16 one
alone, the GEMV, which multiplies by the float32 row, measured 4.1e-3 to 6.1e-3 on the H200,
and a normed `linear` 1.0e-2 on an H100 with other inputs (SmolLM2's norm gains make a few
channels large, and their rounding does not average out). The residual stream has a few
channels hundreds of times larger than the rest, so one ulp of one of them (2^-8 to 2^-7 of
it) is up to 7.8e-3 of the row: cuBLAS adding its product with beta = 1 rounds differently
from the reference, 4.0e-3 on the H200. A product of the un-normed row, or one not added, is
off by far more."""
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
    """Every (operator, output) of a forward pass: the layers' products that apply the
    norm, the o and down projections that add to the residual, and the LM head."""
    names = {name: [name + NORMED] if name in ALWAYS_NORMED else [name] for name in OUTPUTS}
    names["linear"] = ["linear" + ACCUMULATED, "linear" + NORMED]
    return {(label, output) for name, outputs in OUTPUTS.items() for label in names[name] for output in outputs}


def within_tolerance(worst: dict[tuple[str, str], float]) -> bool:
    return all(
        error <= (OPERATOR_TOLERANCE if name in OUTPUTS else FUSED_TOLERANCE) for (name, _), error in worst.items()
    )
