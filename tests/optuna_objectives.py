"""Checks a salus-tune study of several objectives through Optuna itself.

Usage: optuna_objectives.py DB STUDY_NAME OURS_FRONT_JSON N_TRIALS

DB is a SQLite file, or a SQLAlchemy URL (postgresql+psycopg2://...).
Exits non-zero, with a message, on the first disagreement.
"""
import json
import os
import sys

import optuna

db, name, front_path, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
url = db if "://" in db else f"sqlite:///{db}"
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name=name, storage=url)
front = json.load(open(front_path))

assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"], study.directions
assert study.metric_names == ["val_accuracy", "params"], study.metric_names
assert len(study.trials) == n, f"Optuna sees {len(study.trials)} trials, expected {n}"
for t in study.trials:
    if t.state == optuna.trial.TrialState.COMPLETE:
        assert len(t.values) == 2 and all(v is not None for v in t.values), (t.number, t.values)
ours = sorted(t["number"] for t in front)
theirs = sorted(t.number for t in study.best_trials)
assert ours == theirs, f"our front {ours}, Optuna's best_trials {theirs}"
by_number = {t["number"]: t for t in front}
for t in study.best_trials:
    assert t.values == by_number[t.number]["values"], (t.number, t.values, by_number[t.number])
    assert t.params == by_number[t.number]["params"], (t.number, t.params)

df = study.trials_dataframe()
assert len(df) == n
for column in ("values_val_accuracy", "values_params"):
    assert column in df.columns, (column, list(df.columns))
print(f"optuna {optuna.__version__} reads both objectives of all {n} trials; its best_trials are our front {ours}")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optuna_dashboard_api import study_detail  # noqa: E402

served = study_detail(url, name)
if served is not None:
    detail, version = served
    shown = sorted(t["number"] for t in detail["best_trials"])
    # optuna-dashboard draws the front of every COMPLETE trial, feasible or
    # not: in a constrained study that is Optuna's front without constraints.
    from optuna.study._multi_objective import _get_pareto_front_trials_by_trials
    unconstrained = sorted(t.number for t in _get_pareto_front_trials_by_trials(study.trials, study.directions))
    assert shown == unconstrained, f"optuna-dashboard's Pareto front {shown}, Optuna's {unconstrained}"
    same = "the same front" if shown == ours else f"its own front {shown} (it ignores constraints)"
    print(f"optuna-dashboard {version} draws {same}")
