"""This session's rows: each run's medians on seeds 500-999, with the seeds where it is better / worse than
Optuna's TPE one trial at a time, and Levy-5's share of seeds above 1. Run from this folder:
python3 rows.py"""
import json, statistics

OPTUNA = "../nonarrow/optuna-1-levy5-hartmann6-seeds500-999.json"
RUNS = [
    ("Optuna's TPE, 8 in flight (constant liar)", "optuna-8-levy5-hartmann6-seeds500-999.json"),
    ("shipped, 8 in flight with the start", "../batch/shipped-levy5-hartmann6-8-seeds500-999.json"),
    ("ours, one at a time (Levy-5's first column: at 93 trials, against Optuna's at 100)", "ours-1-levy5-at93-and-100-seeds500-999.json"),
    ("2 in flight until 60 trials, then 8", "start-2-until-60-then-8-levy5-hartmann6-seeds500-999.json"),
    ("clip exponent 1.3 from 60 finished", "late-clip-1.3-levy5-hartmann6-8-seeds500-999.json"),
    ("Optuna's clip and weights from 50 finished", "optuna-settings-from-50-finished-levy5-hartmann6-8-seeds500-999.json"),
    ("Optuna's clip and weights", "optuna-settings-levy5-hartmann6-8-seeds500-999.json"),
]


def load(f):
    return {r["problem"]: r for r in json.load(open(f))}


o = load(OPTUNA)
for name, f in [("Optuna's TPE, one at a time", OPTUNA)] + RUNS:
    b = load(f)
    cells = []
    for p in ("hartmann6", "levy5"):
        for k in ("50", "100"):
            if p not in b:
                cells.append("-")
                continue
            # The one-at-a-time run's first column holds its best at 93 trials.
            at93 = f.startswith("ours-1") and k == "50"
            x = o[p]["best_100_per_seed" if at93 else f"best_{k}_per_seed"]
            y = b[p][f"best_{k}_per_seed"]
            better, worse = sum(v < u for u, v in zip(x, y)), sum(v > u for u, v in zip(x, y))
            cells.append(f"{statistics.median(y):.4g}" + ("" if f == OPTUNA else f" ({better} / {worse})"))
    y = b["levy5"]["best_100_per_seed"]
    cells.append(f"{round(100 * sum(v > 1 for v in y) / len(y))}%")
    print(f"| {name} | " + " | ".join(cells) + " |")
