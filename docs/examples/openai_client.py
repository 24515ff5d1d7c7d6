"""The quickstart's `openai` client against `tinyvllm serve`: a streamed chat reply, greedy.
The file starts the server itself on a free port, and stops it at the end (`serve_in_background.py`),
so it runs alone.

Run it from the repository root: python docs/examples/openai_client.py
"""

from openai import OpenAI
from serve_in_background import running_server

with running_server() as url:
    # --8<-- [start:client]
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",  # the model directory's name, or --served-model-name
        messages=[{"role": "user", "content": "Write a haiku about the sea."}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    # --8<-- [end:client]
    print()
    assert chunk.choices[0].finish_reason in ("stop", "length")  # the last chunk says why the reply ended
