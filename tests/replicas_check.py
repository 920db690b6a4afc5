"""kvgate replicas behind the real vllm-router (PyPI, .ci/venv), and kvgate's KV event stream read by an
independent consumer (pyzmq + msgpack). Driven by tests/replicas.rs:

  replicas_check.py router ROUTER_BIN A_URL B_URL A_EVENTS B_EVENTS A_REPLAY B_REPLAY
  replicas_check.py events URL EVENTS REPLAY

router: (1) consistent_hash with X-Session-ID: agent sessions (decision -> follow-up -> next turn) all
200, each session on one replica, both replicas used, follow-ups >= 90% cached; the replicas' vllm:
metrics as llm-d's endpoint picker scrapes them. (2) kv_aware fed by both replicas' KV events (with
session affinity): a new session whose long system prompt one replica holds (warmed there directly, one
prompt per replica, so a tie-break cannot pass the check) is routed to that replica, and its prompt is
then cached; 8 concurrent sessions use both replicas and find their first turn cached.
events: the stream decodes as vLLM's wire format; seq from 1 without gaps; every BlockStored's parent
known (as llm-d's indexer requires, else it drops the store), every BlockRemoved of a known hash; token
ids chain to the prompts' full blocks; a tenant-salted prompt's token ids never appear; the replay
socket returns the same payloads from any start.
"""
import json
import random
import socket
import subprocess
import sys
import time
import urllib.request

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()


def post(url, path, body, headers=None):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200, (path, r.status)
        return json.loads(r.read())


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return r.read().decode()


def served(url):
    """Requests this replica has finished: completions and decisions."""
    total = 0.0
    for line in metrics(url).splitlines():
        if line.startswith("kvgate:request_success_total") or line.startswith("kvgate:decision_requests_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_router(router_bin, workers, extra):
    port = free_port()
    cmd = [router_bin, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
           "--worker-urls", *workers, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("vllm-router did not come up: " + proc.stdout.read().decode()[-3000:])


def state(seed, words=300):
    rnd = random.Random(seed)
    return [{"role": "system", "content": f"You are triage agent {seed}. " + " ".join(rnd.choice(WORDS) for _ in range(words))},
            {"role": "user", "content": "Ticket: the printer on floor 3 is on fire."}]


def which(replicas, before):
    """The replica that served the one request sent since `before` (its counters are recorded by the
    engine thread just after the answer goes out, so they are polled briefly)."""
    for _ in range(100):
        after = [served(u) for u in replicas]
        moved = [i for i in range(len(replicas)) if after[i] > before[i]]
        if moved:
            break
        time.sleep(0.05)
    # A decision's counters move twice (submitted, then ended just after its answer): had the next call
    # started before the second, it would see it as that request's, on this replica, beside the one
    # that served it (seen: "[0, 1]" at a session's first request). Wait until they stop moving.
    for _ in range(50):
        time.sleep(0.1)
        again = [served(u) for u in replicas]
        if again == after:
            break
        after = again
    moved = [i for i in range(len(replicas)) if after[i] > before[i]]
    assert len(moved) == 1, f"one request, replicas that served: {moved} ({before} -> {after})"
    return moved[0], after


def routed_sessions(router_bin, replicas):
    proc, url = start_router(router_bin, replicas, ["--policy", "consistent_hash"])
    try:
        seen = [served(u) for u in replicas]
        used = set()
        cached = prompt = 0
        for s in range(8):
            h = {"X-Session-ID": f"agent-session-{s}"}
            msgs = state(1000 + s)
            homes = set()
            d = post(url, "/v1/systemone", {"state": msgs, "questions": {"route": {
                "type": "choice", "instructions": "Route this ticket to",
                "criteria": {"facilities": None, "billing": None, "technical": None}}}}, h)
            assert d["answers"]["route"]["choice"] in ("facilities", "billing", "technical"), d
            home, seen = which(replicas, seen)
            homes.add(home)
            f = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 12}, h)
            home, seen = which(replicas, seen)
            homes.add(home)
            cached += f["usage"]["prompt_tokens_details"]["cached_tokens"]
            prompt += f["usage"]["prompt_tokens"]
            msgs = msgs + [{"role": "assistant", "content": f["choices"][0]["message"]["content"]},
                           {"role": "user", "content": "It is spreading to the copier. Next step?"}]
            n = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 12}, h)
            home, seen = which(replicas, seen)
            homes.add(home)
            assert len(homes) == 1, f"session {s} split across replicas {homes}"
            used |= homes
            nc, npt = n["usage"]["prompt_tokens_details"]["cached_tokens"], n["usage"]["prompt_tokens"]
            assert nc >= f["usage"]["prompt_tokens"] - 16, f"next turn of session {s}: {nc} of {npt} cached"
        assert used == {0, 1}, f"consistent_hash used replicas {used}"
        share = cached / prompt
        print(f"consistent_hash: 8 sessions x 3 requests, both replicas, follow-ups {cached}/{prompt} cached ({share:.3f})")
        assert share >= 0.9, share
    finally:
        proc.kill()
    # what llm-d's endpoint picker scrapes, on both replicas
    for u in replicas:
        m = metrics(u)
        for name in ("vllm:num_requests_waiting{", "vllm:num_requests_running{", "vllm:kv_cache_usage_perc{",
                     "vllm:cache_config_info{", "vllm:lora_requests_info{", "vllm:prefix_cache_hits_total{",
                     "vllm:e2e_request_latency_seconds_bucket{"):
            assert name in m, f"{u}/metrics has no {name}"
        info = next(l for l in m.splitlines() if l.startswith("vllm:cache_config_info{"))
        assert 'block_size="16"' in info and "num_gpu_blocks=" in info, info
        usage = next(l for l in m.splitlines() if l.startswith("vllm:kv_cache_usage_perc{"))
        assert 0.0 <= float(usage.rsplit(" ", 1)[1]) <= 1.0, usage


