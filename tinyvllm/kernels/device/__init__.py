"""Device code shared by the kernels: bf16 bits, vector loads, rows read past their end, reductions,
PDL, RNG, checks, tensor-core instructions (mma)."""
