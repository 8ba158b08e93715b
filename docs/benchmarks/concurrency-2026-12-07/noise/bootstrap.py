"""How far each cell's verdict (our median against Optuna's) can be
trusted. The seeds are resampled with replacement, in pairs (our run and
Optuna's on the same seed), RESAMPLES times; each cell gives the share of
resamples in which ours meets Optuna's median, and the 90% interval of
median(ours) - median(Optuna) (below zero: ours is better). Ours at the
runner's defaults (`bench samplers --in-flight N`, with `--ramp` at 4 and
8); Optuna 5.0.0's TPE one trial at a time. Seeds 0-199 are the earlier
runs that the tables of ../widen/ and ../start/ count; seeds 200-499 were
run for this (`ours-N-seeds200-499.json` and `optuna-1-seeds200-499.json`
here; Optuna's continuous problems and our Levy-5 and Hartmann-6 at 8 in
flight from earlier runs). Last, Levy-5 and Hartmann-6 over seeds 0-1499
at 8 in flight (../start/seeds0-1499.py), and every problem over seeds
0-999 at 8 in flight (seeds 500-999 run in the thirty-first session:
`ours-8-seeds500-999.json` and `optuna-1-seeds500-999.json` here) and
over seeds 0-499 at 16 in flight (`ours-16-seeds200-499.json`, the same
session). Run
from this folder:
python3 bootstrap.py (a few minutes)"""
import random
import statistics
import sys

sys.path.insert(0, '../widen')
from medians import CONTINUOUS, GRIDS, OLD5, OLD6, load  # noqa: E402
import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location('seeds0_1499', '../start/seeds0-1499.py')
seeds0_1499 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seeds0_1499)

RESAMPLES = 4_000


def verdicts(ours, optuna, rng):
    """Share of paired resamples where ours meets, and the 5% / 95%
    quantiles of median(ours) - median(Optuna)."""
    n = len(ours)
    met, diffs = 0, []
    for _ in range(RESAMPLES):
        idx = [rng.randrange(n) for _ in range(n)]
        d = statistics.median(ours[i] for i in idx) - statistics.median(optuna[i] for i in idx)
        met += d <= 0
        diffs.append(d)
    diffs.sort()
    return met / RESAMPLES, diffs[RESAMPLES // 20], diffs[RESAMPLES - RESAMPLES // 20 - 1]


def table(title, ours, optuna, rng, problems, seeds):
    print(f'| {title} | ours | Optuna | verdict | resamples met | ours - Optuna, 90% | seeds better / worse |')
    print('|---|---|---|---|---|---|---|')
    met = 0
    for p in problems:
        for b in ('50', '100'):
            assert len(ours[p][b]) == len(optuna[p][b]) == seeds, (title, p, b)
            met += statistics.median(ours[p][b]) <= statistics.median(optuna[p][b])
            print(row(f'{p} @{b}', ours[p][b], optuna[p][b], rng))
    print(f'\nmet: {met} of {2 * len(problems)}\n')


def row(name, ours, optuna, rng):
    share, lo, hi = verdicts(ours, optuna, rng)
    mo, mx = statistics.median(optuna), statistics.median(ours)
    mark = 'met' if mx <= mo else 'missed'
    return (f'| {name} | {mx:.4g} | {mo:.4g} | {mark} | {100 * share:.0f}% | '
            f'{lo:+.3g} to {hi:+.3g} | {sum(a < b for a, b in zip(ours, optuna))} / '
            f'{sum(a > b for a, b in zip(ours, optuna))} |')


OPTUNA_0_199 = [OLD5 + 'seeds-0-199/optuna-1.json']
OPTUNA_200_499 = [OLD5 + 'seeds-0-499/optuna-1-branin-rosenbrock10-mixed-seeds200-499.json',
                  OLD5 + 'seeds-0-499/optuna-1-hartmann6-levy5-seeds200-349.json',
                  OLD5 + 'seeds-0-499/optuna-1-hartmann6-levy5-seeds350-499.json',
                  'optuna-1-seeds200-499.json']


def ours_0_199(n):
    """Our seeds 0-199 at `n` in flight, checked bit for bit against the
    current sampler on their first 10 seeds."""
    if n in (8, 16):
        return load([f'../start/first-steps-{n}-seeds0-199.json'])
    if n == 4:
        d = load(['../widen/widen-4-seeds0-199.json'], problems=CONTINUOUS)
        d.update(load([OLD6 + 'grids/grids-4-seeds0.json', OLD6 + 'grids/grids-4-seeds100.json'], problems=GRIDS))
        return d
    d = load([OLD5 + 'seeds-0-499/clip-1.15-2-seeds0-199.json'], problems=CONTINUOUS)
    d.update(load([OLD5 + 'seeds-0-199/ours-2.json'], problems=GRIDS))
    return d


def extend(d, more):
    """Each problem's per-seed values in `d`, followed by those of the
    later seeds in `more`."""
    for p, x in more.items():
        for b in ('50', '100'):
            d[p][b] += x[b]
    return d


def ours_0_499(n):
    later = ['../start/until-30-levy5-hartmann6-8-seeds200-499.json'] if n == 8 else []
    return extend(ours_0_199(n), load(later + [f'ours-{n}-seeds200-499.json']))


# Seeds 500-999 (thirty-first session): the eleven problems run for this,
# Levy-5 and Hartmann-6 from the start's and Optuna's earlier runs.
OPTUNA_500_999 = ['../../concurrency-2026-12-06/nonarrow/optuna-1-levy5-hartmann6-seeds500-999.json',
                  'optuna-1-seeds500-999.json']


def ours_0_999_8():
    return extend(ours_0_499(8), load(['../start/until-30-levy5-hartmann6-8-seeds500-999.json',
                                       'ours-8-seeds500-999.json']))


if __name__ == '__main__':
    rng = random.Random(37)
    problems = CONTINUOUS + GRIDS
    optuna = load(OPTUNA_0_199, 'optuna-tpe')
    optuna_499 = load(OPTUNA_0_199 + OPTUNA_200_499, 'optuna-tpe')
    for n in (2, 4, 8):
        table(f'seeds 0-199, {n} in flight', ours_0_199(n), optuna, rng, problems, 200)
        table(f'seeds 0-499, {n} in flight', ours_0_499(n), optuna_499, rng, problems, 500)
    o = seeds0_1499.optuna
    x = load(seeds0_1499.runs['start in steps'], problems=seeds0_1499.PROBLEMS)
    table('seeds 0-1499, 8 in flight', x, o, rng, seeds0_1499.PROBLEMS, 1500)
    table('seeds 0-999, 8 in flight', ours_0_999_8(),
          load(OPTUNA_0_199 + OPTUNA_200_499 + OPTUNA_500_999, 'optuna-tpe'), rng, problems, 1000)
    table('seeds 0-199, 16 in flight', ours_0_199(16), optuna, rng, problems, 200)
    table('seeds 0-499, 16 in flight', ours_0_499(16), optuna_499, rng, problems, 500)
