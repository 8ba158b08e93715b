//! The convolutional ops (im2col and col2im, pooling, batch norm, residual
//! addition) against float64 references and finite differences, and their
//! batched form against single-slot calls, bit for bit. Each body runs on
//! every backend present (`kernels::device_tests!`).

mod common;

use common::*;
use kernels::*;

type D<B> = Dev<B>;
/// One op run over `slots` slots of the given input, its outputs slot-major.
type SlotRun<'a, B> = &'a dyn Fn(&mut D<B>, usize, &<B as Backend>::Buf) -> Vec<f32>;

/// f64 reference convolution of NHWC images `x` (`n x h x w x c`) with
/// weights `w` (`(kh, kw, c) x oc`, row-major): NHWC output.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f64],
    w: &[f64],
    (n, h, wd, c): (usize, usize, usize, usize),
    k: usize,
    stride: usize,
    pad: usize,
    oc: usize,
) -> Vec<f64> {
    let oh = (h + 2 * pad - k) / stride + 1;
    let ow = (wd + 2 * pad - k) / stride + 1;
    let mut y = vec![0.0; n * oh * ow * oc];
    for img in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for o in 0..oc {
                    let mut acc = 0.0;
                    for ki in 0..k {
                        for kj in 0..k {
                            let iy = (oy * stride + ki) as isize - pad as isize;
                            let ix = (ox * stride + kj) as isize - pad as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                continue;
                            }
                            for ci in 0..c {
                                let xv = x[((img * h + iy as usize) * wd + ix as usize) * c + ci];
                                acc += xv * w[((ki * k + kj) * c + ci) * oc + o];
                            }
                        }
                    }
                    y[((img * oh + oy) * ow + ox) * oc + o] = acc;
                }
            }
        }
    }
    y
}

/// f64 reference pooling without padding.
fn pool_ref(x: &[f64], (n, h, w, c): (usize, usize, usize, usize), p: &Pool2d) -> Vec<f64> {
    let (oh, ow) = (p.out_h(), p.out_w());
    let mut y = vec![0.0; n * oh * ow * c];
    for img in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for ci in 0..c {
                    let vals = (0..p.kh).flat_map(|ki| {
                        (0..p.kw).map(move |kj| {
                            x[((img * h + oy * p.stride + ki) * w + ox * p.stride + kj) * c + ci]
                        })
                    });
                    y[((img * oh + oy) * ow + ox) * c + ci] = match p.kind {
                        PoolKind::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                        PoolKind::Avg => vals.sum::<f64>() / (p.kh * p.kw) as f64,
                    };
                }
            }
        }
    }
    y
}

/// f64 reference batch norm of one slot in training: `(y, mean, biased var)`.
fn bn_ref(
    x: &[f64],
    rows: usize,
    c: usize,
    gb: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mean: Vec<f64> = (0..c)
        .map(|ch| (0..rows).map(|r| x[r * c + ch]).sum::<f64>() / rows as f64)
        .collect();
    let var: Vec<f64> = (0..c)
        .map(|ch| {
            (0..rows)
                .map(|r| (x[r * c + ch] - mean[ch]).powi(2))
                .sum::<f64>()
                / rows as f64
        })
        .collect();
    let y = (0..rows * c)
        .map(|i| {
            let ch = i % c;
            gb[ch] * (x[i] - mean[ch]) / (var[ch] + eps).sqrt() + gb[c + ch]
        })
        .collect();
    (y, mean, var)
}

fn dot(a: &[f64], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(a, &b)| a * b as f64).sum()
}

/// (n, h, w, c, kernel, stride, pad, out channels).
type ConvCase = (usize, usize, usize, usize, usize, usize, usize, usize);

const CONVS: [ConvCase; 4] = [
    (2, 5, 6, 3, 3, 1, 1, 4),
    (3, 7, 7, 2, 5, 2, 2, 3),
    (1, 4, 4, 1, 3, 1, 0, 2),
    (2, 6, 5, 4, 1, 2, 0, 3),
];

fn conv_of(
    slots: usize,
    (n, h, w, c, k, stride, pad): (usize, usize, usize, usize, usize, usize, usize),
    slot_stride: usize,
) -> Conv2d {
    Conv2d {
        input: Images {
            slots,
            n,
            h,
            w,
            c,
            slot_stride,
        },
        kh: k,
        kw: k,
        stride,
        pad,
    }
}

/// im2col then a batched GEMM equals the direct convolution, per slot,
/// with a gap between slots' images and with one batch shared by all.
fn conv_forward_matches_reference<B: Backend>(d: &mut D<B>) {
    for (case, &(n, h, w, c, k, stride, pad, oc)) in CONVS.iter().enumerate() {
        for shared in [false, true] {
            let slots = 2;
            let per = n * h * w * c;
            let ss = if shared { 0 } else { per + 7 };
            let conv = conv_of(slots, (n, h, w, c, k, stride, pad), ss);
            let x = rand_vec(ss * (slots - 1) + per, 10 + case as u64, 1.0);
            let (patch, rows) = (conv.patch(), conv.out_rows());
            let wts = rand_vec(slots * patch * oc, 20 + case as u64, 1.0);
            let (xb, wb) = (d.put(&x), d.put(&wts));
            let mut cols = d.zeros(conv.cols_len());
            d.b.im2col(&mut d.ctx, &conv, at(&xb, 0), at_mut(&mut cols, 0))
                .unwrap();
            let mut y = d.zeros(slots * rows * oc);
            let g = Gemm::new(rows, oc, patch).batched(slots, rows * patch, patch * oc, rows * oc);
            d.b.gemm(&mut d.ctx, &g, at(&cols, 0), at(&wb, 0), at_mut(&mut y, 0))
                .unwrap();
            let got = d.get(&y);
            for s in 0..slots {
                let want = conv_ref(
                    &to64(&x[s * ss..s * ss + per]),
                    &to64(&wts[s * patch * oc..(s + 1) * patch * oc]),
                    (n, h, w, c),
                    k,
                    stride,
                    pad,
                    oc,
                );
                assert_close(
                    &format!("conv case {case} shared={shared} slot {s}"),
                    &got[s * rows * oc..(s + 1) * rows * oc],
                    &want,
                    1e-5,
                );
            }
        }
    }
}

