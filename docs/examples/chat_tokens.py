"""Render a chat with the Llama 3.2 template, tokenize it, and stream the ids back to text with
the incremental detokenizer, on a byte-level tokenizer (no download, no GPU).

Run it from the repository root: python docs/examples/chat_tokens.py
The tokenizer is the test suite's: one token per byte plus Llama 3's special tokens, so a
character of several UTF-8 bytes is several tokens.
"""

import tempfile
from pathlib import Path

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm.engine.detokenizer import IncrementalDetokenizer
from tinyvllm.model.tokenizer import Tokenizer

with tempfile.TemporaryDirectory() as scratch:
    model_dir = make_random_llama_dir(Path(scratch), tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    tokenizer = Tokenizer.from_dir(model_dir)

messages = [{"role": "user", "content": "Héllo 👋"}]
text = tokenizer.apply_chat_template(messages, date_string="26 Jul 2024")
ids = tokenizer.encode_chat(messages, date_string="26 Jul 2024")
print(text)
print(f"{len(ids)} ids, starting {ids[:3]}: the template wrote <|begin_of_text|> itself")
assert ids.count(tokenizer.bos_token_id) == 1  # encoded without the post-processor's BOS
assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")  # the open assistant turn

# Stream a reply one id at a time: the 4-byte emoji is 4 tokens, and no text comes out until
# its last byte arrives, so the stream never shows a broken character.
reply = tokenizer.encode("ok 👋", add_special_tokens=False)
detokenizer = IncrementalDetokenizer(tokenizer)
pieces = [detokenizer.step([token]) for token in reply]
print("emitted per token:", pieces)
assert pieces[-4:-1] == ["", "", ""] and pieces[-1] == "👋"
assert "".join(pieces) + detokenizer.finish() == tokenizer.decode(reply)
