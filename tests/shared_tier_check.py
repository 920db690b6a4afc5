"""Two kvgate replicas sharing a KV tier in Redis behind the real vllm-router (PyPI, .ci/venv). Driven
by tests/shared_tier_replicas.rs:

  shared_tier_check.py ROUTER_BIN A_URL A_PID B_URL B_PID

consistent_hash with X-Session-ID: a session's first two turns go to one replica (the second turn
found cached there); its reference third turn is computed on that replica under another cache_salt
(so nothing it writes is readable by the session: the same greedy text, by construction of
batch-invariant kernels, and nothing extra in the store); the replica is then killed with SIGKILL, the
router sends the third turn to the other one, which serves it with >= 80% of the prompt cached from
the shared tier and the same greedy text; the survivor's kvgate:kv_shared_hits_total grew.
"""
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replicas_check import WORDS, metrics, post, served, start_router, which  # noqa: E402


def counter(url, name):
    """The sum of a counter's series on this replica."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics(url).splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def main():
    router_bin, a, a_pid, b, b_pid = sys.argv[1:6]
    replicas, pids = [a, b], [int(a_pid), int(b_pid)]
    proc, url = start_router(router_bin, replicas, ["--policy", "consistent_hash"])
    try:
        h = {"X-Session-ID": "agent-session-shared"}
        rnd = random.Random(7)
        system = "You are a coding agent. Project notes: " + " ".join(rnd.choice(WORDS) for _ in range(700))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "List three risks."}]
        seen = [served(u) for u in replicas]
        t1 = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0}, h)
        home, seen = which(replicas, seen)
        msgs += [{"role": "assistant", "content": t1["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Which one first?"}]
        t2 = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0}, h)
        again, seen = which(replicas, seen)
        assert again == home, "consistent_hash keeps the session on one replica"
        c2, p2 = t2["usage"]["prompt_tokens_details"]["cached_tokens"], t2["usage"]["prompt_tokens"]
        assert c2 >= 0.8 * p2, f"second turn on its replica: {c2} of {p2} cached"
        msgs += [{"role": "assistant", "content": t2["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Write the fix."}]
        turn3 = {"messages": msgs, "max_tokens": 32, "temperature": 0}
        # what the warm replica answers (under another salt: nothing the session could read)
        ref = post(replicas[home], "/v1/chat/completions", {**turn3, "cache_salt": "reference"})
        # the session's blocks are written behind: give the writer a moment to drain
        time.sleep(1.0)
        os.kill(pids[home], signal.SIGKILL)
        other = 1 - home
        before = counter(replicas[other], "kvgate:kv_shared_hits_total")
        t3 = None
        for attempt in range(10):
            try:
                t3 = post(url, "/v1/chat/completions", turn3, h)
                break
            except Exception as e:  # the router may try the dead replica once before it marks it down
                print(f"attempt {attempt}: {e}")
                time.sleep(0.5)
        assert t3 is not None, "the router never served the moved session"
        c3, p3 = t3["usage"]["prompt_tokens_details"]["cached_tokens"], t3["usage"]["prompt_tokens"]
        hits = counter(replicas[other], "kvgate:kv_shared_hits_total") - before
        print(f"moved session: third turn {c3}/{p3} cached ({c3 / p3:.3f}), {hits:.0f} blocks from the shared tier")
        assert c3 >= 0.8 * p3, f"moved turn: {c3} of {p3} cached"
        assert hits > 0, "the survivor read the shared tier"
        assert t3["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"], \
            (t3["choices"][0]["message"]["content"], ref["choices"][0]["message"]["content"])
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
