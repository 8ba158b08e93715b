//! Convolutional ops on NHWC images: im2col and its adjoint, pooling,
//! batch norm and residual addition.
//!
//! Work is split by whole images (or whole slots for batch norm's
//! statistics), and each task sums in a fixed order, so a slot's bits do
//! not depend on how many slots share the call or how many threads run it:
//! a fused trial computes what it would alone.

use std::cell::RefCell;
use std::ops::Range;

use super::CpuCtx;
use super::gemm;
use super::gemm_unpacked::{Strided, product};
use super::par::{self, MIN_ELEMS_PER_TASK, split_ranges};
use super::vector::{channel_blocks, load, store};
use crate::ops::{
    AugmentSlot, BatchNorm, Conv2d, ConvGemm, Images, Pool2d, PoolKind, dropout_step,
};

/// `(slot, image)` tasks over packed output images of `image_len` elements.
fn image_tasks(
    ctx: &CpuCtx,
    slots: usize,
    n: usize,
    image_len: usize,
) -> Vec<std::ops::Range<usize>> {
    // Whole images per task, enough of them to be worth a hand-off.
    let per_task = (MIN_ELEMS_PER_TASK / image_len.max(1)).max(1);
    let total = slots * n;
    let tasks = total
        .div_ceil(per_task)
        .min(ctx.threads().max(1) * 4)
        .max(1);
    let chunk = total.div_ceil(tasks).max(1);
    (0..total)
        .step_by(chunk)
        .map(|start| start..(start + chunk).min(total))
        .collect()
}

/// [`image_tasks`] (each image weighing `work` elements), each with its
/// images' part of `out`, `out_len` elements an image.
pub(super) fn image_tasks_with<'a>(
    ctx: &CpuCtx,
    i: &Images,
    work: usize,
    out: &'a mut [f32],
    out_len: usize,
) -> Vec<(Range<usize>, &'a mut [f32])> {
    let tasks = image_tasks(ctx, i.slots, i.n, work);
    let parts: Vec<_> = tasks
        .iter()
        .map(|r| r.start * out_len..r.end * out_len)
        .collect();
    tasks.into_iter().zip(split_ranges(out, parts)).collect()
}

/// The start of image `img` of `slot` in an input view.
pub(super) fn image_at(i: &Images, slot: usize, img: usize) -> usize {
    slot * i.slot_stride + img * i.image_len()
}

/// The window's columns `kj0..kj1` that lie inside the image, for the
/// output column `ox`, and where the window starts (`x0`, maybe negative).
#[inline(always)]
fn window_cols(conv: &Conv2d, ox: usize) -> (isize, usize, usize) {
    let x0 = (ox * conv.stride) as isize - conv.pad as isize;
    let kj0 = (-x0).clamp(0, conv.kw as isize) as usize;
    let kj1 = (conv.input.w as isize - x0).clamp(kj0 as isize, conv.kw as isize) as usize;
    (x0, kj0, kj1)
}

/// One image's patch matrix (`out_h * out_w` rows, `ld` apart: `patch`,
/// or one more for a trailing 1 that multiplies a bias). A kernel row's
/// in-image run is one copy: a pixel of a 3-channel image is only 12
/// bytes, too little to copy alone.
fn im2col_image(conv: &Conv2d, src: &[f32], out: &mut [f32], ld: usize) {
    let (i, ow) = (conv.input, conv.out_w());
    for (row, dst) in out.chunks_exact_mut(ld).enumerate() {
        dst[conv.patch()..].fill(1.0);
        let (oy, ox) = (row / ow, row % ow);
        let (x0, kj0, kj1) = window_cols(conv, ox);
        for ki in 0..conv.kh {
            let iy = (oy * conv.stride + ki) as isize - conv.pad as isize;
            let run = &mut dst[ki * conv.kw * i.c..(ki + 1) * conv.kw * i.c];
            if iy < 0 || iy >= i.h as isize || kj0 == kj1 {
                run.fill(0.0);
                continue;
            }
            run[..kj0 * i.c].fill(0.0);
            run[kj1 * i.c..].fill(0.0);
            let at = (iy as usize * i.w + (x0 + kj0 as isize) as usize) * i.c;
            run[kj0 * i.c..kj1 * i.c].copy_from_slice(&src[at..at + (kj1 - kj0) * i.c]);
        }
    }
}

