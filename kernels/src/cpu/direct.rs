//! Direct convolutions for images of few channels, read where they lie.
//!
//! Why: with 1-4 input channels (a net's first convolution) a patch row is
//! short and the patch matrix is most of the work: `im2col` writes it, then
//! `matrixmultiply` copies it again into packed panels. At stride 1 a
//! kernel row's patch entries for consecutive output pixels are consecutive
//! runs of one (zero-padded) input row, `in_c` apart, so each output row is
//! one product of the `kh` input rows under it, read in place (a strided
//! left operand of [`product`], in runs one row apart), with the weights.
//!
//! Work is split as in [`super::conv`]: whole images per task for the
//! output, fixed groups of images summed in order for the filter gradient,
//! so a slot's bits depend on neither the thread count nor the other slots.
//! The input's gradient stays on the patch path (a first convolution needs
//! none).

use std::ops::Range;

use super::CpuCtx;
use super::gemm_unpacked::{Strided, product};
use super::par;
use super::vector::add_assign;
use crate::ops::{Activation, Conv2d, ConvGemm, Pool2d};

/// Where the filter gradient reads the output's gradient: as given, or
/// made an image at a time, in cache, from the convolution's output `z`
/// and the gradient `dp` of its pooled activations (what
/// [`super::activation_pool::backward`] would write for the whole batch).
#[derive(Clone, Copy)]
pub(crate) enum OutputGrad<'a> {
    Given(&'a [f32]),
    ThroughPool {
        act: Activation,
        pool: &'a Pool2d,
        z: &'a [f32],
        dp: &'a [f32],
    },
}

/// Whether a convolution runs directly: stride 1, at most 4 input
/// channels, and a kernel row of at least 8 entries (`kw * in_c`).
/// Measured on the 2-core development machine, batch 64, against the patch
/// path: 5 x 5 on 3 channels at 32 x 32 (`cnn-32`'s first convolution),
/// 8 slots: the output 16.5-17.2 ms against 27, the filter gradient
/// 19.8-20.1 against 24; 3 x 3 on 3 channels, one slot: 1.14 against 1.56
/// and 1.29 against 1.51; 3 x 3 on 1 channel (rows of 3): 0.81-1.24
/// against 0.79, so short rows stay on patches.
pub(crate) fn pays(conv: &Conv2d) -> bool {
    conv.stride == 1 && conv.input.c <= 4 && conv.kw * conv.input.c >= 8
}

/// An image with `pad` zeros on every side, plus a trailing zero row and
/// a register block's rows more (what the filter gradient reads past a
/// kernel row's run, whatever the image's width).
fn padded(conv: &Conv2d, img: &[f32], out: &mut Vec<f32>) -> usize {
    let (i, p) = (conv.input, conv.pad);
    let row = (i.w + 2 * p) * i.c;
    out.clear();
    out.resize((i.h + 2 * p + 1) * row + 4, 0.0);
    for (y, src) in img.chunks_exact(i.w * i.c).enumerate() {
        out[(y + p) * row + p * i.c..][..i.w * i.c].copy_from_slice(src);
    }
    row
}

widest_fn! {
    /// The output of `images` of slot `s` into `out`, row by row.
    fn forward_chunk(
        op: &ConvGemm,
        x: &[f32],
        w: &[f32],
        s: usize,
        images: Range<usize>,
        out: &mut [f32],
    ) {
        let (conv, oc) = (&op.conv, op.out_c);
        let (i, oh, ow) = (conv.input, conv.out_h(), conv.out_w());
        let run = conv.kw * i.c;
        let w = &w[s * op.weight_stride..];
        let bias = op.bias.then(|| &w[conv.patch() * oc..][..oc]);
        let (mut img, mut pad) = (Vec::new(), Vec::new());
        for (n, dst) in images.zip(out.chunks_exact_mut(oh * ow * oc)) {
            let src = &x[s * i.slot_stride + n * i.image_len()..][..i.image_len()];
            let row = padded(conv, src, &mut img);
            for (oy, y) in dst.chunks_exact_mut(ow * oc).enumerate() {
                // One product over every kernel row: a pixel's patch is
                // `kh` runs of `kw * c` entries, one padded row apart.
                let a_op = Strided {
                    data: &img[oy * row..],
                    rs: i.c,
                    ks: 1,
                    runs: Some((run, row)),
                };
                let b = (&w[..conv.kh * run * oc], oc);
                product((ow, oc, conv.kh * run), a_op, b, (&mut *y, oc), false, &mut pad);
                if let Some(b) = bias {
                    for px in y.chunks_exact_mut(oc) {
                        add_assign(px, b);
                    }
                }
            }
        }
    }
}

