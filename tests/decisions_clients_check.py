"""OpenAI's Decisions API clients (openai 3.60.0 and langchain-openai 1.8.1, installed into .ci/venv by
scripts/setup-test-deps.sh) against a running `serve` on the default model: `decisions.create` sync, async
and raw (validated strictly against the SDK's `Decision` type), a 400's `param`, a DecisionsToolRunner run
with real executors (twice: the second run finds the task warm), and LangChain's OpenAIDecisions (text)
and OpenAIClassifier (system, AI tool calls, tool results, a dict as input_json). Run by
tests/decisions_clients.rs: `python tests/decisions_clients_check.py URL`. Prints one line per check;
exits non-zero on any failure."""
import asyncio
import math
import sys

import openai
from openai import AsyncOpenAI, OpenAI
from openai.types import Decision

URL = sys.argv[1] + "/v1"
client = OpenAI(base_url=URL, api_key="sk-local", max_retries=0)
MODEL = client.models.list().data[0].id
Q = [
    {"type": "predicate", "name": "damaged", "instructions": "Does the customer report a damaged item?"},
    {"type": "choice", "name": "dept", "instructions": "Which department?",
     "choices": [{"value": "returns"}, {"value": "billing", "description": "Payments"}, {"value": True}]},
    {"type": "score", "instructions": "How severe?", "levels": [{"label": "cosmetic"}, {"label": "broken"}]},
]
INPUT = "The screen arrived broken and I want my money back."


def check_decision(d):
    assert isinstance(d.model, str), d
    assert [a.type for a in d.answers] == ["predicate", "choice", "score"], d.answers
    assert [a.name for a in d.answers] == ["damaged", "dept", None], d.answers
    p, c, s = d.answers
    assert 0.0 <= p.probability <= 1.0, p
    assert [x.value for x in c.probabilities] == ["returns", "billing", True], c.probabilities
    assert c.choice in ("returns", "billing", True), c.choice
    assert abs(sum(x.probability for x in c.probabilities) - 1.0) < 1e-6, c.probabilities
    assert 0.0 <= c.confidence <= 1.0 and math.isfinite(c.confidence), c
    assert [(x.value, x.label) for x in s.probabilities] == [(0, "cosmetic"), (1, "broken")], s.probabilities
    assert abs(s.score - sum(x.value * x.probability for x in s.probabilities)) < 1e-5, s
    u = d.usage
    counters = [u.input_tokens, u.output_tokens, u.total_tokens, u.input_tokens_details.cached_tokens,
                u.input_tokens_details.cache_write_tokens, u.output_tokens_details.reasoning_tokens]
    assert all(type(x) is int for x in counters), u
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens > 0, u


d = client.decisions.create(model=MODEL, input=INPUT, questions=Q)
check_decision(d)
print("decisions.create:", [(a.type, a.name) for a in d.answers], d.usage.input_tokens)

raw = client.decisions.with_raw_response.create(model=MODEL, input=INPUT, questions=Q)
assert raw.headers.get("x-request-id"), dict(raw.headers)
body = raw.http_response.json()
assert set(body) == {"model", "answers", "usage"}, body
Decision.model_validate(body, strict=True)
check_decision(raw.parse())
assert raw.parse().answers == d.answers, "the same request, the same answers"
print("with_raw_response: strict Decision, x-request-id", raw.headers.get("x-request-id"))


async def run_async():
    async with AsyncOpenAI(base_url=URL, api_key="sk-local", max_retries=0) as ac:
        return await ac.decisions.create(model=MODEL, input=INPUT, questions=Q)


ad = asyncio.run(run_async())
check_decision(ad)
assert ad.answers == d.answers
print("async decisions.create: same answers")

