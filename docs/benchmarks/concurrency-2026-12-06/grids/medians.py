"""The goal over seeds 0-199 with TPE believing pending trials on discrete
spaces from two pending on: ours at 4, 8 and 16 trials in flight with the
runner's start (`bench samplers --in-flight N --ramp`) against Optuna
5.0.0's TPE one trial at a time. The discrete problems are this folder's
runs; the samplers did not change on the others (a continuous parameter
was believed before), so theirs are the earlier runs'. For the discrete
problems, the liar (before) -> the believer (now), and on how many seeds
now is better / worse. Run from this folder with a Python that has the
standard library only: python3 medians.py"""
import json, statistics

CONTINUOUS = ['branin', 'hartmann6', 'rosenbrock10', 'levy5', 'mixed']
GRIDS = ['ordinal5', 'ordinal-hartmann6', 'int-styblinski4', 'int-categorical',
         'tab-digits', 'tab-synthetic-a', 'tab-synthetic-b', 'tab-breast-cancer']
OLD = '../../concurrency-2026-12-05/'


def add(d, f, sampler='tpe'):
    for r in json.load(open(f)):
        if r['sampler'] != sampler:
            continue
        x = d.setdefault(r['problem'], {'50': [], '100': []})
        x['50'] += r['best_50_per_seed']
        x['100'] += r['best_100_per_seed']


optuna = {}
add(optuna, OLD + 'seeds-0-199/optuna-1.json', 'optuna-tpe')
before_files = {4: [OLD + 'ramp/ramp-4-seeds0-199.json'],
                8: ['../ramp-8-seeds0.json', '../ramp-8-seeds100.json'],
                16: ['../ramp-16-seeds0.json', '../ramp-16-seeds100.json']}
for n in (4, 8, 16):
    before, now = {}, {}
    for f in before_files[n]:
        add(before, f)
    for s in (0, 100):
        add(now, f'grids-{n}-seeds{s}.json')
    for p in CONTINUOUS:
        now[p] = before[p]
    met = 0
    print(f'seeds 0-199, {n} in flight with the start: ours / Optuna one at a time ("*": met)')
    for p in CONTINUOUS + GRIDS:
        row = [p.ljust(18)]
        for b in ('50', '100'):
            o, x, y = (d[p][b] for d in (optuna, now, before))
            assert len(o) == len(x) == len(y) == 200, (p, b)
            mo, mx = statistics.median(o), statistics.median(x)
            met += mx <= mo
            cell = f"@{b} {mx:.4g} / {mo:.4g}{'*' if mx <= mo else ' '}"
            if p in GRIDS:
                cell += (f" (liar {statistics.median(y):.4g}; now better/worse "
                         f"{sum(a < c for a, c in zip(x, y))}/{sum(a > c for a, c in zip(x, y))})")
            row.append(cell.ljust(60))
        print(' '.join(row).rstrip())
    print(f'met at {n}: {met} of {2 * len(CONTINUOUS + GRIDS)}\n')