/// The input and weight gradients (col2im of dY W^T, and cols^T dY) against
/// finite differences of L = sum(G * conv(x, W)); col2im with `accumulate`
/// adds onto what is there.
fn conv_backward_finite_differences<B: Backend>(d: &mut D<B>) {
    for (case, &(n, h, w, c, k, stride, pad, oc)) in CONVS.iter().enumerate() {
        let conv = conv_of(1, (n, h, w, c, k, stride, pad), n * h * w * c);
        let (patch, rows) = (conv.patch(), conv.out_rows());
        let x = rand_vec(n * h * w * c, 30 + case as u64, 1.0);
        let wts = rand_vec(patch * oc, 40 + case as u64, 1.0);
        let gy = rand_vec(rows * oc, 50 + case as u64, 1.0);
        let (x64, w64) = (to64(&x), to64(&wts));
        let loss =
            |x: &[f64], wt: &[f64]| dot(&conv_ref(x, wt, (n, h, w, c), k, stride, pad, oc), &gy);
        let (xb, wb, gb) = (d.put(&x), d.put(&wts), d.put(&gy));
        let mut cols = d.zeros(conv.cols_len());
        d.b.im2col(&mut d.ctx, &conv, at(&xb, 0), at_mut(&mut cols, 0))
            .unwrap();
        let mut dw = d.zeros(patch * oc);
        let gw = Gemm::new(patch, oc, rows).trans_a();
        d.b.gemm(
            &mut d.ctx,
            &gw,
            at(&cols, 0),
            at(&gb, 0),
            at_mut(&mut dw, 0),
        )
        .unwrap();
        let gx = Gemm::new(rows, patch, oc).trans_b();
        d.b.gemm(
            &mut d.ctx,
            &gx,
            at(&gb, 0),
            at(&wb, 0),
            at_mut(&mut cols, 0),
        )
        .unwrap();
        let base = rand_vec(n * h * w * c, 60, 1.0);
        let mut dx = d.put(&base);
        d.b.col2im(&mut d.ctx, &conv, at(&cols, 0), at_mut(&mut dx, 0), false)
            .unwrap();
        let want_dx = numeric_grad(|v| loss(v, &w64), &x64);
        assert_close(&format!("conv {case} dx"), &d.get(&dx), &want_dx, 1e-5);
        let mut acc = d.put(&base);
        d.b.col2im(&mut d.ctx, &conv, at(&cols, 0), at_mut(&mut acc, 0), true)
            .unwrap();
        let want_acc: Vec<f64> = want_dx
            .iter()
            .zip(&base)
            .map(|(g, &b)| g + b as f64)
            .collect();
        assert_close(
            &format!("conv {case} dx accumulated"),
            &d.get(&acc),
            &want_acc,
            1e-5,
        );
        let want_dw = numeric_grad(|v| loss(&x64, v), &w64);
        assert_close(&format!("conv {case} dW"), &d.get(&dw), &want_dw, 1e-5);
    }
}

/// f64 reference gradients of `sum(gy * conv(x, w))`: `(dx, dw)`.
#[allow(clippy::too_many_arguments)]
fn conv_grads_ref(
    x: &[f64],
    w: &[f64],
    gy: &[f64],
    (n, h, wd, c): (usize, usize, usize, usize),
    k: usize,
    stride: usize,
    pad: usize,
    oc: usize,
) -> (Vec<f64>, Vec<f64>) {
    let oh = (h + 2 * pad - k) / stride + 1;
    let ow = (wd + 2 * pad - k) / stride + 1;
    let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; w.len()]);
    for img in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                let g = &gy[((img * oh + oy) * ow + ox) * oc..][..oc];
                for ki in 0..k {
                    for kj in 0..k {
                        let iy = (oy * stride + ki) as isize - pad as isize;
                        let ix = (ox * stride + kj) as isize - pad as isize;
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                            continue;
                        }
                        for ci in 0..c {
                            let xi = ((img * h + iy as usize) * wd + ix as usize) * c + ci;
                            let wi = ((ki * k + kj) * c + ci) * oc;
                            for (o, &go) in g.iter().enumerate() {
                                dx[xi] += go * w[wi + o];
                                dw[wi + o] += go * x[xi];
                            }
                        }
                    }
                }
            }
        }
    }
    (dx, dw)
}

/// `conv2d`, then its weights' and its input's gradients (`data`: the
/// latter's op, whose input is packed), into a `dw` and a `dx` that held
/// `dw0` and `dx0`: `[y, dw, dx]`.
fn conv_ops<B: Backend>(
    d: &mut D<B>,
    (op, data): (&ConvGemm, &ConvGemm),
    (x, w, gy): (&B::Buf, &B::Buf, &B::Buf),
    (dw0, dx0): (&[f32], &[f32]),
) -> [Vec<f32>; 3] {
    let (mut cols, mut y) = (d.zeros(op.conv.cols_len()), d.zeros(op.out_len()));
    let (mut dw, mut dx) = (d.put(dw0), d.put(dx0));
    d.b.conv2d(
        &mut d.ctx,
        op,
        at(x, 0),
        at(w, 0),
        at_mut(&mut cols, 0),
        at_mut(&mut y, 0),
    )
    .unwrap();
    d.b.conv2d_filter_grad(
        &mut d.ctx,
        op,
        at(x, 0),
        at(gy, 0),
        at_mut(&mut cols, 0),
        at_mut(&mut dw, 0),
    )
    .unwrap();
    d.b.conv2d_data_grad(
        &mut d.ctx,
        data,
        at(gy, 0),
        at(w, 0),
        at_mut(&mut cols, 0),
        at_mut(&mut dx, 0),
    )
    .unwrap();
    [d.get(&y), d.get(&dw), d.get(&dx)]
}

