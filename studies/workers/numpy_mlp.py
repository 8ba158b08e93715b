"""A NumPy training script tuned by salus-tune (see studies/external_numpy.toml).

A one-hidden-layer MLP with softmax cross-entropy, trained by plain SGD with
momentum on a seeded synthetic data set; it reports the validation loss
every epoch and can be checkpointed and resumed. In a PBT study it takes
another member's state in process (`on_exploit`), or with
SALUS_EXPLOIT=restart by a restart from that member's checkpoint.
"""

import os
import pickle
import sys
import time

import numpy as np

import salus_worker

trial = salus_worker.connect()
p = trial.params
epochs = int(p.get("epochs", 20))
rng = np.random.default_rng(int(p.get("seed", 0)))

# Data: three Gaussian blobs in 10 dimensions.
centers = rng.normal(0, 2.0, size=(3, 10))
X = np.concatenate([c + rng.normal(0, 1.5, size=(400, 10)) for c in centers]).astype(np.float32)
y = np.repeat(np.arange(3), 400)
order = rng.permutation(len(y))
X, y = X[order], y[order]
Xt, yt, Xv, yv = X[:900], y[:900], X[900:], y[900:]

state = trial.load_checkpoint()
if state is None:
    h = int(p.get("hidden", 32))
    init = np.random.default_rng(trial.number)
    state = {
        "epoch": 0,
        "W1": init.normal(0, 1 / np.sqrt(10), (10, h)), "b1": np.zeros(h),
        "W2": init.normal(0, 1 / np.sqrt(h), (h, 3)), "b2": np.zeros(3),
        "v": None,
    }
trial.on_checkpoint(lambda path: trial.save_checkpoint(state, path))


def forward(X, s):
    a = np.maximum(X @ s["W1"] + s["b1"], 0)
    z = a @ s["W2"] + s["b2"]
    z = z - z.max(axis=1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return a, prob


def val_loss(s):
    _, prob = forward(Xv, s)
    return float(-np.log(prob[np.arange(len(yv)), yv] + 1e-12).mean())


lr, momentum, batch = float(p["lr"]), float(p.get("momentum", 0.9)), 64


def take(path, params):
    """PBT: go on from another member's state with new values, in process."""
    global lr, momentum
    with open(path, "rb") as f:
        saved = pickle.load(f)
    state.clear()
    state.update(saved)
    lr, momentum = float(params["lr"]), float(params.get("momentum", 0.9))


# (An older client, without PBT, has no on_exploit.)
if os.environ.get("SALUS_EXPLOIT") != "restart" and hasattr(trial, "on_exploit"):
    trial.on_exploit(take)
log = os.environ.get("SALUS_TEST_LOG")
loss = val_loss(state)
for epoch in trial.iterations(epochs, start=state["epoch"]):
    t0 = time.time()
    perm = np.random.default_rng(epoch * 1000 + trial.number).permutation(len(yt))
    for i in range(0, len(yt) - batch + 1, batch):
        idx = perm[i:i + batch]
        a, prob = forward(Xt[idx], state)
        d = prob.copy()
        d[np.arange(batch), yt[idx]] -= 1
        d /= batch
        grads = {"W2": a.T @ d, "b2": d.sum(0)}
        da = (d @ state["W2"].T) * (a > 0)
        grads["W1"], grads["b1"] = Xt[idx].T @ da, da.sum(0)
        if state["v"] is None:
            state["v"] = {k: np.zeros_like(g) for k, g in grads.items()}
        for k, g in grads.items():
            state["v"][k] = momentum * state["v"][k] + g
            state[k] = state[k] - lr * state["v"][k]
    state["epoch"] = epoch + 1
    loss = val_loss(state)
    if log:
        with open(log, "a") as f:
            f.write(f"{trial.number} {t0:.6f} {time.time():.6f}\n")
    if (epoch + 1) % trial.report_every == 0:
        trial.report(epoch + 1, loss)
trial.done(loss)
