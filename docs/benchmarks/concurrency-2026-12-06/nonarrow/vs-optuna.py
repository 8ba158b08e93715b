"""Medians of Optuna's TPE one trial at a time (the first file) against each later run on the same seeds, seeds where the run is better / worse,
and Levy-5's share of seeds above 1 at 100 trials.
Run from this folder, for example:
python3 vs-optuna.py optuna-1-levy5-hartmann6-seeds500-999.json ../batch/shipped-levy5-hartmann6-8-seeds500-999.json believed-wider-1.5-levy5-hartmann6-8-seeds500-999.json"""
import json,statistics,sys
def load(f): return {r['problem']:r for r in json.load(open(f))}
o=load(sys.argv[1])
for f in sys.argv[2:]:
    b=load(f)
    print(f)
    for p in o:
        row=[p.ljust(10)]
        for k in ('50','100'):
            x,y=o[p][f'best_{k}_per_seed'],b[p][f'best_{k}_per_seed']
            row.append(f"@{k} {statistics.median(x):.4g} vs {statistics.median(y):.4g} ({sum(v<u for u,v in zip(x,y))}/{sum(v>u for u,v in zip(x,y))})")
        print('  '.join(row))
    if 'levy5' in b:
        y=b['levy5']['best_100_per_seed']
        print(f"levy5 above 1 @100: {round(100*sum(v>1 for v in y)/len(y))}%")
