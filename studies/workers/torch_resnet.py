"""A small ResNet on CIFAR-shaped images, tuned by salus-tune
(studies/external_torch_resnet.toml) and, for the comparison, by Optuna
itself (scripts/anchors/optuna_torch.py), which imports the same model,
data and epoch from here.

The images are 3x32x32, ten classes, each a fixed random template plus
noise: learnable, seeded, and with nothing to download. One iteration is
one epoch. One trial of this net cannot fill an H200, which is the case
packing is for.
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def images(n, seed=0):
    """`n` labelled images: seven eighths to train on, the rest to validate."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = templates[y] + 1.5 * torch.randn(n, 3, 32, 32, generator=g)
    cut = n * 7 // 8
    return x[:cut], y[:cut], x[cut:], y[cut:]


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        return F.relu(out + (x if self.skip is None else self.skip(x)))


def resnet(width):
    """Three stages of one residual block (width, 2x, 4x), then pooling."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        Block(width, width, 1), Block(width, 2 * width, 2), Block(2 * width, 4 * width, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10),
    )


def epoch(model, opt, x, y, batch, seed):
    """One epoch in a seeded order."""
    model.train()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)).to(x.device)
    for i in range(0, len(y), batch):
        idx = order[i:i + batch]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = model(x)
        return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def build(params, device, number):
    torch.manual_seed(number)
    model = resnet(int(params["width"])).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=float(params["lr"]), momentum=0.9, nesterov=True)
    return model, opt


def run(trial):
    """One trial: `epochs` iterations, a report after each."""
    p = trial.params
    xt, yt, xv, yv = data(int(p.get("images", 2048)), trial.device)
    model, opt = build(p, trial.device, trial.number)
    trial.track(model, opt)
    loss = float("nan")
    for e in trial.iterations(int(p.get("epochs", 3))):
        epoch(model, opt, xt, yt, int(p.get("batch", 128)), 1000 * trial.number + e)
        loss, accuracy = evaluate(model, xv, yv)
        trial.report(e + 1, loss, val_accuracy=accuracy)
    return loss


_data = {}


def data(n, device):
    """The images on `device`, made once per process."""
    if (n, device) not in _data:
        _data[(n, device)] = tuple(t.to(device) for t in images(n))
    return _data[(n, device)]


if __name__ == "__main__":
    import salus_worker

    torch.set_num_threads(int(os.environ.get("SALUS_TORCH_THREADS", "1")))
    # One process serves trial after trial: torch's import, the CUDA
    # context and cuDNN's warm-up are paid once, not once per trial.
    salus_worker.serve_trials(run)
