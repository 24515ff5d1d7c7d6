"""Every backend implements the Backend protocol (backends/base.py) as it is written."""

import inspect
import typing

import numpy as np
import pytest

from tests.operator_check import OUTPUTS, PARAMETERS, SCRATCH, WEIGHTS
from tinyvllm.backends.base import Backend, ModelOperators, SamplerOperators, methods
from tinyvllm.backends.cuda_backend import CudaBackend
from tinyvllm.backends.numpy_backend import NumpyBackend
from tinyvllm.backends.recording import RecordingBackend
from tinyvllm.backends.variants import VariantTable

BACKENDS = {
    "numpy": lambda: NumpyBackend(),
    "cuda": lambda: CudaBackend(),
    "recording": lambda: RecordingBackend(VariantTable("auto", 132, True)),
}


def _attributes(protocol: type) -> set[str]:
    """The data attributes the protocol (and those it is made of) declares."""
    return {
        name
        for base in protocol.__mro__
        if getattr(base, "_is_protocol", False)
        for name in vars(base).get("__annotations__", {})
    }


@pytest.mark.parametrize("name", BACKENDS)
def test_backend_has_every_protocol_method_with_its_parameter_names(name):
    backend = BACKENDS[name]()
    stated = methods(Backend)
    assert len(stated) > 20
    for method, signature in stated.items():
        implementation = getattr(backend, method, None)
        assert callable(implementation), f"{name} backend lacks {method}"
        assert tuple(inspect.signature(implementation).parameters) == tuple(signature.parameters), method
    for attribute in _attributes(Backend):
        assert hasattr(backend, attribute), f"{name} backend lacks {attribute}"


def test_protocol_keeps_operators_apart_from_memory_events_and_graphs():
    operators = methods(ModelOperators) | methods(SamplerOperators)
    assert set(operators) == {
        "embedding", "gather_rows", "linear", "linear_rope_write_kv", "linear_silu_mul", "prefill_attention",
        "decode_attention", "feed_sampled_tokens", "sample", "apply_penalties", "apply_min_p", "count_sampled_tokens",
        "compute_logprobs",
    }  # fmt: skip
    for name, signature in operators.items():
        assert signature.return_annotation is None, name


def test_array_parameters_are_typed_not_object():
    for name in methods(ModelOperators) | methods(SamplerOperators):
        hints = typing.get_type_hints(getattr(Backend, name), include_extras=True)
        assert object not in hints.values(), name


def test_operator_check_table_comes_from_the_protocol():
    """The check's table, against the forward pass's operators as the NumPy backend names
    their parameters (an implementation, not the protocol)."""
    numpy = NumpyBackend()
    for name, parameters in PARAMETERS.items():
        assert parameters == tuple(inspect.signature(getattr(numpy, name)).parameters)
    assert OUTPUTS["linear_rope_write_kv"] == ("q", "k_cache", "v_cache")
    assert OUTPUTS["linear"] == ("out",) and WEIGHTS["linear"] == ("weight",)
    assert WEIGHTS["embedding"] == ("table",) and WEIGHTS["gather_rows"] == ()
    assert SCRATCH["decode_attention"] == ("scratch",)


def test_numpy_backend_names_what_it_cannot_do():
    backend = NumpyBackend()
    assert not backend.has_device_memory and not backend.can_capture_graphs
    with pytest.raises(NotImplementedError, match="memory_info"):
        backend.memory_info()
    with pytest.raises(NotImplementedError, match="begin_capture"):
        backend.begin_capture()


def test_cuda_backend_refuses_an_unknown_linear_backend_by_name():
    with pytest.raises(ValueError, match="linear_backend"):
        CudaBackend("cutlass")


def test_cuda_backend_measures_device_memory():
    assert CudaBackend().has_device_memory
    assert CudaBackend().activation_dtype == np.uint16
