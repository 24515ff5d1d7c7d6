"""The `tinyvllm` command line: generate, chat, serve, bench, convert, kernels.

Every subcommand that runs a model takes the same engine flags: --model (with none, the
embedded SmolLM2-135M-Instruct) and one flag per EngineConfig field (--mode, --backend,
--max-num-seqs, ...); `serve` also takes the model positionally, as `vllm serve MODEL`
does. Only argparse and the config are imported here; each subcommand imports the engine
when it runs, so `tinyvllm --help` loads no Numba.
"""

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence

from tinyvllm import __version__
from tinyvllm.backends import kernel_list
from tinyvllm.config import EngineConfig, option_type


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, and one flag per EngineConfig field (--max-num-seqs for max_num_seqs), its help and default."""
    group = parser.add_argument_group("engine")
    group.add_argument("--model", help="Hugging Face model directory (default: the embedded SmolLM2-135M-Instruct)")
    for spec in dataclasses.fields(EngineConfig):
        flag = "--" + spec.name.replace("_", "-")
        help_text = spec.metadata["help"]
        kind = option_type(spec)
        if kind is bool:
            # --no-X turns off an option that is on by default (--no-enable-prefix-caching).
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=spec.default, help=help_text)
            continue
        if spec.default is not None:
            help_text += f" (default: {spec.default})"
        group.add_argument(flag, type=kind, choices=spec.metadata["choices"], default=spec.default, help=help_text)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine options the flags set (a bad value raises ValueError naming it)."""
    return EngineConfig(**{spec.name: getattr(args, spec.name) for spec in dataclasses.fields(EngineConfig)})


def add_sampling_arguments(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=-1)
    group.add_argument("--max-tokens", type=int, default=max_tokens)
    group.add_argument("--stop", action="append", help="stop string (repeatable)")
    group.add_argument("--ignore-eos", action="store_true")


def sampling_params(args: argparse.Namespace):
    from tinyvllm.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )


def read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompts)
    if args.file:
        with open(args.file, encoding="utf-8") as handle:
            prompts += [line.rstrip("\n") for line in handle if line.strip()]
    if prompts == ["-"] or (not prompts and not sys.stdin.isatty()):
        prompts = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        raise SystemExit("tinyvllm generate: no prompt given (arguments, --file, or stdin)")
    return prompts


def cmd_generate(args: argparse.Namespace) -> None:
    from tinyvllm.llm import LLM

    prompts = read_prompts(args)
    params = sampling_params(args)
    llm = LLM(args.model, engine_config=engine_config(args))
    if args.raw:
        outputs = llm.generate(prompts, params)
    else:
        outputs = llm.chat([[{"role": "user", "content": prompt}] for prompt in prompts], params)
    for prompt, output in zip(prompts, outputs):
        (completion,) = output.outputs
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": completion.text,
                        "token_ids": completion.token_ids,
                        "finish_reason": completion.finish_reason,
                        "prompt_tokens": len(output.prompt_token_ids),
                    }
                )
            )
        else:
            print(completion.text)


def cmd_chat(args: argparse.Namespace) -> None:
    from tinyvllm.serving.chat import run_chat

    run_chat(args.model, engine_config(args), sampling_params(args), system=args.system)


def serve_model(args: argparse.Namespace) -> str | None:
    """The model `serve` was given, positionally or by --model; both, if they differ, is an error."""
    if args.model_tag is not None and args.model is not None and args.model_tag != args.model:
        raise ValueError(
            f"the positional MODEL ({args.model_tag}) and --model ({args.model}) name different models; give one"
        )
    return args.model_tag if args.model_tag is not None else args.model


def cmd_serve(args: argparse.Namespace) -> None:
    model = serve_model(args)
    from tinyvllm.serving.server import run_server

    run_server(
        model,
        engine_config(args),
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=args.max_body_bytes,
        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,  # as vllm serve reads it
        log_requests=not args.disable_log_requests,
        log_stats=not args.disable_log_stats,
        chat_template=args.chat_template,
    )


BENCH_SETTINGS = {"latency": ("prompt_len", "new_tokens"), "throughput": ("requests", "min_len", "max_len")}
"""The flags each `bench` run reads, recorded in its --output-json."""


def bench_progress(message: str) -> None:
    """A progress line of `tinyvllm bench`, on stderr so that stdout holds only the table."""
    print(f"tinyvllm bench: {message}", file=sys.stderr, flush=True)


def engine_settings(engine) -> dict:
    """The options the engine runs with: its resolved config, with the backend `auto` picked
    and the KV blocks it allocated in place of `auto` and None."""
    runner = engine.runner
    return dataclasses.asdict(engine.engine_config) | {"backend": runner.backend.name, "num_blocks": runner.num_blocks}


