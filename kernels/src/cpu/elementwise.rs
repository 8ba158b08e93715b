//! Element-wise and row-wise ops: bias, activations, dropout, gathers.

use super::CpuCtx;
use super::par::{self, MIN_ELEMS_PER_TASK, split_ranges};
use crate::ops::{Activation, Batched, DropoutSlot, dropout_step, word};
use crate::rng;

const GELU_C: f32 = 0.797_884_6; // sqrt(2 / pi)
const GELU_A: f32 = 0.044_715;

/// An activation's arithmetic on one element, as a type, so that each
/// loop over elements is compiled (and vectorised) for one activation:
/// the element-wise ops and pooling's fused activation
/// ([`super::activation_pool`]) share these, so both give the same bits.
pub(super) trait ElementFns {
    /// `act(x)`.
    fn y(x: f32) -> f32;
    /// `act'(x) * dy`, given `y = act(x)`.
    fn dx(x: f32, y: f32, dy: f32) -> f32;
}

/// No activation: what plain pooling's gradient runs through.
pub(super) struct Identity;
pub(super) struct Relu;
pub(super) struct Gelu;
pub(super) struct Tanh;
pub(super) struct Sigmoid;

impl ElementFns for Identity {
    #[inline(always)]
    fn y(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn dx(_: f32, _: f32, dy: f32) -> f32 {
        dy
    }
}

impl ElementFns for Relu {
    #[inline(always)]
    fn y(x: f32) -> f32 {
        x.max(0.0)
    }
    #[inline(always)]
    fn dx(x: f32, _: f32, dy: f32) -> f32 {
        // A select, not a branch, so loops vectorise.
        if x > 0.0 { dy } else { 0.0 }
    }
}

impl ElementFns for Gelu {
    #[inline(always)]
    fn y(x: f32) -> f32 {
        0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
    }
    #[inline(always)]
    fn dx(x: f32, _: f32, dy: f32) -> f32 {
        let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
        (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)) * dy
    }
}

impl ElementFns for Tanh {
    #[inline(always)]
    fn y(x: f32) -> f32 {
        x.tanh()
    }
    #[inline(always)]
    fn dx(_: f32, y: f32, dy: f32) -> f32 {
        (1.0 - y * y) * dy
    }
}

impl ElementFns for Sigmoid {
    #[inline(always)]
    fn y(x: f32) -> f32 {
        1.0 / (1.0 + (-x).exp())
    }
    #[inline(always)]
    fn dx(_: f32, y: f32, dy: f32) -> f32 {
        y * (1.0 - y) * dy
    }
}

/// `$body` with `$A` the [`ElementFns`] type of activation `$act`.
macro_rules! with_element_fns {
    ($act:expr, $A:ident => $body:expr) => {
        match $act {
            $crate::ops::Activation::Relu => {
                type $A = $crate::cpu::elementwise::Relu;
                $body
            }
            $crate::ops::Activation::Gelu => {
                type $A = $crate::cpu::elementwise::Gelu;
                $body
            }
            $crate::ops::Activation::Tanh => {
                type $A = $crate::cpu::elementwise::Tanh;
                $body
            }
            $crate::ops::Activation::Sigmoid => {
                type $A = $crate::cpu::elementwise::Sigmoid;
                $body
            }
        }
    };
}
pub(super) use with_element_fns;

pub(crate) fn activation(ctx: &CpuCtx, act: Activation, x: &[f32], y: &mut [f32]) {
    let segs = par::segments(ctx, 1, x.len(), MIN_ELEMS_PER_TASK);
    let ys = split_ranges(y, segs.iter().map(|s| s.start..s.end));
    par::run(ctx, segs.iter().zip(ys), |(s, y)| {
        let x = &x[s.start..s.end];
        with_element_fns!(act, A => y.iter_mut().zip(x).for_each(|(y, &x)| *y = A::y(x)))
    });
}

pub(crate) fn activation_backward(
    ctx: &CpuCtx,
    act: Activation,
    x: &[f32],
    y: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    let segs = par::segments(ctx, 1, x.len(), MIN_ELEMS_PER_TASK);
    let dxs = split_ranges(dx, segs.iter().map(|s| s.start..s.end));
    par::run(ctx, segs.iter().zip(dxs), |(s, dx)| {
        let r = s.start..s.end;
        let (x, y, dy) = (&x[r.clone()], &y[r.clone()], &dy[r]);
        with_element_fns!(act, A => dx
            .iter_mut()
            .zip(x)
            .zip(y)
            .zip(dy)
            .for_each(|(((dx, &x), &y), &dy)| *dx = A::dx(x, y, dy)))
    });
}

