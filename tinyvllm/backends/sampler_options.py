"""Which optional sampler kernels a step launches, decided from its host arrays.

Beside the variant table (`variants.py`) but apart from it: the model runner decides a
step's sampler options for every backend, and this module imports no kernel (so no Numba),
which the NumPy backend's engine must not load.
"""

from dataclasses import dataclass


# --8<-- [start:sampler-options]
@dataclass(frozen=True)
class SamplerOptions:
    """The optional sampler kernels a step runs (`kernels/penalties.py`): the penalties and,
    after the draw, the count update when a row reads a token-state slot; min-p when a
    sampled (not greedy) row asks for it; the logprobs kernel (`kernels/logprobs.py`) when a
    row asks for logprobs. A step that needs none launches none."""

    penalties: bool = False
    min_p: bool = False
    logprobs: bool = False


PLAIN_SAMPLER = SamplerOptions()
"""No optional kernel: the sampler alone."""


def sampler_options(penalty_slots, temperature, min_p, num_logprobs) -> SamplerOptions:
    """The options of a step, from its host arrays (one entry per sampled row)."""
    return SamplerOptions(
        bool((penalty_slots >= 0).any()),
        bool(((min_p > 0) & (temperature > 0)).any()),
        bool((num_logprobs >= 0).any()),
    )


# --8<-- [end:sampler-options]
