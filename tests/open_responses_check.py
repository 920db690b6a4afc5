"""The Open Responses compliance cases against a running `serve`, every response and every stream event
validated against the spec's published OpenAPI document (the `openresponses-py` wheel carries it:
openresponses/openapi/2026-04-24.json, Apache-2.0) and against openai-python's generated types. Run by
tests/open_responses.rs: `python tests/open_responses_check.py URL MODEL`. Prints one line per case;
exits non-zero on any failure.

The cases are the suite's (basic, streaming, system prompt, tool calling, tool calling streamed, image
input, multi-turn) — image input on a text-only model must get the spec's error object, a 400 naming
`input` — then the stored response retrieved, the sampling fields echoed with the values used, a
background response polled and one cancelled, a compaction continued from, and the WebSocket mode's cases
(events validated as the stream's, errors as WebSocketErrorEvent)."""
import importlib.resources
import json
import sys
import time

import httpx
import jsonschema
import openai.types.responses as otypes
from openai import OpenAI
from pydantic import TypeAdapter
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

BASE, MODEL = sys.argv[1] + "/v1", sys.argv[2]
DOC = json.loads((importlib.resources.files("openresponses") / "openapi" / "2026-04-24.json").read_text())
URI = "urn:openresponses"
REGISTRY = Registry().with_resource(URI, Resource(contents=DOC, specification=DRAFT202012))
SCHEMAS = DOC["components"]["schemas"]
# the stream's event schemas by their `type`
EVENT_REFS = DOC["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]["oneOf"]
EVENTS = {}
for ref in EVENT_REFS:
    name = ref["$ref"].rsplit("/", 1)[1]
    for t in SCHEMAS[name]["properties"]["type"]["enum"]:
        EVENTS[t] = name
OPENAI_EVENT = TypeAdapter(otypes.ResponseStreamEvent)
failures = []


def validator(name):
    return jsonschema.Draft202012Validator({"$ref": f"{URI}#/components/schemas/{name}"}, registry=REGISTRY)


def check(name, value, what):
    errs = sorted(validator(name).iter_errors(value), key=lambda e: list(e.absolute_path))
    for e in errs[:5]:
        failures.append(f"{what}: {name} at {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}")
    return not errs


def check_response(r, what):
    check("ResponseResource", r, what)
    try:
        otypes.Response.model_validate(r)
    except Exception as e:  # pydantic's ValidationError, shortened
        failures.append(f"{what}: openai-python Response: {str(e)[:400]}")


def post(path, body, **kw):
    return httpx.post(BASE + path, json=body, timeout=600, **kw)


def stream(body):
    events = []
    with httpx.stream("POST", BASE + "/responses", json={**body, "stream": True}, timeout=600) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                ev = json.loads(line[6:])
                assert name == ev["type"], (name, ev["type"])
                events.append(ev)
    return events


def check_events(events, what):
    seqs = [e["sequence_number"] for e in events]
    if seqs != list(range(len(seqs))):
        failures.append(f"{what}: sequence numbers {seqs[:10]}…")
    for e in events:
        name = EVENTS.get(e["type"])
        if name is None:
            failures.append(f"{what}: event type {e['type']!r} is not in the spec")
            continue
        check(name, e, f"{what} {e['type']}")
        try:
            OPENAI_EVENT.validate_python(e)
        except Exception as x:
            failures.append(f"{what}: openai-python {e['type']}: {str(x)[:300]}")
    final = events[-1]["response"]
    check_response(final, what + " (final)")
    return final


def case(id, body, streaming=False):
    body = {"temperature": 0, **body}  # the suite's bodies, greedy: the same answer on every run
    if streaming:
        events = stream(body)
        r = check_events(events, id)
        print(f"{id}: {len(events)} events, status {r['status']}, output {[i['type'] for i in r['output']]}")
        return r, events
    resp = post("/responses", body)
    assert resp.status_code == 200, (id, resp.status_code, resp.text)
    r = resp.json()
    check_response(r, id)
    print(f"{id}: status {r['status']}, output {[i['type'] for i in r['output']]}")
    return r, None


def user(text):
    return {"type": "message", "role": "user", "content": text}


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}},
        "required": ["location"],
    },
}

