"""Engine construction: the arguments users pass to `LLM(...)`, the backend they pick,
and how many KV blocks fit.

Sizing follows vLLM: with `gpu_memory_utilization=u`, tinyvllm may hold u of the GPU's
total memory. After the weights, the workspace and a warm-up forward (which also compiles
every kernel), what is still free under that cap becomes KV blocks. An explicit
`num_blocks` skips the measurement. The NumPy backend holds its arena in host memory,
`cpu_kv_cache_gib` of it by default.
"""

import sys
from dataclasses import dataclass

from tinyvllm.backends.numpy_backend import NumpyBackend
from tinyvllm.engine.model_runner import ModelRunner, kv_block_bytes
from tinyvllm.engine.step_inputs import RunnerLimits
from tinyvllm.hardware import has_cuda_gpu
from tinyvllm.model.config import ModelConfig

BACKENDS = ("auto", "cuda", "numpy")
DEFAULT_MAX_MODEL_LEN = 8192


# --8<-- [start:engine-args]
@dataclass(kw_only=True)
class EngineArgs:
    mode: str = "continuous"
    backend: str = "auto"
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_blocks: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    linear_backend: str = "auto"
    enforce_eager: bool = False
    activation_dtype: str = "float32"
    cpu_kv_cache_gib: float = 1.0
# --8<-- [end:engine-args]

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("block_size", "max_num_seqs", "num_blocks", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.cpu_kv_cache_gib <= 0:
            raise ValueError(f"cpu_kv_cache_gib: must be positive, got {self.cpu_kv_cache_gib}")

    def limits(self, config: ModelConfig) -> RunnerLimits:
        max_model_len = self.max_model_len or min(config.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        if max_model_len > config.max_position_embeddings:
            raise ValueError(
                f"max_model_len: {max_model_len} exceeds the model's max_position_embeddings "
                f"{config.max_position_embeddings}"
            )
        return RunnerLimits(
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or max(max_model_len, 2048),
            max_model_len=max_model_len,
        )


def make_backend(args: EngineArgs):
    name = args.backend
    if name == "auto":
        name = "cuda" if has_cuda_gpu() else "numpy"
        if name == "numpy":
            print("tinyvllm: no CUDA GPU found; running on the NumPy backend (correct, but slow)", file=sys.stderr)
    if name == "cuda":
        from tinyvllm.backends.cuda_backend import CudaBackend

        return CudaBackend(args.linear_backend)
    return NumpyBackend(args.activation_dtype)


# --8<-- [start:kv-sizing]
def build_runner(config: ModelConfig, weights, args: EngineArgs) -> tuple[ModelRunner, RunnerLimits]:
    limits = args.limits(config)
    backend = make_backend(args)
    runner = ModelRunner(config, weights, backend, limits)
    block_bytes = kv_block_bytes(config, limits.block_size, backend.activation_dtype)
    num_blocks = args.num_blocks
    if num_blocks is None and backend.has_device_memory:
        runner.warm_up()
        free, total = backend.memory_info()
        num_blocks = int((free - (1 - args.gpu_memory_utilization) * total) // block_bytes)
    elif num_blocks is None:
        num_blocks = int(args.cpu_kv_cache_gib * 2**30 // block_bytes)
    if num_blocks < 1:
        raise ValueError(
            f"gpu_memory_utilization: {args.gpu_memory_utilization} leaves no memory for the KV cache "
            f"({block_bytes} bytes per block)"
        )
    runner.allocate_kv_cache(num_blocks)
    if backend.can_capture_graphs and not args.enforce_eager:
        runner.capture_decode_graphs()
    return runner, limits
# --8<-- [end:kv-sizing]
