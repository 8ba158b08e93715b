"""A PyTorch training script tuned by salus-tune (studies/external_torch.toml).

An MLP learns scikit-learn's handwritten digits (8x8 images, shipped with
scikit-learn) with Adam; it reports the validation loss and accuracy every
epoch. `trial.track` hands the model and optimizer to salus-tune: their
memory is measured, and a paused trial is swapped to host memory and back
inside this process. On a GPU the script says only "cuda"; salus-tune
chooses which one and caps its memory.

Deterministic: each epoch shuffles with a generator seeded by the trial and
the epoch, so a swapped trial's curve is the unswapped one's, float for
float. In a PBT study it takes another member's state in process
(`on_exploit`), or with SALUS_EXPLOIT=restart by a restart from that
member's checkpoint.
"""

import gzip
import importlib.util
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import salus_worker


def load_digits():
    """scikit-learn's digits (1,797 8x8 images and their labels), read from
    the file scikit-learn ships: finding it without importing scikit-learn
    saves each trial's process about a second."""
    package = os.path.dirname(importlib.util.find_spec("sklearn").origin)
    with gzip.open(os.path.join(package, "datasets", "data", "digits.csv.gz")) as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1], table[:, -1].astype(np.int64)


trial = salus_worker.connect()
p = trial.params
device = trial.device  # "cuda" or "cpu", as salus-tune placed the trial
torch.manual_seed(trial.number)
# One intra-op thread per trial: salus-tune runs trials side by side.
torch.set_num_threads(int(os.environ.get("SALUS_TORCH_THREADS", "1")))

images, labels = load_digits()
X = torch.from_numpy(images / 16.0)
y = torch.from_numpy(labels)
order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
train, val = order[:1437], order[1437:]
Xt, yt, Xv, yv = X[train].to(device), y[train].to(device), X[val].to(device), y[val].to(device)

hidden = int(p.get("hidden", 128))
model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=float(p["lr"]))
start = 0
# After a restart (see on_checkpoint). To the host first: loaded straight
# to the GPU, the state would be there twice, past the trial's grant.
state = trial.load_checkpoint(lambda path: torch.load(path, map_location="cpu"))
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["epoch"]
    # The checkpoint may be another PBT member's: the params are this one's.
    for group in opt.param_groups:
        group["lr"] = float(p["lr"])
trial.track(model, opt)
epoch = start


def save(path):
    # Used only when salus-tune swaps out through a checkpoint (a client
    # that tracks nothing, or an older salus-tune).
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, path)


trial.on_checkpoint(save)


def take(path, params):
    """PBT: go on from another member's checkpoint with new values, in
    process (without this, salus-tune restarts the script from it)."""
    global epoch
    donor = torch.load(path, map_location="cpu")
    model.load_state_dict(donor["model"])
    opt.load_state_dict(donor["opt"])
    for group in opt.param_groups:
        group["lr"] = float(params["lr"])
    epoch = donor["epoch"]


if os.environ.get("SALUS_EXPLOIT") != "restart":
    trial.on_exploit(take)

batch = int(p.get("batch", 64))
loss = float("nan")
for epoch in trial.iterations(int(p.get("epochs", 10)), start=start):
    shuffle = torch.randperm(len(yt), generator=torch.Generator().manual_seed(1000 * trial.number + epoch))
    model.train()
    for i in range(0, len(yt), batch):
        idx = shuffle[i:i + batch].to(device)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(Xt[idx]), yt[idx]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(Xv)
        loss = F.cross_entropy(logits, yv).item()
        accuracy = (logits.argmax(1) == yv).float().mean().item()
    epoch += 1
    trial.report(epoch, loss, val_accuracy=accuracy)
trial.done(loss)