# the suite's cases
r, _ = case("basic-response", {"model": MODEL, "input": [user("Say hello in exactly 3 words.")]})
assert r["output"] and r["status"] == "completed", r
basic = r
r, _ = case("streaming-response", {"model": MODEL, "input": [user("Count from 1 to 5.")]}, streaming=True)
assert r["status"] == "completed", r
r, _ = case("system-prompt", {"model": MODEL, "input": [
    {"type": "message", "role": "system", "content": "You are a pirate. Always respond in pirate speak."},
    user("Say hello.")]})
assert r["output"] and r["status"] == "completed", r
weather = {"model": MODEL, "input": [user("What's the weather like in San Francisco?")], "tools": [WEATHER]}
r, _ = case("tool-calling", weather)
assert any(i["type"] == "function_call" for i in r["output"]), r["output"]
assert r["tools"][0]["strict"] is not None and r["tools"][0]["name"] == "get_weather", r["tools"]
r, events = case("tool-calling-streaming", weather, streaming=True)
kinds = [e["type"] for e in events]
for want in ("response.function_call_arguments.delta", "response.function_call_arguments.done"):
    assert want in kinds, (want, kinds)
for k in ("response.output_item.added", "response.output_item.done"):
    assert any(e["type"] == k and e["item"]["type"] == "function_call" for e in events), (k, kinds)
