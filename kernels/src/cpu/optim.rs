//! Optimizer updates over slots of parameters, in PyTorch's semantics.

use super::CpuCtx;
use super::par::{self, MIN_ELEMS_PER_TASK, split_ranges};
use crate::ops::{ADAM_STEP_WORDS, AdamSlot, SgdSlot, Slots};

pub(crate) fn sgd(
    ctx: &CpuCtx,
    n: usize,
    slots: &[SgdSlot],
    params: &mut [f32],
    grads: &[f32],
    velocity: Option<&mut [f32]>,
) {
    let segs = par::segments(ctx, slots.len(), n, MIN_ELEMS_PER_TASK);
    let at = |s: &par::Segment| s.slot * n + s.start..s.slot * n + s.end;
    let ps = split_ranges(params, segs.iter().map(at));
    // With no velocity, every task gets `None`.
    let mut vs = velocity.map(|v| split_ranges(v, segs.iter().map(at)));
    let vs = std::iter::from_fn(move || Some(vs.as_mut().and_then(|v| v.next())));
    let tasks = segs.iter().zip(ps).zip(vs);
    par::run(ctx, tasks, |((s, p), v)| {
        let h = slots[s.slot];
        let g = &grads[at(s)];
        match v {
            Some(v) if h.momentum != 0.0 => {
                // Nesterov steps along gi + momentum * v; plain momentum along v.
                let pv = p.iter_mut().zip(v.iter_mut()).zip(g);
                if h.nesterov {
                    for ((p, v), &g) in pv {
                        let gi = g + h.weight_decay * *p;
                        *v = h.momentum * *v + gi;
                        *p -= h.lr * (gi + h.momentum * *v);
                    }
                } else {
                    for ((p, v), &g) in pv {
                        *v = h.momentum * *v + g + h.weight_decay * *p;
                        *p -= h.lr * *v;
                    }
                }
            }
            _ => {
                for (p, &g) in p.iter_mut().zip(g) {
                    *p -= h.lr * (g + h.weight_decay * *p);
                }
            }
        }
    });
}

pub(crate) fn adam(
    ctx: &CpuCtx,
    slots: Slots<'_, AdamSlot>,
    scalars: &[f32],
    params: &mut [f32],
    grads: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let (n, slots) = (slots.n, slots.settings);
    let segs = par::segments(ctx, slots.len(), n, MIN_ELEMS_PER_TASK);
    let at = |s: &par::Segment| s.slot * n + s.start..s.slot * n + s.end;
    let (ps, ms, vs) = (
        split_ranges(params, segs.iter().map(at)),
        split_ranges(m, segs.iter().map(at)),
        split_ranges(v, segs.iter().map(at)),
    );
    let tasks = segs.iter().zip(ps).zip(ms).zip(vs);
    par::run(ctx, tasks, |(((s, p), m), v)| {
        let h = slots[s.slot];
        // This step's bias corrections, from the step block.
        let k = s.slot * ADAM_STEP_WORDS;
        let (step_size, inv_sqrt_bc2) = (scalars[k], scalars[k + 1]);
        let decay = if h.decoupled {
            1.0 - h.lr * h.weight_decay
        } else {
            1.0
        };
        let l2 = if h.decoupled { 0.0 } else { h.weight_decay };
        let g = &grads[at(s)];
        for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
            let gi = g + l2 * *p;
            *m = h.beta1 * *m + (1.0 - h.beta1) * gi;
            *v = h.beta2 * *v + (1.0 - h.beta2) * gi * gi;
            let denom = v.sqrt() * inv_sqrt_bc2 + h.eps;
            *p = *p * decay - step_size * *m / denom;
        }
    });
}
