"""/v1/completions' `echo`, vLLM's way: each choice's text and logprobs start with the prompt's.

    {"prompt": "The sky is", "echo": true, "max_tokens": 0, "logprobs": 5}

scores a text: with `max_tokens` 0 a choice is the prompt alone, and its logprobs are the
prompt tokens' (the first token has none: null), each with its top alternatives. That is
how evaluation harnesses (lm-evaluation-harness's loglikelihood, perplexity scripts) use an
OpenAI-compatible server. With `max_tokens` > 0 the completion follows the prompt, its
tokens' logprobs after the prompt's. Asking for `logprobs` with echo asks for the prompt's
too (vLLM sets prompt_logprobs to logprobs). The engine still computes one token for a
`max_tokens` of 0 (a request samples at least one), which usage counts, as vLLM's does.
Streaming with echo is refused (`protocol.parse_completion`).
"""

from tinyvllm.engine.sequence import CompletionOutput, RequestOutput
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.serving.logprobs import LegacyRow, completion_rows, legacy_logprobs, legacy_row
from tinyvllm.serving.protocol import GenerationRequest
from tinyvllm.serving.responses import CompletionsAPI


def echo_choice(
    generation: GenerationRequest, output: RequestOutput, completion: CompletionOutput, tokenizer: Tokenizer
) -> dict:
    """The finished choice of `completion` with the prompt echoed in front of it."""
    only_prompt = generation.echo_only
    text = generation.echo + ("" if only_prompt else completion.text)
    logprobs = None
    if generation.params.logprobs is not None:
        rows = prompt_rows(output, tokenizer) + ([] if only_prompt else completion_rows(completion))
        logprobs = legacy_logprobs(rows)
    return CompletionsAPI.choice(completion.index, text, completion.finish_reason, logprobs)


def prompt_rows(output: RequestOutput, tokenizer: Tokenizer) -> list[LegacyRow]:
    """The legacy rows of the prompt's tokens, from its prompt logprobs."""
    first, *rest = output.prompt_token_ids
    rows: list[LegacyRow] = [(tokenizer.decode([first]), None, None)]
    return rows + [legacy_row(entry, token) for token, entry in zip(rest, output.prompt_logprobs[1:])]
