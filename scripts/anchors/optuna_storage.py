"""Optuna's side of `salus-tune bench storage`: P processes on one study in
the same PostgreSQL, each with Optuna's default sampler and a trivial
objective, so that the storage and its coordination are what is measured.

Usage (the storage URL in $SALUS_TUNE_OPTUNA_URL, so that `ps` does not
show its password):
  optuna_storage.py create STUDY SEED
  optuna_storage.py work STUDY SEED INDEX TARGET GO_FILE

`create` makes the study once (processes that all create it at once race,
Optuna's issue #1092). Each `work` process imports Optuna and connects,
prints "ready", waits for GO_FILE, then runs trials until the study has
TARGET finished trials (Optuna's MaxTrialsCallback), as users run Optuna
in parallel.
"""
import os
import sys
import time

import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

optuna.logging.set_verbosity(optuna.logging.WARNING)
mode, name, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
url = os.environ["SALUS_TUNE_OPTUNA_URL"]

if mode == "create":
    optuna.create_study(storage=url, study_name=name, direction="minimize")
    sys.exit(0)

index, target, go = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
study = optuna.load_study(
    storage=url, study_name=name, sampler=optuna.samplers.TPESampler(seed=seed + index)
)


def objective(trial):
    # The same space as salus-tune's side: an int and a log-scaled float.
    width = trial.suggest_int("width", 2, 8)
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    return (lr - 0.01) ** 2 + width * 1e-3


print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
study.optimize(
    objective,
    callbacks=[MaxTrialsCallback(target, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))],
)
