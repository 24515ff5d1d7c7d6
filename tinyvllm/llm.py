"""LLM: offline generation over an `LLMEngine`, vLLM's entry point for batches of prompts."""

from pathlib import Path

from tinyvllm.engine.llm_engine import LLMEngine, Prompt
from tinyvllm.engine.sequence import RequestOutput
from tinyvllm.sampling_params import SamplingParams


class LLM:
    """Offline generation: `LLM(model).generate(prompts, params)` -> list[RequestOutput].

    Args:
        model: a Hugging Face model directory (`config.json`, `model.safetensors` or a sharded
            index, `tokenizer.json`); None runs the embedded SmolLM2-135M-Instruct, fetched and
            converted on first use.
        **kwargs: the engine options, passed on to `LLMEngine`: either keyword arguments named
            after the fields of `tinyvllm.config.EngineConfig` (`mode`, `backend`, `block_size`,
            `gpu_memory_utilization`, `num_blocks`, `max_num_seqs`, `max_num_batched_tokens`,
            `max_model_len`, `linear_backend`, `enforce_eager`, `enable_prefix_caching`,
            `activation_dtype`, `cpu_kv_cache_gib`), or `engine_config=EngineConfig(...)`, never
            both. Each is checked before any weight loads; a bad one raises ValueError naming it.
    """

    def __init__(self, model: str | Path | None = None, **kwargs):
        self.engine = LLMEngine(model, **kwargs)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in prompt order.

        All prompts are validated before any runs: a bad one raises ValueError and none is queued.

        Args:
            prompts: one prompt or a list; a prompt is a string (sent as it is, no chat template)
                or a list of token ids.
            sampling_params: one `SamplingParams` for every prompt, or one per prompt; None takes
                the model's `generation_config.json` defaults and `max_tokens=16`, as in vLLM.
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
        """Apply the chat template (with the generation prompt) and generate.

        Args:
            messages: one conversation, a list of `{"role", "content"}` dicts, or a list of them.
            sampling_params: as for `generate`.
        """
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.encode_chat(conversation) for conversation in conversations]
        return self.generate(prompts, sampling_params)