/// One image's patch matrix added back onto its pixels, in a fixed order:
/// output pixel, then kernel row (a kernel row's pixels are distinct, so
/// adding its run at once keeps each pixel's order of sums).
fn col2im_image(conv: &Conv2d, src: &[f32], img: &mut [f32]) {
    let (i, ow) = (conv.input, conv.out_w());
    for (row, patch_row) in src.chunks_exact(conv.patch()).enumerate() {
        let (oy, ox) = (row / ow, row % ow);
        let (x0, kj0, kj1) = window_cols(conv, ox);
        for ki in 0..conv.kh {
            let iy = (oy * conv.stride + ki) as isize - conv.pad as isize;
            if iy < 0 || iy >= i.h as isize || kj0 == kj1 {
                continue;
            }
            let at = (iy as usize * i.w + (x0 + kj0 as isize) as usize) * i.c;
            let len = (kj1 - kj0) * i.c;
            let from = &patch_row[(ki * conv.kw + kj0) * i.c..][..len];
            img[at..at + len]
                .iter_mut()
                .zip(from)
                .for_each(|(d, &s)| *d += s);
        }
    }
}

pub(crate) fn im2col(ctx: &CpuCtx, conv: &Conv2d, x: &[f32], cols: &mut [f32]) {
    let i = conv.input;
    let per_image = conv.out_h() * conv.out_w() * conv.patch();
    let tasks = image_tasks_with(ctx, &i, per_image, cols, per_image);
    par::run(ctx, tasks.into_iter(), |(images, out)| {
        for (t, out) in images.zip(out.chunks_exact_mut(per_image)) {
            let src = &x[image_at(&i, t / i.n, t % i.n)..][..i.image_len()];
            im2col_image(conv, src, out, conv.patch());
        }
    });
}

pub(crate) fn col2im(ctx: &CpuCtx, conv: &Conv2d, cols: &[f32], dx: &mut [f32], accumulate: bool) {
    let i = conv.input;
    let per_image = conv.out_h() * conv.out_w() * conv.patch();
    let image_len = i.image_len();
    let tasks = image_tasks_with(ctx, &i, image_len, dx, image_len);
    par::run(ctx, tasks.into_iter(), |(images, out)| {
        for (t, img) in images.zip(out.chunks_exact_mut(image_len)) {
            if !accumulate {
                img.fill(0.0);
            }
            col2im_image(conv, &cols[t * per_image..(t + 1) * per_image], img);
        }
    });
}

// --- convolutions with the patch matrix made a chunk at a time -----------
//
// A whole batch's patch matrix is large (cnn-32's second convolution: 52 MB
// at batch 64), so writing it, then reading it back into the GEMM, runs at
// memory speed. Here each task makes the patches of a few images into a
// per-thread buffer that fits in L2 and multiplies them at once, so the
// GEMM reads them from cache and the whole matrix never exists.

/// Patch-matrix bytes a task makes and multiplies at a time: a quarter of a
/// core's L2 on the machines we measured (1-4 MiB), leaving room for the
/// GEMM's packed panels.
const CHUNK_BYTES: usize = 512 << 10;

/// Per slot, the filter gradient is summed in this many fixed image groups
/// (fewer when there are fewer images, or a form asks for more images a
/// group), each a task of its own, then the groups' partial sums are added
/// in order. Fixed by the shape, so that the bits depend on neither the
/// thread count nor the other slots of the call.
const FILTER_GROUPS: usize = 8;

thread_local! {
    /// A task's patch chunk (or Winograd's tiles), kept between calls: pool
    /// threads live as long as their lane, and the chunk is the same size
    /// every iteration. Never borrowed twice: no task nests two uses.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with_borrow_mut(|v| {
        if v.len() < len {
            v.resize(len, 0.0);
        }
        f(&mut v[..len])
    })
}

/// Images per chunk: as many whole images' patches as fit `CHUNK_BYTES`.
fn chunk_images(conv: &Conv2d) -> usize {
    let per_image = conv.out_h() * conv.out_w() * conv.patch() * 4;
    (CHUNK_BYTES / per_image.max(1)).clamp(1, conv.input.n.max(1))
}