/// The scale dropout applies to element `i` of a slot at `step`: 0 or `1 / (1 - p)`.
#[inline(always)]
pub(crate) fn dropout_scale(d: &DropoutSlot, step: u64, i: usize) -> f32 {
    if d.p <= 0.0 {
        1.0
    } else if rng::uniform(d.seed, step, i as u64) < d.p {
        0.0
    } else {
        1.0 / (1.0 - d.p)
    }
}

/// `y = x * mask`; the same function serves forward (x) and backward (dy).
/// `steps` are the step block's words of each slot's step.
pub(crate) fn dropout(
    ctx: &CpuCtx,
    per_slot: usize,
    slots: &[DropoutSlot],
    steps: &[f32],
    x: &[f32],
    y: &mut [f32],
) {
    let segs = par::segments(ctx, slots.len(), per_slot, MIN_ELEMS_PER_TASK);
    let at = |s: &par::Segment| s.slot * per_slot + s.start..s.slot * per_slot + s.end;
    let ys = split_ranges(y, segs.iter().map(at));
    par::run(ctx, segs.iter().zip(ys), |(s, y)| {
        let d = &slots[s.slot];
        let step = dropout_step(steps, s.slot);
        let x = &x[at(s)];
        match (d.p <= 0.0, d.rows.is_some()) {
            (true, false) => y.copy_from_slice(x),
            (false, false) => {
                for (j, (y, &x)) in y.iter_mut().zip(x).enumerate() {
                    *y = x * dropout_scale(d, step, s.start + j);
                }
            }
            // Padded rows: each element's mask is its own row's, and the
            // padding is 0.
            _ => {
                for (j, (y, &x)) in y.iter_mut().zip(x).enumerate() {
                    *y = match d.mask_index(s.start + j) {
                        Some(i) => x * dropout_scale(d, step, i),
                        None => 0.0,
                    };
                }
            }
        }
    });
}

pub(crate) fn bias_add(
    ctx: &CpuCtx,
    shape: Batched,
    bias_stride: usize,
    x: &mut [f32],
    bias: &[f32],
) {
    let segs = par::segments(
        ctx,
        shape.slots,
        shape.rows,
        MIN_ELEMS_PER_TASK / shape.cols.max(1),
    );
    // Each task owns rows start..end of its slot.
    let rows = |s: &par::Segment| {
        let base = s.slot * shape.per_slot();
        base + s.start * shape.cols..base + s.end * shape.cols
    };
    let xs = split_ranges(x, segs.iter().map(rows));
    par::run(ctx, segs.iter().zip(xs), |(s, x)| {
        let b = &bias[s.slot * bias_stride..s.slot * bias_stride + shape.cols];
        for row in x.chunks_exact_mut(shape.cols) {
            row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
        }
    });
}

pub(crate) fn col_sum(ctx: &CpuCtx, shape: Batched, db_stride: usize, dy: &[f32], db: &mut [f32]) {
    // Tasks own column ranges, so the reduction over rows needs no merge.
    let min_cols = (MIN_ELEMS_PER_TASK / shape.rows.max(1)).max(16);
    let segs = par::segments(ctx, shape.slots, shape.cols, min_cols);
    let cols = |s: &par::Segment| s.slot * db_stride + s.start..s.slot * db_stride + s.end;
    let accs = split_ranges(db, segs.iter().map(cols));
    par::run(ctx, segs.iter().zip(accs), |(s, acc)| {
        acc.fill(0.0);
        let base = s.slot * shape.per_slot();
        for r in 0..shape.rows {
            let row = &dy[base + r * shape.cols + s.start..base + r * shape.cols + s.end];
            acc.iter_mut().zip(row).for_each(|(a, d)| *a += d);
        }
    });
}

/// `dst` row `i` = `src` row `idx[i]` (step-block words), or zeros where
/// that row lies past the end of `src`.
pub(crate) fn gather_rows(ctx: &CpuCtx, cols: usize, idx: &[f32], src: &[f32], dst: &mut [f32]) {
    let src_rows = src.len() / cols;
    let segs = par::segments(ctx, 1, idx.len(), MIN_ELEMS_PER_TASK / cols.max(1));
    // Each task owns destination rows start..end.
    let dsts = split_ranges(dst, segs.iter().map(|s| s.start * cols..s.end * cols));
    par::run(ctx, segs.iter().zip(dsts), |(s, dst)| {
        for (&w, d) in idx[s.start..s.end].iter().zip(dst.chunks_exact_mut(cols)) {
            let r = word(w) as usize;
            if r < src_rows {
                d.copy_from_slice(&src[r * cols..(r + 1) * cols]);
            } else {
                d.fill(0.0);
            }
        }
    });
}