/// The convolution ops (`conv2d` and its two gradients) against float64
/// references, over two slots whose images and weights lie apart with
/// gaps, on shapes whose patches a backend may cut into many chunks
/// (10 images of 460 KB of patches each) or few (19 small images). The
/// weight gradient overwrites what was there; the input gradient
/// overwrites it or adds to it.
fn conv_ops_match_reference<B: Backend>(d: &mut D<B>) {
    let cases: Vec<ConvCase> = CONVS
        .iter()
        .copied()
        .chain([(10, 24, 24, 8, 5, 1, 2, 6), (19, 8, 8, 3, 3, 1, 1, 5)])
        // Shapes the CPU runs as Winograd tiles (5 x 5, 16+ channels each
        // side): tiles cut by the image's edge, channels that are not a
        // whole number of vectors, no padding, and one pixel of it; then
        // directly (few channels, stride 1), padded or not.
        .chain([
            (3, 9, 10, 3, 5, 1, 2, 7),
            (2, 8, 7, 2, 5, 1, 0, 5),
            (2, 9, 11, 17, 5, 1, 2, 18),
            (3, 8, 8, 16, 5, 1, 0, 16),
            (2, 6, 7, 20, 5, 1, 1, 33),
        ])
        .collect();
    let with_bias = cases
        .iter()
        .enumerate()
        .flat_map(|c| [(c, false), (c, true)]);
    for ((case, &(n, h, w, c, k, stride, pad, oc)), bias) in with_bias {
        let slots = 2;
        let per = n * h * w * c;
        let conv = conv_of(slots, (n, h, w, c, k, stride, pad), per + 7);
        let (patch, rows) = (conv.patch(), conv.out_rows());
        let mut op = ConvGemm {
            conv,
            out_c: oc,
            weight_stride: 0,
            precision: Precision::Fp32,
            accumulate_dx: false,
            bias,
        };
        op.weight_stride = op.weights_len() + 5;
        let seed = 200 + 10 * case as u64 + u64::from(bias);
        let x = rand_vec((per + 7) * slots, seed, 1.0);
        let wts = rand_vec(op.weight_stride * slots, seed + 1, 1.0);
        let gy = rand_vec(op.out_len(), seed + 2, 1.0);
        let base = rand_vec(slots * per, seed + 3, 1.0);
        let (xb, wb, gb) = (d.put(&x), d.put(&wts), d.put(&gy));
        let dw0 = vec![7.0; op.weight_stride * slots];
        let (mut y, mut dw, mut dxs) = (Vec::new(), Vec::new(), Vec::new());
        for accumulate_dx in [false, true] {
            let data = ConvGemm {
                conv: conv_of(slots, (n, h, w, c, k, stride, pad), per),
                accumulate_dx,
                ..op
            };
            let [yy, dww, dx] = conv_ops(d, (&op, &data), (&xb, &wb, &gb), (&dw0, &base));
            (y, dw) = (yy, dww);
            dxs.push(dx);
        }
        for s in 0..slots {
            let xs = to64(&x[s * (per + 7)..][..per]);
            let ws = to64(&wts[s * op.weight_stride..][..patch * oc]);
            let gs = to64(&gy[s * rows * oc..][..rows * oc]);
            let dims = (n, h, w, c);
            let mut want_y = conv_ref(&xs, &ws, dims, k, stride, pad, oc);
            let (want_dx, mut want_dw) = conv_grads_ref(&xs, &ws, &gs, dims, k, stride, pad, oc);
            if bias {
                // The bias: added to every output row; its gradient is
                // the output gradient's column sums, after the weights'.
                let b = to64(&wts[s * op.weight_stride + patch * oc..][..oc]);
                want_y
                    .chunks_exact_mut(oc)
                    .for_each(|r| r.iter_mut().zip(&b).for_each(|(y, b)| *y += b));
                let mut db = vec![0.0; oc];
                gs.chunks_exact(oc)
                    .for_each(|r| db.iter_mut().zip(r).for_each(|(d, g)| *d += g));
                want_dw.extend(db);
            }
            let what = |t: &str| format!("conv case {case} bias {bias} slot {s} {t}");
            assert_close(&what("y"), &y[s * rows * oc..][..rows * oc], &want_y, 1e-5);
            let dws = &dw[s * op.weight_stride..][..op.weight_stride];
            assert_close(&what("dw"), &dws[..op.weights_len()], &want_dw, 1e-5);
            assert_eq!(dws[op.weights_len()..], [7.0; 5], "{}", what("dw's gap"));
            assert_close(&what("dx"), &dxs[0][s * per..][..per], &want_dx, 1e-5);
            let want_acc: Vec<f64> = want_dx
                .iter()
                .zip(&base[s * per..][..per])
                .map(|(g, &b)| g + b as f64)
                .collect();
            assert_close(
                &what("dx accumulated"),
                &dxs[1][s * per..][..per],
                &want_acc,
                1e-5,
            );
        }
    }
}

fn pools() -> Vec<(PoolKind, usize, usize, usize, usize)> {
    // (kind, h, w, window, stride); the last of each kind is global.
    let mut v = Vec::new();
    for kind in [PoolKind::Max, PoolKind::Avg] {
        v.extend([
            (kind, 6, 6, 2, 2),
            (kind, 7, 5, 3, 2),
            (kind, 5, 4, 2, 1),
            (kind, 4, 3, 0, 1),
        ]);
    }
    v
}

fn pool_of(
    slots: usize,
    n: usize,
    c: usize,
    slot_stride: usize,
    (kind, h, w, k, stride): (PoolKind, usize, usize, usize, usize),
) -> Pool2d {
    let (kh, kw) = if k == 0 { (h, w) } else { (k, k) };
    Pool2d {
        input: Images {
            slots,
            n,
            h,
            w,
            c,
            slot_stride,
        },
        kind,
        kh,
        kw,
        stride,
    }
}

/// Max and average pooling (overlapping, non-square and global windows)
/// against a float64 reference, and their gradients against finite
/// differences of L = sum(G * pool(x)).
fn pooling_forward_and_finite_differences<B: Backend>(d: &mut D<B>) {
    // 19 channels: a whole vector and a tail, where the CPU works by vectors.
    let (n, c) = (2, 19);
    for (case, geom) in pools().into_iter().enumerate() {
        let (h, w) = (geom.1, geom.2);
        let p = pool_of(1, n, c, n * h * w * c, geom);
        let x = rand_vec(n * h * w * c, 70 + case as u64, 1.0);
        let out = p.output().len();
        let gy = rand_vec(out, 80 + case as u64, 1.0);
        let (xb, gb) = (d.put(&x), d.put(&gy));
        let mut y = d.zeros(out);
        d.b.pool2d(&mut d.ctx, &p, at(&xb, 0), at_mut(&mut y, 0))
            .unwrap();
        let want = pool_ref(&to64(&x), (n, h, w, c), &p);
        assert_close(&format!("pool {case} {geom:?}"), &d.get(&y), &want, 1e-6);
        let mut dx = d.put(&rand_vec(n * h * w * c, 1, 1.0));
        d.b.pool2d_backward(&mut d.ctx, &p, at(&xb, 0), at(&gb, 0), at_mut(&mut dx, 0))
            .unwrap();
        let want = numeric_grad(|v| dot(&pool_ref(v, (n, h, w, c), &p), &gy), &to64(&x));
        assert_close(
            &format!("pool {case} {geom:?} dx"),
            &d.get(&dx),
            &want,
            1e-5,
        );
    }
}