/// Images per task of a product whose rows are independent (the output and
/// the input's gradient, where chunking cannot change a bit): what fits
/// the cache, fewer where that leaves a thread idle, but never under
/// the GEMM's smallest task.
fn task_images(ctx: &CpuCtx, op: &ConvGemm) -> usize {
    let conv = &op.conv;
    let (i, fit) = (conv.input, chunk_images(conv));
    let per_thread = i.n.div_ceil(ctx.threads().div_ceil(i.slots.max(1)).max(1));
    let image_macs = conv.out_h() * conv.out_w() * conv.patch() * op.out_c;
    let smallest = (gemm::MIN_MACS_PER_TASK / image_macs.max(1)).max(1);
    fit.min(per_thread.max(smallest)).max(1)
}

/// `(slot, images)` for every slot, its images cut into runs of `per`.
pub(super) fn slot_chunks(i: &Images, per: usize) -> Vec<(usize, Range<usize>)> {
    (0..i.slots)
        .flat_map(|s| {
            (0..i.n)
                .step_by(per.max(1))
                .map(move |lo| (s, lo..(lo + per).min(i.n)))
        })
        .collect()
}

/// `buf` (packed images, slot-major, `per_image` elements each) cut at the
/// tasks of [`slot_chunks`]: each task's own images.
pub(super) fn chunk_outputs<'a>(
    buf: &'a mut [f32],
    tasks: &'a [(usize, Range<usize>)],
    n: usize,
    per_image: usize,
) -> impl Iterator<Item = &'a mut [f32]> {
    split_ranges(
        buf,
        tasks
            .iter()
            .map(move |(s, r)| (s * n + r.start) * per_image..(s * n + r.end) * per_image),
    )
}

/// The patch rows of `images` of `slot` into `cols`, each `op.weight_rows()`
/// long (a trailing 1 where the weights end with a bias).
fn chunk_patches(op: &ConvGemm, x: &[f32], slot: usize, images: Range<usize>, cols: &mut [f32]) {
    let (conv, ld) = (&op.conv, op.weight_rows());
    let i = conv.input;
    let per_image = conv.out_h() * conv.out_w() * ld;
    for (img, dst) in images.zip(cols.chunks_exact_mut(per_image)) {
        im2col_image(
            conv,
            &x[image_at(&i, slot, img)..][..i.image_len()],
            dst,
            ld,
        );
    }
}

widest_fn! {
    /// `out = cols . w` for a chunk's patch rows, which are in cache:
    /// multiplied where they lie ([`product`]), not copied into packed
    /// panels first as `matrixmultiply` does. Measured on the 2-core
    /// development machine: a 3 x 3 residual net on 32 x 32 images
    /// (32-128 channels) 8% faster a study, `studies/digits_cnn.toml` 4-6%.
    /// (The two gradients stay with `matrixmultiply`: through [`product`]
    /// they measured slower, the filter gradient's left operand being the
    /// patches transposed and the input gradient's inner dimension short.)
    fn patch_product(dims: (usize, usize, usize), cols: &[f32], w: &[f32], out: &mut [f32]) {
        let (_, oc, ld) = dims;
        let a = Strided { data: cols, rs: ld, ks: 1, runs: None };
        product(dims, a, (w, oc), (out, oc), false, &mut Vec::new())
    }
}

/// `y = im2col(x) . w` per slot (`+ bias`, a trailing 1 in each patch row
/// times the weights' last row), a chunk of images per task.
pub(crate) fn conv2d(ctx: &CpuCtx, op: &ConvGemm, x: &[f32], w: &[f32], y: &mut [f32]) {
    let (conv, oc) = (&op.conv, op.out_c);
    let (i, pixels, ld) = (conv.input, conv.out_h() * conv.out_w(), op.weight_rows());
    let tasks = slot_chunks(&i, task_images(ctx, op));
    let outs = chunk_outputs(y, &tasks, i.n, pixels * oc);
    par::run(ctx, tasks.iter().zip(outs), |((s, images), out)| {
        let rows = images.len() * pixels;
        with_scratch(rows * ld, |cols| {
            chunk_patches(op, x, *s, images.clone(), cols);
            let w = &w[s * op.weight_stride..][..ld * oc];
            patch_product((rows, oc, ld), cols, w, out);
        });
    });
}

