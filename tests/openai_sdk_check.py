"""The OpenAI Python SDK (openai 3.60.0, installed into .ci/venv by scripts/setup-test-deps.sh) against a
running `serve` on the default model: what real clients send besides sampling. Run by
tests/openai_sdk.rs: `python tests/openai_sdk_check.py URL`. Prints one line per check; exits non-zero
on any failure."""
import struct
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
name = client.models.list().data[0].id
m = client.models.retrieve(name)
assert (m.id, m.object) == (name, "model"), m
print("models.retrieve:", m.id)

msgs = [{"role": "user", "content": "Say hi"}]
r = client.chat.completions.create(
    model=name, messages=msgs, max_tokens=5, temperature=0,
    store=True, metadata={"run": "ci"}, user="u1", service_tier="auto", reasoning_effort="low",
)
plain = client.chat.completions.create(model=name, messages=msgs, max_tokens=5, temperature=0)
assert r.choices[0].message.content == plain.choices[0].message.content
print("store/metadata/user/service_tier/reasoning_effort:", repr(r.choices[0].message.content))

stream = client.chat.completions.create(
    model=name, messages=msgs, max_tokens=5, temperature=0, stream=True,
    stream_options={"include_usage": True, "continuous_usage_stats": True},
)
chunks = list(stream)
assert all(c.usage is not None for c in chunks), chunks
done = [c.usage.completion_tokens for c in chunks]
assert done == sorted(done) and done[-1] == plain.usage.completion_tokens, done
print("continuous_usage_stats:", done)

r = client.completions.create(model=name, prompt="The capital of France is", max_tokens=0, echo=True, logprobs=1)
c = r.choices[0]
assert c.text == "The capital of France is" and r.usage.completion_tokens == 0, r
lps = c.logprobs.token_logprobs
assert lps[0] is None and len(lps) == r.usage.prompt_tokens and all(x < 0 for x in lps[1:]), lps
print("max_tokens=0 echo:", lps)

r = client.completions.create(model=name, prompt="", max_tokens=3, temperature=0)
assert r.usage.prompt_tokens == 1 and r.choices[0].text, r
print("empty prompt:", repr(r.choices[0].text))

# /v1/responses: create, the stream helper's accumulator against the same request unstreamed (greedy),
# a tool call both ways, previous_response_id over a warm state, retrieve and delete.
r = client.responses.create(model=name, input="Say hello in one word.", max_output_tokens=200, temperature=0)
assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed", r
with client.responses.stream(model=name, input="Say hello in one word.", max_output_tokens=200, temperature=0) as s:
    types = [e.type for e in s]
    f = s.get_final_response()
assert f.output_text == r.output_text and f.status == r.status, (f, r)
assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed", types
print("responses.create / stream:", repr(r.output_text), r.status)
# the output limit: status incomplete, and the raw stream ends with response.incomplete
r = client.responses.create(model=name, input="Tell me a long story.", max_output_tokens=5, temperature=0)
assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
events = list(client.responses.create(model=name, input="Tell me a long story.", max_output_tokens=5,
                                      temperature=0, stream=True))
assert events[-1].type == "response.incomplete", events[-1]
assert [e.sequence_number for e in events] == list(range(len(events))), events
print("max_output_tokens: incomplete")

tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
r = client.responses.create(model=name, input="Weather in Paris?", tools=tools, tool_choice="required",
                            max_output_tokens=60, temperature=0)
calls = [(o.name, o.arguments) for o in r.output if o.type == "function_call"]
with client.responses.stream(model=name, input="Weather in Paris?", tools=tools, tool_choice="required",
                             max_output_tokens=60, temperature=0) as s:
    for _ in s:
        pass
    f = s.get_final_response()
assert calls and calls == [(o.name, o.arguments) for o in f.output if o.type == "function_call"], (r, f)
print("responses tool call:", calls)
r = client.responses.create(model=name, input="Fix the typo in README.", max_output_tokens=120, temperature=0,
                            tools=[{"type": "custom", "name": "apply_patch", "description": "Apply a patch"}],
                            tool_choice={"type": "custom", "name": "apply_patch"})
assert r.output[0].type == "custom_tool_call" and r.output[0].name == "apply_patch", r
assert isinstance(r.output[0].input, str), r
print("responses custom tool call:", repr(r.output[0].input[:40]))

state = " ".join(f"Entry {i}: parcel {i * 37 % 101} left the north warehouse." for i in range(40))
first = client.responses.create(model=name, input=state + " Summarize.", max_output_tokens=16, temperature=0)
second = client.responses.create(model=name, previous_response_id=first.id, input="Shorter.",
                                 max_output_tokens=4, temperature=0)
turn = first.usage.input_tokens + first.usage.output_tokens
cached = second.usage.input_tokens_details.cached_tokens
assert cached >= 0.9 * turn, (cached, turn)
print("previous_response_id:", cached, "of the first turn's", turn, "tokens cached")
assert client.responses.retrieve(first.id).output_text == first.output_text
client.responses.delete(first.id)
try:
    client.responses.retrieve(first.id)
    raise SystemExit("a deleted response is still there")
except Exception as e:  # openai.NotFoundError
    assert "404" in str(e) or "not" in str(e).lower(), e
print("retrieve / delete: ok")

# embeddings: the SDK asks for base64 by default and decodes it; floats asked explicitly agree with it
texts = ["The order shipped late.", "Refund the customer.", "The order shipped late."]
e64 = client.embeddings.create(model=name, input=texts)
ef = client.embeddings.create(model=name, input=texts, encoding_format="float")
assert [d.index for d in e64.data] == [0, 1, 2], e64
dim = len(e64.data[0].embedding)
assert dim > 0 and all(len(d.embedding) == dim for d in e64.data + ef.data)
f32 = lambda v: list(struct.unpack(f"{len(v)}f", struct.pack(f"{len(v)}f", *v)))
for a, b in zip(e64.data, ef.data):
    assert f32(a.embedding) == f32(b.embedding), "base64 and float disagree"
norm = sum(x * x for x in ef.data[0].embedding) ** 0.5
assert abs(norm - 1.0) < 1e-4, norm
assert ef.data[0].embedding == ef.data[2].embedding, "the same text twice differs"
assert ef.usage.prompt_tokens == ef.usage.total_tokens > 0, ef.usage
ids = client.embeddings.create(model=name, input=[[1, 2, 3], [4, 5]], encoding_format="float")
assert len(ids.data) == 2 and ids.usage.prompt_tokens == 5, ids.usage
try:
    client.embeddings.create(model=name, input="x", dimensions=dim // 2)
    raise SystemExit("dimensions was not refused")
except Exception as e:  # openai.BadRequestError
    assert "400" in str(e) and "dimensions" in str(e), e
print("embeddings:", dim, "dimensions, base64 == float, unit norm, token-id inputs, dimensions refused")
