"""The goal over seeds 0-199 after believed kernels widen on continuous
dimensions from three pending trials (`WIDEN_BELIEVED_FROM` in
orchestrator/tuning/src/sampler/tpe.rs): ours with the runner's start
(`bench samplers --in-flight N --ramp`) against Optuna 5.0.0's TPE one
trial at a time, and against the sampler before: the continuous
problems' runs of 2026-12-05/06 and the discrete ones of
../../concurrency-2026-12-06/grids/. The rule leaves discrete dimensions
alone, so the discrete problems' proposals are those before (checked
bit for bit on int-categorical at 8 in flight) and their rows repeat
them. At 8 in flight the four problems of floats only are the runs of
the rule before it left grids alone (unrestricted-8-*.json; no grid
dimension, so the same proposals), `mixed` its own run; last, the
discrete problems under that first rule. Each cell: ours / Optuna ("*":
met), then the sampler before and on how many seeds ours is better /
worse. Run from this folder: python3 medians.py"""
import json, statistics

CONTINUOUS = ['branin', 'hartmann6', 'rosenbrock10', 'levy5', 'mixed']
GRIDS = ['ordinal5', 'ordinal-hartmann6', 'int-styblinski4', 'int-categorical',
         'tab-digits', 'tab-synthetic-a', 'tab-synthetic-b', 'tab-breast-cancer']
OLD5, OLD6 = '../../concurrency-2026-12-05/', '../../concurrency-2026-12-06/'


def load(files, sampler='tpe', problems=None):
    d = {}
    for f in files:
        for r in json.load(open(f)):
            if r['sampler'] != sampler or (problems and r['problem'] not in problems):
                continue
            x = d.setdefault(r['problem'], {'50': [], '100': []})
            x['50'] += r['best_50_per_seed']
            x['100'] += r['best_100_per_seed']
    return d


def table(title, now, before, problems, optuna):
    print(title)
    met = met_before = 0
    for p in problems:
        row = [p.ljust(18)]
        for b in ('50', '100'):
            o, x, y = (d[p][b] for d in (optuna, now, before))
            assert len(o) == len(x) == len(y) == 200, (p, b)
            mo, mx, my = statistics.median(o), statistics.median(x), statistics.median(y)
            met += mx <= mo
            met_before += my <= mo
            row.append((f"@{b} {mx:.4g} / {mo:.4g}{'*' if mx <= mo else ' '} (before {my:.4g}; "
                        f"better/worse {sum(a < c for a, c in zip(x, y))}/"
                        f"{sum(a > c for a, c in zip(x, y))})").ljust(64))
        print(' '.join(row).rstrip())
    print(f'met: {met} of {2 * len(problems)} (before: {met_before})\n')


if __name__ == '__main__':
    optuna = load([OLD5 + 'seeds-0-199/optuna-1.json'], 'optuna-tpe')
    before_files = {4: [OLD5 + 'ramp/ramp-4-seeds0-199.json'],
                    8: [OLD6 + 'ramp-8-seeds0.json', OLD6 + 'ramp-8-seeds100.json'],
                    16: [OLD6 + 'ramp-16-seeds0.json', OLD6 + 'ramp-16-seeds100.json']}
    unrestricted = ['unrestricted-8-seeds0.json', 'unrestricted-8-seeds100.json']
    for n in (4, 8, 16):
        before = load(before_files[n], problems=CONTINUOUS)
        before.update(load([f'{OLD6}grids/grids-{n}-seeds{s}.json' for s in (0, 100)]))
        if n == 8:
            now = load(unrestricted, problems=CONTINUOUS[:4])
            now.update(load(['mixed-8-seeds0-199.json']))
        else:
            now = load([f'widen-{n}-seeds0-199.json'])
        now.update({p: before[p] for p in GRIDS})
        table(f'seeds 0-199, {n} in flight with the start: ours / Optuna one at a time ("*": met)',
              now, before, CONTINUOUS + GRIDS, optuna)
        if n == 8:
            table('the discrete problems at 8 in flight under the first rule, widening on grids too',
                  load(unrestricted, problems=GRIDS), before, GRIDS, optuna)
