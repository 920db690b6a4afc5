"""Offline calibration fits over a decision_quality dump (`DQ_DUMP=path cargo bench --bench
decision_quality`): per question type, the expected calibration error (10 bins) at T = 1 and held out
(2-fold: alternate items, as the bench) with one temperature fitted by least log loss per type, per
number of options, and per task; for choices, the temperature each option count wants. Usage:
python3 scripts/calibration-fit.py DUMP.jsonl
"""
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def temper(p, t):
    m = max(p)
    if m <= 0: return p
    q = [(x/m)**(1/t) if x > 0 else 0 for x in p]; s = sum(q); return [x/s for x in q]
def logloss(rs, t):
    return sum(-math.log(max(temper(r["p"], t)[r["want"]], 1e-12)) for r in rs) / len(rs)
def fit(rs):
    best = (1e18, 1.0); t = 0.02
    while t <= 50:
        l = logloss(rs, t)
        if l < best[0]: best = (l, t)
        t *= 1.05
    return best[1]
def ece(pairs):
    bins = [[0, 0.0, 0] for _ in range(10)]
    for c, ok in pairs:
        b = min(int(c*10), 9); bins[b][0] += 1; bins[b][1] += c; bins[b][2] += ok
    n = len(pairs)
    return sum((k/n) * abs(c/k - o/k) for k, c, o in bins if k)
def conf(p, want):
    i = max(range(len(p)), key=lambda j: p[j]); return (p[i], int(i == want))
def cv(rs, group):
    """2-fold (alternate items of the type, as the bench), temperature per group(r) fitted on the other fold."""
    folds = [[r for i, r in enumerate(rs) if i % 2 == f] for f in (0, 1)]
    out = []
    for f in (0, 1):
        train = folds[1-f]
        ts = {}
        for g in set(map(group, train)):
            ts[g] = fit([r for r in train if group(r) == g])
        for r in folds[f]:
            t = ts.get(group(r), 1.0)
            out.append(conf(temper(r["p"], t), r["want"]))
    return ece(out)
for kind in ("noul", "choice", "score"):
    rs = [r for r in rows if r["type"] == kind]
    if not rs: continue
    n = len(rs)
    base = ece([conf(r["p"], r["want"]) for r in rs])
    print(f"{kind} ({n}): T=1 {base:.3f} | per type {cv(rs, lambda r: 0):.3f} | per option count {cv(rs, lambda r: len(r['p'])):.3f} | per task {cv(rs, lambda r: r['task']):.3f}")
    if kind == "choice":
        for k in sorted(set(len(r['p']) for r in rs)):
            sub = [r for r in rs if len(r['p']) == k]
            print(f"   {k} options: n={len(sub)} fitted T {fit(sub):.2f}, acc {sum(conf(r['p'], r['want'])[1] for r in sub)}/{len(sub)}")
