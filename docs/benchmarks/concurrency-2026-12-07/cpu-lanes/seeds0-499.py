"""A CPU of 4 lanes keeping one trial per lane (no pruner, built-in
trials): 4 in flight. Before the thirty-third session it had no start
(4 in flight throughout). This is the first form of that session's
start for it, not kept: 2 in flight from the random start until the
study holds 30 trials, then 4 (the cap at most one per lane, as
`bench samplers --in-flight 4 --ramp --lanes 4` modelled it before the
cap became at most half the default; with the kept binary that command
models 2 until 60 trials, the start of ../noise/'s 4-in-flight runs). Against Optuna 5.0.0's TPE one trial at
a time, judged as ../noise/bootstrap.py judges the other defaults, over
seeds 0-199 and 0-499; and seed for seed against the 2-lane start (2 in
flight until 60 trials, `--in-flight 4 --ramp`, ../noise/'s runs). Run
for this (the binary with --lanes and the first form of the cap):

  salus-tune bench samplers --seeds 250 --first-seed 0 --in-flight 4 \
      --ramp --lanes 4 --samplers tpe --no-optuna --json > ours-4-lanes4-seeds0-249.json
  (and --first-seed 250 > ours-4-lanes4-seeds250-499.json)

Run from this folder: python3 seeds0-499.py (a minute or two)"""
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# bootstrap.py's paths are relative to its own folder.
os.chdir(os.path.join(HERE, '../noise'))
sys.path.insert(0, '.')
sys.path.insert(0, '../widen')
import bootstrap  # noqa: E402
from medians import CONTINUOUS, GRIDS, load  # noqa: E402

FILES = [os.path.join(HERE, f) for f in ('ours-4-lanes4-seeds0-249.json', 'ours-4-lanes4-seeds250-499.json')]


def first(d, n):
    return {p: {b: x[b][:n] for b in x} for p, x in d.items()}


if __name__ == '__main__':
    rng = random.Random(37)
    problems = CONTINUOUS + GRIDS
    ours = load(FILES)
    optuna_199 = load(bootstrap.OPTUNA_0_199, 'optuna-tpe')
    optuna_499 = load(bootstrap.OPTUNA_0_199 + bootstrap.OPTUNA_200_499, 'optuna-tpe')
    bootstrap.table('seeds 0-199, 4 lanes, one per lane', first(ours, 200), optuna_199, rng, problems, 200)
    bootstrap.table('seeds 0-499, 4 lanes, one per lane', ours, optuna_499, rng, problems, 500)
    two_lanes = bootstrap.ours_0_499(4)
    print('| seeds 0-499, 4 in flight | 4 lanes @50 | 2 lanes @50 | better / worse | 4 lanes @100 | 2 lanes @100 | better / worse |')
    print('|---|---|---|---|---|---|---|')
    for p in problems:
        cells = []
        for b in ('50', '100'):
            x, y = ours[p][b], two_lanes[p][b]
            cells += [f'{statistics.median(x):.4g}', f'{statistics.median(y):.4g}',
                      f'{sum(a < c for a, c in zip(x, y))} / {sum(a > c for a, c in zip(x, y))}']
        print(f'| {p} | ' + ' | '.join(cells) + ' |')
