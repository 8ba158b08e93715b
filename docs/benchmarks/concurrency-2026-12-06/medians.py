"""Our TPE at 8 and 16 trials in flight with the runner's start (half as
many until the study holds 60 trials: `bench samplers --in-flight N --ramp`),
the defaults of a run on one GPU and on two (4 lanes a GPU, two trials per
lane), against Optuna 5.0.0's TPE one trial at a time, every problem over
seeds 0-199; beside ours at 4 in flight with the start, the default of a
CPU run with a pruner, on the same seeds. Run from this folder with a
Python that has the standard library only: python3 medians.py"""
import json, statistics

ALL = ['branin', 'hartmann6', 'rosenbrock10', 'levy5', 'mixed', 'ordinal5',
       'ordinal-hartmann6', 'int-styblinski4', 'int-categorical', 'tab-digits',
       'tab-synthetic-a', 'tab-synthetic-b', 'tab-breast-cancer']
OLD = '../concurrency-2026-12-05/'


def add(d, f, sampler='tpe'):
    for r in json.load(open(f)):
        if r['sampler'] != sampler or r['problem'] not in ALL:
            continue
        x = d.setdefault(r['problem'], {'50': [], '100': []})
        x['50'] += r['best_50_per_seed']
        x['100'] += r['best_100_per_seed']


# Each list runs over the seeds in order.
four, optuna = {}, {}
add(four, OLD + 'ramp/ramp-4-seeds0-199.json')
add(optuna, OLD + 'seeds-0-199/optuna-1.json', 'optuna-tpe')

for n in (8, 16):
    ours = {}
    add(ours, f'ramp-{n}-seeds0.json')
    add(ours, f'ramp-{n}-seeds100.json')
    met = 0
    print(f'seeds 0-199: ours at {n} in flight with the start / Optuna one at a time ("*": met); ours at 4')
    for p in ALL:
        row = [p.ljust(18)]
        for b in ('50', '100'):
            o, x, y = (d[p][b][:200] for d in (optuna, ours, four))
            assert len(o) == len(x) == len(y) == 200, (p, b)
            mo, mx = statistics.median(o), statistics.median(x)
            met += mx <= mo
            row.append(f"@{b} {mx:.4g} / {mo:.4g}{'*' if mx <= mo else ' '} "
                       f"(better/worse than Optuna on {sum(a < c for a, c in zip(x, o))}/"
                       f"{sum(a > c for a, c in zip(x, o))}; at 4: {statistics.median(y):.4g})")
        print('  '.join(row))
    print(f'met at {n}: {met} of {2 * len(ALL)}')
