//! Pooling of an activation's output, with the activation applied as each
//! pixel is read: `pool(act(x))` and its gradient with respect to `x`, in
//! one pass over the images where the separate ops make two.
//!
//! Only for windows that tile the images ([`Pool2d::tiles`]), where each
//! pixel belongs to one window: its activation is computed once forward
//! and once backward, and its gradient is written once. The arithmetic is
//! the separate ops' own ([`super::elementwise::ElementFns`], the same
//! first-largest rule for max pooling), so the bits are theirs: a net
//! that fuses them trains as one that does not.

use std::ops::Range;

use super::CpuCtx;
use super::conv::{beats, image_at, image_tasks_with, window_pixel};
use super::elementwise::{ElementFns, Identity, with_element_fns};
use super::par;
use crate::ops::{Activation, Pool2d, PoolKind};

/// `y = pool(act(x))`.
pub(crate) fn forward(ctx: &CpuCtx, act: Activation, p: &Pool2d, x: &[f32], y: &mut [f32]) {
    let (i, o) = (p.input, p.output());
    let tasks = image_tasks_with(ctx, &i, 4 * i.image_len(), y, o.image_len());
    par::run(ctx, tasks.into_iter(), |(images, out)| {
        forward_images(act, p, x, images, out)
    });
}

/// `dx = act'(x) * pool'(dy)`, the gradient of [`forward`] (overwritten).
pub(crate) fn backward(
    ctx: &CpuCtx,
    act: Activation,
    p: &Pool2d,
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    let len = p.input.image_len();
    let tasks = image_tasks_with(ctx, &p.input, 4 * len, dx, len);
    par::run(ctx, tasks.into_iter(), |(images, out)| {
        backward_images(act, p, x, dy, images, out)
    });
}

widest_fn! {
    /// [`forward`] over one task's images (packed `(slot, image)` indices).
    fn forward_images(act: Activation, p: &Pool2d, x: &[f32], images: Range<usize>, out: &mut [f32]) {
        with_element_fns!(act, A => forward_generic::<A>(p, x, images, out))
    }
}

widest_fn! {
    /// [`backward`] over one task's images (packed `(slot, image)` indices).
    pub(super) fn backward_images(
        act: Activation,
        p: &Pool2d,
        x: &[f32],
        dy: &[f32],
        images: Range<usize>,
        out: &mut [f32],
    ) {
        with_element_fns!(act, A => backward_generic::<A>(p, x, dy, images, out))
    }
}

widest_fn! {
    /// Max pooling's gradient where the windows tile the image (no
    /// activation): per window, its maximum, then the first pixel equal
    /// to it (NaN equal to NaN) takes the gradient and the others 0. The
    /// same pixel as the general path's first-largest rule.
    pub(super) fn max_pool_backward_tiled(
        p: &Pool2d,
        x: &[f32],
        dy: &[f32],
        images: Range<usize>,
        out: &mut [f32],
    ) {
        backward_generic::<Identity>(p, x, dy, images, out)
    }
}

#[inline(always)]
fn forward_generic<A: ElementFns>(p: &Pool2d, x: &[f32], images: Range<usize>, out: &mut [f32]) {
    let (i, o, c) = (p.input, p.output(), p.input.c);
    let inv = 1.0 / (p.kh * p.kw) as f32;
    for (t, dst) in images.zip(out.chunks_exact_mut(o.image_len())) {
        let img = &x[image_at(&i, t / i.n, t % i.n)..][..i.image_len()];
        for oy in 0..o.h {
            for ox in 0..o.w {
                let d = &mut dst[(oy * o.w + ox) * c..][..c];
                for ki in 0..p.kh {
                    for kj in 0..p.kw {
                        let at = window_pixel(p, oy, ox, ki, kj) * c;
                        let v = &img[at..at + c];
                        let pairs = d.iter_mut().zip(v);
                        if ki == 0 && kj == 0 {
                            pairs.for_each(|(d, &v)| *d = A::y(v));
                            continue;
                        }
                        match p.kind {
                            PoolKind::Max => pairs.for_each(|(b, &v)| {
                                let v = A::y(v);
                                *b = if beats(v, *b) { v } else { *b };
                            }),
                            PoolKind::Avg => pairs.for_each(|(b, &v)| *b += A::y(v)),
                        }
                    }
                }
                if p.kind == PoolKind::Avg {
                    d.iter_mut().for_each(|v| *v *= inv);
                }
            }
        }
    }
}

#[inline(always)]
fn backward_generic<A: ElementFns>(
    p: &Pool2d,
    x: &[f32],
    dy: &[f32],
    images: Range<usize>,
    out: &mut [f32],
) {
    let (i, o, c) = (p.input, p.output(), p.input.c);
    let inv = 1.0 / (p.kh * p.kw) as f32;
    // Per channel: the window's largest activation, and whether a pixel
    // has taken the window's gradient yet.
    let (mut best, mut taken) = (vec![0.0f32; c], vec![false; c]);
    for (t, dimg) in images.zip(out.chunks_exact_mut(i.image_len())) {
        let img = &x[image_at(&i, t / i.n, t % i.n)..][..i.image_len()];
        let g = &dy[t * o.image_len()..(t + 1) * o.image_len()];
        for oy in 0..o.h {
            for ox in 0..o.w {
                let gd = &g[(oy * o.w + ox) * c..][..c];
                if p.kind == PoolKind::Max {
                    let first = window_pixel(p, oy, ox, 0, 0) * c;
                    best.iter_mut()
                        .zip(&img[first..first + c])
                        .for_each(|(b, &v)| *b = A::y(v));
                    for ki in 0..p.kh {
                        for kj in 0..p.kw {
                            let at = window_pixel(p, oy, ox, ki, kj) * c;
                            for (b, &v) in best.iter_mut().zip(&img[at..at + c]) {
                                let v = A::y(v);
                                *b = if beats(v, *b) { v } else { *b };
                            }
                        }
                    }
                    taken.fill(false);
                }
                for ki in 0..p.kh {
                    for kj in 0..p.kw {
                        let at = window_pixel(p, oy, ox, ki, kj) * c;
                        let v = &img[at..at + c];
                        let d = &mut dimg[at..at + c];
                        match p.kind {
                            // The first pixel equal to the largest takes the
                            // gradient (NaN equal to NaN), as in unfused max
                            // pooling; `&` and `|` keep the loop branch-free.
                            PoolKind::Max => {
                                for ((((d, &v), &b), &g), t) in
                                    d.iter_mut().zip(v).zip(&best).zip(gd).zip(taken.iter_mut())
                                {
                                    let y = A::y(v);
                                    let hit = !*t & ((y == b) | (y.is_nan() & b.is_nan()));
                                    *t |= hit;
                                    *d = A::dx(v, y, if hit { g } else { 0.0 });
                                }
                            }
                            PoolKind::Avg => {
                                for ((d, &v), &g) in d.iter_mut().zip(v).zip(gd) {
                                    // `0.0 +`: the unfused op adds onto zeros, which turns -0 into 0.
                                    *d = A::dx(v, A::y(v), 0.0 + g * inv);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
