"""Levy-5 and Hartmann-6 at 8 in flight over the 1,000 seeds 500-1499:
each variant's medians against Optuna 5.0.0's TPE one trial at a time,
the seeds where it is better / worse than Optuna, and than the start
before (the kept sampler of ../widen/). `until-N`: 2 in flight until the
study holds N trials, 4 until 60, 8 after (with the random start all at
once the proposals are the same: checked bit for bit on 20 seeds);
`startup-counts-…`: TPE's random start ends when finished plus pending
(or half the pending) trials reach 10. Run from this folder: python3
rows.py"""
import json, statistics

N, W = '../../concurrency-2026-12-06/nonarrow/', '../widen/'


def load(prefix):
    d = {}
    for s in ('500-999', '1000-1499'):
        for r in json.load(open(f'{prefix}-seeds{s}.json')):
            x = d.setdefault(r['problem'], {'50': [], '100': []})
            x['50'] += r['best_50_per_seed']
            x['100'] += r['best_100_per_seed']
    return d


def split(x, y):
    return f'{sum(v < u for u, v in zip(x, y))} / {sum(v > u for u, v in zip(x, y))}'


optuna = load(N + 'optuna-1-levy5-hartmann6')
before = load(W + 'widen-levy5-hartmann6-8')
print('| seeds 500-1499 | Hartmann-6 @50 | Hartmann-6 @100 | Levy-5 @50 | Levy-5 @100 |')
print('|---|---|---|---|---|')
print('| Optuna, one at a time | ' + ' | '.join(
    f'{statistics.median(optuna[p][b]):.4g}' for p in ('hartmann6', 'levy5') for b in ('50', '100')) + ' |')
for name in ['before'] + [f'until-{n}' for n in (20, 30)] + ['startup-counts-pending', 'startup-counts-half-pending']:
    d = before if name == 'before' else load(f'{name}-levy5-hartmann6-8')
    cells = []
    for p in ('hartmann6', 'levy5'):
        for b in ('50', '100'):
            o, x, c = optuna[p][b], d[p][b], before[p][b]
            met = statistics.median(x) <= statistics.median(o)
            cell = f'{statistics.median(x):.4g}'
            cell = f'**{cell}**' if met else cell
            cell += f' ({split(o, x)}'
            cell += ')' if name == 'before' else f'; {split(c, x)})'
            cells.append(cell)
    print(f'| {name} | ' + ' | '.join(cells) + ' |')
