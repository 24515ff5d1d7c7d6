"""The Numba CUDA kernels. Each module is one operator: the math, the kernel, the launcher.

numba-cuda 0.30.4 calls `np.row_stack` while compiling its first kernel, and numpy 2.5
removed that alias. Restoring it here, before `numba.cuda` is imported by any kernel
module, is the one place this shim lives.
"""

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