/// Max pooling passes the gradient to the first largest input of a window,
/// as PyTorch does, when values tie: with one channel, and with 17 (a
/// whole vector of channels and one more) holding the same windows.
fn max_pool_ties_go_to_the_first<B: Backend>(d: &mut D<B>) {
    // A NaN is the window's maximum (it propagates), the first NaN taking
    // the gradient; +0 and -0 tie.
    let windows = [
        ([1.0, 3.0, 3.0, 2.0], [0.0, 5.0, 0.0, 0.0]),
        ([2.0, f32::NAN, 5.0, f32::NAN], [0.0, 5.0, 0.0, 0.0]),
        ([-0.0, 0.0, -1.0, 0.0], [5.0, 0.0, 0.0, 0.0]),
    ];
    for c in [1, 17] {
        let p = pool_of(1, 1, c, 4 * c, (PoolKind::Max, 2, 2, 2, 2));
        let per_channel =
            |v: [f32; 4]| -> Vec<f32> { v.iter().flat_map(|&v| vec![v; c]).collect() };
        let gb = d.put(&vec![5.0; c]);
        let mut dx = d.zeros(4 * c);
        for (x, want) in windows {
            let xb = d.put(&per_channel(x));
            d.b.pool2d_backward(&mut d.ctx, &p, at(&xb, 0), at(&gb, 0), at_mut(&mut dx, 0))
                .unwrap();
            let want: Vec<f32> = per_channel(want);
            assert_eq!(d.get(&dx), want, "window {x:?}, {c} channels");
        }
    }
}

/// Whether the backend offers the pooled-activation ops, given what a
/// call of one returned: where it does not, the call must say so.
fn offered<B: Backend>(d: &D<B>, called: kernels::Result<()>) -> bool {
    if d.b.pools_activations() {
        called.unwrap();
        return true;
    }
    assert!(
        matches!(called, Err(KernelError::Unsupported { .. })),
        "{called:?}"
    );
    false
}

/// Pooling an activation as it is read (where the backend offers it) gives
/// the bits of the activation then the pooling, forward and backward, for
/// every activation and both kinds, with ties (ReLU's zeros, repeated
/// values), NaNs, channels past a vector and slots with gaps; windows that
/// do not tile are refused. A backend without it says so.
fn activation_pool_equals_the_two_ops<B: Backend>(d: &mut D<B>) {
    let tiled = pool_of(1, 1, 1, 16, (PoolKind::Max, 4, 4, 2, 2));
    let (xb, mut y) = (d.put(&[0.0; 16]), d.zeros(4));
    let fused = d.b.activation_pool2d(
        &mut d.ctx,
        Activation::Relu,
        &tiled,
        at(&xb, 0),
        at_mut(&mut y, 0),
    );
    if !offered(d, fused) {
        return;
    }
    let (slots, n, c) = (2, 3, 19);
    for (h, w, k) in [(4, 6, 2), (6, 6, 3), (2, 2, 2)] {
        let per = n * h * w * c;
        let stride = per + 5;
        for kind in [PoolKind::Max, PoolKind::Avg] {
            let p = pool_of(slots, n, c, stride, (kind, h, w, k, k));
            assert!(p.tiles());
            // Quarter steps repeat, so windows hold ties; some NaNs.
            let mut x: Vec<f32> = rand_vec(slots * stride, 40 + h as u64, 2.0)
                .iter()
                .map(|v| (v * 4.0).round() / 4.0)
                .collect();
            for i in (7..x.len()).step_by(97) {
                x[i] = f32::NAN;
            }
            let mut g = rand_vec(p.output().len(), 41, 1.0);
            // The unfused average adds onto zeros, where -0 becomes 0.
            g[3] = -0.0;
            let (xb, gb) = (d.put(&x), d.put(&g));
            for act in Activation::ALL {
                let case = format!("{} {kind:?} {h}x{w} window {k}", act.name());
                let op = ActivationOp {
                    activation: act,
                    n: slots * stride,
                };
                let mut a = d.zeros(slots * stride);
                d.b.activation(&mut d.ctx, op, at(&xb, 0), at_mut(&mut a, 0))
                    .unwrap();
                let mut want = d.zeros(p.output().len());
                d.b.pool2d(&mut d.ctx, &p, at(&a, 0), at_mut(&mut want, 0))
                    .unwrap();
                let mut got = d.zeros(p.output().len());
                d.b.activation_pool2d(&mut d.ctx, act, &p, at(&xb, 0), at_mut(&mut got, 0))
                    .unwrap();
                let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(d.get(&got)), bits(d.get(&want)), "{case}: forward");

                // Unfused: the pooling's gradient into packed images, then
                // the activation's over the same packed pixels.
                let packed = p.input.len();
                let mut da = d.zeros(packed);
                let pa = Pool2d {
                    input: Images {
                        slot_stride: n * h * w * c,
                        ..p.input
                    },
                    ..p
                };
                let xp: Vec<f32> = (0..slots)
                    .flat_map(|s| x[s * stride..][..per].to_vec())
                    .collect();
                let (xpb, mut ap) = (d.put(&xp), d.zeros(packed));
                let opp = ActivationOp {
                    activation: act,
                    n: packed,
                };
                d.b.activation(&mut d.ctx, opp, at(&xpb, 0), at_mut(&mut ap, 0))
                    .unwrap();
                d.b.pool2d_backward(&mut d.ctx, &pa, at(&ap, 0), at(&gb, 0), at_mut(&mut da, 0))
                    .unwrap();
                let mut want = d.zeros(packed);
                d.b.activation_backward(
                    &mut d.ctx,
                    opp,
                    at(&xpb, 0),
                    at(&ap, 0),
                    at(&da, 0),
                    at_mut(&mut want, 0),
                )
                .unwrap();
                let mut got = d.zeros(packed);
                d.b.activation_pool2d_backward(
                    &mut d.ctx,
                    act,
                    &p,
                    at(&xb, 0),
                    at(&gb, 0),
                    at_mut(&mut got, 0),
                )
                .unwrap();
                assert_eq!(bits(d.get(&got)), bits(d.get(&want)), "{case}: backward");
            }
        }
    }
    // Overlapping windows, and a size the windows leave a row of.
    for geom in [(PoolKind::Max, 5, 5, 3, 2), (PoolKind::Avg, 5, 4, 2, 2)] {
        let p = pool_of(1, 1, 1, 25, geom);
        let err =
            d.b.activation_pool2d(
                &mut d.ctx,
                Activation::Relu,
                &p,
                at(&xb, 0),
                at_mut(&mut y, 0),
            )
            .unwrap_err();
        assert!(err.to_string().contains("do not tile"), "{err}");
    }
}

