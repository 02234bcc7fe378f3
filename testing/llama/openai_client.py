"""The official OpenAI Python client against `routelab serve` (host/tests/integration/llama.rs).

Usage: python openai_client.py BASE_URL   (e.g. http://127.0.0.1:8080/v1)
Prints one JSON object: what each call returned, for the test to check.
"""

import json
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused", timeout=120, max_retries=0)
out = {}
out["models"] = [m.id for m in client.models.list().data]

c = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0)
out["completion"] = {"text": c.choices[0].text, "completion_tokens": c.usage.completion_tokens}

chunks = list(
    client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
)
out["completion_stream"] = {"text": "".join(ch.choices[0].text for ch in chunks if ch.choices), "events": len(chunks)}

messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0)
out["chat"] = {"role": r.choices[0].message.role, "text": r.choices[0].message.content}

text, usage, usage_only_events = "", None, 0
for ch in client.chat.completions.create(
    model="smollm2", messages=messages, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
):
    if ch.choices and ch.choices[0].delta.content:
        text += ch.choices[0].delta.content
    if ch.usage is not None:
        usage = {"completion_tokens": ch.usage.completion_tokens, "prompt_tokens": ch.usage.prompt_tokens}
        usage_only_events += not ch.choices
out["chat_stream"] = {"text": text, "usage": usage, "usage_only_events": usage_only_events}
print(json.dumps(out))
