"""Optuna 5.0's NSGAIISampler on the problems of several objectives of `salus-tune bench samplers`.

Usage: optuna_fronts.py SEEDS PROBLEMS FIRST TRIALS, PROBLEMS comma-separated
(zdt1, zdt2, dtlz2, bnh), the seeds FIRST to FIRST+SEEDS-1. Prints a JSON
array of {problem, runs: [{seed, values, feasible, ms_per_trial}]}: every
trial's objective values in order and whether it holds the constraints
(bnh's, given to the sampler as its constraints_func), so that salus-tune computes both sides' hypervolumes with
one function, and the median wall time per trial for the last ten trials
(the sampler plus Optuna's in-memory storage). The functions and spaces
mirror orchestrator/src/bench/fronts.rs exactly; the sampler keeps its
defaults (population 50, uniform crossover).
"""
import json
import math
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
    t.set_user_attr("c", [(x0 - 5) ** 2 + x1 ** 2 - 25, 7.7 - ((x0 - 8) ** 2 + (x1 + 3) ** 2)])
    return 4 * x0 * x0 + 4 * x1 * x1, (x0 - 5) ** 2 + (x1 - 5) ** 2


def constraints(trial):
    return trial.user_attrs["c"]


PROBLEMS = {"zdt1": (zdt1, 2), "zdt2": (zdt2, 2), "dtlz2": (dtlz2, 3), "bnh": (bnh, 2)}
seeds, wanted, first, trials = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
rows = []
for name in wanted:
    f, m = PROBLEMS[name]
    runs = []
    for seed in range(first, first + seeds):
        ends = []
        constrained = name == "bnh"
        sampler = optuna.samplers.NSGAIISampler(seed=seed, constraints_func=constraints if constrained else None)
        study = optuna.create_study(directions=["minimize"] * m, sampler=sampler)
        study.optimize(f, n_trials=trials, callbacks=[lambda s, t: ends.append(time.perf_counter())])
        runs.append({"seed": seed, "values": [list(tr.values) for tr in study.trials],
                     "feasible": [all(c <= 0 for c in tr.user_attrs.get("c", [])) for tr in study.trials],
                     "ms_per_trial": (ends[-1] - ends[-11]) * 1e3 / 10})
    print(f"  optuna-nsga2 {name}: {seeds} seeds of {trials} trials", file=sys.stderr, flush=True)
    rows.append({"problem": name, "runs": runs})
print(json.dumps(rows))
