"""Phases of weight streaming: a chain of kernels against one resident grid with barriers.

    python -m perf.experiments.persistent_phases [--repeats 20] [--blocks-per-sm 1 2 4]   (GPU)

Issue 34's persistent decode kernel replaces each kernel boundary of the decode chain with a
barrier between phases of one resident grid, and asks whether a cooperative launch (Numba's
grid group) or co-residency with atomic counters serves it better. A decode step at batch 1
is a sequence of weight streams, each needing the one before to have finished. This times
that skeleton with no model around it: each phase XORs one weight slab of a real layer's
size (q|k|v, o, gate|up, down) across the grid, and every phase must end before the next
begins. The slabs, 16 bytes a load and DEPTH loads in flight a thread, are those of 4 layers
of Llama 3.2 1B (486 MB, 16 phases) and 30 of SmolLM2-135M (212 MB, 120 phases), fresh in
HBM each run (perf/timing's cold L2). Variants:

- `chain`: a kernel a phase, captured in one CUDA graph with PDL, the engine's way: each
  kernel issues its first loads before `griddepcontrol.wait` (the GEMV does too);
- `cooperative`: one cooperative launch, `cuda.cg.this_grid().sync()` between phases;
- `counter`: one launch of a grid that fits on the GPU at once, a barrier of one arrival
  counter in global memory (a `red.release` a block, then one thread polls with
  `ld.acquire` until every block of the phase has arrived);
- `..._ahead`: the same, each thread issuing the next phase's first DEPTH loads before it
  waits at the barrier (weights depend on nothing), which a chain of kernels cannot do
  past its PDL wait for the kernel ahead to let it start.

Every run's per-phase XORs are checked against NumPy's. The table gives ms, TB/s, and per
boundary the time beyond the slabs' bytes at the device's copy rate; the JSON goes to
perf/results/experiments/persistent_phases.json.
"""

import argparse
import json
from pathlib import Path

import numpy as np
from numba import config, cuda, int32, types, uint32

from perf.timing import captured, copy_tbps, median_ms, result_header
from tinyvllm.kernels.device.multiprocessors import multiprocessor_count
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.vector_io import VECTOR, element_pointer, load_words

RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "persistent_phases.json"
THREADS = 256
DEPTH = 4
"""Loads a thread issues before it uses any (64 bytes in flight)."""
LLAMA_LAYER = (2048 * 3072, 2048 * 2048, 2048 * 16384, 8192 * 2048)
SMOLLM2_LAYER = (576 * 960, 576 * 576, 576 * 3072, 1536 * 576)
WORKLOADS = {"llama-1b x 4 layers": LLAMA_LAYER * 4, "smollm2 x 30 layers": SMOLLM2_LAYER * 30}
"""Each phase's slab in bf16 elements (a layer's products' weights, in the decode's order)."""


def _sync_intrinsics():
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    def first_address(context, builder, array_type, array):
        pointer = element_pointer(context, builder, array_type, array, types.intp, context.get_constant(types.intp, 0))
        return builder.ptrtoint(pointer, ir.IntType(64))

    def counter_array(array):
        return isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.uint32

    def counter_instruction(text: str, constraints: str, result):
        """An intrinsic of one PTX instruction on counter[0]'s address; result: the LLVM type
        of what it returns (a uint32), or None."""

        @intrinsic
        def instruction(typingctx, counter):
            if not counter_array(counter):
                return None

            def codegen(context, builder, sig, args):
                address = first_address(context, builder, sig.args[0], args[0])
                returns = ir.VoidType() if result is None else result
                asm = ir.InlineAsm(ir.FunctionType(returns, [ir.IntType(64)]), text, constraints, side_effect=True)
                value = builder.call(asm, [address])
                return context.get_dummy_value() if result is None else value

            return (types.void if result is None else types.uint32)(counter), codegen

        return instruction

    # counter[0] += 1 with release semantics at GPU scope; counter[0] read with acquire semantics
    arrive = counter_instruction("red.release.gpu.global.add.u32 [$0], 1;", "l,~{memory}", None)
    load_acquire = counter_instruction("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l,~{memory}", ir.IntType(32))
    return arrive, load_acquire


