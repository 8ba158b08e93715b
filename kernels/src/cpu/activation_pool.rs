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
use super::vector::{channel_blocks, load, store};
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
    /// Pooling with no activation, any windows (they need not tile).
    pub(super) fn pool_forward_images(p: &Pool2d, x: &[f32], images: Range<usize>, out: &mut [f32]) {
        forward_generic::<Identity>(p, x, images, out)
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
    for (t, dst) in images.zip(out.chunks_exact_mut(o.image_len())) {
        let img = &x[image_at(&i, t / i.n, t % i.n)..][..i.image_len()];
        for oy in 0..o.h {
            for ox in 0..o.w {
                let at = (oy * o.w + ox) * c;
                channel_blocks!(c, |ch, N| store(
                    dst,
                    at + ch,
                    forward_window::<A, N>(p, img, (oy, ox), ch)
                ));
            }
        }
    }
}

/// `pool(act(x))` of window `(oy, ox)`, channels `ch..ch + N`.
#[inline(always)]
fn forward_window<A: ElementFns, const N: usize>(
    p: &Pool2d,
    img: &[f32],
    (oy, ox): (usize, usize),
    ch: usize,
) -> [f32; N] {
    let c = p.input.c;
    let at = |ki, kj| window_pixel(p, oy, ox, ki, kj) * c + ch;
    let first: [f32; N] = load(img, at(0, 0));
    let mut d = first.map(A::y);
    for ki in 0..p.kh {
        for kj in 0..p.kw {
            if ki + kj == 0 {
                continue;
            }
            let v: [f32; N] = load(img, at(ki, kj));
            match p.kind {
                PoolKind::Max => {
                    for j in 0..N {
                        let v = A::y(v[j]);
                        d[j] = if beats(v, d[j]) { v } else { d[j] };
                    }
                }
                PoolKind::Avg => (0..N).for_each(|j| d[j] += A::y(v[j])),
            }
        }
    }
    if p.kind == PoolKind::Avg {
        let inv = 1.0 / (p.kh * p.kw) as f32;
        d.iter_mut().for_each(|v| *v *= inv);
    }
    d
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
    for (t, dimg) in images.zip(out.chunks_exact_mut(i.image_len())) {
        let img = &x[image_at(&i, t / i.n, t % i.n)..][..i.image_len()];
        let g = &dy[t * o.image_len()..(t + 1) * o.image_len()];
        for oy in 0..o.h {
            for ox in 0..o.w {
                let at = (oy * o.w + ox) * c;
                channel_blocks!(c, |ch, N| backward_window::<A, N>(
                    p,
                    img,
                    load(g, at + ch),
                    (oy, ox),
                    ch,
                    dimg
                ));
            }
        }
    }
}

/// The gradient of window `(oy, ox)`'s pixels, channels `ch..ch + N`,
/// given the window's output gradient `g`.
#[inline(always)]
fn backward_window<A: ElementFns, const N: usize>(
    p: &Pool2d,
    img: &[f32],
    g: [f32; N],
    (oy, ox): (usize, usize),
    ch: usize,
    dimg: &mut [f32],
) {
    let c = p.input.c;
    let at = |ki, kj| window_pixel(p, oy, ox, ki, kj) * c + ch;
    match p.kind {
        PoolKind::Max => {
            // The window's largest activation, then the first pixel equal
            // to it (NaN equal to NaN), row-major, takes the gradient, as
            // in unfused max pooling; `&` and `|` keep the loop branch-free.
            let first: [f32; N] = load(img, at(0, 0));
            let mut best = first.map(A::y);
            for ki in 0..p.kh {
                for kj in 0..p.kw {
                    let v: [f32; N] = load(img, at(ki, kj));
                    for j in 0..N {
                        let y = A::y(v[j]);
                        best[j] = if beats(y, best[j]) { y } else { best[j] };
                    }
                }
            }
            let mut taken = [false; N];
            for ki in 0..p.kh {
                for kj in 0..p.kw {
                    let v: [f32; N] = load(img, at(ki, kj));
                    let mut d = [0.0; N];
                    for j in 0..N {
                        let (y, b) = (A::y(v[j]), best[j]);
                        let hit = !taken[j] & ((y == b) | (y.is_nan() & b.is_nan()));
                        taken[j] |= hit;
                        d[j] = A::dx(v[j], y, if hit { g[j] } else { 0.0 });
                    }
                    store(dimg, at(ki, kj), d);
                }
            }
        }
        PoolKind::Avg => {
            let inv = 1.0 / (p.kh * p.kw) as f32;
            for ki in 0..p.kh {
                for kj in 0..p.kw {
                    let v: [f32; N] = load(img, at(ki, kj));
                    let mut d = [0.0; N];
                    for j in 0..N {
                        // `0.0 +`: the unfused op adds onto zeros, which turns -0 into 0.
                        d[j] = A::dx(v[j], A::y(v[j]), 0.0 + g[j] * inv);
                    }
                    store(dimg, at(ki, kj), d);
                }
            }
        }
    }
}
