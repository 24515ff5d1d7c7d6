"""perf/experiments/persistent_phases.py: the chain's phase kernels cover each slab exactly once.

Each phase's XOR over its slab's 32-bit words, gathered from the grid's per-warp atomics, must
equal NumPy's XOR of the same words (a word read twice or missed changes it). Slabs of drawn
sizes (multiples of 8 elements, some shorter than one pass of the grid, some several passes
long) over grids of drawn sizes. The persistent kernels' barriers are inline PTX, which the
simulator does not run; they are checked the same way on the GPU by the script itself.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from perf.experiments.persistent_phases import chain_phase, expected_xors

THREADS = 32  # one warp a block: the simulator runs a thread per Python thread


@settings(max_examples=8, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 500).map(lambda n: 8 * n), min_size=1, max_size=3),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_each_phase_reads_its_slab_once(sizes, blocks, seed):
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rng = np.random.default_rng(seed)
    slab = rng.integers(0, 1 << 16, size=int(offsets[-1]), dtype=np.uint16)
    # random words, not zeros: the kernel XORs into them, so an overwrite would show
    start = rng.integers(-(2**31), 2**31, size=(len(sizes), blocks), dtype=np.int32)
    out = cuda.to_device(start)
    slab_d, offsets_d = cuda.to_device(slab), cuda.to_device(offsets)
    for phase in range(len(sizes)):
        chain_phase[blocks, THREADS](slab_d, offsets_d, phase, out)
    got = np.bitwise_xor.reduce(out.copy_to_host(), axis=1)
    expected = expected_xors(slab, offsets).view(np.int32) ^ np.bitwise_xor.reduce(start, axis=1)
    np.testing.assert_array_equal(got, expected)
