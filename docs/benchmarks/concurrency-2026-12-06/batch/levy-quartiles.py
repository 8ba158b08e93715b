"""Levy-5's best values over seeds 0-499, by quartile: Optuna 5.0.0's TPE
one trial at a time, ours at 2 trials in flight (the CPU's default) and
at 8 with the start (one GPU's). Run from this folder: python3 levy-quartiles.py"""
import json

OLD = '../../concurrency-2026-12-05/'


def levy(files, sampler='tpe'):
    x = {'50': [], '100': []}
    for f in files:
        for r in json.load(open(f)):
            if r['sampler'] == sampler and r['problem'] == 'levy5':
                x['50'] += r['best_50_per_seed']
                x['100'] += r['best_100_per_seed']
    assert len(x['50']) == 500, files
    return x


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


runs = {
    'Optuna, one at a time': levy([OLD + 'seeds-0-199/optuna-1.json',
                                   OLD + 'seeds-0-499/optuna-1-hartmann6-levy5-seeds200-349.json',
                                   OLD + 'seeds-0-499/optuna-1-hartmann6-levy5-seeds350-499.json'], 'optuna-tpe'),
    'ours, 2 in flight': levy([OLD + f'seeds-0-499/clip-1.15-2-seeds{s}.json' for s in ('0-199', '200-299', '300-499')]),
    'ours, 8 in flight': levy(['../ramp-8-seeds0.json', '../ramp-8-seeds100.json'] +
                              [f'../seeds-0-499/continuous-8-seeds{s}.json' for s in (200, 300, 400)]),
}
for b in ('50', '100'):
    print(f'@{b}: quartiles 25 / 50 / 75 %, and the share of seeds above 1')
    for name, x in runs.items():
        qs = ' / '.join(f'{quantile(x[b], q):.3g}' for q in (0.25, 0.5, 0.75))
        print(f'  {name.ljust(22)} {qs}   {sum(v > 1 for v in x[b]) / 5:.0f}%')
