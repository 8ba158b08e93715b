"""The goal over seeds 0-199 after the runner's start gained its first
step (`Ramp` in orchestrator/src/runner/mod.rs: the random start all at
once, then half the lanes for the first modelled proposals): ours with
that start (`bench samplers --in-flight N --ramp`) against Optuna 5.0.0's
TPE one trial at a time, and against the start before (the runs of
../widen/, as its medians.py puts them together). Only 8 and 16 in flight
change: on 2 lanes half the lanes is one per lane already, and running
the random start at once changes no proposal. Run from this folder:
python3 medians.py"""
import sys

sys.path.insert(0, '../widen')
from medians import CONTINUOUS, GRIDS, OLD5, OLD6, load, table  # noqa: E402

optuna = load([OLD5 + 'seeds-0-199/optuna-1.json'], 'optuna-tpe')
for n in (8, 16):
    grids = load([f'{OLD6}grids/grids-{n}-seeds{s}.json' for s in (0, 100)])
    if n == 8:
        before = load(['../widen/unrestricted-8-seeds0.json', '../widen/unrestricted-8-seeds100.json'],
                      problems=CONTINUOUS[:4])
        before.update(load(['../widen/mixed-8-seeds0-199.json']))
    else:
        before = load([f'../widen/widen-{n}-seeds0-199.json'], problems=CONTINUOUS)
    before.update(grids)
    now = load([f'first-steps-{n}-seeds0-199.json'])
    table(f'seeds 0-199, {n} in flight with the start in steps: ours / Optuna one at a time ("*": met)',
          now, before, CONTINUOUS + GRIDS, optuna)
