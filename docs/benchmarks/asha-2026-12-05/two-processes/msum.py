"""Two processes (one lane each) on one ASHA + TPE digits study, seeds 0-39:
m-METRIC-before.txt (binary ef0616f) against m-METRIC-fix.txt (239a199), and the
same two with the sync every 0.1 s instead of 2 s (-s100). Per pair: runs that hit
the 60 s deadline with trials left RUNNING or WAITING ("stuck"), then, over the
seeds where neither was stuck, the medians of rung 0 (the mean value at epoch 3
of the trials numbered 10 on), of the best value and of the seconds the pair took.
Run from this folder: python3 msum.py
Other pairs of files in the folder it runs from: python3 msum.py BEFORE AFTER
(m-METRIC-BEFORE.txt against m-METRIC-AFTER.txt)."""
import ast, statistics, sys
def load(f):
    d = {}
    for line in open(f):
        s, best, rest = line.split(' ', 2)
        d[int(s)] = (None if best == 'None' else float(best), ast.literal_eval(rest))
    return d
PAIRS = [tuple(sys.argv[1:3])] if len(sys.argv) == 3 else [('before', 'fix'), ('before-s100', 'fix-s100')]
for metric, lower in (('loss', True), ('acc', False)):
    for a_name, b_name in PAIRS:
        try:
            a, b = load(f'm-{metric}-{a_name}.txt'), load(f'm-{metric}-{b_name}.txt')
        except FileNotFoundError:
            continue
        seeds = sorted(set(a) & set(b))
        def stuck(d): return [s for s in seeds if d[s][1].get('RUNNING') or d[s][1].get('WAITING')]
        ok = [s for s in seeds if s not in stuck(a) and s not in stuck(b)]
        out = [f'{metric} {a_name} -> {b_name}: {len(seeds)} seeds, stuck {len(stuck(a))} -> {len(stuck(b))}']
        for what, get in (('rung0', lambda r: r[1]['rung0']), ('best', lambda r: r[0]), ('seconds', lambda r: r[1]['seconds'])):
            x = [get(a[s]) for s in ok]; y = [get(b[s]) for s in ok]
            if what == 'seconds':
                out.append(f'seconds median {statistics.median(x):.2f} -> {statistics.median(y):.2f}')
                continue
            better = sum((v < u) if lower else (v > u) for u, v in zip(x, y))
            worse = sum((v > u) if lower else (v < u) for u, v in zip(x, y))
            out.append(f'{what} median {statistics.median(x):.4f} -> {statistics.median(y):.4f} ({better} better, {worse} worse)')
        c = [statistics.mean(d[s][1].get('COMPLETE', 0) for s in ok) for d in (a, b)]
        out.append(f'COMPLETE {c[0]:.2f} -> {c[1]:.2f}')
        print('; '.join(out))
