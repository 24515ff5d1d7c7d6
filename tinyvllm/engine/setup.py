"""Engine construction: the backend the config picks, the model runner, and how many KV
blocks fit.

Sizing follows vLLM: with `gpu_memory_utilization=u`, tinyvllm may hold u of the GPU's
total memory. After the weights, the workspace and a warm-up forward (which also compiles
every kernel), what is still free under that cap becomes KV blocks. An explicit
`num_blocks` skips the measurement. The NumPy backend holds its arena in host memory,
`cpu_kv_cache_gib` of it by default.
"""

import sys

from tinyvllm.backends.numpy_backend import NumpyBackend
from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.model_runner import ModelRunner, kv_block_bytes
from tinyvllm.hardware import has_cuda_gpu, missing_for_cuda
from tinyvllm.model.config import ModelConfig


def make_backend(config: ResolvedEngineConfig):
    name = config.backend
    if name == "auto":
        name = "cuda" if has_cuda_gpu() else "numpy"
        if name == "numpy":
            print("tinyvllm: no CUDA GPU found; running on the NumPy backend (correct, but slow)", file=sys.stderr)
    if name == "cuda":
        from tinyvllm.kernels.device.simulator import SIMULATOR

        missing = None if SIMULATOR else missing_for_cuda()
        if missing is not None:
            raise ValueError(f"backend: 'cuda' needs {missing}; use --backend numpy (or auto)")
        from tinyvllm.backends.cuda_backend import CudaBackend

        return CudaBackend(config.linear_backend)
    return NumpyBackend(config.activation_dtype)


# --8<-- [start:kv-sizing]
def build_runner(model_config: ModelConfig, weights, config: ResolvedEngineConfig) -> ModelRunner:
    backend = make_backend(config)
    runner = ModelRunner(model_config, weights, backend, config)
    block_bytes = kv_block_bytes(model_config, config.block_size, backend.activation_dtype)
    num_blocks = config.num_blocks
    if num_blocks is None and backend.has_device_memory:
        runner.warm_up()
        free, total = backend.memory_info()
        num_blocks = int((free - (1 - config.gpu_memory_utilization) * total) // block_bytes)
    elif num_blocks is None:
        num_blocks = int(config.cpu_kv_cache_gib * 2**30 // block_bytes)
    if num_blocks < 1:
        raise ValueError(
            f"gpu_memory_utilization: {config.gpu_memory_utilization} leaves no memory for the KV cache "
            f"({block_bytes} bytes per block)"
        )
    runner.allocate_kv_cache(num_blocks)
    if backend.can_capture_graphs and not config.enforce_eager:
        runner.capture_decode_graphs()
    return runner


# --8<-- [end:kv-sizing]
