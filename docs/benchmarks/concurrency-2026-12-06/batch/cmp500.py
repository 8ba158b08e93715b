"""A variant's run at N trials in flight with the start over seeds 0-499
(its JSON files, together 500 seeds in order) against the shipped
binary's (../ramp-N-seeds*.json, ../seeds-0-499/) and Optuna 5.0.0's TPE
one trial at a time: medians, and seeds better / worse.
Run from this folder:
python3 cmp500.py 8 penalty-width1-early-8-seeds0-249.json penalty-width1-early-8-seeds250-499.json"""
import json, statistics, sys
D='../'
OLD=D+'../concurrency-2026-12-05/'
P=['branin','hartmann6','rosenbrock10','levy5','mixed']
def add(d,f,s):
    for r in json.load(open(f)):
        if r['sampler']!=s or r['problem'] not in P: continue
        x=d.setdefault(r['problem'],{'50':[],'100':[]})
        x['50']+=r['best_50_per_seed']; x['100']+=r['best_100_per_seed']
opt={}
for f in ['seeds-0-199/optuna-1.json','seeds-0-499/optuna-1-branin-rosenbrock10-mixed-seeds200-499.json','seeds-0-499/optuna-1-hartmann6-levy5-seeds200-349.json','seeds-0-499/optuna-1-hartmann6-levy5-seeds350-499.json']:
    add(opt,OLD+f,'optuna-tpe')
n=sys.argv[1]
base={}
for f in [D+f'ramp-{n}-seeds0.json',D+f'ramp-{n}-seeds100.json']+[D+f'seeds-0-499/continuous-{n}-seeds{s}.json' for s in (200,300,400)]:
    add(base,f,'tpe')
var={}
for f in sys.argv[2:]: add(var,f,'tpe')
for p in var:
    row=[p.ljust(13)]
    for b in ('50','100'):
        o,x,v=opt[p][b],base[p][b],var[p][b]
        assert len(v)==500
        row.append(f"@{b} opt {statistics.median(o):.4g} base {statistics.median(x):.4g} var {statistics.median(v):.4g} vs base {sum(a<c for a,c in zip(v,x))}/{sum(a>c for a,c in zip(v,x))} vs opt {sum(a<c for a,c in zip(v,o))}/{sum(a>c for a,c in zip(v,o))}")
    print('  '.join(row))
