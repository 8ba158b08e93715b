"""Our TPE at 4 trials in flight with the runner's start of one trial per
lane (2 in flight until the study holds 60 trials, `bench samplers
--in-flight 4 --ramp`) against Optuna 5.0.0's TPE one trial at a time:
every problem over seeds 0-199, Hartmann-6 and Levy-5 over seeds 0-499;
and against our TPE at 4 in flight without the start, on the same seeds.
Run from this folder with a Python that has the standard library only:
python3 medians.py"""
import json, statistics

ALL = ['branin', 'hartmann6', 'rosenbrock10', 'levy5', 'mixed', 'ordinal5',
       'ordinal-hartmann6', 'int-styblinski4', 'int-categorical', 'tab-digits',
       'tab-synthetic-a', 'tab-synthetic-b', 'tab-breast-cancer']
CONT, H = ALL[:5], ['hartmann6', 'levy5']


def add(d, f, probs, sampler='tpe'):
    for r in json.load(open(f)):
        if r['sampler'] != sampler or r['problem'] not in probs:
            continue
        x = d.setdefault(r['problem'], {'50': [], '100': []})
        x['50'] += r['best_50_per_seed']
        x['100'] += r['best_100_per_seed']


# Each list runs over the seeds in order.
ramp, optuna, plain = {}, {}, {}
add(ramp, 'ramp-4-seeds0-199.json', ALL)
add(ramp, 'ramp-4-hartmann6-levy5-seeds200-349.json', H)
add(ramp, 'ramp-4-hartmann6-levy5-seeds350-499.json', H)
add(optuna, '../seeds-0-199/optuna-1.json', ALL, 'optuna-tpe')
add(optuna, '../seeds-0-499/optuna-1-hartmann6-levy5-seeds200-349.json', H, 'optuna-tpe')
add(optuna, '../seeds-0-499/optuna-1-hartmann6-levy5-seeds350-499.json', H, 'optuna-tpe')
add(plain, '../seeds-0-499/clip-1.15-4-seeds0-199.json', CONT)

met = 0
print('seeds 0-199: ours at 4 in flight with the start / Optuna one at a time ("*": met)')
for p in ALL:
    row = [p.ljust(18)]
    for b in ('50', '100'):
        o, x = (d[p][b][:200] for d in (optuna, ramp))
        assert len(o) == len(x) == 200, (p, b)
        mo, mx = statistics.median(o), statistics.median(x)
        met += mx <= mo
        row.append(f"@{b} {mx:.4g} / {mo:.4g}{'*' if mx <= mo else ' '}")
        if p in plain:
            y = plain[p][b]
            row.append(f"(without: {statistics.median(y):.4g}; with better/worse on "
                       f"{sum(a < c for a, c in zip(x, y))}/{sum(a > c for a, c in zip(x, y))})")
    print('  '.join(row))
print(f'met: {met} of {2 * len(ALL)}')
print('seeds 0-499')
for p in H:
    row = [p.ljust(18)]
    for b in ('50', '100'):
        o, x = optuna[p][b], ramp[p][b]
        assert len(o) == len(x) == 500, (p, b)
        mo, mx = statistics.median(o), statistics.median(x)
        row.append(f"@{b} {mx:.4g} / {mo:.4g}{'*' if mx <= mo else ' '} "
                   f"(better/worse on {sum(a < c for a, c in zip(x, o))}/{sum(a > c for a, c in zip(x, o))})")
    print('  '.join(row))
