"""Ours (old age-weighted good group, new equal) against Optuna's TPE over seeds 0-99, seed for seed."""
import json, random, statistics as st
old = json.load(open("../../fronts-2026-12-05/tpe-100-seeds.json")) + json.load(open("../../fronts-2026-12-05/tpe-zdt2-100-seeds.json"))
new = json.load(open("tpe-seeds0-99.json"))
def rows(d, s): return {x['problem']: x for x in d if x['sampler'] == s}
o, q, n = rows(old, 'tpe'), rows(old, 'optuna-tpe'), rows(new, 'tpe')
def share(a, b, rng):
    k = len(a); hits = 0
    for _ in range(2000):
        idx = [rng.randrange(k) for _ in range(k)]
        hits += st.median([a[i] for i in idx]) >= st.median([b[i] for i in idx])
    return hits / 2000
print("problem @300: median old / new / optuna; old vs optuna better/worse (share); new vs optuna; new vs old better/worse")
for p in ['zdt1', 'zdt2', 'dtlz2', 'bnh']:
    a, b, c = (x[p]['hypervolume_300_per_seed'] for x in (o, n, q))
    rng = random.Random(0)
    bw = lambda x, y: f"{sum(u > v for u, v in zip(x, y))} / {sum(u < v for u, v in zip(x, y))}"
    print(f"{p:6} {st.median(a):.4f} / {st.median(b):.4f} / {st.median(c):.4f};  {bw(a, c)} ({share(a, c, rng):.0%});  {bw(b, c)} ({share(b, c, rng):.0%});  {bw(b, a)}")
# The digits MLP's stored TPE run predates the eleventh session's change to
# its proposals, so only now against Optuna, at both budgets.
for t in ["100", "300"]:
    b, c = (x["mlp-digits"][f"hypervolume_{t}_per_seed"] for x in (n, q))
    rng = random.Random(0)
    print(f"mlp-digits @{t}: now {st.median(b):.2f} / optuna {st.median(c):.2f};  "
          f"{bw(b, c)} ({share(b, c, rng):.0%})")
