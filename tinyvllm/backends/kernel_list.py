"""`tinyvllm kernels`: the exact list of kernels one decode step launches on the GPU.

The list is not written out by hand: the real runner (`ModelRunner`: the forward pass of
`LlamaModel`, the sampler, the CUDA graph of the batch's bucket) runs one decode step on
the recording backend (`recording.py`), which asks the variant table what each operator
call launches. Only the model's config is read (no weights), and no GPU is needed: the
GPU is described by its SM count and whether cuBLAS runs there. The module imports
nothing heavy (NumPy, Numba) until the command runs: `tinyvllm --help` stays fast.
"""

import argparse
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

H200_SMS = 132
"""The SM count of the H200 the project measures on: the default GPU."""
DEFAULT_CONTEXT = 32
"""Tokens each sequence has in its cache: the kernels do not depend on it (only the block
table's width, from max_model_len, does), but a step needs one."""


class _ZeroWeights(Mapping):
    """Every tensor a Llama of `config` loads, as zeros that hold no memory (read-only
    broadcasts of one zero), made when the model asks for it."""

    def __init__(self, config):
        from tinyvllm.model.weights import weight_shapes

        self.shapes = weight_shapes(config)

    def __getitem__(self, name: str):
        import numpy as np

        return np.broadcast_to(np.uint16(0), self.shapes[name])

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def load_model_config(path: str | Path):
    """The ModelConfig of a model directory, or of a config.json file itself."""
    from tinyvllm.model.config import ModelConfig

    path = Path(path)
    if path.is_dir():
        return ModelConfig.from_dir(path)
    return ModelConfig.from_dict(json.loads(path.read_text()), source=str(path))


def decode_step_kernels(
    config,
    batch: int,
    *,
    context: int = DEFAULT_CONTEXT,
    shared: int = 0,
    num_sms: int = H200_SMS,
    cublas_available: bool = True,
    **engine_options,
) -> list:
    """The OperatorCalls, in launch order, of one decode step of `batch` sequences of
    `context` cached tokens each, the first `shared` of them in the same blocks (as the
    prefix cache shares them), as the CUDA engine built with `engine_options` (the
    EngineConfig fields: linear_backend, max_model_len, block_size, max_num_seqs,
    enforce_eager, ...) runs it on a GPU of num_sms SMs."""
    from tinyvllm.backends.recording import RecordingBackend
    from tinyvllm.backends.variants import VariantTable
    from tinyvllm.config import EngineConfig
    from tinyvllm.engine.model_runner import ModelRunner

    engine = EngineConfig(**(engine_options | {"backend": "cuda"})).resolve(config)
    backend = RecordingBackend(VariantTable(engine.linear_backend, num_sms, cublas_available))
    runner = ModelRunner(config, _ZeroWeights(config), backend, engine)
    step = prepare_decode_step(runner, batch, context, shared=shared, capture_graphs=not engine.enforce_eager)
    backend.calls.clear()
    runner.execute(step)
    return backend.calls


def prepare_decode_step(runner, batch: int, context: int, *, shared: int = 0, capture_graphs: bool):
    """Give the runner a KV arena (and its CUDA graphs where `capture_graphs` and its
    backend can), and return a decode step of `batch` sequences of `context` cached tokens,
    the blocks of the first `shared` of them (whole blocks) the same in every sequence."""
    import numpy as np

    from tinyvllm.engine.block_manager import blocks_needed
    from tinyvllm.engine.scheduled_batch import ScheduledBatch
    from tinyvllm.engine.sequence import Sequence
    from tinyvllm.sampling_params import SamplingParams

    limits = runner.limits
    if not 1 <= batch <= limits.max_num_seqs:
        raise ValueError(f"batch: must be 1 to max_num_seqs ({limits.max_num_seqs}), got {batch}")
    if not 1 <= context < limits.max_model_len:
        raise ValueError(f"context: must be 1 to max_model_len - 1 ({limits.max_model_len - 1}), got {context}")
    if not 0 <= shared <= context:
        raise ValueError(f"shared: must be 0 to context ({context}), got {shared}")
    blocks_per_seq = blocks_needed(context + 1, limits.block_size)
    common = shared // limits.block_size
    runner.allocate_kv_cache(batch * blocks_per_seq)
    if capture_graphs and runner.backend.can_capture_graphs:
        runner.capture_decode_graphs()
    seqs = []
    for index in range(batch):
        seq = Sequence(f"seq-{index}", [0] * context, SamplingParams(temperature=0.0, max_tokens=2))
        seq.block_table = list(range(common)) + list(
            range(index * blocks_per_seq + common, (index + 1) * blocks_per_seq)
        )
        seq.num_computed_tokens = context
        seq.append_token(0)
        seqs.append(seq)
    return ScheduledBatch(
        seqs=seqs, num_scheduled_tokens=np.ones(batch, np.int32), samples=np.ones(batch, bool), num_decodes=batch
    )


