"""Optuna tuning the same PyTorch trials as studies/external_torch_resnet.toml
(the model, data and epochs of studies/workers/torch_resnet.py), for
scripts/torch-study-bench.sh: N trials with TPE, one at a time or with
`n_jobs` threads on the same device. Prints one JSON line: trials, seconds,
trials per hour, the best value.

    python scripts/anchors/optuna_torch.py --trials 16 --jobs 1 --device cuda
"""

import argparse
import json
import os
import sys
import time

import optuna
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "studies", "workers"))
import torch_resnet as net  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    xt, yt, xv, yv = (t.to(a.device) for t in net.images(a.images))

    def objective(trial):
        params = {
            "lr": trial.suggest_float("lr", 1e-3, 1e-1, log=True),
            "width": trial.suggest_categorical("width", [16, 32]),
        }
        model, opt = net.build(params, a.device, trial.number)
        loss = float("nan")
        for e in range(a.epochs):
            net.epoch(model, opt, xt, yt, a.batch, 1000 * trial.number + e)
            loss, _ = net.evaluate(model, xv, yv)
            trial.report(loss, e + 1)
        return loss

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    start = time.perf_counter()
    study.optimize(objective, n_trials=a.trials, n_jobs=a.jobs)
    seconds = time.perf_counter() - start
    print(json.dumps({
        "mode": f"optuna-jobs{a.jobs}",
        "trials": a.trials,
        "seconds": seconds,
        "trials_per_hour": 3600 * a.trials / seconds,
        "best": study.best_value,
    }))


if __name__ == "__main__":
    main()
