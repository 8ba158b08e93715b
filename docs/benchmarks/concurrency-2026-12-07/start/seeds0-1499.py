"""Levy-5 and Hartmann-6 at 8 in flight over every seed measured, 0-1499:
the kept start in steps (`until-30`) and the start before (the kept
sampler of ../widen/), each against Optuna 5.0.0's TPE one trial at a
time on the same seeds: medians, and seeds better / worse. Seeds 0-199
from the full tables (this folder's first-steps-8-seeds0-199.json and
../widen/unrestricted-8-*), 200-499 run for this comparison, 500-1499
from rows.py's runs. Run from this folder: python3 seeds0-1499.py"""
import statistics
import sys

sys.path.insert(0, '../widen')
from medians import load  # noqa: E402

O5, O6 = '../../concurrency-2026-12-05/', '../../concurrency-2026-12-06/nonarrow/'
PROBLEMS = ('hartmann6', 'levy5')


optuna = load([O5 + 'seeds-0-199/optuna-1.json', O5 + 'seeds-0-499/optuna-1-hartmann6-levy5-seeds200-349.json',
               O5 + 'seeds-0-499/optuna-1-hartmann6-levy5-seeds350-499.json',
               O6 + 'optuna-1-levy5-hartmann6-seeds500-999.json', O6 + 'optuna-1-levy5-hartmann6-seeds1000-1499.json'],
              'optuna-tpe', PROBLEMS)
runs = {
    'before': ['../widen/unrestricted-8-seeds0.json', '../widen/unrestricted-8-seeds100.json',
               '../widen/widen-levy5-hartmann6-8-seeds200-499.json',
               '../widen/widen-levy5-hartmann6-8-seeds500-999.json', '../widen/widen-levy5-hartmann6-8-seeds1000-1499.json'],
    'start in steps': ['../start/first-steps-8-seeds0-199.json', '../start/until-30-levy5-hartmann6-8-seeds200-499.json',
                       '../start/until-30-levy5-hartmann6-8-seeds500-999.json',
                       '../start/until-30-levy5-hartmann6-8-seeds1000-1499.json'],
}
if __name__ == '__main__':
    print('| seeds 0-1499 | Hartmann-6 @50 | Hartmann-6 @100 | Levy-5 @50 | Levy-5 @100 |')
    print('|---|---|---|---|---|')
    print('| Optuna, one at a time | ' + ' | '.join(
        f'{statistics.median(optuna[p][b]):.4g}' for p in PROBLEMS for b in ('50', '100')) + ' |')
    for name, files in runs.items():
        d = load(files, problems=PROBLEMS)
        cells = []
        for p in PROBLEMS:
            for b in ('50', '100'):
                o, x = optuna[p][b], d[p][b]
                assert len(o) == len(x) == 1500, (name, p, b, len(o), len(x))
                m = f'{statistics.median(x):.4g}'
                cells.append((f'**{m}**' if statistics.median(x) <= statistics.median(o) else m)
                             + f' ({sum(v < u for u, v in zip(o, x))} / {sum(v > u for u, v in zip(o, x))})')
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
