"""PyTorch's strongest set-up for K same-shape MLP trials, in a chosen
precision: the anchor for `bench packing --precision` (phase 23 of
scripts/gpu-check.sh).

The workload is bench packing's: 784-h-h-10 MLPs, batch 128, Adam,
cross-entropy. The K trials are fused with torch.func (their parameters
stacked, one vmap'd gradient, one foreach Adam step over the stacks), and
on CUDA the whole iteration is captured once as a CUDA graph and replayed,
which removes PyTorch's per-op host cost.

    --precision fp32   TF32 off
    --precision tf32   TF32 matmuls (torch.backends.cuda.matmul.allow_tf32)
    --precision bf16   autocast to bfloat16: matmuls in bf16 with fp32
                       accumulation, fp32 master weights and Adam state
                       (no loss scaling: bf16 has fp32's exponent range)

One JSON line per (h, K): aggregate TFLOP/s counted as bench packing
counts them (forward and backward: 3 GEMMs per layer), the final mean
loss (so that a broken set-up shows), and the seconds timed.

    python scripts/anchors/torch_mlp_precision.py --precision bf16 --h 256,1024 --k 64
"""

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, IN, OUT = 128, 784, 10


def flops(h):
    return 2.0 * BATCH * (IN * h + h * h + h * OUT) * 3.0


def fused_trials(h, k, device, precision):
    """A function running one training iteration of K trials, and their
    mean loss (a tensor, read after timing)."""
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    torch.manual_seed(0)
    models = [
        nn.Sequential(nn.Linear(IN, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, OUT)).to(device)
        for _ in range(k)
    ]
    params, buffers = stack_module_state(models)
    params = {n: p.detach().clone() for n, p in params.items()}
    base = models[0].to("meta")
    x = torch.randn(k, BATCH, IN, device=device)
    y = torch.randint(0, OUT, (k, BATCH), device=device)
    autocast = precision == "bf16"
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"

    def loss(p, b, xx, yy):
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
            logits = functional_call(base, (p, b), (xx,))
        return F.cross_entropy(logits.float(), yy)

    step_grad = vmap(grad_and_value(loss))
    names = list(params)
    ps = [params[n] for n in names]
    m1 = [torch.zeros_like(p) for p in ps]
    m2 = [torch.zeros_like(p) for p in ps]
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    t = torch.zeros((), device=device)
    last = torch.zeros((), device=device)

    def step():
        g, value = step_grad(dict(zip(names, ps)), buffers, x, y)
        grads = [g[n] for n in names]
        t.add_(1)
        torch._foreach_mul_(m1, b1)
        torch._foreach_add_(m1, grads, alpha=1 - b1)
        torch._foreach_mul_(m2, b2)
        torch._foreach_addcmul_(m2, grads, grads, value=1 - b2)
        c1 = 1 - b1 ** t
        c2 = 1 - b2 ** t
        denom = torch._foreach_sqrt(m2)
        torch._foreach_div_(denom, torch.sqrt(c2))
        torch._foreach_add_(denom, eps)
        upd = torch._foreach_div(m1, denom)
        torch._foreach_mul_(upd, lr / c1)
        torch._foreach_sub_(ps, upd)
        last.copy_(value.mean())

    return step, last


def capture(fn):
    """Warm up on a side stream, then capture one call as a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def measure(h, k, device, precision, seconds, graphs):
    step, last = fused_trials(h, k, device, precision)
    run = capture(step) if graphs else step
    run()
    sync(device)
    # Enough iterations for `seconds`, from one timed probe.
    t0 = time.perf_counter()
    run()
    sync(device)
    probe = max(time.perf_counter() - t0, 1e-6)
    iters = max(2, int(seconds / probe))
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    sync(device)
    s = time.perf_counter() - t0
    return {
        "h": h,
        "k": k,
        "precision": precision,
        "mode": "vmap_graph" if graphs else "vmap",
        "device": str(device),
        "iterations": iters,
        "seconds": s,
        "tflops": flops(h) * k * iters / s / 1e12,
        "loss": float(last.item()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    ap.add_argument("--h", default="256,1024,4096", help="hidden widths, comma-separated")
    ap.add_argument("--k", default="64", help="trial counts, comma-separated")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per cell")
    a = ap.parse_args()
    device = torch.device(a.device)
    if a.precision == "tf32" and device.type != "cuda":
        ap.error("--precision tf32 needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    graphs = device.type == "cuda"
    for h in (int(v) for v in a.h.split(",")):
        for k in (int(v) for v in a.k.split(",")):
            try:
                row = measure(h, k, device, a.precision, a.seconds, graphs)
            except Exception as e:  # one cell's failure (memory, say) is its row
                row = {"h": h, "k": k, "precision": a.precision, "error": f"{type(e).__name__}: {e}"[:300]}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
