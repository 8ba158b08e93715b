"""An Optuna process that holds one RUNNING trial of a salus-tune study, as
`study.ask()` leaves it, for `tests/it/optuna_interop.rs`.

Usage: optuna_holder.py STORAGE STUDY HEARTBEAT TELL_FILE

HEARTBEAT 0: no heartbeat (Optuna's default). Otherwise Optuna's
RDBStorage heartbeat, recorded every HEARTBEAT seconds. Prints "asked N"
once the trial exists (and has its first heartbeat), then tells it (value
0.5) when TELL_FILE appears.
"""
import os
import sys
import time

import optuna

url, name, beat, tell = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = optuna.storages.RDBStorage(url, heartbeat_interval=beat or None)
study = optuna.load_study(study_name=name, storage=storage)
trial = study.ask()
trial.suggest_categorical("width", [16, 32])
trial.suggest_categorical("optimizer", ["sgd", "adam"])
trial.suggest_float("lr", 1e-3, 1e-1, log=True)
if beat:
    storage.record_heartbeat(trial._trial_id)
print("asked", trial.number, flush=True)
while not os.path.exists(tell):
    if beat:
        storage.record_heartbeat(trial._trial_id)
    time.sleep(beat or 0.2)
study.tell(trial, 0.5)