def kv_routed(router_bin, replicas, events, replays):
    extra = ["--policy", "kv_aware", "--kv-event-block-size", "16", "--kv-event-model", "kvgate-test",
             "--kv-aware-session-affinity-ttl-secs", "60"]
    for u, e in zip(replicas, events):
        extra += ["--kv-event-source", f"{u}={e}"]
    for u, r in zip(replicas, replays):
        extra += ["--kv-event-replay-source", f"{u}={r}"]
    proc, url = start_router(router_bin, replicas, extra)
    try:
        time.sleep(1.0)  # the router's subscribers connect
        # one long system prompt per replica, warmed there directly (not through the router)
        prompts = {0: state(2000, 400)[0], 1: state(2001, 400)[0]}
        for i, sysmsg in prompts.items():
            post(replicas[i], "/v1/chat/completions", {"messages": [sysmsg, {"role": "user", "content": "warm up"}], "max_tokens": 2})
        time.sleep(0.5)  # the events reach the router
        seen = [served(u) for u in replicas]
        for rep in range(2):
            for i in (1, 0):
                msgs = [prompts[i], {"role": "user", "content": f"New session {rep}: the coffee machine is leaking."}]
                r = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4})
                home, seen = which(replicas, seen)
                c, p = r["usage"]["prompt_tokens_details"]["cached_tokens"], r["usage"]["prompt_tokens"]
                assert home == i, f"a session sharing replica {i}'s system prompt went to replica {home}"
                assert c >= 0.9 * (p - 32), f"routed to its prefix but {c} of {p} cached"
        print("kv_aware: 4 new sessions, each on the replica holding its system prompt (cached >= 90%)")
        # 8 agent sessions at once (with their session header): both replicas busy, follow-ups warm
        import threading
        before = [served(u) for u in replicas]
        res, errors = {}, []

        def session(k):
            try:
                h = {"X-Session-ID": f"concurrent-{k}"}
                msgs = state(3000 + k)
                f = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8}, h)
                msgs = msgs + [{"role": "assistant", "content": f["choices"][0]["message"]["content"]},
                               {"role": "user", "content": "Next step?"}]
                n = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8}, h)
                res[k] = (n["usage"]["prompt_tokens_details"]["cached_tokens"], f["usage"]["prompt_tokens"])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=session, args=(k,)) for k in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors, errors
        time.sleep(0.3)
        after = [served(u) for u in replicas]
        assert all(a > b for a, b in zip(after, before)), f"both replicas serve: {before} -> {after}"
        cached, first = sum(c for c, _ in res.values()), sum(p for _, p in res.values())
        print(f"kv_aware with session affinity: 8 concurrent sessions, follow-ups found {cached} of the "
              f"first turns' {first} tokens cached")
        assert cached >= 0.9 * first, (cached, first)
    finally:
        proc.kill()