img = post("/responses", {"model": MODEL, "input": [{"type": "message", "role": "user", "content": [
    {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]})
assert img.status_code == 400, (img.status_code, img.text)
check("ErrorPayload", img.json()["error"], "image-input error")
assert img.json()["error"]["param"] == "input" and "image" in img.json()["error"]["message"], img.text
print("image-input: 400", img.json()["error"]["message"])
r, _ = case("multi-turn", {"model": MODEL, "input": [
    user("My name is Alice."),
    {"type": "message", "role": "assistant", "content": "Hello Alice! Nice to meet you. How can I help you today?"},
    user("What is my name?")]})
assert r["output"] and r["status"] == "completed", r

# stored, retrieved: the same object
got = httpx.get(f"{BASE}/responses/{basic['id']}", timeout=60).json()
check_response(got, "retrieve")
assert got == basic, (got, basic)
print("retrieve: equal to the created response")

# the fields echoed with the values used
r, _ = case("echo", {"model": MODEL, "input": "Hi", "max_output_tokens": 4, "temperature": 0.5, "top_p": 0.9,
                     "presence_penalty": 0.25, "frequency_penalty": 0.5, "prompt_cache_key": "k-echo",
                     "safety_identifier": "u-1", "max_tool_calls": 3, "reasoning": {"effort": "low"},
                     "text": {"verbosity": "low"}, "metadata": {"a": "b"}})
want = {"temperature": 0.5, "top_p": 0.9, "presence_penalty": 0.25, "frequency_penalty": 0.5,
        "prompt_cache_key": "k-echo", "safety_identifier": "u-1", "max_tool_calls": 3, "top_logprobs": 0,
        "max_output_tokens": 4, "metadata": {"a": "b"}}
assert {k: r[k] for k in want} == want, {k: r[k] for k in want}
assert r["status"] == "incomplete" and r["completed_at"] is None, r
assert r["reasoning"] == {"effort": "low", "summary": None} and r["text"]["format"] == {"type": "text"}, r
d, _ = case("defaults", {"model": MODEL, "input": "Hi", "max_output_tokens": 16})
assert isinstance(d["temperature"], float | int) and isinstance(d["top_p"], float | int), d
assert d["status"] != "completed" or d["completed_at"] >= d["created_at"], d
print("echo:", want)

# background: queued at once, polled to its end; another cancelled while it runs (the OpenAI SDK)
client = OpenAI(base_url=BASE, api_key="unused")
raw = client.responses.with_raw_response.create(model=MODEL, input="Count from 1 to 20.", background=True,
                                                temperature=0, max_output_tokens=48)
bg = raw.http_response.json()
check_response(bg, "background (created)")
assert bg["background"] is True and bg["status"] in ("queued", "in_progress"), bg
deadline = time.time() + 300
while True:
    body = client.responses.with_raw_response.retrieve(bg["id"]).http_response.json()
    if body["status"] not in ("queued", "in_progress") or time.time() > deadline:
        break
    time.sleep(0.2)
check_response(body, "background (polled)")
assert body["status"] in ("completed", "incomplete") and body["output"], body
print("background:", bg["status"], "->", body["status"], body["usage"]["output_tokens"], "tokens")
long = client.responses.create(model=MODEL, input="Write a very long story.", background=True, temperature=0,
                               max_output_tokens=4000)
c = client.responses.with_raw_response.cancel(long.id).http_response.json()
check_response(c, "background (cancelled)")
got = client.responses.retrieve(long.id)
assert c["status"] == "cancelled" and got.status == "cancelled", (c["status"], got.status)
print("background cancel:", got.status)

# compaction: a long conversation compacted, then continued from the window, warm
facts = [f"Run {i}: the cache held {i * 37 % 101} blocks, latency was {i * 13 % 97} ms, and the fix for case {i} "
         f"was to raise the pool to {i * 8} slots." for i in range(1, 41)]
convo = []
for t in range(6):
    convo.append(user(f"Report batch {t} of the benchmark."))
    convo.append({"type": "message", "role": "assistant",
                  "content": " ".join(facts[(t * 7 + k) % 40] for k in range(26))})
convo.append(user("Which run had the largest pool?"))
raw = client.responses.with_raw_response.compact(model=MODEL, input=convo, prompt_cache_key="k-compact")
cmp = raw.http_response.json()
check("CompactResource", cmp, "compact")
# openai-python's CompactedResponse types `output` as output items, which cannot hold the user messages
# (input_text) its own docstring says the window keeps: its usage and compaction item are checked
try:
    otypes.ResponseUsage.model_validate(cmp["usage"])
    otypes.ResponseCompactionItem.model_validate(cmp["output"][-1])
except Exception as e:
    failures.append(f"compact: openai-python types: {str(e)[:400]}")
assert cmp["output"][-1]["type"] == "compaction", cmp["output"]
full = cmp["usage"]["input_tokens"]
nxt, _ = case("after-compaction", {"model": MODEL, "input": cmp["output"] + [user("Continue.")],
                                   "prompt_cache_key": "k-compact", "max_output_tokens": 8})
u = nxt["usage"]
share, cached = u["input_tokens"] / full, u["input_tokens_details"]["cached_tokens"] / u["input_tokens"]
print(f"compaction: {full} prompt tokens compacted; next turn {u['input_tokens']} ({share:.1%}), "
      f"{u['input_tokens_details']['cached_tokens']} cached ({cached:.1%})")
assert full >= 6000, full
assert share <= 0.25 and cached >= 0.9, (share, cached)
bad = post("/responses", {"model": MODEL, "input": [{"type": "compaction", "encrypted_content": "cmp_nope"}]})
assert bad.status_code == 404 and isinstance(bad.json()["error"]["code"], str), bad.text
check("ErrorPayload", bad.json()["error"], "unknown compaction")

# conversations: created with an item, answered into, listed, updated, items deleted, deleted
conv = client.conversations.create(items=[user("My name is Alice.")], metadata={"topic": "names"})
r1 = client.responses.with_raw_response.create(model=MODEL, input="What is my name?", conversation=conv.id,
                                               temperature=0, max_output_tokens=12).http_response.json()
check_response(r1, "conversation turn 1")
assert r1["conversation"] == {"id": conv.id}, r1["conversation"]
r2 = client.responses.create(model=MODEL, input="Say it again.", conversation={"id": conv.id}, temperature=0,
                             max_output_tokens=12)
items = client.conversations.items.list(conv.id, order="asc")
kinds = [(i.type, getattr(i, "role", None)) for i in items.data]
assert kinds == [("message", "user"), ("message", "user"), ("message", "assistant"), ("message", "user"),
                 ("message", "assistant")], kinds
warm = r2.usage.input_tokens_details.cached_tokens / r2.usage.input_tokens
assert warm >= 0.5, (r2.usage, warm)
assert client.conversations.update(conv.id, metadata={"topic": "x"}).metadata == {"topic": "x"}
first = items.data[0].id
assert client.conversations.items.retrieve(first, conversation_id=conv.id).id == first
client.conversations.items.delete(first, conversation_id=conv.id)
assert len(client.conversations.items.list(conv.id).data) == 4
page = client.conversations.items.list(conv.id, limit=2, order="asc")
assert len(page.data) == 2 and page.has_more, page
assert client.conversations.delete(conv.id).deleted
gone = httpx.get(f"{BASE}/conversations/{conv.id}", timeout=60)
assert gone.status_code == 404, gone.text
print(f"conversations: {len(kinds)} items, turn 2 {warm:.0%} cached, update/items/delete ok")

# WebSocket mode (x-openresponses-websocket): the suite's WebSocket cases over one connection — client
# messages as WebSocketResponseCreateEvent, server events as the stream's schemas, failures as
# WebSocketErrorEvent, the connection answering after each error
from websockets.sync.client import connect as ws_connect

WS_URL = BASE.replace("http://", "ws://", 1) + "/responses"


def ws_turn(ws, body, what, valid=True):
    msg = {"type": "response.create", "temperature": 0, "max_output_tokens": 64, **body}
    if valid:
        check("WebSocketResponseCreateEvent", msg, what + " (client message)")
    ws.send(json.dumps(msg))
    events = []
    while True:
        e = json.loads(ws.recv(timeout=600))
        if e["type"] == "error":
            check("WebSocketErrorEvent", e, what + " error")
            return None, e
        events.append(e)
        if e["type"] in ("response.completed", "response.incomplete", "response.failed"):
            return check_events(events, what), events


with ws_connect(WS_URL, open_timeout=60) as ws:
    r, events = ws_turn(ws, {"model": MODEL, "input": [user("Count from 1 to 5.")]}, "ws-basic")
    assert r["status"] == "completed", r
    print(f"ws-basic: {len(events)} events")
    r, events = ws_turn(ws, weather, "ws-tool-calling")
    call = next(i for i in r["output"] if i["type"] == "function_call")
    assert any(e["type"] == "response.function_call_arguments.done" for e in events), events
    r2, _ = ws_turn(ws, {"model": MODEL, "previous_response_id": r["id"], "store": False, "tools": [WEATHER],
                         "input": [{"type": "function_call_output", "call_id": call["call_id"],
                                    "output": "Sunny, 21 C"}]}, "ws-tool-output")
    assert r2["previous_response_id"] == r["id"], r2
    print("ws-tool-calling: call and output continued")
    a, _ = ws_turn(ws, {"model": MODEL, "store": False, "input": [user("My name is Alice.")]}, "ws-multi-turn 1")
    b, _ = ws_turn(ws, {"model": MODEL, "store": False, "previous_response_id": a["id"],
                        "input": [user("What is my name?")]}, "ws-multi-turn 2")
    assert b["previous_response_id"] == a["id"] and b["store"] is False, b
    print("ws-multi-turn: store false continued on the connection")
    _, e = ws_turn(ws, {"model": MODEL, "previous_response_id": "resp_missing", "input": [user("hi")]},
                   "ws-previous-not-found")
    assert e and e["status"] == 404 and e["error"]["code"] == "previous_response_not_found", e
    # a failed continuation evicts what it continued: the chain's end no longer continues either
    _, e = ws_turn(ws, {"model": MODEL, "previous_response_id": b["id"], "input": [user("x")],
                        "max_output_tokens": 0}, "ws-failed-continuation", valid=False)
    assert e and e["status"] == 400, e
    _, e = ws_turn(ws, {"model": MODEL, "previous_response_id": b["id"], "input": [user("x")]},
                   "ws-evicted")
    assert e and e["error"]["code"] == "previous_response_not_found", e
    ws.send("{not json")
    e = json.loads(ws.recv(timeout=60))
    assert e["type"] == "error" and e["status"] == 400, e
    check("WebSocketErrorEvent", e, "ws-invalid-json error")
    r, _ = ws_turn(ws, {"model": MODEL, "input": [user("Say hello.")]}, "ws-after-errors")
    assert r["status"] == "completed", r
    print("ws-errors: previous_response_not_found, eviction, invalid JSON; the connection goes on")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("all cases pass the Open Responses schema and openai-python's types")