/// `dx = col2im(dy . w^T)` per slot (added to `dx` when `accumulate_dx`), a
/// chunk of images per task.
pub(crate) fn conv2d_data_grad(ctx: &CpuCtx, op: &ConvGemm, dy: &[f32], w: &[f32], dx: &mut [f32]) {
    let (conv, oc, accumulate) = (&op.conv, op.out_c, op.accumulate_dx);
    let (i, pixels, patch) = (conv.input, conv.out_h() * conv.out_w(), conv.patch());
    let image_len = i.image_len();
    let tasks = slot_chunks(&i, task_images(ctx, op));
    let outs = chunk_outputs(dx, &tasks, i.n, image_len);
    par::run(ctx, tasks.iter().zip(outs), |((s, images), out)| {
        let rows = images.len() * pixels;
        with_scratch(rows * patch, |cols| {
            let dy = &dy[(s * i.n + images.start) * pixels * oc..][..rows * oc];
            let w = &w[s * op.weight_stride..][..patch * oc];
            gemm::sgemm_one((rows, patch, oc), (dy, false), (w, true), 0.0, cols);
            for (src, img) in cols
                .chunks_exact(pixels * patch)
                .zip(out.chunks_exact_mut(image_len))
            {
                if !accumulate {
                    img.fill(0.0);
                }
                col2im_image(conv, src, img);
            }
        });
    });
}

/// `dw = im2col(x)^T . dy` per slot (overwritten; with a bias, its
/// gradient, the column sums of `dy`, is the last row): each of a slot's image
/// groups sums its chunks into a partial gradient, then the partials are
/// added in group order.
pub(crate) fn conv2d_filter_grad(
    ctx: &CpuCtx,
    op: &ConvGemm,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) {
    let (conv, oc) = (&op.conv, op.out_c);
    let (i, pixels, ld) = (conv.input, conv.out_h() * conv.out_w(), op.weight_rows());
    let per = chunk_images(conv);
    sum_over_image_groups(ctx, op, 1, dw, |s, images, part| {
        let mut beta = 0.0;
        for lo in images.clone().step_by(per) {
            let chunk = lo..(lo + per).min(images.end);
            let rows = chunk.len() * pixels;
            with_scratch(rows * ld, |cols| {
                chunk_patches(op, x, s, chunk.clone(), cols);
                let dy = &dy[(s * i.n + chunk.start) * pixels * oc..][..rows * oc];
                gemm::sgemm_one((ld, oc, rows), (cols, true), (dy, false), beta, part);
            });
            beta = 1.0;
        }
    });
}

/// A weight gradient per slot (overwritten), summed over
/// [`FILTER_GROUPS`] fixed groups of each slot's images (fewer where a
/// group would get fewer than `min_images`): `group(slot, images, part)`
/// writes one group's partial gradient (`weights_len()` elements, the
/// bias's after the weights'), each a task of its own, and the partials
/// are added in group order. Every form of the convolution sums this way,
/// so that a slot's bits depend on its shape alone, neither on the thread
/// count nor on the other slots.
pub(super) fn sum_over_image_groups(
    ctx: &CpuCtx,
    op: &ConvGemm,
    min_images: usize,
    dw: &mut [f32],
    group: impl Fn(usize, Range<usize>, &mut [f32]) + Sync + Send,
) {
    let (i, len) = (op.conv.input, op.weights_len());
    let groups = FILTER_GROUPS.min(i.n / min_images.max(1)).max(1);
    let tasks: Vec<(usize, Range<usize>)> = (0..i.slots)
        .flat_map(|s| (0..groups).map(move |g| (s, g * i.n / groups..(g + 1) * i.n / groups)))
        .collect();
    let mut partials = vec![0.0f32; tasks.len() * len];
    par::run(
        ctx,
        tasks.iter().zip(partials.chunks_exact_mut(len)),
        |((s, images), part)| group(*s, images.clone(), part),
    );
    let outs = split_ranges(
        dw,
        (0..i.slots).map(|s| s * op.weight_stride..s * op.weight_stride + len),
    );
    par::run(
        ctx,
        partials.chunks_exact(groups * len).zip(outs),
        |(parts, out)| {
            out.copy_from_slice(&parts[..len]);
            for part in parts[len..].chunks_exact(len) {
                out.iter_mut().zip(part).for_each(|(d, &p)| *d += p);
            }
        },
    );
}

