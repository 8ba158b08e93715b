"""PyTorch anchor for the conv-net cells of `salus-tune bench packing`.

Trains K copies of the same network one after another, as a user without
salus-tune would: PyTorch on the CPU, the given threads, Adam (lr 1e-3),
cross-entropy, a fixed batch size, each trial for the same iterations.
The networks mirror the bench's (orchestrator/src/bench/packing.rs):

  cnn-digits  1x8x8:  conv3x3(16, no bias)-BN-ReLU-maxpool2,
                      conv3x3(32, no bias)-BN-ReLU-maxpool2, flatten (128),
                      Linear(128, 64)-ReLU, Linear(64, 10)
  cnn-32      3x32x32 (cuda-convnet): conv5x5(32)-ReLU-maxpool2,
                      conv5x5(32)-ReLU-maxpool2, conv5x5(64)-ReLU-maxpool2,
                      flatten (1024), Linear(1024, 10)

Usage: torch_cnn.py WORKLOAD K ITERATIONS BATCH THREADS [DEVICE]
DEVICE is cpu (the default) or cuda; on cuda the clock stops after a
synchronize. Prints one JSON object: seconds for all K trials and images per second.
A short untimed warm-up trial runs first (PyTorch's first calls allocate
and pick kernels).
"""

import json
import sys
import time

import torch
from torch import nn


def net(workload):
    if workload == "cnn-digits":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10),
        ), (1, 8, 8)
    if workload == "cnn-32":
        return nn.Sequential(
            nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(1024, 10),
        ), (3, 32, 32)
    raise SystemExit(f"unknown workload {workload}")


def trial(workload, iterations, batch, seed, device):
    torch.manual_seed(seed)
    model, shape = net(workload)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = batch + batch // 2
    x = torch.randn(rows, *shape, device=device)
    y = torch.randint(0, 10, (rows,), device=device)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(iterations):
        idx = torch.randperm(rows, device=device)[:batch]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()


def main():
    workload, k, iterations, batch, threads = sys.argv[1], *map(int, sys.argv[2:6])
    device = sys.argv[6] if len(sys.argv) > 6 else "cpu"
    torch.set_num_threads(threads)
    trial(workload, min(iterations, 5), batch, 12345, device)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for s in range(k):
        trial(workload, iterations, batch, s, device)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "workload": workload,
        "k": k,
        "iterations": iterations,
        "batch": batch,
        "threads": threads,
        "device": device,
        "seconds": seconds,
        "images_per_s": k * iterations * batch / seconds,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
