"""Per problem: medians at 50 and 100 trials of run A -> run B, and on how many seeds B is better / worse.
Usage: python3 cmp.py A.json B.json"""
import json, statistics, sys
def load(f):
    d={}
    for r in json.load(open(f)):
        if r['sampler']=='tpe': d[r['problem']]=r
    return d
a,b=load(sys.argv[1]),load(sys.argv[2])
for p in a:
    if p not in b: continue
    row=[p.ljust(14)]
    for b_ in ('50','100'):
        k=f'best_{b_}_per_seed'
        x,y=a[p][k],b[p][k]
        row.append(f"@{b_} {statistics.median(x):.4g} -> {statistics.median(y):.4g} ({sum(v<u for u,v in zip(x,y))}/{sum(v>u for u,v in zip(x,y))})")
    print('  '.join(row))
