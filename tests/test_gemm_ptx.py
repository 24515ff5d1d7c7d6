"""perf/experiments/gemm_ptx.py's fingerprint: blind to Numba's per-process counters, not to the code."""

from perf.experiments.gemm_ptx import fingerprint, mma_loops
from tests.helpers import sass_listing

PTX = """.common .global .align 8 .u64 _ZN08NumbaEnv5numba4implB4v138B100cwE;
.common .global .align 8 .u64 _ZN08NumbaEnv8tinyvllm4gemmB3v78B104cwE;
.extern .shared .align 16 .b8 _cudapy_smem_1[];
.visible .entry _ZN8tinyvllm7kernels4gemmB3v78B104cwE(
	mov.u64 	%rd175, _cudapy_smem_1;
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 	{%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4};
"""


def test_a_second_compilation_of_the_same_kernel_has_the_same_fingerprint():
    lines = PTX.splitlines()
    again = "\n".join([lines[1], lines[0], *lines[2:]]).replace("v78", "v84").replace("v138", "v140")
    assert fingerprint(again.replace("_cudapy_smem_1", "_cudapy_smem_2")) == fingerprint(PTX)


def test_a_changed_instruction_changes_the_fingerprint():
    assert fingerprint(PTX.replace("%rd175", "%rd176")) != fingerprint(PTX)
    assert fingerprint(PTX.replace("row.col", "col.row")) != fingerprint(PTX)


def test_mma_loops_counts_each_loop_that_multiplies():
    """A setup loop without mmas is left out; a loop nested in another is counted on its own
    and inside the outer one's text (the listing is the oracle: its lines counted by hand)."""
    sass = sass_listing(
        [
            ".L_x_0",  # no HMMA: left out
            "IADD3 R0, R0, 0x1, RZ",
            "@P0 BRA `(.L_x_0)",
            ".L_x_1",  # the outer loop, 8 instructions: 2 HMMA, 1 LDSM, 2 LDGSTS
            "LDGSTS.E.BYPASS.128 [R1], desc[UR6][R2.64]",
            "LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64]",
            ".L_x_2",  # the inner loop, 3 instructions: 1 HMMA, 1 LDSM
            "LDSM.16.M88.4 R8, [R5]",
            "HMMA.16816.F32.BF16 R12, R8, R10, R12",
            "@P1 BRA `(.L_x_2)",
            "HMMA.16816.F32.BF16 R16, R8, R10, R16",
            "BAR.SYNC.DEFER_BLOCKING 0x0",
            "@P2 BRA `(.L_x_1)",
            "EXIT",
        ]
    )
    assert mma_loops(sass) == [
        {"instructions": 3, "hmma": 1, "ldsm": 1, "ldgsts": 0},
        {"instructions": 8, "hmma": 2, "ldsm": 1, "ldgsts": 2},
    ]
