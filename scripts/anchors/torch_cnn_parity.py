"""The conv net of `studies/cnn_parity.toml` in PyTorch, trained as
salus-tune trains it, for scripts/cnn-parity.sh: scikit-learn's 8x8 digits
as 1x8x8 images, a stratified 80/20 split by the seed, pixels standardised
with the training split's mean and deviation (one channel), then
conv3x3(16, no bias)-BN-ReLU-maxpool2, conv3x3(32, no bias)-BN-ReLU-maxpool2,
Linear(128, 64)-ReLU, Linear(64, 10); Adam, batch 32, cross-entropy,
PyTorch's default initialisation and batch-norm settings.

    python scripts/anchors/torch_cnn_parity.py --lrs 3e-4,1e-3,3e-3 --seeds 5 --epochs 3

With `--npy IMAGES LABELS` the images come from those files instead (N x 1 x
H x W, and the class of each), as `[data] source = "npy"` with `layout =
"NCHW"` reads them; the head's input grows with H and W (scripts/cnn-parity.sh
with DATA=shapes, on scripts/anchors/make_shapes.py's images).

One JSON line per (lr, seed): the validation accuracy after the last epoch.
"""

import argparse
import json

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

# The same net as bench packing's cnn-digits anchor, from beside this file.
from torch_cnn import net as anchor_net


def net(height, width, classes):
    if (height, width, classes) == (8, 8, 10):
        return anchor_net("cnn-digits")[0]
    # The same layers, the head's input as two 2x2 poolings leave it.
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (height // 4) * (width // 4), 64), nn.ReLU(), nn.Linear(64, classes),
    )


def load(npy):
    if npy is None:
        x, y = load_digits(return_X_y=True)
        return x.reshape(-1, 1, 8, 8), y
    return np.load(npy[0]).astype(np.float64), np.load(npy[1])


def run(lr, seed, epochs, batch, npy):
    x, y = load(npy)
    height, width, classes = x.shape[2], x.shape[3], int(y.max()) + 1
    xt, xv, yt, yv = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    mean, std = xt.mean(), xt.std()
    to = lambda a: torch.tensor((a - mean) / std, dtype=torch.float32).reshape(-1, 1, height, width)
    xt, xv = to(xt), to(xv)
    yt, yv = torch.tensor(yt), torch.tensor(yv)
    torch.manual_seed(seed)
    model = net(height, width, classes)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(yt), generator=g)
        for i in range(0, len(yt), batch):
            idx = order[i:i + batch]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return (model(xv).argmax(1) == yv).float().mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lrs", default="3e-4,1e-3,3e-3")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--npy", nargs=2, metavar=("IMAGES", "LABELS"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    for lr in (float(v) for v in a.lrs.split(",")):
        for seed in range(a.seeds):
            acc = run(lr, seed, a.epochs, a.batch, a.npy)
            print(json.dumps({"side": "pytorch", "lr": lr, "seed": seed, "val_accuracy": acc}), flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