def decode_kernel_count(config, batch: int, **options) -> int:
    """How many kernels one decode step launches (options as in `decode_step_kernels`)."""
    return sum(len(call.kernels) for call in decode_step_kernels(config, batch, **options))


def split_layers(calls: list) -> tuple[list, list[list], list]:
    """(the calls before the layers, each layer's calls, the calls after them): a layer
    starts at its q|k|v product, and the last one ends where the sampled rows are gathered."""
    starts = [i for i, call in enumerate(calls) if call.operator == "linear_rope_write_kv"]
    end = next(i for i, call in enumerate(calls) if call.operator == "gather_rows")
    layers = [calls[start:stop] for start, stop in zip(starts, [*starts[1:], end])]
    return calls[: starts[0]], layers, calls[end:]


def format_kernels(calls: list, num_layers: int) -> str:
    """The kernel list as text: before the layers, per layer (once when all layers are
    alike, as in a decode step), after them, and the total."""
    before, layers, after = split_layers(calls)
    if len(layers) != num_layers:
        raise ValueError(f"found {len(layers)} layers in the step, the config has {num_layers}")

    def block(title: str, section: list) -> list[str]:
        count = sum(len(call.kernels) for call in section)
        lines = [f"{title}: {count} kernels"]
        lines += [f"  {call.operator:<22} {', '.join(map(str, call.kernels))}" for call in section]
        return lines

    lines = block("before the layers", before)
    if all(layer == layers[0] for layer in layers):
        lines += block(f"each of the {num_layers} layers", layers[0])
    else:
        for index, layer in enumerate(layers):
            lines += block(f"layer {index}", layer)
    lines += block("after the layers", after)
    per_section = [sum(len(call.kernels) for call in section) for section in (before, *layers, after)]
    lines.append(f"total: {sum(per_section)} kernels")
    return "\n".join(lines)


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Add the `kernels` command to the CLI's subcommands: the step's shape, the GPU, and
    the engine's own flags (`cli.add_engine_arguments`)."""
    from tinyvllm.cli import add_engine_arguments

    parser = subcommands.add_parser("kernels", help="the kernels one decode step launches on the GPU, from the config")
    parser.add_argument("--batch", type=int, default=1, help="sequences in the step (default 1)")
    parser.add_argument(
        "--context",
        type=int,
        default=DEFAULT_CONTEXT,
        help=f"cached tokens per sequence (default {DEFAULT_CONTEXT}; the kernels do not depend on it)",
    )
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="of those, tokens every sequence holds in the same blocks, as the prefix cache shares them (default 0)",
    )
    parser.add_argument("--sms", type=int, default=H200_SMS, help=f"the GPU's SM count (default {H200_SMS}, the H200)")
    parser.add_argument("--no-cublas", action="store_true", help="a GPU without cuBLAS (CuPy not installed)")
    add_engine_arguments(parser)
    parser.set_defaults(handler=run_kernels)
    return parser


def run_kernels(args: argparse.Namespace) -> None:
    """Print the decode step's kernel list for the command's arguments (--model: a model
    directory or its config.json)."""
    from tinyvllm.cli import engine_config

    if args.model is None:
        raise ValueError("model: give a model directory or its config.json")
    config = load_model_config(args.model)
    engine = engine_config(args)
    calls = decode_step_kernels(
        config,
        args.batch,
        context=args.context,
        shared=args.shared_prefix,
        num_sms=args.sms,
        cublas_available=not args.no_cublas,
        **dataclasses.asdict(engine),
    )
    cublas = "without cuBLAS" if args.no_cublas else "with cuBLAS"
    print(
        f"{args.model}: one decode step of {args.batch} sequence{'s' if args.batch > 1 else ''} "
        f"({args.shared_prefix} of {args.context} cached tokens shared) "
        f"on a GPU of {args.sms} SMs {cublas}, "
        f"linear_backend {engine.linear_backend!r}"
    )
    print(format_kernels(calls, config.num_hidden_layers))
