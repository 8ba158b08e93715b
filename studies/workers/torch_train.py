"""A PyTorch training script tuned by salus-tune on a GPU (see
studies/external_torch.toml). Not run in CI: it needs torch and a device.

Many of these processes share one GPU: each asks salus-tune before every
epoch, so only as many run at once as the study has lanes, and each
declares its memory ([worker] memory) for salus-tune's ledger.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import salus_worker

trial = salus_worker.connect()
p = trial.params
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(trial.number)

g = torch.Generator().manual_seed(0)
X = torch.randn(8192, 784, generator=g)
y = torch.randint(0, 10, (8192,), generator=g)
Xv, yv = X[-1024:].to(device), y[-1024:].to(device)
X, y = X[:-1024].to(device), y[:-1024].to(device)

model = nn.Sequential(nn.Linear(784, p["hidden"]), nn.ReLU(), nn.Linear(p["hidden"], 10)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=p["lr"])
start = 0
state = trial.load_checkpoint()
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["epoch"]


def save(path):
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1}, path)


trial.on_checkpoint(save)
trial.load_checkpoint = lambda: torch.load(trial.resume_from) if trial.resume_from else None

loss = float("nan")
for epoch in trial.iterations(int(p.get("epochs", 10)), start=start):
    for i in range(0, len(y), 256):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(X[i:i + 256]), y[i:i + 256]).backward()
        opt.step()
    with torch.no_grad():
        loss = F.cross_entropy(model(Xv), yv).item()
    trial.report(epoch + 1, loss)
trial.done(loss)