/// A convolution's filter gradient through its pooled activations gives
/// the bits of the pooling's gradient then the filter gradient: a first
/// convolution of 3 channels (the CPU's direct form, which makes the
/// output's gradient an image at a time) and one of 16 (made whole), with
/// a bias, two slots and a gap between their images. A backend without it
/// says so.
fn filter_grad_through_pool_equals_the_two_ops<B: Backend>(d: &mut D<B>) {
    for (c, k, oc, act) in [
        (3, 5, 20, Activation::Relu),
        (3, 3, 16, Activation::Tanh),
        (16, 3, 16, Activation::Relu),
    ] {
        let (slots, n, h, w) = (2, 5, 8, 6);
        let per = n * h * w * c;
        let conv = conv_of(slots, (n, h, w, c, k, 1, k / 2), per + 7);
        let op = ConvGemm {
            conv,
            out_c: oc,
            weight_stride: (conv.patch() + 1) * oc + 3,
            precision: Precision::Fp32,
            accumulate_dx: false,
            bias: true,
        };
        let pool = Pool2d {
            input: Images::packed(slots, n, h, w, oc),
            kind: PoolKind::Max,
            kh: 2,
            kw: 2,
            stride: 2,
        };
        let x = d.put(&rand_vec(slots * (per + 7), 60 + c as u64, 1.0));
        let z = d.put(&rand_vec(op.out_len(), 61, 1.0));
        let dp = d.put(&rand_vec(pool.output().len(), 62, 1.0));
        let mut cols = d.zeros(op.conv.cols_len().max(1));
        let mut got = d.zeros(slots * op.weight_stride);
        let fused = d.b.conv2d_filter_grad_through_pool(
            &mut d.ctx,
            &op,
            act,
            &pool,
            at(&x, 0),
            at(&z, 0),
            at(&dp, 0),
            at_mut(&mut cols, 0),
            at_mut(&mut got, 0),
        );
        if !offered(d, fused) {
            return;
        }
        let mut dy = d.zeros(op.out_len());
        d.b.activation_pool2d_backward(
            &mut d.ctx,
            act,
            &pool,
            at(&z, 0),
            at(&dp, 0),
            at_mut(&mut dy, 0),
        )
        .unwrap();
        let mut want = d.zeros(slots * op.weight_stride);
        d.b.conv2d_filter_grad(
            &mut d.ctx,
            &op,
            at(&x, 0),
            at(&dy, 0),
            at_mut(&mut cols, 0),
            at_mut(&mut want, 0),
        )
        .unwrap();
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(d.get(&got)),
            bits(d.get(&want)),
            "{c} channels, {k}x{k}"
        );
    }
    // A pooling of some other images than the convolution's output.
    let conv = conv_of(1, (1, 4, 4, 3, 3, 1, 1), 48);
    let op = ConvGemm {
        conv,
        out_c: 8,
        weight_stride: 28 * 8,
        precision: Precision::Fp32,
        accumulate_dx: false,
        bias: true,
    };
    let pool = pool_of(1, 1, 4, 64, (PoolKind::Max, 4, 4, 2, 2));
    let (x, mut cols, mut dw) = (
        d.put(&[0.0; 48]),
        d.zeros(op.conv.cols_len()),
        d.zeros(28 * 8),
    );
    let (z, dp) = (d.zeros(128), d.zeros(32));
    let err =
        d.b.conv2d_filter_grad_through_pool(
            &mut d.ctx,
            &op,
            Activation::Relu,
            &pool,
            at(&x, 0),
            at(&z, 0),
            at(&dp, 0),
            at_mut(&mut cols, 0),
            at_mut(&mut dw, 0),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("convolution's packed output"),
        "{err}"
    );
}

