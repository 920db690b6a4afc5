"""The OpenAI Python SDK (openai 3.57.0, installed into .ci/venv by scripts/setup-test-deps.sh) against a
running `serve` on the default model: what real clients send besides sampling. Run by
tests/openai_sdk.rs: `python tests/openai_sdk_check.py URL`. Prints one line per check; exits non-zero
on any failure."""
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
