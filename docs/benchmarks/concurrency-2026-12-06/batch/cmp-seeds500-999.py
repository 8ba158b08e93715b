"""Two runs over the same seeds (here 500-999, Levy-5 and Hartmann-6): medians of A -> B, seeds B is better / worse, and Levy-5's share of seeds above 1.
Run from this folder: python3 cmp-seeds500-999.py shipped-levy5-hartmann6-8-seeds500-999.json best-weight2-levy5-hartmann6-8-seeds500-999.json"""
import json,statistics,sys
def load(f): return {r['problem']:r for r in json.load(open(f)) if r['sampler']=='tpe'}
a,b=load(sys.argv[1]),load(sys.argv[2])
def share(x): return sum(v>1 for v in x)/len(x)
for p in a:
    row=[p.ljust(10)]
    for k in ('50','100'):
        x,y=a[p][f'best_{k}_per_seed'],b[p][f'best_{k}_per_seed']
        row.append(f"@{k} {statistics.median(x):.4g} -> {statistics.median(y):.4g} ({sum(v<u for u,v in zip(x,y))}/{sum(v>u for u,v in zip(x,y))})" + (f" >1: {share(x):.0%} -> {share(y):.0%}" if p=='levy5' else ''))
    print('  '.join(row))
