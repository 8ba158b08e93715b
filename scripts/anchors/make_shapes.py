"""Image data of our own for the conv-net parity check (scripts/cnn-parity.sh
with DATA=shapes): grayscale 16x16 images of six shapes (filled square,
hollow square, filled disc, ring, plus, diagonal cross), each at a random
place and size, a random brightness, on Gaussian noise. Deterministic for a
seed; written as `shapes-images.npy` (N x 1 x 16 x 16, float32, NCHW) and
`shapes-labels.npy` (N, int64) in OUTDIR.

    python scripts/anchors/make_shapes.py OUTDIR [--n 4000] [--seed 0] [--noise 0.3]
"""

import argparse
import os

import numpy as np

SIZE = 16
CLASSES = 6


def shape(kind, rng):
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    r = rng.uniform(3.0, 6.0)
    cy, cx = rng.uniform(r, SIZE - 1 - r, size=2)
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    d = np.hypot(yy - cy, xx - cx)
    if kind == 0:  # filled square
        m = (dy <= r) & (dx <= r)
    elif kind == 1:  # hollow square
        m = (dy <= r) & (dx <= r) & ((dy >= r - 1.2) | (dx >= r - 1.2))
    elif kind == 2:  # filled disc
        m = d <= r
    elif kind == 3:  # ring
        m = (d <= r) & (d >= r - 1.4)
    elif kind == 4:  # plus
        m = ((dy <= 0.8) & (dx <= r)) | ((dx <= 0.8) & (dy <= r))
    else:  # diagonal cross
        u, v = (yy - cy + xx - cx) / np.sqrt(2), (yy - cy - xx + cx) / np.sqrt(2)
        m = ((np.abs(u) <= 0.8) & (np.abs(v) <= r)) | ((np.abs(v) <= 0.8) & (np.abs(u) <= r))
    return m.astype(np.float32) * rng.uniform(0.5, 1.0)


def make(n, seed, noise):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % CLASSES
    rng.shuffle(labels)
    images = np.stack([shape(k, rng) for k in labels])
    images += rng.normal(0.0, noise, size=images.shape).astype(np.float32)
    return images.reshape(n, 1, SIZE, SIZE).astype(np.float32), labels.astype(np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", type=float, default=0.3)
    a = ap.parse_args()
    images, labels = make(a.n, a.seed, a.noise)
    os.makedirs(a.outdir, exist_ok=True)
    np.save(os.path.join(a.outdir, "shapes-images.npy"), images)
    np.save(os.path.join(a.outdir, "shapes-labels.npy"), labels)


if __name__ == "__main__":
    main()
