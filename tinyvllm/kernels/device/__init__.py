"""Device code shared by the kernels: bf16 bits, vector loads, reductions, PDL, RNG, checks."""
