"""SamplingParams: every bad value is a ValueError naming its parameter; good ones pass through."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyvllm.sampling_params import SamplingParams

INVALID = [
    ("n", 0),
    ("n", -1),
    ("n", 2.0),
    ("n", True),
    ("n", None),
    ("temperature", -0.1),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", "hot"),
    ("temperature", True),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", -0.5),
    ("top_p", None),
    ("top_k", 0),
    ("top_k", -2),
    ("top_k", 1.5),
    ("top_k", True),
    ("max_tokens", 0),
    ("max_tokens", -3),
    ("max_tokens", 2.0),
    ("max_tokens", None),
    ("stop", 3),
    ("stop", ["ok", 3]),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", {"a"}),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1, 2.5]),
    ("stop_token_ids", 7),
    ("stop_token_ids", [True]),
    ("ignore_eos", 1),
    ("ignore_eos", "yes"),
    ("skip_special_tokens", 0),
    ("skip_special_tokens", None),
    ("include_stop_str_in_output", "no"),
    ("truncate_prompt_tokens", 0),
    ("truncate_prompt_tokens", -2),
    ("truncate_prompt_tokens", 1.5),
    ("truncate_prompt_tokens", True),
    ("seed", -1),
    ("seed", 2**63),
    ("seed", 1.0),
    ("seed", "42"),
    ("presence_penalty", 2.01),
    ("presence_penalty", -2.5),
    ("presence_penalty", math.nan),
    ("presence_penalty", "0.5"),
    ("frequency_penalty", 3),
    ("frequency_penalty", -math.inf),
    ("frequency_penalty", True),
    ("repetition_penalty", 0),
    ("repetition_penalty", -1.2),
    ("repetition_penalty", math.inf),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("min_p", None),
    ("min_tokens", -1),
    ("min_tokens", 17),  # above the default max_tokens of 16
    ("min_tokens", 1.0),
]


@pytest.mark.parametrize(("name", "value"), INVALID)
def test_bad_values_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


@given(
    temperature=st.floats(0, 10),
    top_k=st.integers(1, 100_000) | st.just(-1),
    top_p=st.floats(0, 1, exclude_min=True),
    max_tokens=st.integers(1, 1 << 20),
    stop=st.none() | st.text(min_size=1) | st.lists(st.text(min_size=1), max_size=3),
    stop_token_ids=st.none() | st.lists(st.integers(0, 1 << 20), max_size=4),
    seed=st.none() | st.integers(0, 2**63 - 1),
)
def test_good_values_are_kept_and_stops_become_lists(temperature, top_k, top_p, max_tokens, stop, stop_token_ids, seed):
    params = SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_tokens=max_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        seed=seed,
    )
    assert (params.temperature, params.top_k, params.top_p) == (temperature, top_k, top_p)
    assert (params.max_tokens, params.seed) == (max_tokens, seed)
    assert params.stop == ([] if stop is None else [stop] if isinstance(stop, str) else stop)
    assert params.stop_token_ids == (stop_token_ids or [])
    assert params.greedy == (temperature < 1e-5)


@given(
    presence=st.floats(-2, 2),
    frequency=st.floats(-2, 2),
    repetition=st.floats(0, 10, exclude_min=True),
    min_p=st.floats(0, 1),
    min_tokens=st.integers(0, 16),
)
def test_good_penalties_and_minimums_are_kept(presence, frequency, repetition, min_p, min_tokens):
    values = {
        "presence_penalty": presence,
        "frequency_penalty": frequency,
        "repetition_penalty": repetition,
        "min_p": min_p,
        "min_tokens": min_tokens,
    }
    params = SamplingParams(**values)
    assert {name: getattr(params, name) for name in values} == values
    assert params.uses_token_state == (presence != 0 or frequency != 0 or repetition != 1 or min_tokens > 0)


def test_numpy_scalars_are_accepted_as_python_numbers():
    params = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(4), max_tokens=np.int32(8), seed=np.uint32(3))
    assert type(params.temperature) is float and type(params.top_k) is int
    assert type(params.max_tokens) is int and type(params.seed) is int


def test_greedy_is_temperature_zero():
    assert SamplingParams(temperature=0).greedy
    assert not SamplingParams().greedy


def test_validate_for_vocab_names_unknown_stop_token_ids():
    params = SamplingParams(stop_token_ids=[3, 10, 99])
    params.validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"stop_token_ids \[99\]"):
        params.validate_for_vocab(99)
    SamplingParams().validate_for_vocab(1)
