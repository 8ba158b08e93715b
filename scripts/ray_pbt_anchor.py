"""Ray Tune's PBT on the task of `scripts/bench-pbt-quality.sh`: a NumPy
MLP (2 hidden layers of 64, ReLU, Adam with decoupled weight decay) on
scikit-learn's digits, 12 epochs, a population of 8 exploiting every
epoch (`synch=True`, as salus-tune's population meets), learning rate
and weight decay searched and mutated.

It measures what one exploit costs Ray: the same 8 trials are run under
FIFO (no exploits) and under PBT, synchronous (`synch=True`) and Ray's
default asynchronous one, all checkpointing every epoch as PBT needs; the
extra wall time over the number of exploits (a trial restored from
another trial's checkpoint) is Ray's cost per exploit, and over the number
of restarts (synchronous PBT also pauses and restores every trial at each
point) its cost per restart. The trainable times its own checkpoint
writes and restores too. Writes one JSON object to OUT (Ray prints its own tables on
stdout).

    python scripts/ray_pbt_anchor.py SEEDS OUT

Needs `ray[tune]` and scikit-learn (not installed by the tests: this is an
anchor run by hand, see docs/benchmarks/pbt.md).
"""

import json
import os
import pickle
import random
import statistics
import sys
import tempfile
import time

import numpy as np
from sklearn.datasets import load_digits

EPOCHS = 12
POPULATION = 8
WIDTH = 64
BATCH = 64


def data(seed):
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-8)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    cut = int(len(x) * 0.8)
    tr, va = order[:cut], order[cut:]
    return (x[tr].astype(np.float32), y[tr]), (x[va].astype(np.float32), y[va])


def init(rng):
    sizes = [64, WIDTH, WIDTH, 10]
    params = []
    for a, b in zip(sizes, sizes[1:]):
        bound = 1.0 / np.sqrt(a)
        params.append(rng.uniform(-bound, bound, (a, b)).astype(np.float32))
        params.append(rng.uniform(-bound, bound, b).astype(np.float32))
    return params


def forward(params, x):
    acts = [x]
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i + 2 < len(params):
            h = np.maximum(h, 0)
        acts.append(h)
    return acts


def step(state, x, y, lr, wd):
    params, m, v, t = state["params"], state["m"], state["v"], state["t"] + 1
    acts = forward(params, x)
    logits = acts[-1]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = p
    g[np.arange(len(y)), y] -= 1
    g /= len(y)
    grads = [None] * len(params)
    for i in range(len(params) - 2, -1, -2):
        grads[i] = acts[i // 2].T @ g
        grads[i + 1] = g.sum(0)
        if i > 0:
            g = (g @ params[i].T) * (acts[i // 2] > 0)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for i, gr in enumerate(grads):
        m[i] = b1 * m[i] + (1 - b1) * gr
        v[i] = b2 * v[i] + (1 - b2) * gr * gr
        mh = m[i] / (1 - b1**t)
        vh = v[i] / (1 - b2**t)
        params[i] -= lr * (mh / (np.sqrt(vh) + eps) + wd * params[i])
    state["t"] = t


def trainable(config):
    from ray import tune
    from ray.tune import Checkpoint

    (xt, yt), (xv, yv) = data(config["split_seed"])
    rng = np.random.default_rng(config["seed"])
    state = None
    save_s = restore_s = 0.0
    me = tune.get_context().get_trial_id()
    exploited = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        t0 = time.perf_counter()
        with ckpt.as_directory() as d:
            with open(os.path.join(d, "state.pkl"), "rb") as f:
                state = pickle.load(f)
        restore_s = time.perf_counter() - t0
        # Another trial's checkpoint: an exploit (else a pause and resume).
        exploited = int(state["owner"] != me)
        state["owner"] = me
    if state is None:
        params = init(rng)
        state = {
            "params": params,
            "m": [np.zeros_like(p) for p in params],
            "v": [np.zeros_like(p) for p in params],
            "t": 0,
            "epoch": 0,
            "owner": me,
        }
    while state["epoch"] < EPOCHS:
        order = rng.permutation(len(xt))
        for s in range(0, len(order), BATCH):
            idx = order[s : s + BATCH]
            step(state, xt[idx], yt[idx], config["lr"], config["weight_decay"])
        state["epoch"] += 1
        acc = float((forward(state["params"], xv)[-1].argmax(1) == yv).mean())
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.pkl"), "wb") as f:
                pickle.dump(state, f)
            save_s = time.perf_counter() - t0
            tune.report(
                {
                    "val_accuracy": acc,
                    "save_s": save_s,
                    "restore_s": restore_s,
                    "exploited": exploited,
                },
                checkpoint=Checkpoint.from_directory(d),
            )
        restore_s = 0.0
        exploited = 0


def run(seed, pbt, synch=True):
    import ray
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler, PopulationBasedTraining

    space = {
        "lr": tune.loguniform(1e-4, 1e-1),
        "weight_decay": tune.loguniform(1e-6, 1e-2),
    }
    scheduler = (
        PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            hyperparam_mutations=space,
            quantile_fraction=0.25,
            synch=synch,
        )
        if pbt
        else FIFOScheduler()
    )
    # Ray's PBT draws from Python's `random`.
    random.seed(seed)
    config = dict(space, seed=seed, split_seed=seed)
    storage = tempfile.mkdtemp(prefix="ray-pbt-")
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 2 / POPULATION}),
        param_space=config,
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            scheduler=scheduler,
            num_samples=POPULATION,
        ),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    t0 = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - t0
    frames = [r.metrics_dataframe for r in results if r.metrics_dataframe is not None]
    best = max(float(f["val_accuracy"].max()) for f in frames)
    restores = sum(int((f["restore_s"] > 0).sum()) for f in frames)
    exploits = sum(int(f["exploited"].sum()) for f in frames)
    restore_s = sum(float(f["restore_s"].sum()) for f in frames)
    save_s = [float(x) for f in frames for x in f["save_s"]]
    return {
        "wall_s": wall,
        "best_val_accuracy": best,
        "restores": restores,
        "exploits": exploits,
        "restore_s_total": restore_s,
        "save_s_median": statistics.median(save_s),
    }


def main():
    import ray

    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = {"population": POPULATION, "epochs": EPOCHS, "seeds": []}
    for seed in range(seeds):
        row = {"seed": seed, "fifo": run(seed, pbt=False)}
        for name, synch in [("pbt_synch", True), ("pbt_async", False)]:
            r = run(seed, pbt=True, synch=synch)
            extra = r["wall_s"] - row["fifo"]["wall_s"]
            r["overhead_s"] = extra
            r["overhead_per_exploit_s"] = extra / max(r["exploits"], 1)
            r["overhead_per_restart_s"] = extra / max(r["restores"], 1)
            row[name] = r
        out["seeds"].append(row)
    for name in ["pbt_synch", "pbt_async"]:
        out[name] = {
            k: statistics.median(s[name][k] for s in out["seeds"])
            for k in ["overhead_per_exploit_s", "overhead_per_restart_s", "best_val_accuracy"]
        }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