/// A convolution of 2 images of 16 x 16 and `c` channels with a square
/// kernel, "same" padding: for the forms' choice tests.
#[cfg(test)]
pub(super) fn square_conv(c: usize, k: usize, stride: usize) -> Conv2d {
    let input = Images {
        slots: 1,
        n: 2,
        h: 16,
        w: 16,
        c,
        slot_stride: 0,
    };
    Conv2d {
        input,
        kh: k,
        kw: k,
        stride,
        pad: k / 2,
    }
}

/// Whether `v` replaces `best` as a window's maximum: larger, or NaN over a
/// number (NaN propagates, as PyTorch's), the first of equals staying.
#[inline(always)]
pub(super) fn beats(v: f32, best: f32) -> bool {
    v > best || (v.is_nan() && !best.is_nan())
}

/// The pixel (row-major index) of window `(oy, ox)`'s `(ki, kj)`.
#[inline(always)]
pub(super) fn window_pixel(p: &Pool2d, oy: usize, ox: usize, ki: usize, kj: usize) -> usize {
    (oy * p.stride + ki) * p.input.w + ox * p.stride + kj
}

// Pooling works a window's pixels a channel vector at a time (contiguous
// in NHWC), through the loops of the fused activation's pooling; a task
// is a few whole images, smaller than for element-wise ops since each
// output reads a window.
pub(crate) fn pool2d(ctx: &CpuCtx, p: &Pool2d, x: &[f32], y: &mut [f32]) {
    let (i, o) = (p.input, p.output());
    let tasks = image_tasks_with(ctx, &i, 4 * i.image_len(), y, o.image_len());
    par::run(ctx, tasks.into_iter(), |(images, out)| {
        super::activation_pool::pool_forward_images(p, x, images, out)
    });
}

