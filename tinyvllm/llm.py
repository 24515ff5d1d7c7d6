"""LLM: offline generation over an `LLMEngine`, vLLM's entry point for batches of prompts."""

from pathlib import Path

from tinyvllm.engine.llm_engine import LLMEngine, Prompt
from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.sampling_params import SamplingParams


class LLM:
    """Offline generation: `LLM(model).generate(prompts, params)` -> list[RequestOutput]."""

    def __init__(self, model: str | Path | None = None, **kwargs):
        """`kwargs` are the engine options, EngineConfig's fields, or `engine_config=EngineConfig(...)`."""
        self.engine = LLMEngine(model, **kwargs)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in prompt order.

        All prompts are validated before any runs: a bad one raises ValueError and none is queued.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(prompts)} prompts")
        request_ids = []
        try:
            for prompt, params in zip(prompts, sampling_params):
                request_ids.append(self.engine.add_request(prompt, params, final_only=True))
        except ValueError:
            for request_id in request_ids:
                self.engine.abort(request_id)
            raise
        finished: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
        return [finished[request_id] for request_id in request_ids]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template (with the generation prompt) and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.encode_chat(conversation) for conversation in conversations]
        return self.generate(prompts, sampling_params)
