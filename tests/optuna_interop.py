"""Checks a salus-tune database through Optuna itself.

Usage: optuna_interop.py DB STUDY_NAME OURS_TRIALS_JSON OURS_BEST_JSON N_TRIALS

DB is a SQLite file, or a SQLAlchemy URL (postgresql+psycopg2://...).
Exits non-zero, with a message, on the first disagreement.
"""
import json
import os
import pathlib
import subprocess
import sys

import optuna

db, name, trials_path, best_path, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
url = db if "://" in db else f"sqlite:///{db}"
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name=name, storage=url)
ours = json.load(open(trials_path))
best = json.load(open(best_path))

assert len(study.trials) == n, f"Optuna sees {len(study.trials)} trials, expected {n}"
assert [t.number for t in study.trials] == [t["number"] for t in ours]
for t, o in zip(study.trials, ours):
    assert t.state.name == o["state"], (t.number, t.state, o["state"])
    assert t.params == o["params"], (t.number, t.params, o["params"])
    assert t.value == o["value"], (t.number, t.value, o["value"])
    steps = {int(s): v for s, v in o["intermediate_values"]}
    assert t.intermediate_values == steps, (t.number, t.intermediate_values, steps)
    assert t.datetime_start is not None and t.datetime_complete is not None

assert study.best_trial.number == best["number"], (study.best_trial.number, best["number"])
assert study.best_trial.params == best["params"], (study.best_trial.params, best["params"])
assert study.best_value == best["value"]

df = study.trials_dataframe()
assert len(df) == n
for p in study.best_trial.params:
    assert f"params_{p}" in df.columns, (p, list(df.columns))

cli = subprocess.run(
    [str(pathlib.Path(sys.executable).parent / "optuna"), "trials", "--storage", url, "--study-name", name, "-f", "json"],
    capture_output=True, text=True, check=True,
)
rows = json.loads(cli.stdout)
assert len(rows) == n, cli.stdout
print(f"optuna {optuna.__version__} reads all {n} trials, their params, values and intermediate values; best trial {best['number']} agrees")

# optuna-dashboard's own API reads the study too (scripts/test.sh installs it).
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from optuna_dashboard_api import study_detail  # noqa: E402

served = study_detail(url, name)
if served is not None:
    detail, version = served
    assert len(detail["trials"]) == n, len(detail["trials"])
    shown = {p["name"]: p["param_external_value"] for p in detail["trials"][0]["params"]}
    assert shown == {k: str(v) for k, v in study.trials[0].params.items()}, (shown, study.trials[0].params)
    print(f"optuna-dashboard {version} shows all {n} trials")
