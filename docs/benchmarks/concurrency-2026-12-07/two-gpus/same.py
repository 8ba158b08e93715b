"""Checks that two GPUs' start (`bench samplers --in-flight 16 --ramp`)
gives, seed for seed and problem for problem, the best values at 50 and
100 trials of one GPU's (`--in-flight 8 --ramp`, the twenty-ninth
session's run). Run: python3 same.py"""
import json

two = {r['problem']: r for r in json.load(open('ours-16-seeds0-199.json'))}
one = {r['problem']: r for r in json.load(open('../start/first-steps-8-seeds0-199.json'))}
assert sorted(two) == sorted(one), (sorted(two), sorted(one))
same = differ = 0
for problem in sorted(two):
    for budget in ('best_50_per_seed', 'best_100_per_seed'):
        a, b = two[problem][budget], one[problem][budget]
        assert len(a) == len(b) == 200, problem
        n = sum(x == y for x, y in zip(a, b))
        same += n
        differ += len(a) - n
        if n < len(a):
            print(f'{problem} {budget}: {len(a) - n} seeds differ')
print(f'{len(two)} problems, 200 seeds, 50 and 100 trials: {same} values the same bit for bit, {differ} differ')
print('ramp at 16:', json.dumps(next(iter(two.values()))['ramp'], sort_keys=True))
print('ramp at 8: ', json.dumps(next(iter(one.values()))['ramp'], sort_keys=True))
