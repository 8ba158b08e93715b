//! Losses with their gradients and running statistics, one task per slot.

use super::CpuCtx;
use super::par::{self, split_ranges};
use crate::ops::{Batched, Loss, STATS_LEN};

/// One task per slot: the slot, its gradient rows (when wanted) and its
/// statistics, each owned by the task.
fn slot_tasks<'a>(
    shape: Batched,
    grad: Option<&'a mut [f32]>,
    stats: &'a mut [f32],
) -> impl Iterator<Item = (usize, Option<&'a mut [f32]>, &'a mut [f32])> {
    let per = shape.per_slot();
    let mut grads =
        grad.map(|g| split_ranges(g, (0..shape.slots).map(move |s| s * per..(s + 1) * per)));
    let grads = std::iter::from_fn(move || Some(grads.as_mut().and_then(|g| g.next())));
    let stats = split_ranges(
        stats,
        (0..shape.slots).map(|s| s * STATS_LEN..(s + 1) * STATS_LEN),
    );
    (0..shape.slots)
        .zip(grads)
        .zip(stats)
        .map(|((s, g), st)| (s, g, st))
}

pub(crate) fn softmax_xent(
    ctx: &CpuCtx,
    loss: &Loss,
    logits: &[f32],
    labels: &[f32],
    dlogits: Option<&mut [f32]>,
    stats: &mut [f32],
) {
    let Loss {
        shape,
        target_stride: label_stride,
        accumulate,
    } = *loss;
    let c = shape.cols;
    let inv_rows = 1.0 / shape.rows.max(1) as f32;
    par::run(
        ctx,
        slot_tasks(shape, dlogits, stats),
        |(s, mut grad, st)| {
            let (mut loss, mut correct, mut bad) = (0.0f64, 0.0f64, 0.0f64);
            for r in 0..shape.rows {
                let off = s * shape.per_slot() + r * c;
                let z = &logits[off..off + c];
                let l = labels[s * label_stride + r];
                let d = grad.as_deref_mut().map(|g| &mut g[r * c..(r + 1) * c]);
                // Not a class index: counted (see STATS_LEN), no loss, no gradient.
                if !(l >= 0.0 && l < c as f32 && l.fract() == 0.0) {
                    bad += 1.0;
                    if let Some(d) = d {
                        d.fill(0.0);
                    }
                    continue;
                }
                let label = l as usize;
                let (mut best, mut max) = (0, f32::NEG_INFINITY);
                for (j, &v) in z.iter().enumerate() {
                    if v > max {
                        max = v;
                        best = j;
                    }
                }
                let sum: f32 = z.iter().map(|&v| (v - max).exp()).sum();
                let lse = max + sum.ln();
                loss += (lse - z[label]) as f64;
                correct += (best == label) as u32 as f64;
                if let Some(d) = d {
                    let inv_sum = 1.0 / sum;
                    for j in 0..c {
                        d[j] =
                            ((z[j] - max).exp() * inv_sum - (j == label) as u32 as f32) * inv_rows;
                    }
                }
            }
            write_stats(st, accumulate, [loss, correct, shape.rows as f64, bad]);
        },
    );
}

pub(crate) fn mse(
    ctx: &CpuCtx,
    loss: &Loss,
    pred: &[f32],
    target: &[f32],
    dpred: Option<&mut [f32]>,
    stats: &mut [f32],
) {
    let Loss {
        shape,
        target_stride,
        accumulate,
    } = *loss;
    let c = shape.cols;
    let scale = 2.0 / (shape.rows * c).max(1) as f32;
    par::run(ctx, slot_tasks(shape, dpred, stats), |(s, mut grad, st)| {
        let mut sse = 0.0f64;
        for r in 0..shape.rows {
            let off = s * shape.per_slot() + r * c;
            let toff = s * target_stride + r * c;
            let (p, t) = (&pred[off..off + c], &target[toff..toff + c]);
            let mut d = grad.as_deref_mut().map(|g| &mut g[r * c..(r + 1) * c]);
            for j in 0..c {
                let e = p[j] - t[j];
                sse += (e * e) as f64;
                if let Some(d) = d.as_deref_mut() {
                    d[j] = scale * e;
                }
            }
        }
        write_stats(
            st,
            accumulate,
            [sse / c as f64, sse, shape.rows as f64, 0.0],
        );
    });
}

fn write_stats(out: &mut [f32], accumulate: bool, v: [f64; STATS_LEN]) {
    for (o, v) in out.iter_mut().zip(v) {
        *o = if accumulate { *o + v as f32 } else { v as f32 };
    }
}
