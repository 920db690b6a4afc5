#!/usr/bin/env bash
# On a GPU machine: `serve --device cuda:0` on the model given, then a completion, a streamed chat, a
# decision over a ~1k-token state and the same decision again (its follow-up on warm blocks), each timed;
# and /metrics' prefix-cache counters. Used by scripts/device-check.sh; needs only python3.
set -u
MODEL=$1
PORT=${PORT:-18931}
BIN=${SERVE:-device-bundle/serve}
DEVICE=${DEVICE:-cuda:0}
"$BIN" --device "$DEVICE" --model "$MODEL" --port "$PORT" --max-model-len 8192 > /tmp/kvgate-serve.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null' EXIT
PORT=$PORT python3 - <<'PY'
import json, os, time, urllib.request
port = os.environ["PORT"]
base = f"http://127.0.0.1:{port}"
def get(path):
    return urllib.request.urlopen(base + path, timeout=5).read().decode()
def post(path, body, stream=False):
    r = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    resp = urllib.request.urlopen(r, timeout=300)
    return resp.read().decode() if stream else json.load(resp)
t0 = time.time()
while True:
    try:
        get("/health"); break
    except Exception:
        if time.time() - t0 > 180:
            print("serve did not come up in 180 s"); print(open("/tmp/kvgate-serve.log").read()[-3000:]); raise SystemExit(1)
        time.sleep(1)
print(f"serve up in {time.time() - t0:.1f} s")
model = json.loads(get("/v1/models"))["data"][0]["id"]
t = time.time()
c = post("/v1/completions", {"model": model, "prompt": "The capital of France is", "max_tokens": 32, "temperature": 0})
print(f"completion ({time.time() - t:.3f} s): {c['choices'][0]['text']!r} usage {c['usage']}")
t = time.time()
s = post("/v1/chat/completions", {"model": model, "stream": True, "max_tokens": 64, "temperature": 0,
         "messages": [{"role": "user", "content": "Name three rivers in Europe."}]}, stream=True)
chunks = [l for l in s.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
text = "".join((json.loads(l[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or "" for l in chunks)
print(f"streamed chat ({time.time() - t:.3f} s, {len(chunks)} chunks): {text!r}")
state = " ".join(f"Order {i}: customer reports the parcel arrived damaged and asks for a refund." for i in range(60))
q = {"urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
     "team": {"type": "choice", "instructions": "Which team should handle this?",
              "criteria": {"billing": "refunds and payments", "shipping": "deliveries", "technical": "bugs"}}}
for name in ("decision", "follow-up"):
    t = time.time()
    a = post("/v1/systemone", {"state": state, "questions": q})
    print(f"{name} ({(time.time() - t) * 1000:.1f} ms): {json.dumps(a['answers'])}")
m = [l for l in get("/metrics").splitlines() if "prefix_cache" in l and not l.startswith("#")]
print("\n".join(m[:8]))
PY
