"""The wall time of a study under each start, in trial durations, as
`bench samplers` models it (the oldest trial finishes first, all take as
long) and as if a GPU ran N trials N times as fast as one: an upper bound
on what running fewer at once costs, since a GPU's lanes run fewer trials
each faster (docs/gpu-runs/2026-11-30: 8 trials at once ran 3.3 times as
fast as one after another, not 8). 8 in flight on 4 lanes; TPE's random
start is 10 trials. Run: python3 rounds.py"""
import heapq


def wall(limit, trials):
    t, running, held, done = 0.0, [], 0, 0
    while done < trials:
        while held < trials and len(running) < limit(held):
            heapq.heappush(running, t + 1.0)
            held += 1
        t = heapq.heappop(running)
        done += 1
    return t


STARTS = {
    'before: 4 until 60': lambda h: 4 if h < 60 else 8,
    'kept: all 8 until 10, 2 until 30, 4 until 60': lambda h: 8 if h < 10 else 2 if h < 30 else 4 if h < 60 else 8,
    'all 8 until 10, 2 until 20, 4 until 60': lambda h: 8 if h < 10 else 2 if h < 20 else 4 if h < 60 else 8,
    '2 until 30 (the random start too), 4 until 60': lambda h: 2 if h < 30 else 4 if h < 60 else 8,
    '2 until 60': lambda h: 2 if h < 60 else 8,
    '8 throughout': lambda h: 8,
}
if __name__ == '__main__':
    print('| start | 50 trials | 100 trials | 200 trials |')
    print('|---|---|---|---|')
    for name, f in STARTS.items():
        cells = [f"{wall(f, n):.0f} ({wall(f, n) / wall(STARTS['before: 4 until 60'], n):.2f}x)" for n in (50, 100, 200)]
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