/// Batch norm in training against float64 (output, saved statistics and the
/// running update), in evaluation from the running statistics, and its
/// three gradients against finite differences; more than 32 channels cross
/// a CUDA block.
fn batch_norm_matches_reference_and_finite_differences<B: Backend>(d: &mut D<B>) {
    for (case, &(rows, c)) in [(10usize, 3usize), (7, 40)].iter().enumerate() {
        let slots = 2;
        let (ps, rs) = (2 * c + 5, 2 * c + 3);
        let bn = BatchNorm {
            shape: Batched::new(slots, rows, c),
            param_stride: ps,
            running_stride: rs,
            momentum: 0.1,
            eps: 1e-5,
        };
        let x: Vec<f32> = rand_vec(slots * rows * c, 90 + case as u64, 2.0)
            .iter()
            .enumerate()
            .map(|(i, v)| v + (i % c) as f32 * 0.3)
            .collect();
        let mut params = rand_vec(slots * ps, 91, 1.0);
        params.iter_mut().step_by(2).for_each(|g| *g += 1.5);
        let running0: Vec<f32> = (0..slots * rs)
            .map(|i| 0.5 + (i % 7) as f32 * 0.1)
            .collect();
        let gy = rand_vec(slots * rows * c, 92 + case as u64, 1.0);
        let (xb, pb, gb) = (d.put(&x), d.put(&params), d.put(&gy));
        let mut running = d.put(&running0);
        let (mut saved, mut y) = (d.zeros(bn.saved_len()), d.zeros(slots * rows * c));
        d.b.batch_norm_train(
            &mut d.ctx,
            &bn,
            at(&xb, 0),
            at(&pb, 0),
            at_mut(&mut running, 0),
            at_mut(&mut saved, 0),
            at_mut(&mut y, 0),
        )
        .unwrap();
        let (yv, sv, rv) = (d.get(&y), d.get(&saved), d.get(&running));
        let (mut dx, mut dp) = (d.zeros(slots * rows * c), d.put(&vec![7.0; slots * ps]));
        d.b.batch_norm_backward(
            &mut d.ctx,
            &bn,
            at(&xb, 0),
            at(&pb, 0),
            at(&saved, 0),
            at(&gb, 0),
            at_mut(&mut dx, 0),
            at_mut(&mut dp, 0),
        )
        .unwrap();
        let (dxv, dpv) = (d.get(&dx), d.get(&dp));
        let mut ye = d.zeros(slots * rows * c);
        d.b.batch_norm_eval(
            &mut d.ctx,
            &bn,
            at(&xb, 0),
            at(&pb, 0),
            at(&running, 0),
            at_mut(&mut ye, 0),
        )
        .unwrap();
        let yev = d.get(&ye);
        for s in 0..slots {
            let what = format!("bn case {case} slot {s}");
            let xs = to64(&x[s * rows * c..(s + 1) * rows * c]);
            let gbv = to64(&params[s * ps..s * ps + 2 * c]);
            let g = &gy[s * rows * c..(s + 1) * rows * c];
            let (want, mean, var) = bn_ref(&xs, rows, c, &gbv, 1e-5);
            let span = s * rows * c..(s + 1) * rows * c;
            assert_close(&format!("{what} y"), &yv[span.clone()], &want, 1e-5);
            let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + 1e-5f64).sqrt()).collect();
            let saved_want: Vec<f64> = mean.iter().chain(&inv).copied().collect();
            assert_close(
                &format!("{what} saved"),
                &sv[s * 2 * c..(s + 1) * 2 * c],
                &saved_want,
                1e-5,
            );
            let r0 = &running0[s * rs..s * rs + 2 * c];
            let run_want: Vec<f64> = (0..2 * c)
                .map(|i| {
                    let batch = if i < c {
                        mean[i]
                    } else {
                        var[i - c] * rows as f64 / (rows - 1) as f64
                    };
                    0.9 * r0[i] as f64 + 0.1 * batch
                })
                .collect();
            assert_close(
                &format!("{what} running"),
                &rv[s * rs..s * rs + 2 * c],
                &run_want,
                1e-5,
            );
            assert_eq!(
                &rv[s * rs + 2 * c..(s + 1) * rs],
                &running0[s * rs + 2 * c..(s + 1) * rs],
                "{what}: past the running stats"
            );
            let rm = &rv[s * rs..s * rs + 2 * c];
            let eval_want: Vec<f64> = (0..rows * c)
                .map(|i| {
                    let ch = i % c;
                    gbv[ch] * (xs[i] - rm[ch] as f64) / (rm[c + ch] as f64 + 1e-5).sqrt()
                        + gbv[c + ch]
                })
                .collect();
            assert_close(
                &format!("{what} eval"),
                &yev[span.clone()],
                &eval_want,
                1e-5,
            );
            let loss = |xv: &[f64], p: &[f64]| dot(&bn_ref(xv, rows, c, p, 1e-5).0, g);
            assert_close(
                &format!("{what} dx"),
                &dxv[span],
                &numeric_grad(|v| loss(v, &gbv), &xs),
                1e-4,
            );
            assert_close(
                &format!("{what} dgamma dbeta"),
                &dpv[s * ps..s * ps + 2 * c],
                &numeric_grad(|v| loss(&xs, v), &gbv),
                1e-5,
            );
            assert!(
                dpv[s * ps + 2 * c..(s + 1) * ps].iter().all(|&v| v == 7.0),
                "{what}: past dparams"
            );
        }
    }
}