pub(crate) fn pool2d_backward(ctx: &CpuCtx, p: &Pool2d, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    let i = p.input;
    let o = p.output();
    let c = i.c;
    let inv = 1.0 / (p.kh * p.kw) as f32;
    let image_len = i.image_len();
    let tasks = image_tasks_with(ctx, &i, 4 * image_len, dx, image_len);
    // Windows that tile the image exactly (2x2 stride 2 on even sizes):
    // every pixel has one window, so its gradient is written once, with
    // no zero fill and no scatter.
    let tiled = p.kind == PoolKind::Max && p.tiles();
    par::run(ctx, tasks.into_iter(), |(images, out)| {
        if tiled {
            // The fused pass's loops, with no activation.
            return super::activation_pool::max_pool_backward_tiled(p, x, dy, images, out);
        }
        // Per channel: the window's best value and pixel so far.
        let (mut best, mut arg) = (vec![0.0f32; c], vec![0usize; c]);
        for (t, dimg) in images.zip(out.chunks_exact_mut(image_len)) {
            let img = &x[image_at(&i, t / i.n, t % i.n)..][..image_len];
            let g = &dy[t * o.image_len()..(t + 1) * o.image_len()];
            dimg.fill(0.0);
            for oy in 0..o.h {
                for ox in 0..o.w {
                    let gd = &g[(oy * o.w + ox) * c..][..c];
                    match p.kind {
                        PoolKind::Max => {
                            let first = window_pixel(p, oy, ox, 0, 0);
                            best.copy_from_slice(&img[first * c..first * c + c]);
                            arg.fill(first);
                            for ki in 0..p.kh {
                                for kj in 0..p.kw {
                                    let px = window_pixel(p, oy, ox, ki, kj);
                                    let v = &img[px * c..px * c + c];
                                    for ch in 0..c {
                                        if beats(v[ch], best[ch]) {
                                            best[ch] = v[ch];
                                            arg[ch] = px;
                                        }
                                    }
                                }
                            }
                            for ch in 0..c {
                                dimg[arg[ch] * c + ch] += gd[ch];
                            }
                        }
                        PoolKind::Avg => {
                            for ki in 0..p.kh {
                                for kj in 0..p.kw {
                                    let at = window_pixel(p, oy, ox, ki, kj) * c;
                                    dimg[at..at + c]
                                        .iter_mut()
                                        .zip(gd)
                                        .for_each(|(d, &g)| *d += g * inv);
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}

widest_fn! {
    /// Per channel of one slot's `rows x c` values `xs`, in f64: the mean
    /// into `out[..c]`, then the sum of squared deviations from it into
    /// `out[c..]`, each channel summed over rows in order (a vector of
    /// channels at a time: the bits of one channel at a time).
    fn slot_moments(xs: &[f32], c: usize, out: &mut [f64]) {
        let rows = xs.len() / c;
        channel_blocks!(c, |ch, N| {
            let mut sum = [0.0f64; N];
            for r in 0..rows {
                let v: [f32; N] = load(xs, r * c + ch);
                (0..N).for_each(|j| sum[j] += v[j] as f64);
            }
            let mean = sum.map(|v| v / rows as f64);
            let mut sq = [0.0f64; N];
            for r in 0..rows {
                let v: [f32; N] = load(xs, r * c + ch);
                for j in 0..N {
                    let d = v[j] as f64 - mean[j];
                    sq[j] += d * d;
                }
            }
            out[ch..ch + N].copy_from_slice(&mean);
            out[c + ch..c + ch + N].copy_from_slice(&sq);
        })
    }
}

widest_fn! {
    /// Per channel of one slot, in f64 (summed as [`slot_moments`]): the
    /// sum of the output's gradient `dy` into `out[..c]` (beta's gradient)
    /// and of `dy * xhat` into `out[c..]` (gamma's), `xhat` from `x` and
    /// the slot's saved `[mean; c]`, `[1/std; c]`.
    fn slot_param_grads(x: &[f32], dy: &[f32], saved: &[f32], c: usize, out: &mut [f64]) {
        let rows = x.len() / c;
        channel_blocks!(c, |ch, N| {
            let (mean, inv): ([f32; N], [f32; N]) = (load(saved, ch), load(saved, c + ch));
            let (mut dbeta, mut dgamma) = ([0.0f64; N], [0.0f64; N]);
            for r in 0..rows {
                let (xv, g): ([f32; N], [f32; N]) = (load(x, r * c + ch), load(dy, r * c + ch));
                for j in 0..N {
                    let xhat = (xv[j] - mean[j]) * inv[j];
                    dbeta[j] += g[j] as f64;
                    dgamma[j] += g[j] as f64 * xhat as f64;
                }
            }
            out[ch..ch + N].copy_from_slice(&dbeta);
            out[c + ch..c + ch + N].copy_from_slice(&dgamma);
        })
    }
}

pub(crate) fn batch_norm_train(
    ctx: &CpuCtx,
    bn: &BatchNorm,
    x: &[f32],
    params: &[f32],
    running: &mut [f32],
    saved: &mut [f32],
    y: &mut [f32],
) {
    let s = bn.shape;
    let (rows, c) = (s.rows, s.cols);
    // Slots in parallel: each one's sums are its own, in order.
    let mut moments = vec![0.0f64; s.slots * 2 * c];
    par::run(
        ctx,
        moments.chunks_exact_mut(2 * c).enumerate(),
        |(slot, out)| slot_moments(&x[slot * s.per_slot()..][..s.per_slot()], c, out),
    );
    for (slot, mo) in moments.chunks_exact(2 * c).enumerate() {
        let (mean, sq) = mo.split_at(c);
        let sv = &mut saved[slot * 2 * c..(slot + 1) * 2 * c];
        let run = &mut running[slot * bn.running_stride..][..2 * c];
        let m = bn.momentum as f64;
        for ch in 0..c {
            let var = sq[ch] / rows as f64;
            sv[ch] = mean[ch] as f32;
            sv[c + ch] = (1.0 / (var + bn.eps as f64).sqrt()) as f32;
            let unbiased = sq[ch] / (rows - 1) as f64;
            run[ch] = ((1.0 - m) * run[ch] as f64 + m * mean[ch]) as f32;
            run[c + ch] = ((1.0 - m) * run[c + ch] as f64 + m * unbiased) as f32;
        }
    }
    apply(ctx, bn, x, params, saved, 2 * c, None, y);
}

pub(crate) fn batch_norm_eval(
    ctx: &CpuCtx,
    bn: &BatchNorm,
    x: &[f32],
    params: &[f32],
    running: &[f32],
    y: &mut [f32],
) {
    apply(
        ctx,
        bn,
        x,
        params,
        running,
        bn.running_stride,
        Some(bn.eps),
        y,
    );
}

/// `y = gamma * ((x - mean) * inv_std) + beta`, with `[mean; c]` and then
/// `[1/std; c]` per slot in `stats` (`stat_stride` apart), or `[mean; c]`
/// and `[var; c]` when `eps` is given (the running statistics).
#[allow(clippy::too_many_arguments)]
fn apply(
    ctx: &CpuCtx,
    bn: &BatchNorm,
    x: &[f32],
    params: &[f32],
    stats: &[f32],
    stat_stride: usize,
    eps: Option<f32>,
    y: &mut [f32],
) {
    let s = bn.shape;
    let c = s.cols;
    let segs = par::segments(ctx, s.slots, s.rows, MIN_ELEMS_PER_TASK / c.max(1));
    let ys = split_ranges(
        y,
        segs.iter()
            .map(|g| (g.slot * s.rows + g.start) * c..(g.slot * s.rows + g.end) * c),
    );
    par::run(ctx, segs.iter().zip(ys), |(g, y)| {
        let st = &stats[g.slot * stat_stride..][..2 * c];
        let p = &params[g.slot * bn.param_stride..][..2 * c];
        let inv: Vec<f32> = match eps {
            Some(eps) => st[c..].iter().map(|&v| 1.0 / (v + eps).sqrt()).collect(),
            None => st[c..].to_vec(),
        };
        let xs = &x[(g.slot * s.rows + g.start) * c..(g.slot * s.rows + g.end) * c];
        normalise_rows(xs, st, &inv, p, c, y)
    });
}

widest_fn! {
    /// `y = gamma * ((x - mean) * inv_std) + beta` over rows of `c`
    /// channels, `mean` in `st[..c]` and `[gamma; c] [beta; c]` in `p`.
    fn normalise_rows(xs: &[f32], st: &[f32], inv: &[f32], p: &[f32], c: usize, y: &mut [f32]) {
        for (yr, r) in y.chunks_exact_mut(c).zip((0..).step_by(c)) {
            channel_blocks!(c, |ch, N| {
                let (x, mean, inv): ([f32; N], [f32; N], [f32; N]) =
                    (load(xs, r + ch), load(st, ch), load(inv, ch));
                let (gamma, beta): ([f32; N], [f32; N]) = (load(p, ch), load(p, c + ch));
                let mut v = [0.0; N];
                (0..N).for_each(|j| v[j] = gamma[j] * ((x[j] - mean[j]) * inv[j]) + beta[j]);
                store(yr, ch, v)
            })
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_backward(
    ctx: &CpuCtx,
    bn: &BatchNorm,
    x: &[f32],
    params: &[f32],
    saved: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dparams: &mut [f32],
) {
    let s = bn.shape;
    let (rows, c) = (s.rows, s.cols);
    let mut sums = vec![0.0f64; s.slots * 2 * c];
    par::run(
        ctx,
        sums.chunks_exact_mut(2 * c).enumerate(),
        |(slot, out)| {
            let at = slot * s.per_slot()..(slot + 1) * s.per_slot();
            let sv = &saved[slot * 2 * c..(slot + 1) * 2 * c];
            slot_param_grads(&x[at.clone()], &dy[at], sv, c, out)
        },
    );
    for (slot, sums) in sums.chunks_exact(2 * c).enumerate() {
        let (dbeta, dgamma) = sums.split_at(c);
        let dp = &mut dparams[slot * bn.param_stride..][..2 * c];
        for ch in 0..c {
            dp[ch] = dgamma[ch] as f32;
            dp[c + ch] = dbeta[ch] as f32;
        }
    }
    let segs = par::segments(ctx, s.slots, rows, MIN_ELEMS_PER_TASK / c.max(1));
    let dxs = split_ranges(
        dx,
        segs.iter()
            .map(|g| (g.slot * rows + g.start) * c..(g.slot * rows + g.end) * c),
    );
    let dparams = &*dparams;
    par::run(ctx, segs.iter().zip(dxs), |(g, dx)| {
        let sv = &saved[g.slot * 2 * c..(g.slot + 1) * 2 * c];
        let p = &params[g.slot * bn.param_stride..][..2 * c];
        let dp = &dparams[g.slot * bn.param_stride..][..2 * c];
        let at = (g.slot * rows + g.start) * c..(g.slot * rows + g.end) * c;
        normalise_rows_backward(&x[at.clone()], &dy[at], sv, p, dp, rows, c, dx)
    });
}

widest_fn! {
    /// The input's gradient over rows of `c` channels, given the slot's
    /// saved `[mean; c] [1/std; c]`, `[gamma; c] [beta; c]` and their
    /// gradients, the statistics over `rows` rows.
    fn normalise_rows_backward(
        x: &[f32],
        dy: &[f32],
        sv: &[f32],
        p: &[f32],
        dp: &[f32],
        rows: usize,
        c: usize,
        dx: &mut [f32],
    ) {
        let m = rows as f32;
        for (dxr, at) in dx.chunks_exact_mut(c).zip((0..).step_by(c)) {
            channel_blocks!(c, |ch, N| {
                let (xv, g): ([f32; N], [f32; N]) = (load(x, at + ch), load(dy, at + ch));
                let (mean, inv, gamma): ([f32; N], [f32; N], [f32; N]) =
                    (load(sv, ch), load(sv, c + ch), load(p, ch));
                let (dgamma, dbeta): ([f32; N], [f32; N]) = (load(dp, ch), load(dp, c + ch));
                let mut d = [0.0; N];
                for j in 0..N {
                    let xhat = (xv[j] - mean[j]) * inv[j];
                    let scale = gamma[j] * inv[j] / m;
                    d[j] = scale * (m * g[j] - dbeta[j] - xhat * dgamma[j]);
                }
                store(dxr, ch, d)
            })
        }
    }
}

pub(crate) fn add(ctx: &CpuCtx, x: &[f32], y: &mut [f32]) {
    let segs = par::segments(ctx, 1, x.len(), MIN_ELEMS_PER_TASK);
    let ys = split_ranges(y, segs.iter().map(|s| s.start..s.end));
    par::run(ctx, segs.iter().zip(ys), |(s, y)| {
        y.iter_mut()
            .zip(&x[s.start..s.end])
            .for_each(|(y, &x)| *y += x);
    });
}

pub(crate) fn augment(
    ctx: &CpuCtx,
    images: &Images,
    slots: &[AugmentSlot],
    steps: &[f32],
    x: &[f32],
    y: &mut [f32],
) {
    let i = *images;
    let len = i.image_len();
    let tasks = image_tasks_with(ctx, &i, len, y, len);
    par::run(ctx, tasks.into_iter(), |(range, out)| {
        for (t, dst) in range.zip(out.chunks_exact_mut(len)) {
            let (slot, img) = (t / i.n, t % i.n);
            let (dy, dx, flip) = slots[slot].draw(dropout_step(steps, slot), img as u64);
            let src = &x[t * len..(t + 1) * len];
            for r in 0..i.h {
                for c in 0..i.w {
                    let sr = r as isize + dy;
                    let sc = if flip { i.w - 1 - c } else { c } as isize + dx;
                    let d = &mut dst[(r * i.w + c) * i.c..][..i.c];
                    if sr < 0 || sc < 0 || sr >= i.h as isize || sc >= i.w as isize {
                        d.fill(0.0);
                    } else {
                        let at = (sr as usize * i.w + sc as usize) * i.c;
                        d.copy_from_slice(&src[at..at + i.c]);
                    }
                }
            }
        }
    });
}
