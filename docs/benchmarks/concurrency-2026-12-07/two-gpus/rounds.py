"""The wall time of a study on two GPUs' 8 lanes (16 in flight by default)
under each start, in trial durations, as `bench samplers` models it (the
oldest trial finishes first, all take as long) and as if N trials at once
ran N times as fast as one: an upper bound on what running fewer at once
costs, since a GPU's lanes run fewer trials each faster. TPE's random
start is 10 trials. One GPU's start on its 4 lanes is the last row, for
comparison. Run: python3 rounds.py"""
import os
import sys

# The same model as one GPU's table (../start/rounds.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'start'))
from rounds import wall  # noqa: E402


def doubling(h):
    """2 until 30, 4 until 60, then twice as many each time the trials double."""
    if h < 30:
        return 2
    cap, until = 4, 60
    while h >= until:
        cap, until = cap * 2, until * 2
    return cap


STARTS = {
    'before: all 16 until 10, 4 until 30, 8 until 60': lambda h: 16 if h < 10 else 4 if h < 30 else 8 if h < 60 else 16,
    'now: all 16 until 10, 2 until 30, 4 until 60, 8 until 120': lambda h: 16 if h < 10 else min(16, doubling(h)),
    '16 throughout': lambda h: 16,
    '8 throughout': lambda h: 8,
    "one GPU's start (8 in flight)": lambda h: 8 if h < 10 else min(8, doubling(h)),
}
BUDGETS = (50, 100, 200, 500, 1000)
BEFORE = STARTS['before: all 16 until 10, 4 until 30, 8 until 60']
print('| start | ' + ' | '.join(f'{n} trials' for n in BUDGETS) + ' |')
print('|---|' + '---|' * len(BUDGETS))
for name, f in STARTS.items():
    cells = [f"{wall(f, n):.0f} ({wall(f, n) / wall(BEFORE, n):.2f}x)" for n in BUDGETS]
    print(f'| {name} | ' + ' | '.join(cells) + ' |')