/// Every conv op over K slots gives, bit for bit, what K single-slot calls
/// give: what fused trials rely on.
fn conv_ops_batched_equal_single_calls<B: Backend>(d: &mut D<B>) {
    let (k, n, h, w, c) = (3, 2, 6, 6, 16);
    let per = n * h * w * c;
    let x = rand_vec(k * per, 100, 1.0);
    let xb = d.put(&x);
    let single = |d: &mut D<B>, s: usize, f: SlotRun<'_, B>| {
        let xs = d.put(&x[s * per..(s + 1) * per]);
        f(d, 1, &xs)
    };
    let check = |d: &mut D<B>, what: &str, f: SlotRun<'_, B>| {
        let all = f(d, k, &xb);
        let each = all.len() / k;
        for s in 0..k {
            let alone = single(d, s, f);
            let slot = &all[s * each..(s + 1) * each];
            // cuBLAS may pick another kernel for a batched product than
            // for a single one, so ops with a GEMM agree to rounding there.
            if what.starts_with("conv2d") && d.b.kind() != DeviceKind::Cpu {
                assert_rel_max(&format!("{what} slot {s}"), slot, &alone, 1e-5);
            } else {
                assert_eq!(slot, &alone[..], "{what} slot {s}");
            }
        }
    };
    let conv = |slots| conv_of(slots, (n, h, w, c, 3, 1, 1), per);
    check(d, "im2col", &|d, slots, xb| {
        let cv = conv(slots);
        let mut cols = d.zeros(cv.cols_len());
        d.b.im2col(&mut d.ctx, &cv, at(xb, 0), at_mut(&mut cols, 0))
            .unwrap();
        d.get(&cols)
    });
    check(d, "col2im", &|d, slots, xb| {
        let cv = conv(slots);
        let mut cols = d.zeros(cv.cols_len());
        d.b.im2col(&mut d.ctx, &cv, at(xb, 0), at_mut(&mut cols, 0))
            .unwrap();
        let mut dx = d.zeros(slots * per);
        d.b.col2im(&mut d.ctx, &cv, at(&cols, 0), at_mut(&mut dx, 0), false)
            .unwrap();
        d.get(&dx)
    });
    // On the CPU: 3 x 3 with 16 channels through the patch matrix, 5 x 5
    // with 16 channels each side through Winograd tiles, and 5 x 5 on 3
    // channels (the first 3 of each pixel's 16 here) directly.
    for (kernel, ch) in [(3, 16), (5, 16), (5, 3)] {
        check(d, "conv2d and its gradients", &|d, slots, xb| {
            let conv = conv_of(slots, (n, h, w, ch, kernel, 1, kernel / 2), per);
            let op = ConvGemm {
                conv,
                out_c: 16,
                weight_stride: (conv.patch() + 1) * 16,
                precision: Precision::Fp32,
                accumulate_dx: false,
                bias: true,
            };
            // The input's gradient comes packed.
            let packed = n * h * w * ch;
            let data = ConvGemm {
                conv: conv_of(slots, (n, h, w, ch, kernel, 1, kernel / 2), packed),
                ..op
            };
            // The same weights and output gradient for every slot.
            let wb = d.put(&rand_vec(op.weight_stride, 101, 1.0).repeat(slots));
            let per_out = op.out_len() / slots;
            let gb = d.put(&rand_vec(per_out, 102, 1.0).repeat(slots));
            let (dw0, dx0) = (
                vec![0.0; slots * op.weight_stride],
                vec![0.0; slots * packed],
            );
            let parts = conv_ops(d, (&op, &data), (xb, &wb, &gb), (&dw0, &dx0));
            let each = [per_out, op.weight_stride, packed];
            (0..slots)
                .flat_map(|s| {
                    parts
                        .iter()
                        .zip(each)
                        .flat_map(move |(v, each)| v[s * each..(s + 1) * each].to_vec())
                        .collect::<Vec<_>>()
                })
                .collect()
        });
    }
    for kind in [PoolKind::Max, PoolKind::Avg] {
        check(d, "pool2d and backward", &|d, slots, xb| {
            let p = pool_of(slots, n, c, per, (kind, h, w, 3, 2));
            let mut y = d.zeros(p.output().len());
            d.b.pool2d(&mut d.ctx, &p, at(xb, 0), at_mut(&mut y, 0))
                .unwrap();
            let mut dx = d.zeros(slots * per);
            d.b.pool2d_backward(&mut d.ctx, &p, at(xb, 0), at(&y, 0), at_mut(&mut dx, 0))
                .unwrap();
            let mut out = d.get(&y);
            out.extend(d.get(&dx));
            // Slot-major: regroup so each slot's pooled and gradient values are together.
            let (py, pd) = (p.output().len() / slots, per);
            (0..slots)
                .flat_map(|s| {
                    let mut v = out[s * py..(s + 1) * py].to_vec();
                    v.extend(&out[slots * py + s * pd..slots * py + (s + 1) * pd]);
                    v
                })
                .collect()
        });
    }
    check(d, "batch norm", &|d, slots, xb| {
        let bn = BatchNorm {
            shape: Batched::new(slots, n * h * w, c),
            param_stride: 2 * c,
            running_stride: 2 * c,
            momentum: 0.1,
            eps: 1e-5,
        };
        let pb = d.put(&vec![1.25; slots * 2 * c]);
        let mut run = d.put(&vec![0.5; slots * 2 * c]);
        let (mut saved, mut y) = (d.zeros(bn.saved_len()), d.zeros(slots * per));
        d.b.batch_norm_train(
            &mut d.ctx,
            &bn,
            at(xb, 0),
            at(&pb, 0),
            at_mut(&mut run, 0),
            at_mut(&mut saved, 0),
            at_mut(&mut y, 0),
        )
        .unwrap();
        let (mut dx, mut dp) = (d.zeros(slots * per), d.zeros(slots * 2 * c));
        d.b.batch_norm_backward(
            &mut d.ctx,
            &bn,
            at(xb, 0),
            at(&pb, 0),
            at(&saved, 0),
            at(&y, 0),
            at_mut(&mut dx, 0),
            at_mut(&mut dp, 0),
        )
        .unwrap();
        let parts = [
            (d.get(&y), per),
            (d.get(&dx), per),
            (d.get(&run), 2 * c),
            (d.get(&dp), 2 * c),
        ];
        (0..slots)
            .flat_map(|s| {
                parts
                    .iter()
                    .flat_map(move |(v, each)| v[s * each..(s + 1) * each].to_vec())
                    .collect::<Vec<_>>()
            })
            .collect()
    });
}

fn add_adds<B: Backend>(d: &mut D<B>) {
    let (x, y0) = (rand_vec(1000, 110, 1.0), rand_vec(1003, 111, 1.0));
    let xb = d.put(&x);
    let mut yb = d.put(&y0);
    d.b.add(&mut d.ctx, 1000, at(&xb, 0), at_mut(&mut yb, 2))
        .unwrap();
    let got = d.get(&yb);
    for i in 0..1003 {
        let want = if (2..1002).contains(&i) {
            y0[i] + x[i - 2]
        } else {
            y0[i]
        };
        assert_eq!(got[i], want, "add[{i}]");
    }
}

/// Geometry that cannot work is refused with a shape error, not run.
fn conv_ops_refuse_bad_geometry<B: Backend>(d: &mut D<B>) {
    let xb = d.zeros(64);
    let mut out = d.zeros(4096);
    let big = conv_of(1, (1, 2, 2, 1, 5, 1, 1), 4);
    let err =
        d.b.im2col(&mut d.ctx, &big, at(&xb, 0), at_mut(&mut out, 0))
            .unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    let p = pool_of(1, 1, 1, 4, (PoolKind::Max, 2, 2, 3, 1));
    let err =
        d.b.pool2d(&mut d.ctx, &p, at(&xb, 0), at_mut(&mut out, 0))
            .unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    let bn = BatchNorm {
        shape: Batched::new(1, 1, 3),
        param_stride: 6,
        running_stride: 6,
        momentum: 0.1,
        eps: 1e-5,
    };
    let (pb, mut run, mut sv) = (d.zeros(6), d.zeros(6), d.zeros(6));
    let err =
        d.b.batch_norm_train(
            &mut d.ctx,
            &bn,
            at(&xb, 0),
            at(&pb, 0),
            at_mut(&mut run, 0),
            at_mut(&mut sv, 0),
            at_mut(&mut out, 0),
        )
        .unwrap_err();
    assert!(err.to_string().contains("more than one value"), "{err}");
}

