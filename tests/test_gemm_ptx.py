"""perf/experiments/gemm_ptx.py's fingerprint: blind to Numba's per-process counters, not to the code."""

from perf.experiments.gemm_ptx import fingerprint

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
