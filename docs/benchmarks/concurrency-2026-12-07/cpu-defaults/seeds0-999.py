"""The CPU's defaults over seeds 0-999: 2 in flight (a CPU's two lanes,
built-in trials, no pruner) and 4 with the start (a CPU with a pruner,
PBT or external workers: `--in-flight 4 --ramp`), against Optuna 5.0.0's
TPE one trial at a time, as ../noise/bootstrap.py judges seeds 0-199 and
0-499. Seeds 500-999 were run for this (thirty-third session, the
binary at cd0cc96, whose samplers are those of the thirty-first
session's 8-in-flight run over the same seeds; the same runs over seeds
200-209 gave ../noise/ours-N-seeds200-499.json's first 10 seeds bit for
bit, 260 of 260 values at each N):

  salus-tune bench samplers --seeds 500 --first-seed 500 --in-flight 2 \
      --samplers tpe --no-optuna --json > ours-2-seeds500-999.json
  salus-tune bench samplers --seeds 500 --first-seed 500 --in-flight 4 \
      --ramp --samplers tpe --no-optuna --json > ours-4-seeds500-999.json

Optuna's seeds 500-999 are the thirty-first session's runs. Run from this
folder: python3 seeds0-999.py (a few minutes)"""
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# bootstrap.py's paths are relative to its own folder.
os.chdir(os.path.join(HERE, '../noise'))
sys.path.insert(0, '.')
sys.path.insert(0, '../widen')
import bootstrap  # noqa: E402
from medians import CONTINUOUS, GRIDS, load  # noqa: E402


def ours_500_999(n):
    return load([os.path.join(HERE, f'ours-{n}-seeds500-999.json')])


def ours_0_999(n):
    return bootstrap.extend(bootstrap.ours_0_499(n), ours_500_999(n))


if __name__ == '__main__':
    rng = random.Random(37)
    problems = CONTINUOUS + GRIDS
    optuna_500 = load(bootstrap.OPTUNA_500_999, 'optuna-tpe')
    optuna_999 = load(bootstrap.OPTUNA_0_199 + bootstrap.OPTUNA_200_499 + bootstrap.OPTUNA_500_999,
                      'optuna-tpe')
    for n in (2, 4):
        bootstrap.table(f'seeds 500-999, {n} in flight', ours_500_999(n), optuna_500, rng, problems, 500)
        bootstrap.table(f'seeds 0-999, {n} in flight', ours_0_999(n), optuna_999, rng, problems, 1000)