/// Random crops and flips against a host reference of the same draws;
/// with no padding and no flip, the identity; each slot its own setting.
fn augment_matches_reference<B: Backend>(d: &mut D<B>) {
    let (n, h, w, c) = (5, 6, 7, 2);
    let per = n * h * w * c;
    let slots = [
        AugmentSlot {
            seed: 1,
            pad: 2,
            flip: true,
        },
        AugmentSlot {
            seed: 2,
            pad: 0,
            flip: false,
        },
        AugmentSlot {
            seed: 3,
            pad: 1,
            flip: false,
        },
    ];
    let steps_v = [7u64, 8, 1 << 40];
    let x = rand_vec(slots.len() * per, 120, 1.0);
    let (xb, st) = (d.put(&x), d.dropout_steps(&steps_v));
    let images = Images::packed(slots.len(), n, h, w, c);
    let mut y = d.zeros(slots.len() * per);
    d.b.augment(
        &mut d.ctx,
        &images,
        &slots,
        at(&st, 0),
        at(&xb, 0),
        at_mut(&mut y, 0),
    )
    .unwrap();
    let got = d.get(&y);
    let mut shifted = 0;
    for (s, a) in slots.iter().enumerate() {
        for img in 0..n {
            let (dy, dx, flip) = a.draw(steps_v[s], img as u64);
            assert!(dy.unsigned_abs() <= a.pad && dx.unsigned_abs() <= a.pad);
            shifted += (dy != 0 || dx != 0 || flip) as usize;
            for r in 0..h {
                for col in 0..w {
                    for ch in 0..c {
                        let (sr, sc) = (
                            r as isize + dy,
                            if flip { w - 1 - col } else { col } as isize + dx,
                        );
                        let want = if sr < 0 || sc < 0 || sr >= h as isize || sc >= w as isize {
                            0.0
                        } else {
                            x[s * per + img * h * w * c + (sr as usize * w + sc as usize) * c + ch]
                        };
                        let at = s * per + img * h * w * c + (r * w + col) * c + ch;
                        assert_eq!(got[at], want, "slot {s} image {img} ({r}, {col}, {ch})");
                    }
                }
            }
        }
    }
    assert_eq!(
        got[per..2 * per],
        x[per..2 * per],
        "no padding, no flip: the identity"
    );
    assert!(
        shifted >= 5,
        "the draws move most images ({shifted} of {})",
        2 * n
    );
    // The same slot alone gives the same bits.
    let st0 = d.dropout_steps(&steps_v[..1]);
    let x0 = d.put(&x[..per]);
    let mut y0 = d.zeros(per);
    let one = Images::packed(1, n, h, w, c);
    d.b.augment(
        &mut d.ctx,
        &one,
        &slots[..1],
        at(&st0, 0),
        at(&x0, 0),
        at_mut(&mut y0, 0),
    )
    .unwrap();
    assert_eq!(d.get(&y0), got[..per]);
}

kernels::device_tests!(
    // Three threads exercise the uneven task splits.
    cpu: crate::common::Dev::new(kernels::CpuBackend::new(), 3),
    cuda: |b| crate::common::Dev::new(b, 1);
    augment_matches_reference,
    conv_forward_matches_reference,
    conv_backward_finite_differences,
    conv_ops_match_reference,
    pooling_forward_and_finite_differences,
    max_pool_ties_go_to_the_first,
    activation_pool_equals_the_two_ops,
    filter_grad_through_pool_equals_the_two_ops,
    batch_norm_matches_reference_and_finite_differences,
    conv_ops_batched_equal_single_calls,
    add_adds,
    conv_ops_refuse_bad_geometry,
);

/// On the CPU the convolution ops give the same bits whatever the thread
/// count: the output and the input's gradient are cut into tasks by
/// threads (rows are independent), the weights' gradient by fixed image
/// groups.
#[test]
fn cpu_conv_ops_do_not_depend_on_threads() {
    // Through the patch matrix, Winograd tiles and directly.
    for (k, c) in [(3, 16), (5, 16), (5, 3)] {
        conv_ops_same_bits_at_every_thread_count(k, c);
    }
}

fn conv_ops_same_bits_at_every_thread_count(k: usize, c: usize) {
    let (n, h, w, oc) = (16, 16, 16, 16);
    let per = n * h * w * c;
    let conv = conv_of(1, (n, h, w, c, k, 1, k / 2), per);
    let op = ConvGemm {
        conv,
        out_c: oc,
        weight_stride: (conv.patch() + 1) * oc,
        precision: Precision::Fp32,
        accumulate_dx: false,
        bias: true,
    };
    let run = |threads: usize| {
        let mut d = Dev::new(CpuBackend::new(), threads);
        let x = d.put(&rand_vec(per, 300, 1.0));
        let wb = d.put(&rand_vec(op.weight_stride, 301, 1.0));
        let gb = d.put(&rand_vec(op.out_len(), 302, 1.0));
        let (dw0, dx0) = (vec![0.0; op.weight_stride], vec![0.0; per]);
        conv_ops(&mut d, (&op, &op), (&x, &wb, &gb), (&dw0, &dx0))
    };
    let one = run(1);
    for threads in [2, 3] {
        let got = run(threads);
        for (what, (a, b)) in ["y", "dw", "dx"].iter().zip(one.iter().zip(&got)) {
            assert!(
                a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{k}x{k} on {c} channels: {what} with {threads} threads"
            );
        }
    }
}

/// In bf16 the CPU runs the convolution ops as the whole patch matrix, a
/// GEMM and the bias as ops of their own (`by_patches`, what CUDA runs):
/// with the bias, they agree with the fp32 ops to bf16's rounding.
#[test]
fn cpu_bf16_conv_ops_with_a_bias_agree_with_fp32() {
    let (n, h, w, c, oc) = (3, 6, 6, 4, 5);
    let per = n * h * w * c;
    let conv = conv_of(2, (n, h, w, c, 3, 1, 1), per);
    let fp32 = ConvGemm {
        conv,
        out_c: oc,
        weight_stride: (conv.patch() + 1) * oc + 3,
        precision: Precision::Fp32,
        accumulate_dx: false,
        bias: true,
    };
    let bf16 = ConvGemm {
        precision: Precision::Bf16,
        ..fp32
    };
    let mut d = Dev::new(CpuBackend::new(), 2);
    let x = d.put(&rand_vec(2 * per, 400, 1.0));
    // Biases far from zero, so that a lost bias shows.
    let mut wv = rand_vec(2 * fp32.weight_stride, 401, 1.0);
    for s in 0..2 {
        wv[s * fp32.weight_stride + conv.patch() * oc..][..oc].fill(3.0);
    }
    let wb = d.put(&wv);
    let gb = d.put(&rand_vec(fp32.out_len(), 402, 1.0));
    let (dw0, dx0) = (vec![0.0; 2 * fp32.weight_stride], vec![0.0; 2 * per]);
    let want = conv_ops(&mut d, (&fp32, &fp32), (&x, &wb, &gb), (&dw0, &dx0));
    let got = conv_ops(&mut d, (&bf16, &bf16), (&x, &wb, &gb), (&dw0, &dx0));
    for (what, (g, w)) in ["y", "dw and db", "dx"].iter().zip(got.iter().zip(&want)) {
        assert_rel_max(what, g, w, 2e-2);
    }
}
