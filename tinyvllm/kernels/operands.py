"""Operands that the operators share beyond plain arrays; host types, importing no Numba.

The model builds them and both backends read them, so they live apart from the kernels:
building a model on the NumPy backend compiles nothing.
"""

from typing import NamedTuple


class RMSNorm(NamedTuple):
    """The norm in front of a product: the product reads rmsnorm(x) * weight, not x.

    `normed` (x's shape, bf16) is where the normed rows go when the norm runs as its own
    kernel (`tinyvllm.kernels.rmsnorm`); a product that applies the norm itself leaves it alone.
    """

    weight: object
    eps: float
    normed: object