try:
    client.decisions.create(model=MODEL, input=INPUT, questions=[
        {"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}])
    raise AssertionError("a duplicate choice was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.param == "questions[0].choices[1].value", (e.param, e.body)
    print("BadRequestError.param:", e.param)
try:
    client.decisions.create(model="no-such-model", input=INPUT, questions=Q)
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError:
    print("NotFoundError on an unknown model")

# DecisionsToolRunner: a pipeline of three steps run by real executors, each offered until it has run
# (then only `done` is left, which ends the run without a request); a stable task, a changing observation.
from openai.lib.decisions_tool_runner import DecisionsToolRunner  # noqa: E402

TASK = "You run a data pipeline. " + " ".join(
    f"Rule {i}: every step must be logged in the audit trail with its reason and its operator." for i in range(40))
STEPS = {"fetch": "Download the input files", "transform": "Clean and join the tables", "store": "Write the result"}


def run_pipeline():
    done = []

    def executor(step):
        return lambda: done.append(step)

    runner = DecisionsToolRunner(
        observe=lambda: "completed steps: " + (", ".join(done) or "none"),
        candidates=lambda obs: [
            {"id": k, "description": d, "execute": executor(k)} for k, d in STEPS.items() if k not in done
        ] + [{"id": "done", "description": "Every step of the pipeline has run", "done": True}],
        verify=lambda obs: True)
    res = runner.run(client, {"model": MODEL, "input": TASK, "safety_identifier": None}, max_steps=6)
    assert res["status"] in ("verified", "unverified"), res
    for d in res["decisions"]:
        assert d.answers[0].name == "next_action" and d.answers[0].type == "choice", d
    return res["status"], done, res["decisions"]


status1, done1, decisions1 = run_pipeline()
status2, done2, decisions2 = run_pipeline()
assert (status1, done1) == (status2, done2), "greedy reads: the same run twice"
assert decisions1, "the runner asked at least once"
first = decisions2[0]
cached = first.usage.input_tokens_details.cached_tokens
assert cached >= 0.8 * first.usage.input_tokens, f"second run's first step cached {cached} of {first.usage.input_tokens}"
later = [(d.usage.input_tokens_details.cached_tokens, d.usage.input_tokens) for d in decisions1[1:]]
print("DecisionsToolRunner:", status1, done1, len(decisions1), "decisions; second run's first step cached",
      cached, "of", first.usage.input_tokens, "; first run's later steps (cached, input):", later)

# Prompt-cache controls as openai 3.60 sends them on decisions, chat and responses: a breakpoint on the
# shared system text, written once, then read back warm by the other two APIs' calls over it.
SYSTEM = "You triage support tickets. " + " ".join(f"Rule {i}: route by the product named first." for i in range(30))
d = client.decisions.create(
    model=MODEL, prompt_cache_key="triage", prompt_cache_options={"mode": "implicit", "ttl": "30m"},
    input=[{"role": "system", "content": [{"type": "input_text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit"}}]},
           {"role": "user", "content": "My payout failed."}],
    questions=[{"type": "predicate", "name": "urgent", "instructions": "Is it urgent?"}])
wrote = d.usage.input_tokens_details.cache_write_tokens
assert wrote > 0, d.usage
c = client.chat.completions.create(
    model=MODEL, max_tokens=2, prompt_cache_key="triage", prompt_cache_retention="in_memory",
    prompt_cache_options={"mode": "explicit", "ttl": "30m"},
    messages=[{"role": "system", "content": [{"type": "text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}]},
              {"role": "user", "content": "Invoices are wrong."}])
assert c.usage.prompt_tokens_details.cached_tokens >= wrote, (c.usage, wrote)
r = client.responses.create(
    model=MODEL, max_output_tokens=16, store=False, prompt_cache_key="triage",
    prompt_cache_options={"mode": "implicit", "ttl": "12h"},
    input=[{"role": "developer", "content": [{"type": "input_text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit"}}]},
           {"role": "user", "content": "The app crashes."}])
assert r.usage.input_tokens_details.cached_tokens >= wrote, (r.usage, wrote)
print("prompt_cache_options/breakpoints: decision wrote", wrote, "; chat cached", c.usage.prompt_tokens_details.cached_tokens,
      "; responses cached", r.usage.input_tokens_details.cached_tokens)

# LangChain
from langchain_core.decisions import Choice as LcChoice  # noqa: E402
from langchain_core.decisions import Noul, Score as LcScore  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_openai.decisions import Choice, OpenAIClassifier, OpenAIDecisions, Predicate, Score  # noqa: E402

dm = OpenAIDecisions(model=MODEL, base_url=URL, api_key="sk-local", max_retries=0)
r = dm.invoke({"input": "Stripe has failed for three days. Help ASAP.",
               "questions": {"urgent": Predicate(instructions="Is this urgent?"),
                             "dept": Choice(instructions="Which team?", choices={"billing": "Payments", "technical": None}),
                             "anger": Score(instructions="How frustrated?", levels=["calm", "concerned", "angry"])}})
print("langchain OpenAIDecisions:", type(r).__name__, r if len(str(r)) < 400 else str(r)[:400])

cl = OpenAIClassifier(model=MODEL, base_url=URL, api_key="sk-local", max_retries=0)
questions = {
    "dept": LcChoice(instructions="Which team should handle this?", criteria={"billing": "Payments", "technical": "Bugs"}),
    "urgent": Noul(instructions="Is this urgent?"),
    "anger": LcScore(instructions="How frustrated is the customer?", criteria=["Calm.", "Concerned.", "Angry."]),
}
conv = [
    SystemMessage("You are a support triage agent."),
    HumanMessage("My payout failed again. Order 4417."),
    AIMessage("", tool_calls=[{"id": "call_1", "name": "lookup_order", "args": {"order": 4417}}]),
    ToolMessage("payout blocked: bank account closed", tool_call_id="call_1"),
]
rc = cl.invoke({"state": conv, "questions": questions})
assert rc.choices["dept"].choice in ("billing", "technical"), rc
assert 0.0 <= rc.nouls["urgent"].noul <= 1.0, rc
print("langchain OpenAIClassifier (messages, tool call and result):", rc.choices["dept"].choice,
      round(rc.nouls["urgent"].noul, 3), round(rc.scores["anger"].score, 3))
rj = cl.invoke({"state": {"order": 4417, "events": [{"kind": "payout_failed", "days": 3}]}, "questions": questions})
assert rj.choices["dept"].choice in ("billing", "technical"), rj
print("langchain OpenAIClassifier (dict state as input_json):", rj.choices["dept"].choice)
print("all decisions client checks passed")
