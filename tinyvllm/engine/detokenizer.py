"""Streaming text: token ids arrive one step at a time; emit only text that is final.

Decoding each new token on its own is wrong twice over. A byte-level BPE token can hold
part of a UTF-8 character (an emoji spans up to four tokens), and decoding it alone gives
U+FFFD, the replacement character. And a sentencepiece-style decoder drops the leading
space of whichever token comes first, so "▁world" alone reads "world", not " world".

So, as vLLM does, keep two offsets into the ids: `read_offset`, up to which text has
been emitted, and `prefix_offset`, a little before it. Each step decodes the window
ids[prefix_offset:] and subtracts the text of ids[prefix_offset:read_offset]; the
tokens before read_offset give the new ones their context (leading spaces come out
right) and the window stays a few tokens long, so a step costs the same at token 10
and token 10,000. While the window's text ends in U+FFFD a character is still
incomplete: nothing is emitted and the offsets stay, so the next token completes it.
`finish()` emits whatever is still held, replacement characters included, once the
sequence has ended. For valid text the stream is exactly the full decode. Ids that make
invalid UTF-8 differ in one corner: a sentencepiece byte-fallback decoder turns every
byte of an invalid run into U+FFFD, so a byte already streamed as a character may read
U+FFFD in a later full decode (vLLM streams the same way).

Stop strings are found in the emitted text: `find_stop_string` for a match, and
`partial_stop_length` for the tail that could still grow into one, which a stream holds
back until it can tell.
"""

from collections.abc import Sequence

from tinyvllm.model.tokenizer import Tokenizer

REPLACEMENT_CHARACTER = "\ufffd"
PROMPT_CONTEXT_TOKENS = 5  # vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET


# --8<-- [start:incremental]
class IncrementalDetokenizer:
    """One sequence's streaming decoder. `text` is everything emitted so far, `num_tokens` the
    number of ids it has been given (the prompt's and the generated ones)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # The window never reaches back past the prompt's last PROMPT_CONTEXT_TOKENS: keeping
        # only those spares a copy of every prompt at admission.
        self.token_ids = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self.num_tokens = len(prompt_ids)
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text = ""

    def step(self, new_ids: Sequence[int]) -> str:
        """Append generated ids; return the text they make final (possibly empty)."""
        self.token_ids.extend(new_ids)
        self.num_tokens += len(new_ids)
        prefix_text, window_text = self._window_texts()
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT_CHARACTER):
            return ""
        return self._emit(window_text[len(prefix_text) :])

    def finish(self) -> str:
        """The sequence has ended: return the text still held back (an incomplete character decodes as U+FFFD)."""
        prefix_text, window_text = self._window_texts()
        if len(window_text) <= len(prefix_text):
            return ""
        return self._emit(window_text[len(prefix_text) :])

    def _window_texts(self) -> tuple[str, str]:
        decode = self.tokenizer.decode
        prefix_text = decode(self.token_ids[self.prefix_offset : self.read_offset], self.skip_special_tokens)
        window_text = decode(self.token_ids[self.prefix_offset :], self.skip_special_tokens)
        return prefix_text, window_text

    def _emit(self, new_text: str) -> str:
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.text += new_text
        return new_text


# --8<-- [end:incremental]


def find_stop_string(text: str, stop: Sequence[str], num_new_chars: int) -> tuple[int, str] | None:
    """The earliest stop string in `text` that reaches into its last `num_new_chars` characters.

    Returns (index where it starts, the stop string), or None. Only matches that overlap
    the new characters are looked for: earlier ones were found in earlier steps.
    """
    best = None
    for candidate in stop:
        if not candidate:
            continue
        start = max(len(text) - num_new_chars - len(candidate) + 1, 0)
        index = text.find(candidate, start)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, candidate)
    return best


def partial_stop_length(text: str, stop: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string (hold it back)."""
    longest = 0
    for candidate in stop:
        for length in range(min(len(candidate) - 1, len(text)), longest, -1):
            if text.endswith(candidate[:length]):
                longest = length
                break
    return longest