if not config.ENABLE_CUDASIM:
    arrive, load_acquire = _sync_intrinsics()


@cuda.jit(device=True, inline=True)
def issue(slab, i, end, stride, ahead):
    """The DEPTH loads from element i on, stride apart (zeros past end), into ahead."""
    for u in range(DEPTH):
        j = i + u * stride
        if j < end:
            w0, w1, w2, w3 = load_words(slab, j)
            ahead[u] = w0 ^ w1 ^ w2 ^ w3
        else:
            ahead[u] = uint32(0)


@cuda.jit(device=True, inline=True)
def thread_share(offsets, phase):
    """This thread's share of phase's slab: (its first element, the slab's end, the stride)."""
    stride = cuda.gridDim.x * cuda.blockDim.x * VECTOR
    return offsets[phase] + (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * VECTOR, offsets[phase + 1], stride


@cuda.jit(device=True, inline=True)
def fold_phase(slab, offsets, phase, ahead, issued):
    """This thread's XOR over its share of phase's slab; `issued`: its first DEPTH loads are
    already in ahead."""
    i, end, stride = thread_share(offsets, phase)
    if not issued:
        issue(slab, i, end, stride, ahead)
    acc = uint32(0)
    while True:
        for u in range(DEPTH):
            acc ^= ahead[u]
        i += DEPTH * stride
        if i >= end:
            return acc
        issue(slab, i, end, stride, ahead)


if config.ENABLE_CUDASIM:  # the simulator has no shuffles: an atomic a thread

    @cuda.jit(device=True, inline=True)
    def record(out, phase, acc):
        cuda.atomic.xor(out, (phase, cuda.blockIdx.x), int32(acc))

else:

    @cuda.jit(device=True, inline=True)
    def record(out, phase, acc):
        """out[phase, block] ^= the warp's XOR of acc (one atomic a warp; shuffles take signed words)."""
        value = int32(acc)
        for shift in (16, 8, 4, 2, 1):
            value ^= cuda.shfl_xor_sync(0xFFFFFFFF, value, shift)
        if cuda.laneid == 0:
            cuda.atomic.xor(out, (phase, cuda.blockIdx.x), value)


@cuda.jit(device=True, inline=True)
def first_loads(slab, offsets, phase, ahead):
    """Issue this thread's first DEPTH loads of phase (nothing if it is the last)."""
    if phase < offsets.size - 1:
        i, end, stride = thread_share(offsets, phase)
        issue(slab, i, end, stride, ahead)


@cuda.jit
def chain_phase(slab, offsets, phase, out):
    allow_dependent_launch()
    ahead = cuda.local.array(DEPTH, uint32)
    first_loads(slab, offsets, phase, ahead)
    wait_for_prior_grid()
    record(out, phase, fold_phase(slab, offsets, phase, ahead, True))


def persistent_kernel(barrier: str, ahead_of_barrier: bool):
    """One resident grid over every phase, `barrier` "cooperative" or "counter" between them."""

    @cuda.jit(device=True, inline=True)
    def counter_barrier(counter, base, phase):
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            arrive(counter)
            target = uint32(base + (phase + 1) * cuda.gridDim.x)
            while load_acquire(counter) < target:
                pass
        cuda.syncthreads()

    @cuda.jit
    def persistent(slab, offsets, counter, base, out):
        ahead = cuda.local.array(DEPTH, uint32)
        phases = offsets.size - 1
        issued = False
        for phase in range(phases):
            record(out, phase, fold_phase(slab, offsets, phase, ahead, issued))
            if ahead_of_barrier:
                first_loads(slab, offsets, phase + 1, ahead)
                issued = True
            if phase + 1 < phases:
                if barrier == "cooperative":
                    cuda.cg.this_grid().sync()
                else:
                    counter_barrier(counter, base, phase)

    return persistent


def expected_xors(slab_host: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each phase's XOR of its slab's 32-bit words: the oracle."""
    words = slab_host.view(np.uint32)
    return np.array([np.bitwise_xor.reduce(words[a // 2 : b // 2]) for a, b in zip(offsets[:-1], offsets[1:])])


def run_workload(name: str, sizes: tuple, blocks: int, repeats: int, copy: float) -> list[dict]:
    """Every variant over one workload's phases: checked against NumPy, then timed."""
    import cupy

    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    slab_host = np.random.default_rng(0).integers(0, 1 << 16, size=int(offsets[-1]), dtype=np.uint16)
    slab, offsets_d = cuda.to_device(slab_host), cuda.to_device(offsets)
    expected = expected_xors(slab_host, offsets)
    phases = len(sizes)
    out = cuda.device_array((phases, blocks), dtype=np.int32)
    counter = cuda.to_device(np.zeros(1, np.uint32))
    arrivals = [0]  # the counter only grows: each launch's barriers count on from where the last left it
    cupy_stream = cupy.cuda.Stream(non_blocking=True)
    stream = cuda.external_stream(cupy_stream.ptr)

    def chain_launches():
        for phase in range(phases):
            chain_phase[blocks, THREADS, stream](slab, offsets_d, phase, out)

    def persistent_launch(kernel, counts: bool):
        def launch():
            kernel[blocks, THREADS, stream](slab, offsets_d, counter, arrivals[0], out)
            arrivals[0] += (phases - 1) * blocks * counts

        return launch

    chain_launches()  # compiles outside the capture
    stream.synchronize()
    launches = {"chain": captured(cupy_stream, chain_launches)}
    for barrier in ("cooperative", "counter"):
        for ahead_of_barrier in (False, True):
            launches[barrier + "_ahead" * ahead_of_barrier] = persistent_launch(
                persistent_kernel(barrier, ahead_of_barrier), barrier == "counter"
            )
    rows = []
    total_bytes = 2 * int(offsets[-1])
    for variant, launch in launches.items():
        out.copy_to_device(np.zeros((phases, blocks), np.int32))
        launch()
        cuda.synchronize()
        correct = bool((np.bitwise_xor.reduce(out.copy_to_host(), axis=1) == expected.view(np.int32)).all())
        ms = median_ms(launch, repeats=repeats, stream=stream)
        rows.append(
            {
                "workload": name,
                "variant": variant,
                "blocks": blocks,
                "threads": THREADS,
                "phases": phases,
                "bytes": total_bytes,
                "ms": ms,
                "tbps": total_bytes / ms / 1e9,
                "us_beyond_copy_per_boundary": (ms * 1e3 - total_bytes / copy / 1e6) / max(1, phases - 1),
                "correct": correct,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--blocks-per-sm", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    if config.ENABLE_CUDASIM:
        raise SystemExit("persistent_phases times real kernels: it needs a CUDA GPU, not the simulator")
    copy = copy_tbps(1 << 29, args.repeats)
    rows = []
    for per_sm in args.blocks_per_sm:
        if per_sm * THREADS > cuda.get_current_device().MAX_THREADS_PER_MULTIPROCESSOR:
            raise SystemExit(f"{per_sm} blocks of {THREADS} threads an SM cannot all be resident: a barrier would hang")
        blocks = per_sm * multiprocessor_count()
        for name, sizes in WORKLOADS.items():
            rows += run_workload(name, sizes, blocks, args.repeats, copy)
    print(f"device copy (read+write): {copy:.2f} TB/s")
    print(f"{'workload':>20} {'variant':>18} {'blocks':>6} {'ms':>8} {'TB/s':>6} {'us/boundary':>11} {'correct':>7}")
    for r in rows:
        print(
            f"{r['workload']:>20} {r['variant']:>18} {r['blocks']:>6} {r['ms']:8.3f} {r['tbps']:6.2f} "
            f"{r['us_beyond_copy_per_boundary']:11.2f} {str(r['correct']):>7}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result_header() | {"copy_tbps": copy, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