def cmd_bench(args: argparse.Namespace) -> None:
    from tinyvllm import benchmark
    from tinyvllm.llm import LLM
    from tinyvllm.provenance import run_header

    bench_progress(f"loading {args.model or 'the embedded SmolLM2-135M-Instruct'}")
    start = time.perf_counter()
    llm = LLM(args.model, engine_config=engine_config(args))
    engine = engine_settings(llm.engine)
    settings = {name: getattr(args, name) for name in BENCH_SETTINGS[args.run]}
    bench_progress(
        f"model loaded in {time.perf_counter() - start:.1f} s; "
        + ", ".join(f"{name}={value}" for name, value in (engine | settings).items())
    )
    vocab = llm.engine.config.vocab_size
    if args.run == "latency":
        result = benchmark.decode_latency(llm, args.prompt_len, args.new_tokens, progress=bench_progress)
        rows = [
            ("time to first token (ms)", result["time_to_first_token_ms"]),
            ("decode ms/token", result["decode_ms_per_token"]),
            ("decode tok/s", result["decode_tok_per_s"]),
        ]
    else:
        workload = benchmark.random_workload(
            args.requests, (args.min_len, args.max_len), (args.min_len, args.max_len), vocab
        )
        result = benchmark.throughput(llm, workload, progress=bench_progress)
        rows = [
            ("requests", result["requests"]),
            ("output tokens", result["output_tokens"]),
            ("seconds", result["seconds"]),
            ("output tok/s", result["output_tok_per_s"]),
        ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:12.2f}" if isinstance(value, float) else f"{name:<{width}}  {value:12d}")
    if args.output_json:
        record = run_header(engine["backend"], args.command_line) | {
            "benchmark": args.run,
            "model": str(llm.engine.model_dir),
            "settings": settings,
            "engine": engine,
            "results": result,
        }
        with open(args.output_json, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(record, indent=2) + "\n")
        bench_progress(f"wrote {args.output_json}")


def cmd_convert(args: argparse.Namespace) -> None:
    from tinyvllm.model.gguf.convert import convert_gguf

    convert_gguf(args.gguf, args.out_dir)
    print(f"wrote {args.out_dir}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinyvllm", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tinyvllm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate text for one or more prompts")
    generate.add_argument("prompts", nargs="*", help="prompts ('-' reads one per line from stdin)")
    generate.add_argument("--file", help="read prompts from a file, one per line")
    generate.add_argument("--raw", action="store_true", help="plain completion, no chat template")
    generate.add_argument("--json", action="store_true", help="one JSON object per prompt")
    add_engine_arguments(generate)
    add_sampling_arguments(generate, max_tokens=256)
    generate.set_defaults(handler=cmd_generate)

    chat = commands.add_parser("chat", help="an interactive conversation (/reset, /exit)")
    chat.add_argument("--system", help="system prompt")
    add_engine_arguments(chat)
    add_sampling_arguments(chat, max_tokens=512)
    chat.set_defaults(handler=cmd_chat)

    serve = commands.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)"
    )
    serve.add_argument(
        "model_tag", nargs="?", metavar="MODEL", help="Hugging Face model directory, as --model (vllm serve MODEL)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (without --api-key, keep it local)")
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/* (default: $VLLM_API_KEY)")
    serve.add_argument("--disable-log-requests", action="store_true", help="no log line per request")
    serve.add_argument("--disable-log-stats", action="store_true", help="no periodic engine stats line")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", help="the model's name in the API (default: the model directory's name)")
    serve.add_argument(
        "--max-tokens-limit", type=int, help="most max_tokens a request may ask for (default: max_model_len)"
    )
    serve.add_argument("--chat-template", help="a chat template file (or its Jinja text) in place of the model's")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body accepted")
    add_engine_arguments(serve)
    serve.set_defaults(handler=cmd_serve)

    bench = commands.add_parser("bench", help="latency (batch-1 decode) or offline throughput, as a table")
    bench.add_argument("run", choices=("latency", "throughput"))
    bench.add_argument("--prompt-len", type=int, default=128, help="latency: prompt tokens")
    bench.add_argument("--new-tokens", type=int, default=256, help="latency: tokens to generate")
    bench.add_argument("--requests", type=int, default=256, help="throughput: number of requests")
    bench.add_argument("--min-len", type=int, default=100, help="throughput: shortest prompt and output")
    bench.add_argument("--max-len", type=int, default=1024, help="throughput: longest prompt and output")
    bench.add_argument(
        "--output-json", metavar="FILE", help="also write the results, device, date, git revision and settings here"
    )
    add_engine_arguments(bench)
    bench.set_defaults(handler=cmd_bench)

    convert = commands.add_parser("convert", help="convert a GGUF file into a Hugging Face model directory")
    convert.add_argument("gguf", help="the .gguf file")
    convert.add_argument("out_dir", help="the directory to write")
    convert.set_defaults(handler=cmd_convert)

    kernel_list.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # bench records the command that produced its numbers; argv, not sys.argv, is it when main is called directly.
    args.command_line = shlex.join(["tinyvllm", *argv])
    try:
        args.handler(args)
    except ValueError as error:
        raise SystemExit(f"tinyvllm {args.command}: {error}") from error
