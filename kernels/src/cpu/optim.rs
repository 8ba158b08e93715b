//! Optimizer updates over slots of parameters, in PyTorch's semantics.

use super::CpuCtx;
use super::par::{self, MIN_ELEMS_PER_TASK, SyncPtr};
use crate::ops::{AdamSlot, SgdSlot};

pub(crate) fn sgd(ctx: &CpuCtx, n: usize, slots: &[SgdSlot], params: &mut [f32], grads: &[f32], velocity: Option<&mut [f32]>) {
    let p_out = SyncPtr::new(params);
    let v_out = velocity.map(SyncPtr::new);
    let segs = par::segments(ctx, slots.len(), n, MIN_ELEMS_PER_TASK);
    par::run(ctx, &segs, |s| {
        let h = slots[s.slot];
        let off = s.slot * n + s.start;
        let len = s.end - s.start;
        // SAFETY: segments are disjoint and inside every buffer.
        let p = unsafe { p_out.slice(off, len) };
        let g = &grads[off..off + len];
        match v_out {
            Some(v_out) if h.momentum != 0.0 => {
                let v = unsafe { v_out.slice(off, len) };
                for i in 0..len {
                    let gi = g[i] + h.weight_decay * p[i];
                    v[i] = h.momentum * v[i] + gi;
                    let step = if h.nesterov { gi + h.momentum * v[i] } else { v[i] };
                    p[i] -= h.lr * step;
                }
            }
            _ => {
                for i in 0..len {
                    p[i] -= h.lr * (g[i] + h.weight_decay * p[i]);
                }
            }
        }
    });
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn adam(ctx: &CpuCtx, n: usize, slots: &[AdamSlot], params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32]) {
    let (p_out, m_out, v_out) = (SyncPtr::new(params), SyncPtr::new(m), SyncPtr::new(v));
    let segs = par::segments(ctx, slots.len(), n, MIN_ELEMS_PER_TASK);
    par::run(ctx, &segs, |s| {
        let h = slots[s.slot];
        let (bc1, bc2) = h.bias_corrections();
        let step_size = (h.lr as f64 / bc1) as f32;
        let inv_sqrt_bc2 = (1.0 / bc2.sqrt()) as f32;
        let decay = if h.decoupled { 1.0 - h.lr * h.weight_decay } else { 1.0 };
        let l2 = if h.decoupled { 0.0 } else { h.weight_decay };
        let off = s.slot * n + s.start;
        let len = s.end - s.start;
        // SAFETY: segments are disjoint and inside every buffer.
        let (p, m, v) = unsafe { (p_out.slice(off, len), m_out.slice(off, len), v_out.slice(off, len)) };
        let g = &grads[off..off + len];
        for i in 0..len {
            let gi = g[i] + l2 * p[i];
            m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * gi;
            v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * gi * gi;
            let denom = v[i].sqrt() * inv_sqrt_bc2 + h.eps;
            p[i] = p[i] * decay - step_size * m[i] / denom;
        }
    });
}
