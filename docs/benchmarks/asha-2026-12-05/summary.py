"""Medians and seed-by-seed counts of the runs in this folder, before
(78bd074) and after (40fbccc) TPE learned from paused and pruned trials.
Run from this folder: python3 summary.py"""
import ast, statistics


def load(f):
    d = {}
    for line in open(f):
        s, best, rest = line.split(' ', 2)
        d[int(s)] = (float(best), ast.literal_eval(rest))
    return d


for metric, lower in (('loss', True), ('accuracy', False)):
    a, b = load(f'{metric}-before.txt'), load(f'{metric}-after.txt')
    seeds = sorted(a)
    assert seeds == sorted(b) == list(range(40))
    for what, get in (('rung0', lambda r: r[1]['rung0']), ('best', lambda r: r[0])):
        x = [get(a[s]) for s in seeds]
        y = [get(b[s]) for s in seeds]
        better = sum((v < u) if lower else (v > u) for u, v in zip(x, y))
        worse = sum((v > u) if lower else (v < u) for u, v in zip(x, y))
        print(f'{metric} {what}: median {statistics.median(x):.4f} -> {statistics.median(y):.4f}, '
              f'mean {statistics.mean(x):.4f} -> {statistics.mean(y):.4f}; after better on {better}, worse on {worse}')
    c = [statistics.mean(d[s][1].get('COMPLETE', 0) for s in seeds) for d in (a, b)]
    print(f'{metric}: COMPLETE trials per study {c[0]:.2f} -> {c[1]:.2f}')
r = load('loss-random.txt')
print('random search, loss: rung0 median %.4f mean %.4f; best median %.4f' % (
    statistics.median(v[1]['rung0'] for v in r.values()), statistics.mean(v[1]['rung0'] for v in r.values()),
    statistics.median(v[0] for v in r.values())))
