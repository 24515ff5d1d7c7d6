"""perf/experiments/prefill_ptx.py's count of a flash kernel's tile loop, on SASS text written
here in nvdisasm's layout (no toolchain needed). The oracle is the listing itself: which
instructions lie between the loop's label and its branch back, counted by hand."""

import pytest

from perf.experiments.prefill_ptx import tile_loop
from tests.helpers import sass_listing as listing

SASS = listing(
    [
        "S2R R0, SR_TID.X",
        ".L_x_0",  # a setup loop: one HMMA
        "HMMA.16816.F32.BF16 R4, R8, R12, R4",
        "ISETP.GE.AND P0, PT, R0, 0x4, PT",
        "@!P0 BRA `(.L_x_0)",
        "BRA `(.L_x_9)",  # a forward branch is no loop
        ".L_x_1",  # the tile loop, 9 instructions: three HMMA, two MUFU.EX2, one 64-bit compare
        "HMMA.16816.F32.BF16 R4, R8, R12, R4",
        "HMMA.16816.F32.BF16 R16, R8, R14, R16",
        "FFMA R20, R21, R22, -R23",
        "MUFU.EX2 R20, R20",
        "MUFU.EX2 R24, R24",
        "ISETP.GE.U32.AND P1, PT, R2, R3, PT",
        "@P1 ISETP.GE.AND.EX P1, PT, R5, R6, PT, P1",
        "HMMA.16816.F32.F16 R4, R8, R12, R4",
        "@P1 BRA `(.L_x_1)",
        ".L_x_9",
        "EXIT",
    ]
)


def test_the_tile_loop_is_the_backward_branch_with_the_most_hmma():
    assert tile_loop(SASS) == {"instructions": 9, "hmma": 3, "mufu_ex2": 2, "compares_64bit": 1}


def test_sass_without_a_loop_is_refused():
    with pytest.raises(ValueError, match="no loop"):
        tile_loop(listing(["HMMA.16816.F32.BF16 R4, R8, R12, R4", "BRA `(.L_x_3)", ".L_x_3", "EXIT"]))
