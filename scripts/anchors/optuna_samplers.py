"""Optuna 5.0's TPESampler and GPSampler on the problems of `salus-tune bench samplers`.

Usage: optuna_samplers.py SEEDS [SAMPLERS [PROBLEMS [FIRST [IN_FLIGHT]]]],
SAMPLERS and PROBLEMS comma-separated (default: tpe,gp and every problem),
the seeds FIRST to FIRST+SEEDS-1 (FIRST defaults to 0). With IN_FLIGHT N > 1
each trial is asked while the N - 1 before it still run (ask and tell, the
oldest told first), TPE with constant_liar=True. Prints a
JSON array of {problem, sampler, at_50, at_100, ms_per_trial, best_50,
best_100}: the median best value over the seeds, each seed's best value
(in seed order), and the median wall time per trial for trials
91-100 (the objectives cost microseconds, so this is the sampler plus
Optuna's in-memory storage). The functions and spaces mirror
orchestrator/src/bench/samplers.rs exactly; the tabulated problems
(tab-*) read the tables salus-tune writes beside this script
(orchestrator/src/bench/tables.rs). GPSampler needs torch and scipy.
"""
import csv
import json
import math
import os
import statistics
import sys
import time

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)

ALPHA = [1.0, 1.2, 3.0, 3.2]
A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
P = [[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
     [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]]


def branin(t):
    x1, x2 = t.suggest_float("x1", -5, 10), t.suggest_float("x2", 0, 15)
    b, c, s = 5.1 / (4 * math.pi ** 2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1 * x1 + c * x1 - 6) ** 2 + 10 * (1 - s) * math.cos(x1) + 10


def hartmann6_at(x):
    return -sum(ALPHA[i] * math.exp(-sum(A[i][j] * (x[j] - 1e-4 * P[i][j]) ** 2 for j in range(6))) for i in range(4))


def hartmann6(t):
    return hartmann6_at([t.suggest_float(f"x{j}", 0, 1) for j in range(6)])


def rosenbrock10(t):
    x = [t.suggest_float(f"x{j}", -2, 2) for j in range(10)]
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(9))


def mixed(t):
    lr = t.suggest_float("lr", 1e-5, 1, log=True)
    width = t.suggest_int("width", 8, 1024, log=True)
    depth = t.suggest_int("depth", 1, 5)
    opt = t.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop"])
    dropout = t.suggest_float("dropout", 0, 0.5, step=0.1)
    penalty = {"sgd": 1.0, "adam": 0.0, "rmsprop": 0.5}[opt]
    return (math.log10(lr) + 2.5) ** 2 + (math.log2(width) - 7) ** 2 / 4 + (depth - 3) ** 2 / 2 + penalty + 10 * (dropout - 0.2) ** 2


ORDINAL_LEVELS = [3, 4, 6, 8, 10]


def ordinal5(t):
    u = [t.suggest_int(f"o{i}", 0, n - 1) / (n - 1) for i, n in enumerate(ORDINAL_LEVELS)]
    return ((u[0] - 0.5) ** 2 + (u[1] - 0.33) ** 2 + 2 * (u[2] - 0.6) ** 2 + 3 * (u[3] - 0.43) ** 2
            + (u[4] - 0.22) ** 2 + 2 * (u[2] - u[3]) ** 2 + 1.5 * (u[0] - u[4]) ** 2 + u[1] * u[3])


def levy5(t):
    w = [1 + (t.suggest_float(f"x{j}", -10, 10) - 1) / 4 for j in range(5)]
    return (math.sin(math.pi * w[0]) ** 2
            + sum((wi - 1) ** 2 * (1 + 10 * math.sin(math.pi * wi + 1) ** 2) for wi in w[:4])
            + (w[4] - 1) ** 2 * (1 + math.sin(2 * math.pi * w[4]) ** 2))


ORDINAL_HARTMANN_LEVELS = [4, 5, 6, 7, 8, 10]


def ordinal_hartmann6(t):
    u = [t.suggest_int(f"h{j}", 0, l - 1) / (l - 1) for j, l in enumerate(ORDINAL_HARTMANN_LEVELS)]
    return hartmann6_at(u)


def int_styblinski4(t):
    return sum(0.5 * (v ** 4 - 16 * v * v + 5 * v) for v in (t.suggest_int(f"k{i}", -5, 5) for i in range(4)))


