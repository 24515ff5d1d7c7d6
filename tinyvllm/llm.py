"""LLM: offline generation over an `LLMEngine`, vLLM's entry point for batches of prompts."""

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tinyvllm.engine.llm_engine import LLMEngine, Prompt
from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.sampling_params import SamplingParams


class LLM:
    """Offline generation: `LLM(model).generate(prompts, params)` -> list[RequestOutput].

    Args:
        model: a Hugging Face model directory (`config.json`, `model.safetensors` or a sharded
            index, `tokenizer.json`); None runs the embedded SmolLM2-135M-Instruct, fetched and
            converted on first use.
        **kwargs: the engine options, passed on to `LLMEngine`: either keyword arguments named
            after the fields of `tinyvllm.config.EngineConfig` (documented there, on this page),
            or `engine_config=EngineConfig(...)`, never both. Each is checked before any weight
            loads; a bad one raises ValueError naming it.
    """

    def __init__(self, model: str | Path | None = None, **kwargs):
        self.engine = LLMEngine(model, **kwargs)
        self.tokenizer = self.engine.tokenizer

    @property
    def llm_engine(self) -> LLMEngine:
        """The engine underneath (vLLM's name for it; `engine` here)."""
        return self.engine

    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without SamplingParams samples with: the model's generation_config.json
        defaults (vLLM's name)."""
        return self.engine.default_sampling_params()

    def get_tokenizer(self) -> Tokenizer:
        """The model's tokenizer (vLLM's name)."""
        return self.tokenizer

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool | Callable = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, token ids, or a dict prompt: {"prompt": text} or
        {"prompt_token_ids": ids}); outputs in prompt order, each finished.

        All prompts are validated before any runs: a bad one raises ValueError and none is queued.

        Args:
            prompts: one prompt or a list; a prompt is a string (sent as it is, no chat template)
                a list of token ids, or a dict prompt.
            sampling_params: one `SamplingParams` for every prompt, or one per prompt; None takes
                the model's `generation_config.json` defaults and `max_tokens=16`, as in vLLM.
            use_tqdm: show a tqdm progress bar on stderr, as vLLM does (a callable: a tqdm-like
                class to use instead); False shows none.
        """
        if isinstance(prompts, (str, Mapping)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(prompts)} prompts")
        request_ids = []
        finished: dict[str, RequestOutput] = {}
        progress = None
        try:
            for prompt, params in zip(prompts, sampling_params):
                request_ids.append(self.engine.add_request(prompt, params, final_only=True))
            progress = _Progress(len(request_ids), use_tqdm)
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        progress.update(output)
        except BaseException:  # a bad prompt, or KeyboardInterrupt: what was queued frees its blocks
            for request_id in request_ids:
                self.engine.abort(request_id)
            raise
        finally:
            if progress is not None:
                progress.close()
        return [finished[request_id] for request_id in request_ids]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool | Callable = True,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template and generate (vLLM's arguments).

        Args:
            messages: one conversation, a list of `{"role", "content"}` dicts, or a list of them.
            sampling_params: as for `generate`.
            use_tqdm: as for `generate`.
            add_generation_prompt: end the prompt with the template's opening of an assistant turn.
            continue_final_message: end the prompt inside the last message, which the model then
                continues (a prefilled answer); needs add_generation_prompt=False, as in vLLM.
            chat_template: a Jinja chat template (its text) in place of the model's.
            chat_template_kwargs: more variables for the template (e.g. `date_string`).
        """
        if add_generation_prompt and continue_final_message:
            raise ValueError("continue_final_message needs add_generation_prompt=False")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        options = {**(chat_template_kwargs or {}), "continue_final_message": continue_final_message,
                   "chat_template": chat_template}  # fmt: skip
        prompts = [self.tokenizer.encode_chat(chat, add_generation_prompt, **options) for chat in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)


class _Progress:
    """vLLM's bar: prompts processed, and the input and output speed so far."""

    def __init__(self, total: int, use_tqdm: bool | Callable) -> None:
        self.bar = None
        if not use_tqdm:
            return
        if callable(use_tqdm):
            bar_class = use_tqdm
        else:
            from tqdm import tqdm as bar_class
        self.start = time.perf_counter()
        self.input_tokens = self.output_tokens = 0
        self.bar = bar_class(total=total, desc="Processed prompts", dynamic_ncols=True, postfix=_speeds(0.0, 0.0))

    def update(self, output: RequestOutput) -> None:
        if self.bar is None:
            return
        self.input_tokens += len(output.prompt_token_ids)
        self.output_tokens += sum(len(completion.token_ids) for completion in output.outputs)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.bar.postfix = _speeds(self.input_tokens / elapsed, self.output_tokens / elapsed)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _speeds(input_per_s: float, output_per_s: float) -> str:
    return f"est. speed input: {input_per_s:.2f} toks/s, output: {output_per_s:.2f} toks/s"
