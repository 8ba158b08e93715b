"""The continuous problems at 8 and 16 trials in flight with the start,
over seeds 0-499: ours (seeds 0-199 from ../ramp-N-seeds*.json, 200-499
from this folder) against Optuna 5.0.0's TPE one trial at a time (seeds
0-199 from the thirteenth session's optuna-1.json, 200-499 from the
fifteenth session's runs). Run from this folder: python3 medians.py"""
import json, statistics

PROBLEMS = ['branin', 'hartmann6', 'rosenbrock10', 'levy5', 'mixed']
OLD = '../../concurrency-2026-12-05/'


def add(d, f, sampler):
    for r in json.load(open(f)):
        if r['sampler'] != sampler or r['problem'] not in PROBLEMS:
            continue
        x = d.setdefault(r['problem'], {'50': [], '100': []})
        x['50'] += r['best_50_per_seed']
        x['100'] += r['best_100_per_seed']


optuna = {}
for f in ['seeds-0-199/optuna-1.json',
          'seeds-0-499/optuna-1-branin-rosenbrock10-mixed-seeds200-499.json',
          'seeds-0-499/optuna-1-hartmann6-levy5-seeds200-349.json',
          'seeds-0-499/optuna-1-hartmann6-levy5-seeds350-499.json']:
    add(optuna, OLD + f, 'optuna-tpe')
for n in (8, 16):
    ours = {}
    for f in [f'../ramp-{n}-seeds0.json', f'../ramp-{n}-seeds100.json'] + [
            f'continuous-{n}-seeds{s}.json' for s in (200, 300, 400)]:
        add(ours, f, 'tpe')
    print(f'{n} in flight with the start, seeds 0-499: ours / Optuna one at a time ("*": met), seeds better / worse')
    for p in PROBLEMS:
        row = [p.ljust(13)]
        for b in ('50', '100'):
            o, x = optuna[p][b], ours[p][b]
            assert len(o) == len(x) == 500, (p, b, len(o), len(x))
            mo, mx = statistics.median(o), statistics.median(x)
            row.append(f"@{b} {mx:.4g} / {mo:.4g}{'*' if mx <= mo else ' '} "
                       f"({sum(a < c for a, c in zip(x, o))} / {sum(a > c for a, c in zip(x, o))})".ljust(44))
        print(' '.join(row).rstrip())