def int_categorical(t):
    width = t.suggest_int("width", 8, 1024, log=True)
    depth = t.suggest_int("depth", 1, 8)
    batch = t.suggest_int("batch", 16, 512, log=True)
    act = t.suggest_categorical("activation", ["relu", "tanh", "gelu", "silu"])
    opt = t.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop"])
    centre, act_penalty = {"relu": (7, 0.3), "tanh": (8, 0.6), "gelu": (6.5, 0), "silu": (7.5, 0.1)}[act]
    best_depth, opt_penalty = {"sgd": (2, 0.5), "adam": (4, 0), "rmsprop": (3, 0.2)}[opt]
    return ((math.log2(width) - centre) ** 2 / 4 + (depth - best_depth) ** 2 / 2
            + (math.log2(batch) - 6) ** 2 / 4 + act_penalty + opt_penalty)


ORDINAL = ["width", "depth", "lr", "batch_size"]
ACTIVATIONS = ["relu", "tanh", "gelu"]


def tabulated(path):
    """A lookup in a table of scripts/tabulate.sh: the knobs' levels as
    indices (ascending), the activation as a categorical, the validation
    loss as the value (a diverged configuration's is the table's worst)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    levels = [sorted({r[k] for r in rows}, key=float) for k in ORDINAL]
    table = {tuple(levels[j].index(r[k]) for j, k in enumerate(ORDINAL)) + (r["activation"],): float(r["val_loss"])
             for r in rows}
    worst = max(v for v in table.values() if math.isfinite(v))

    def f(t):
        key = tuple(t.suggest_int(k, 0, len(levels[j]) - 1) for j, k in enumerate(ORDINAL))
        loss = table[key + (t.suggest_categorical("activation", ACTIVATIONS),)]
        return loss if math.isfinite(loss) else worst
    return f


here = os.path.dirname(os.path.abspath(__file__))
TABLES = [(name[:-4], tabulated(os.path.join(here, name)))
          for name in sorted(os.listdir(here)) if name.startswith("tab-") and name.endswith(".csv")]

seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
samplers = sys.argv[2].split(",") if len(sys.argv) > 2 else ["tpe", "gp"]
PROBLEMS = [("branin", branin), ("hartmann6", hartmann6), ("rosenbrock10", rosenbrock10), ("levy5", levy5),
            ("mixed", mixed), ("ordinal5", ordinal5), ("ordinal-hartmann6", ordinal_hartmann6),
            ("int-styblinski4", int_styblinski4), ("int-categorical", int_categorical)] + TABLES
first = int(sys.argv[4]) if len(sys.argv) > 4 else 0
in_flight = int(sys.argv[5]) if len(sys.argv) > 5 else 1
if len(sys.argv) > 3 and sys.argv[3]:
    wanted = sys.argv[3].split(",")
    PROBLEMS = [p for p in PROBLEMS if p[0] in wanted]
SAMPLERS = {"tpe": optuna.samplers.TPESampler, "gp": optuna.samplers.GPSampler}
rows = []
for name, f in PROBLEMS:
    for sampler in samplers:
        b50, b100, ms = [], [], []
        for seed in range(first, first + seeds):
            ends = []
            kwargs = {"constant_liar": True} if sampler == "tpe" and in_flight > 1 else {}
            study = optuna.create_study(sampler=SAMPLERS[sampler](seed=seed, **kwargs))
            if in_flight == 1:
                study.optimize(f, n_trials=100, callbacks=[lambda s, t: ends.append(time.perf_counter())])
                values = [tr.value for tr in study.trials]
            else:
                # N trials running at once, as n_jobs=N runs them, but in a
                # fixed order: ask until N run, then the oldest finishes. A
                # trial's parameters are drawn as it starts (the objective
                # suggests them then; its value is only told when it
                # finishes), so each draw sees the running ones' parameters.
                running, values, asked = [], [], 0
                while len(values) < 100:
                    while len(running) < in_flight and asked < 100:
                        t0 = time.perf_counter()
                        t = study.ask()
                        running.append((t, f(t)))
                        asked += 1
                        # The clock of trials 90-100 (a proposal each).
                        ends.append(time.perf_counter() - t0 + (ends[-1] if ends else 0.0))
                    t, v = running.pop(0)
                    study.tell(t, v)
                    values.append(v)
            b50.append(min(values[:50]))
            b100.append(min(values))
            ms.append((ends[99] - ends[89]) * 1e3 / 10)
        row = {"problem": name, "sampler": sampler, "at_50": statistics.median(b50),
               "at_100": statistics.median(b100), "ms_per_trial": statistics.median(ms),
               "best_50": b50, "best_100": b100}
        print(f"  optuna-{sampler} {name}: {row['at_50']:.4f} at 50, {row['at_100']:.4f} at 100, "
              f"{row['ms_per_trial']:.1f} ms per trial", file=sys.stderr, flush=True)
        rows.append(row)
print(json.dumps(rows))
