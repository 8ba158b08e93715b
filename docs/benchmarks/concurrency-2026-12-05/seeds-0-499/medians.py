"""Medians over seeds 0-199 and 0-499 of the five continuous problems at 2
trials in flight: Optuna's TPE one at a time, our TPE before and after the
wider continuous clip. Run from this folder with a Python that has the
standard library only: python3 medians.py"""
import json, statistics

P = ['branin', 'hartmann6', 'rosenbrock10', 'levy5', 'mixed']
H, O = ['hartmann6', 'levy5'], ['branin', 'rosenbrock10', 'mixed']


def add(d, f, probs, sampler='tpe'):
    for r in json.load(open(f)):
        if r['sampler'] != sampler or r['problem'] not in probs:
            continue
        x = d.setdefault(r['problem'], {'50': [], '100': []})
        x['50'] += r['best_50_per_seed']
        x['100'] += r['best_100_per_seed']


# Each list runs over seeds 0-499 in order.
before, after, optuna = {}, {}, {}
add(before, '../seeds-0-199/ours-2.json', P)
add(before, '../seeds-0-199/variants/seeds200-299-two-in-flight-current.json', O)
add(before, 'before-2-branin-rosenbrock10-mixed-seeds300-499.json', O)
add(before, 'before-2-hartmann6-levy5-seeds200-349.json', H)
add(before, 'before-2-hartmann6-levy5-seeds350-499.json', H)
for f in ['clip-1.15-2-seeds0-199.json', 'clip-1.15-2-seeds200-299.json', 'clip-1.15-2-seeds300-499.json']:
    add(after, f, P)
add(optuna, '../seeds-0-199/optuna-1.json', P, 'optuna-tpe')
add(optuna, 'optuna-1-hartmann6-levy5-seeds200-349.json', H, 'optuna-tpe')
add(optuna, 'optuna-1-hartmann6-levy5-seeds350-499.json', H, 'optuna-tpe')
add(optuna, 'optuna-1-branin-rosenbrock10-mixed-seeds200-499.json', O, 'optuna-tpe')

for hi in (200, 500):
    print(f'seeds 0-{hi - 1}')
    for p in P:
        row = [p.ljust(13)]
        for b in ('50', '100'):
            o, x, y = (d[p][b][:hi] for d in (optuna, before, after))
            assert len(o) == len(x) == len(y) == hi, (p, b, len(o), len(x), len(y))
            mo, mx, my = (statistics.median(v) for v in (o, x, y))
            better = sum(a < c for a, c in zip(y, x))
            worse = sum(a > c for a, c in zip(y, x))
            row.append(
                f"@{b} optuna {mo:.4g} before {mx:.4g}{'*' if mx <= mo else ' '} "
                f"after {my:.4g}{'*' if my <= mo else ' '} (after vs before {better}/{worse})"
            )
        print('  '.join(row))
