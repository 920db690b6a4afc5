"""What option orders and calibration buy on the labeled choices, measured offline: every rotation of a
choice's canonical order read once (`x_read: plain`, options listed in that rotation) over the item's
state and over the content-free state (`N/A`), from a running `serve` (start it with
`--decision-temperature 1`); then read methods recombined from those reads, each with a temperature
fitted on one half of the items and its accuracy and expected calibration error (10 bins) measured on
the other half (2-fold, alternate items, as `benches/decision_quality.rs`).

  python3 scripts/order-study.py collect PORT reads.jsonl      # ~6 min on Qwen2.5-0.5B, 2 cores
  python3 scripts/order-study.py analyze reads.jsonl
"""
import collections, json, math, sys, urllib.request

ITEMS = "benches/data/decisions-labeled.jsonl"


def collect(port, path):
    out = open(path, "a")
    def post(body):
        r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/systemone", data=json.dumps(body).encode(),
                                   headers={"content-type": "application/json"})
        return json.load(urllib.request.urlopen(r, timeout=600))
    for it in (json.loads(l) for l in open(ITEMS) if l.strip()):
        q = it["question"]
        if q["type"] != "choice":
            continue
        canon = sorted(q["criteria"], key=lambda s: (s.strip().lower(), s))
        n = len(canon)
        for j in range(n):
            order = [canon[(i + j) % n] for i in range(n)]
            qq = dict(q, criteria={k: q["criteria"][k] for k in order})
            for state in (it["state"], "N/A"):
                a = post({"state": state, "x_read": "plain", "questions": {"q": qq}})["answers"]["q"]
                out.write(json.dumps({"id": it["id"], "task": it["task"], "rot": j, "order": order, "cf": state == "N/A",
                                      "p_by_pos": [a["probabilities"][k] for k in order], "answer": it["answer"]}) + "\n")
                out.flush()


def norm(p):
    s = sum(p)
    return [x / s for x in p]


def temper(p, t):
    m = max(p)
    return norm([(x / m) ** (1 / t) for x in p])


def ece(pairs):
    bins = [[0, 0.0, 0] for _ in range(10)]
    for c, ok in pairs:
        b = bins[min(int(c * 10), 9)]
        b[0] += 1; b[1] += c; b[2] += ok
    return sum((k / len(pairs)) * abs(c / k - o / k) for k, c, o in bins if k)


def conf(p, w):
    i = max(range(len(p)), key=lambda j: p[j])
    return p[i], int(i == w)


def analyze(path):
    by = collections.OrderedDict()
    for r in map(json.loads, open(path)):
        it = by.setdefault(r["id"], {"task": r["task"], "answer": r["answer"], "R": {}, "C": {}})
        canon = sorted(r["order"], key=lambda s: (s.strip().lower(), s))
        p = dict(zip(r["order"], norm([max(x, 1e-9) for x in r["p_by_pos"]])))
        (it["C"] if r["cf"] else it["R"])[r["rot"]] = [p[c] for c in canon]
        it["want"] = canon.index(r["answer"])
    items = [v for v in by.values() if v["R"] and len(v["R"]) == len(v["C"])]
    def mean(ps):
        return norm([sum(x) for x in zip(*ps)])
    def gm(ps):
        return norm([math.exp(sum(math.log(p[i]) for p in ps) / len(ps)) for i in range(len(ps[0]))])
    def div(a, b):
        return norm([x / y for x, y in zip(a, b)])
    def rots(it, k):
        n = len(it["R"])
        return [j * n // min(n, k) for j in range(min(n, k))] if k else list(it["R"])
    methods = {
        "one order (plain, canonical)": lambda it: it["R"][0],
        "one order / its content-free read (calibrated@1)": lambda it: div(it["R"][0], it["C"][0]),
        "all rotations, mean (ordered)": lambda it: mean(list(it["R"].values())),
        "all rotations, geometric mean": lambda it: gm(list(it["R"].values())),
        "all rotations, mean / content-free mean (the default)": lambda it: div(mean(list(it["R"].values())), mean(list(it["C"].values()))),
        "all rotations, mean of calibrated reads": lambda it: mean([div(it["R"][j], it["C"][j]) for j in it["R"]]),
    }
    for k in (2, 3, 4):
        methods[f"{k} rotations, mean / content-free mean"] = lambda it, k=k: div(mean([it["R"][j] for j in rots(it, k)]), mean([it["C"][j] for j in rots(it, k)]))
    def fit(rs):
        best, t = (1e18, 1.0), 0.02
        while t <= 50:
            l = sum(-math.log(max(temper(p, t)[w], 1e-12)) for p, w in rs) / len(rs)
            best = min(best, (l, t))
            t *= 1.05
        return best[1]
    print(f"{len(items)} choices; held out: 2-fold, one temperature fitted on the other half")
    print("| method | accuracy | ECE held out | log loss held out | T (per fold) | per task (right/items@mean confidence) |\n|---|---|---|---|---|---|")
    for name, fn in methods.items():
        folds = [[it for i, it in enumerate(items) if i % 2 == f] for f in (0, 1)]
        res, ts = [], []
        for f in (0, 1):
            t = fit([(fn(it), it["want"]) for it in folds[1 - f]])
            ts.append(f"{t:.2f}")
            res += [(temper(fn(it), t), it["want"], it["task"]) for it in folds[f]]
        tasks = collections.defaultdict(lambda: [0, 0, 0.0])
        for p, w, task in res:
            c, ok = conf(p, w)
            tasks[task][0] += ok; tasks[task][1] += 1; tasks[task][2] += c
        print(f"| {name} | {sum(conf(p, w)[1] for p, w, _ in res)}/{len(res)} | {ece([conf(p, w) for p, w, _ in res]):.3f} | "
              f"{sum(-math.log(max(p[w], 1e-12)) for p, w, _ in res) / len(res):.3f} | {', '.join(ts)} | "
              + " ".join(f"{k} {a}/{b}@{c / b:.2f}" for k, (a, b, c) in tasks.items()) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "collect":
        collect(int(sys.argv[2]), sys.argv[3])
    else:
        analyze(sys.argv[2])