def events(url, endpoint, replay):
    import msgpack
    import zmq
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    time.sleep(0.5)
    salted_words = [f"secret{i}" for i in range(80)]
    salted = " ".join(salted_words)
    prompts = [" ".join(random.Random(s).choice(WORDS) for _ in range(200)) for s in range(30)]
    for p in prompts:
        post(url, "/v1/completions", {"prompt": p, "max_tokens": 2})
    post(url, "/v1/completions", {"prompt": salted, "max_tokens": 2, "cache_salt": "tenant-a"})
    salted_ids = post(url, "/tokenize", {"prompt": salted})["tokens"]
    time.sleep(0.5)
    batches = []
    while sub.poll(300):
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"", topic
        batches.append((int.from_bytes(seq, "big"), payload))
    assert batches, "no KV events"
    seqs = [s for s, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"a gap: {seqs}"
    index = {}  # hash -> token ids of its block, as llm-d's indexer keeps them (by engine hash)
    stores = removes = 0
    for s, payload in batches:
        ts, evs, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == 0, (ts, rank)
        for e in evs:
            t = e["type"]
            if t == "AllBlocksCleared":
                index.clear()
            elif t == "BlockStored":
                bs = e["block_size"]
                assert bs == 16 and e["medium"] == "GPU", e
                toks = e["token_ids"]
                assert len(toks) == bs * len(e["block_hashes"]), e
                parent = e["parent_block_hash"]
                assert parent is None or parent in index, f"seq {s}: a store whose parent is unknown"
                for i, h in enumerate(e["block_hashes"]):
                    index[h] = toks[i * bs:(i + 1) * bs]
                    stores += 1
            elif t == "BlockRemoved":
                for h in e["block_hashes"]:
                    assert h in index, f"seq {s}: removal of an unknown hash"
                    del index[h]
                    removes += 1
            else:
                raise AssertionError(f"unknown event {t}")
    held = {tuple(v) for v in index.values()}
    for p in prompts[-4:]:  # the latest prompts are still cached: their full blocks are in the index
        ids = post(url, "/tokenize", {"prompt": p})["tokens"]
        for i in range(len(ids) // 16):
            assert tuple(ids[i * 16:(i + 1) * 16]) in held, f"a full block of a cached prompt is not indexed"
    # The salted prompt's blocks are never published. (Checked per block: a lone token of it may turn
    # up in a published block among the tokens an unsalted request sampled.)
    secret = set(salted_ids) - set(t for p in prompts for t in post(url, "/tokenize", {"prompt": p})["tokens"])
    salted_blocks = {tuple(salted_ids[i * 16:(i + 1) * 16]) for i in range(len(salted_ids) // 16)}
    assert salted_blocks, "the salted prompt fills blocks"
    for _, payload in batches:
        for e in msgpack.unpackb(payload)[1]:
            toks = e.get("token_ids", [])
            for i in range(0, len(toks), 16):
                block = toks[i:i + 16]
                assert tuple(block) not in salted_blocks, "a salted prompt's block was published"
                assert sum(t in secret for t in block) <= 2, f"a block of mostly salted tokens was published: {block}"
    print(f"events: {len(batches)} batches from seq {seqs[0]}, {stores} blocks stored, {removes} removed, "
          f"{len(index)} indexed; parents always known; the salted prompt unpublished")
    assert removes > 0, "the small cache evicted"
    rep = ctx.socket(zmq.DEALER)
    rep.connect(replay)
    start = seqs[len(seqs) // 2]
    rep.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        assert rep.poll(5000), "replay answered"
        f = rep.recv_multipart()
        assert f[0] == b"", f
        s = int.from_bytes(f[1], "big", signed=True)
        if s == -1:
            break
        got.append((s, f[2]))
    assert got == [b for b in batches if b[0] >= start], "replay returns the same batches"
    print(f"replay from {start}: {len(got)} batches, the same payloads")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "router":
        router_bin, a, b, ea, eb, ra, rb = sys.argv[2:9]
        routed_sessions(router_bin, [a, b])
        kv_routed(router_bin, [a, b], [ea, eb], [ra, rb])
    elif mode == "events":
        events(*sys.argv[2:5])
    else:
        raise SystemExit(f"unknown mode {mode}")