/// `y = conv(x, w) (+ bias)` per slot, a few whole images per task.
pub(crate) fn conv2d(ctx: &CpuCtx, op: &ConvGemm, x: &[f32], w: &[f32], y: &mut [f32]) {
    let (conv, oc) = (&op.conv, op.out_c);
    let (i, per_image) = (conv.input, conv.out_h() * conv.out_w() * oc);
    let per_thread = i.n.div_ceil(ctx.threads().div_ceil(i.slots.max(1)).max(1));
    let tasks = super::conv::slot_chunks(&i, per_thread.clamp(1, 4));
    let outs = super::conv::chunk_outputs(y, &tasks, i.n, per_image);
    par::run(ctx, tasks.iter().zip(outs), |((s, images), out)| {
        forward_chunk(op, x, w, *s, images.clone(), out)
    });
}

widest_fn! {
    /// A group's weight gradient `part` (and the bias's) over `images` of
    /// slot `s`.
    ///
    /// Per image and kernel row `a`, one product: `dw[a][k][co]` sums
    /// `img[oy + a][x * c + k] * dy[oy][x][co]` over the pixels of every
    /// row, taken `wide` (the padded width) to a row so that the left
    /// operand is the padded image read at one stride; `dy` is widened to
    /// match with zeros. A kernel row's `kw * c` entries are rounded up to
    /// whole register blocks of 4, reading up to 3 entries past the run
    /// (the trailing zeros keep that inside the buffer); those rows of the
    /// sum are dropped.
    fn filter_grad_group(
        op: &ConvGemm,
        x: &[f32],
        dy: OutputGrad<'_>,
        s: usize,
        images: Range<usize>,
        part: &mut [f32],
    ) {
        let (conv, oc) = (&op.conv, op.out_c);
        let (i, oh, ow) = (conv.input, conv.out_h(), conv.out_w());
        let (run, wide) = (conv.kw * i.c, ow + conv.kw - 1);
        let rows = run.next_multiple_of(4);
        let (mut img, mut dyp, mut pad) = (Vec::new(), vec![0.0f32; oh * wide * oc], Vec::new());
        let mut sums = vec![0.0f32; conv.kh * rows * oc];
        let mut made = match dy {
            OutputGrad::Given(_) => Vec::new(),
            OutputGrad::ThroughPool { .. } => vec![0.0f32; oh * ow * oc],
        };
        if op.bias {
            part[conv.patch() * oc..][..oc].fill(0.0);
        }
        for (k, n) in images.clone().enumerate() {
            let src = &x[s * i.slot_stride + n * i.image_len()..][..i.image_len()];
            let row = padded(conv, src, &mut img);
            let t = s * i.n + n;
            let dyi = match dy {
                OutputGrad::Given(dy) => &dy[t * oh * ow * oc..][..oh * ow * oc],
                OutputGrad::ThroughPool { act, pool, z, dp } => {
                    super::activation_pool::backward_images(act, pool, z, dp, t..t + 1, &mut made);
                    &made[..]
                }
            };
            for (dst, g) in dyp.chunks_exact_mut(wide * oc).zip(dyi.chunks_exact(ow * oc)) {
                dst[..ow * oc].copy_from_slice(g);
            }
            // The bias's gradient: the output gradient's column sums, image
            // by image and pixel by pixel.
            if op.bias {
                let db = &mut part[conv.patch() * oc..][..oc];
                for g in dyi.chunks_exact(oc) {
                    add_assign(db, g);
                }
            }
            for (a, sum) in sums.chunks_exact_mut(rows * oc).enumerate() {
                let a_op = Strided {
                    data: &img[a * row..],
                    rs: 1,
                    ks: i.c,
                    runs: None,
                };
                product((rows, oc, oh * wide), a_op, (&dyp, oc), (sum, oc), k > 0, &mut pad);
            }
        }
        for (dst, sum) in part.chunks_exact_mut(run * oc).zip(sums.chunks_exact(rows * oc)).take(conv.kh) {
            dst.copy_from_slice(&sum[..run * oc]);
        }
    }
}

/// `dw = conv_w^T(x, dy)` per slot (overwritten; with a bias, its
/// gradient after the weights), over fixed groups of images added in order.
pub(crate) fn conv2d_filter_grad(
    ctx: &CpuCtx,
    op: &ConvGemm,
    x: &[f32],
    dy: OutputGrad<'_>,
    dw: &mut [f32],
) {
    super::conv::sum_over_image_groups(ctx, op, 1, dw, |s, images, part| {
        filter_grad_group(op, x, dy, s, images, part)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::conv::square_conv as conv;

    #[test]
    fn direct_only_where_it_measured_faster() {
        assert!(pays(&conv(3, 5, 1)));
        assert!(pays(&conv(3, 3, 1)));
        assert!(pays(&conv(2, 5, 1)));
        // Rows too short, too many channels, or strided.
        assert!(!pays(&conv(1, 3, 1)));
        assert!(!pays(&conv(1, 5, 1)));
        assert!(!pays(&conv(8, 5, 1)));
        assert!(!pays(&conv(3, 5, 2)));
    }
}
