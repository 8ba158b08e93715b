"""Optuna 5.0's NSGAIISampler, NSGAIIISampler and TPESampler on the problems of several objectives of `salus-tune bench samplers`.

Usage: optuna_fronts.py SEEDS PROBLEMS FIRST TRIALS SAMPLERS, PROBLEMS
comma-separated (zdt1, zdt2, dtlz2, bnh, mlp-digits: the digits table
salus-tune writes beside this script), SAMPLERS some of nsga2, nsga3, tpe; the
seeds FIRST to FIRST+SEEDS-1. Prints a JSON array of {problem, sampler,
runs: [{seed, values, feasible, ms_per_trial}]}: every trial's objective
values in order and whether it holds the constraints (bnh's, set with
`trial.set_constraint`, which both samplers honour), so that salus-tune
computes both sides' hypervolumes with one function, and the wall time
per trial over the last ten trials (the sampler plus Optuna's in-memory
storage). The functions and spaces mirror orchestrator/src/bench/fronts.rs
exactly; the samplers keep their defaults (NSGA-II and NSGA-III:
population 50, uniform crossover, NSGA-III's reference points of 3
divisions; TPE: its multi-objective defaults).
"""
import csv
import json
import math
import os
import sys
import time

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)


def xs(t, n):
    return [t.suggest_float(f"x{i}", 0, 1) for i in range(n)]


def zdt(t, f2):
    x = xs(t, 5)
    g = 1 + 9 * sum(x[1:]) / (len(x) - 1)
    return x[0], g * f2(x[0], g)


def zdt1(t):
    return zdt(t, lambda f1, g: 1 - math.sqrt(f1 / g))


def zdt2(t):
    return zdt(t, lambda f1, g: 1 - (f1 / g) ** 2)


def dtlz2(t):
    x = xs(t, 7)
    g = sum((v - 0.5) ** 2 for v in x[2:])
    a, b = x[0] * math.pi / 2, x[1] * math.pi / 2
    return ((1 + g) * math.cos(a) * math.cos(b), (1 + g) * math.cos(a) * math.sin(b), (1 + g) * math.sin(a))


def bnh(t):
    x0, x1 = t.suggest_float("x0", 0, 5), t.suggest_float("x1", 0, 3)
    t.set_constraint("c0", (x0 - 5) ** 2 + x1 ** 2 - 25)
    t.set_constraint("c1", 7.7 - ((x0 - 8) ** 2 + (x1 + 3) ** 2))
    return 4 * x0 * x0 + 4 * x1 * x1, (x0 - 5) ** 2 + (x1 - 5) ** 2


ORDINAL = ["width", "depth", "lr", "batch_size"]


def mlp_digits():
    """The digits table of scripts/tabulate.sh, which salus-tune writes
    beside this script: validation error against parameters."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tab-digits.csv")) as f:
        rows = list(csv.DictReader(f))
    levels = [sorted({r[k] for r in rows}, key=float) for k in ORDINAL]
    table = {tuple(levels[j].index(r[k]) for j, k in enumerate(ORDINAL)) + (r["activation"],):
             (1 - float(r["val_accuracy"]), float(r["params"])) for r in rows}

    def f(t):
        key = tuple(t.suggest_int(k, 0, len(levels[j]) - 1) for j, k in enumerate(ORDINAL))
        error, params = table[key + (t.suggest_categorical("activation", ["relu", "tanh", "gelu"]),)]
        return (error if math.isfinite(error) else 1.0), params
    return f


PROBLEMS = {"zdt1": (zdt1, 2), "zdt2": (zdt2, 2), "dtlz2": (dtlz2, 3), "bnh": (bnh, 2)}
if "mlp-digits" in sys.argv[2].split(","):
    PROBLEMS["mlp-digits"] = (mlp_digits(), 2)
SAMPLERS = {"nsga2": optuna.samplers.NSGAIISampler, "nsga3": optuna.samplers.NSGAIIISampler,
            "tpe": optuna.samplers.TPESampler}
seeds, wanted, first, trials = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
samplers = sys.argv[5].split(",") if len(sys.argv) > 5 else ["nsga2"]
rows = []
for name in wanted:
    f, m = PROBLEMS[name]
    for kind in samplers:
        runs = []
        for seed in range(first, first + seeds):
            ends = []
            study = optuna.create_study(directions=["minimize"] * m, sampler=SAMPLERS[kind](seed=seed))
            study.optimize(f, n_trials=trials, callbacks=[lambda s, t: ends.append(time.perf_counter())])
            runs.append({"seed": seed, "values": [list(tr.values) for tr in study.trials],
                         "feasible": [all(c <= 0 for c in tr.constraints.values()) for tr in study.trials],
                         "ms_per_trial": (ends[-1] - ends[-11]) * 1e3 / 10})
        print(f"  optuna-{kind} {name}: {seeds} seeds of {trials} trials", file=sys.stderr, flush=True)
        rows.append({"problem": name, "sampler": kind, "runs": runs})
print(json.dumps(rows))
