//! Winograd convolutions on 8 x 8 input tiles: F(4 x 4, 5 x 5), for
//! stride-1 convolutions in fp32 with enough channels ([`pays`]).
//!
//! Why: a convolution computed as products with its patch matrix runs at
//! the CPU's GEMM rate at best, and on 2 cores that rate was below what
//! the packing goal asks of `cnn-32` (its three 5 x 5 convolutions).
//! Winograd's minimal filtering (Lavin and Gray, 2016) computes an
//! `m x m` output tile of an `r x r` filter from an 8 x 8 input tile with
//! 64 products per channel pair instead of `m * m * r * r` (400 for 5 x 5,
//! 324 for 3 x 3): after the tiles' transforms the convolution is 64
//! products of `tiles x in_c` by `in_c x out_c` matrices, one per point of
//! the tile, multiplied without packing ([`product`]).
//!
//! The transforms come from Toom-Cook with the points 0, +-1, +-2, +-1/2
//! and infinity (those of NNPACK's F(6 x 6, 3 x 3)), built in float64 at
//! first use. In fp32 they add a relative error of about 1e-6 to each
//! output, against about 1e-7 for the products with the patch matrix.
//!
//! The two gradients are the adjoints of the forward's algorithm, through
//! the same transforms and 64 products, so each pass does 4-6x fewer
//! multiplications than with patches. Work is split as in [`super::conv`]:
//! whole images per task, tiles in a fixed order, and the filter gradient
//! summed over fixed groups of images, so that a slot's bits depend on
//! neither the thread count nor the other slots of the call.

use std::ops::Range;
use std::sync::OnceLock;

use super::CpuCtx;
use super::conv::with_scratch;
use super::gemm_unpacked::{Strided, product};
use super::par;
// A transform holds `LANES` channels in registers at once.
use super::vector::{LANES, add_assign, load, store};
use crate::ops::{Conv2d, ConvGemm};

/// Side of an input tile.
const T: usize = 8;
/// Points of a tile: the products per channel pair.
const POS: usize = T * T;

/// Bytes of transformed tiles (inputs and outputs) a task works on at a
/// time: the 64 products then read their operands from L2.
const CHUNK_BYTES: usize = 768 << 10;

/// The transforms of F(m x m, r x r) on 8 x 8 tiles, from Toom-Cook:
/// `at` is `m x 8` (output), `g` is `8 x r` (filter), `bt` is `8 x 8`
/// (input), and a tile's output is
/// `at . ((g . w . g^T) * (bt . d . bt^T)) . at^T`. The input's and the
/// output's transforms run as the formulas [`input_1d`] and [`output_1d`]
/// (the matrices are kept for the tests that check them); the filter's,
/// once a call per slot, as a product with `g`.
pub(crate) struct Transforms {
    m: usize,
    r: usize,
    /// `8 x r`, row-major.
    g: Vec<f32>,
    #[cfg(test)]
    at: Mat,
    #[cfg(test)]
    bt: Mat,
}

/// A transform's matrix, zero-padded to 8 x 8.
#[cfg(test)]
type Mat = [[f32; T]; T];

/// Coefficients (lowest power first) of the monic polynomial with these roots.
fn poly_from_roots(roots: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut c = vec![1.0];
    for q in roots {
        let mut next = vec![0.0; c.len() + 1];
        for (i, &a) in c.iter().enumerate() {
            next[i + 1] += a;
            next[i] -= q * a;
        }
        c = next;
    }
    c
}

impl Transforms {
    fn build(r: usize) -> Transforms {
        const POINTS: [f64; T - 1] = [0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5];
        let m = T + 1 - r;
        let (mut at, mut g, mut bt) = (vec![0.0f64; m * T], vec![0.0f64; T * r], vec![0.0; POS]);
        for (j, &p) in POINTS.iter().enumerate() {
            let others = || POINTS.iter().enumerate().filter(move |(l, _)| *l != j);
            let f: f64 = others().map(|(_, &q)| p - q).product();
            for i in 0..m {
                at[i * T + j] = p.powi(i as i32);
            }
            for k in 0..r {
                g[j * r + k] = p.powi(k as i32) / f;
            }
            for (k, c) in poly_from_roots(others().map(|(_, &q)| q))
                .into_iter()
                .enumerate()
            {
                bt[j * T + k] = c;
            }
        }
        // The point at infinity.
        at[(m - 1) * T + T - 1] = 1.0;
        g[(T - 1) * r + r - 1] = 1.0;
        for (k, c) in poly_from_roots(POINTS.into_iter()).into_iter().enumerate() {
            bt[(T - 1) * T + k] = c;
        }
        #[cfg(test)]
        let mat = |v: &[f64], rows: usize| -> Mat {
            std::array::from_fn(|i| {
                std::array::from_fn(|j| if i < rows { v[i * T + j] as f32 } else { 0.0 })
            })
        };
        Transforms {
            m,
            r,
            g: g.into_iter().map(|x| x as f32).collect(),
            #[cfg(test)]
            at: mat(&at, m),
            #[cfg(test)]
            bt: mat(&bt, T),
        }
    }

    /// The transforms for this convolution where they beat the patch
    /// matrix ([`pays`]).
    pub(crate) fn for_op(op: &ConvGemm) -> Option<&'static Transforms> {
        static F4X5: OnceLock<Transforms> = OnceLock::new();
        pays(&op.conv, op.out_c).then(|| F4X5.get_or_init(|| Transforms::build(5)))
    }
}

/// Whether a convolution goes through Winograd tiles rather than the patch
/// matrix: a 5 x 5 kernel at stride 1 with at least 16 input and 16 output
/// channels. Measured on the 2-core development machine (the three passes
/// together, batch 64): 1.25-2.7x faster with 16-64 channels on 4 x 4 to
/// 28 x 28 outputs, but 0.5-0.9x with 4 or 8 input channels (the products'
/// inner dimension is the input's channels, too short to pay for the
/// transforms); F(6 x 6, 3 x 3) for 3 x 3 kernels was 0.5-1.3x, so those
/// stay on patches.
pub(crate) fn pays(conv: &Conv2d, out_c: usize) -> bool {
    conv.stride == 1 && conv.kh == 5 && conv.kw == 5 && conv.input.c >= 16 && out_c >= 16
}

/// Tiles a filter gradient's image group covers at least, where the
/// slot's images allow it (see [`conv2d_filter_grad`]).
const MIN_TILES_PER_GROUP: usize = 64;

/// A convolution's tiles.
#[derive(Clone, Copy)]
struct Tiling {
    m: usize,
    /// Tiles down and across an image.
    th: usize,
    tw: usize,
    in_c: usize,
    out_c: usize,
    conv: Conv2d,
}

impl Tiling {
    fn new(tf: &Transforms, op: &ConvGemm) -> Tiling {
        let conv = op.conv;
        Tiling {
            m: tf.m,
            th: conv.out_h().div_ceil(tf.m),
            tw: conv.out_w().div_ceil(tf.m),
            in_c: conv.input.c,
            out_c: op.out_c,
            conv,
        }
    }
    fn per_image(&self) -> usize {
        self.th * self.tw
    }
    /// Images a task transforms at once: what fits `CHUNK_BYTES`.
    fn chunk_images(&self) -> usize {
        let per_image = POS * self.per_image() * (self.in_c + self.out_c) * 4;
        (CHUNK_BYTES / per_image.max(1)).clamp(1, self.conv.input.n.max(1))
    }
    /// Scratch a task needs for `images` images.
    fn scratch_len(&self, images: usize) -> usize {
        let (tiles, c) = (images * self.per_image(), self.in_c.max(self.out_c));
        POS * tiles * (self.in_c + self.out_c) + 2 * POS * c
    }
}

/// `dst += a * src`. Not fused, so that every vector width gives the
/// same bits.
#[inline(always)]
fn axpy(dst: &mut [f32], a: f32, src: &[f32]) {
    dst.iter_mut().zip(src).for_each(|(d, &s)| *d += a * s);
}

/// `dst = sum_k coef(k) * src(k)` over `k < n`, skipping zero coefficients.
#[inline(always)]
fn combine<'a>(
    dst: &mut [f32],
    n: usize,
    coef: impl Fn(usize) -> f32,
    src: impl Fn(usize) -> &'a [f32],
) {
    dst.fill(0.0);
    for k in 0..n {
        let a = coef(k);
        if a != 0.0 {
            axpy(dst, a, src(k));
        }
    }
}

/// Which of the one-dimensional transforms [`transform`] applies.
#[derive(Clone, Copy)]
enum OneD {
    Input,
    InputAdjoint,
    Output,
    OutputAdjoint,
}

/// The 8 points of a tile (or 4 of an output tile) for `LANES` channels.
type Block = [[f32; LANES]; T];

/// `dst[to[r]] (+)= f(src[from[..]])[r]` for each row `r` with a
/// destination, over `len` channels: the 8 source vectors of a block of
/// `LANES` channels are loaded once and every row made from them in
/// registers. A missing source reads as zeros.
#[inline(always)]
fn transform(
    f: OneD,
    (src, from): (&[f32], &[Option<usize>; T]),
    (dst, to): (&mut [f32], &[Option<usize>; T]),
    len: usize,
    add: bool,
) {
    // Declared once, outside the loop: 512-byte arrays zeroed or returned
    // per block compiled to calls to memset and memmove.
    let (mut s, mut o) = ([[0.0f32; LANES]; T], [[0.0f32; LANES]; T]);
    // Plain index loops and whole-vector loads and stores: iterator
    // adapters here were left as calls (`fold`) that wrote the block in
    // pieces, and each 64-byte read of it then waited for those stores.
    let mut c0 = 0;
    while c0 < len {
        let w = LANES.min(len - c0);
        for k in 0..T {
            s[k] = match from[k] {
                Some(at) if w == LANES => load(src, at + c0),
                // A last, partial block: lanes past `w` are zeros, and
                // lanes do not mix.
                Some(at) => {
                    let mut v = [0.0f32; LANES];
                    v[..w].copy_from_slice(&src[at + c0..][..w]);
                    v
                }
                None => [0.0; LANES],
            };
        }
        // Called by name, so that each inlines into the caller compiled
        // for wide vectors (through a function pointer or `Fn` it did not).
        match f {
            OneD::Input => input_1d(&s, &mut o),
            OneD::InputAdjoint => input_adjoint_1d(&s, &mut o),
            OneD::Output => output_1d(&s, &mut o),
            OneD::OutputAdjoint => output_adjoint_1d(&s, &mut o),
        }
        for r in 0..T {
            let Some(at) = to[r] else { continue };
            if w == LANES {
                let mut v = o[r];
                if add {
                    let d = load::<LANES>(dst, at + c0);
                    for j in 0..LANES {
                        v[j] += d[j];
                    }
                }
                store(dst, at + c0, v);
            } else {
                let d = &mut dst[at + c0..][..w];
                for j in 0..w {
                    d[j] = if add { d[j] + o[r][j] } else { o[r][j] };
                }
            }
        }
        c0 += LANES;
    }
}

/// Where a transform's 8 rows are (`None`: zeros, or no destination), by
/// a plain loop: `std::array::from_fn` was left as a call.
#[inline(always)]
fn offsets(at: impl Fn(usize) -> Option<usize>) -> [Option<usize>; T] {
    let mut out = [None; T];
    for (k, o) in out.iter_mut().enumerate() {
        *o = at(k);
    }
    out
}

// The four one-dimensional transforms of F(4, 5) with the points 0, +-1,
// +-2, +-1/2 and infinity, written out: their matrices are 30-45% zeros
// and their rows pair up as `e + o` and `e - o`, so these take a third of
// the operations of the dense products (`tests` checks them against the
// matrices that `toom_cook` builds).

/// `bt . d`: an input tile's transform along one axis.
#[inline(always)]
fn input_1d(d: &Block, v: &mut Block) {
    for j in 0..LANES {
        let x = |k: usize| d[k][j];
        v[0][j] = (x(6) - x(0)) + 5.25 * (x(2) - x(4));
        v[7][j] = (x(7) - x(1)) + 5.25 * (x(3) - x(5));
        let (e, o) = (x(2) - 4.25 * x(4) + x(6), x(1) - 4.25 * x(3) + x(5));
        (v[1][j], v[2][j]) = (e + o, e - o);
        let (e, o) = (
            0.25 * x(2) - 1.25 * x(4) + x(6),
            0.5 * x(1) - 2.5 * x(3) + 2.0 * x(5),
        );
        (v[3][j], v[4][j]) = (e + o, e - o);
        let (e, o) = (
            4.0 * x(2) - 5.0 * x(4) + x(6),
            2.0 * x(1) - 2.5 * x(3) + 0.5 * x(5),
        );
        (v[5][j], v[6][j]) = (e + o, e - o);
    }
}

/// `bt^T . v`: the adjoint of [`input_1d`].
#[inline(always)]
fn input_adjoint_1d(v: &Block, d: &mut Block) {
    for j in 0..LANES {
        let x = |k: usize| v[k][j];
        let (p1, m1) = (x(1) + x(2), x(1) - x(2));
        let (p3, m3) = (x(3) + x(4), x(3) - x(4));
        let (p5, m5) = (x(5) + x(6), x(5) - x(6));
        d[0][j] = -x(0);
        d[1][j] = m1 + 0.5 * m3 + 2.0 * m5 - x(7);
        d[2][j] = 5.25 * x(0) + p1 + 0.25 * p3 + 4.0 * p5;
        d[3][j] = -4.25 * m1 - 2.5 * m3 - 2.5 * m5 + 5.25 * x(7);
        d[4][j] = -5.25 * x(0) - 4.25 * p1 - 1.25 * p3 - 5.0 * p5;
        d[5][j] = m1 + 2.0 * m3 + 0.5 * m5 - 5.25 * x(7);
        d[6][j] = x(0) + p1 + p3 + p5;
        d[7][j] = x(7);
    }
}

/// `at . m`: a product tile back to 4 outputs along one axis (rows 0-3
/// of `y`; the rest are left as they were).
#[inline(always)]
fn output_1d(m: &Block, y: &mut Block) {
    for j in 0..LANES {
        let x = |k: usize| m[k][j];
        let (a, b) = (x(1) + x(2), x(1) - x(2));
        let (c, d) = (x(3) + x(4), x(3) - x(4));
        let (e, f) = (x(5) + x(6), x(5) - x(6));
        y[0][j] = x(0) + a + c + e;
        y[1][j] = b + 2.0 * d + 0.5 * f;
        y[2][j] = a + 4.0 * c + 0.25 * e;
        y[3][j] = b + 8.0 * d + 0.125 * f + x(7);
    }
}

/// `at^T . y`: the adjoint of [`output_1d`], from rows 0-3 of `y`.
#[inline(always)]
fn output_adjoint_1d(y: &Block, m: &mut Block) {
    for j in 0..LANES {
        let x = |k: usize| y[k][j];
        m[0][j] = x(0);
        m[7][j] = x(3);
        for (s, lo) in [(1.0f32, 1), (2.0, 3), (0.5, 5)] {
            let (e, o) = (x(0) + s * s * x(2), s * x(1) + s * s * s * x(3));
            (m[lo][j], m[lo + 1][j]) = (e + o, e - o);
        }
    }
}

widest_fn! {
    /// One slot's filter transforms `u[pos]` (`in_c x out_c`, row-major)
    /// from its weights `w` (`(kernel row, kernel column, in_c) x out_c`).
    fn filter_transform(tf: &Transforms, w: &[f32], block: usize, u: &mut [f32]) {
        let r = tf.r;
        let wb = |a: usize, b: usize| &w[(a * r + b) * block..][..block];
        // tmp[y][b] = sum_a g[y][a] w[a][b]
        let mut tmp = vec![0.0f32; T * r * block];
        for (yb, dst) in tmp.chunks_exact_mut(block).enumerate() {
            let (y, b) = (yb / r, yb % r);
            combine(dst, r, |a| tf.g[y * r + a], |a| wb(a, b));
        }
        // u[y][x] = sum_b tmp[y][b] g[x][b]
        for (pos, dst) in u.chunks_exact_mut(block).enumerate() {
            let (y, x) = (pos / T, pos % T);
            combine(dst, r, |b| tf.g[x * r + b], |b| &tmp[(y * r + b) * block..][..block]);
        }
    }
}

/// Per slot, the filters' transforms: `POS` blocks of `in_c x out_c`, or
/// with `transposed` of `out_c x in_c` (what the input's gradient
/// multiplies by).
fn filter_transforms(
    ctx: &CpuCtx,
    tf: &Transforms,
    op: &ConvGemm,
    w: &[f32],
    transposed: bool,
) -> Vec<f32> {
    let (r, cin, oc) = (tf.r, op.conv.input.c, op.out_c);
    let block = cin * oc;
    let mut u = vec![0.0f32; op.conv.input.slots * POS * block];
    par::run(
        ctx,
        u.chunks_exact_mut(POS * block).enumerate(),
        |(s, u)| {
            filter_transform(tf, &w[s * op.weight_stride..][..r * r * block], block, u);
            if transposed {
                let mut t = vec![0.0f32; block];
                for b in u.chunks_exact_mut(block) {
                    for (ci, row) in b.chunks_exact(oc).enumerate() {
                        row.iter()
                            .enumerate()
                            .for_each(|(co, &v)| t[co * cin + ci] = v);
                    }
                    b.copy_from_slice(&t);
                }
            }
        },
    );
    u
}

/// Image `img`'s tile `(ty, tx)` (8 x 8 pixels of `in_c`, zeros outside
/// the image) transformed into row `t` of each point's `tiles x in_c`
/// matrix in `v`. `tmp` is `POS * in_c` scratch.
#[inline(always)]
fn input_tile(
    tl: &Tiling,
    img: &[f32],
    (ty, tx): (usize, usize),
    (v, t, tiles): (&mut [f32], usize, usize),
    tmp: &mut [f32],
) {
    let (c, i) = (tl.in_c, tl.conv.input);
    let y0 = (ty * tl.m) as isize - tl.conv.pad as isize;
    let x0 = (tx * tl.m) as isize - tl.conv.pad as isize;
    let pixel = |k: usize, l: usize| {
        let (iy, ix) = (y0 + k as isize, x0 + l as isize);
        let inside = iy >= 0 && iy < i.h as isize && ix >= 0 && ix < i.w as isize;
        inside.then(|| (iy as usize * i.w + ix as usize) * c)
    };
    // tmp[y][l] = sum_k bt[y][k] img[k][l]
    for l in 0..T {
        let from = offsets(|k| pixel(k, l));
        let to = offsets(|y| Some((y * T + l) * c));
        transform(OneD::Input, (img, &from), (tmp, &to), c, false);
    }
    // v[y][x] = sum_l bt[x][l] tmp[y][l]
    for y in 0..T {
        let from = offsets(|l| Some((y * T + l) * c));
        let to = offsets(|x| Some(((y * T + x) * tiles + t) * c));
        transform(OneD::Input, (tmp, &from), (v, &to), c, false);
    }
}

/// The `tiles x in_c` input transforms of `images` of `slot`, image by
/// image, tile by tile.
#[inline(always)]
fn input_tiles(
    tl: &Tiling,
    x: &[f32],
    (slot, images): (usize, Range<usize>),
    v: &mut [f32],
    scratch: &mut [f32],
) {
    let i = tl.conv.input;
    let tiles = images.len() * tl.per_image();
    for (n, img) in images.enumerate() {
        let src = &x[slot * i.slot_stride + img * i.image_len()..][..i.image_len()];
        for tile in 0..tl.per_image() {
            let t = n * tl.per_image() + tile;
            let at = (tile / tl.tw, tile % tl.tw);
            input_tile(tl, src, at, (v, t, tiles), &mut scratch[..POS * tl.in_c]);
        }
    }
}

/// Row `t` of each point's `tiles x out_c` product in `mm` transformed
/// back into the tile's `m x m` output pixels (those inside the image).
#[inline(always)]
fn output_tile(
    tl: &Tiling,
    (mm, t, tiles): (&[f32], usize, usize),
    bias: Option<&[f32]>,
    tmp: &mut [f32],
    out: &mut [f32],
    tile: usize,
) {
    let (m, oc) = (tl.m, tl.out_c);
    let (oh, ow) = (tl.conv.out_h(), tl.conv.out_w());
    let (ty, tx) = (tile / tl.tw, tile % tl.tw);
    let (mi, mj) = (m.min(oh - ty * m), m.min(ow - tx * m));
    // tmp[i][x] = sum_y at[i][y] mm[y][x]
    for x in 0..T {
        let from = offsets(|y| Some(((y * T + x) * tiles + t) * oc));
        let to = offsets(|i| (i < m).then_some((i * T + x) * oc));
        transform(OneD::Output, (mm, &from), (tmp, &to), oc, false);
    }
    // out[i][j] = sum_x at[j][x] tmp[i][x]
    for i in 0..mi {
        let from = offsets(|x| Some((i * T + x) * oc));
        let px = |j: usize| ((ty * m + i) * ow + tx * m + j) * oc;
        let to = offsets(|j| (j < mj).then(|| px(j)));
        transform(OneD::Output, (tmp, &from), (out, &to), oc, false);
        if let Some(b) = bias {
            for j in 0..mj {
                add_assign(&mut out[px(j)..][..oc], b);
            }
        }
    }
}

/// Row `t` of each point's `tiles x out_c` output gradient in `dm`, from
/// image `dy`'s tile `(ty, tx)` (its `m x m` pixels, zeros outside the
/// output): the adjoint of [`output_tile`]. `tmp` is `POS * out_c`.
#[inline(always)]
fn output_grad_tile(
    tl: &Tiling,
    dy: &[f32],
    tile: usize,
    (dm, t, tiles): (&mut [f32], usize, usize),
    tmp: &mut [f32],
) {
    let (m, oc) = (tl.m, tl.out_c);
    let (oh, ow) = (tl.conv.out_h(), tl.conv.out_w());
    let (ty, tx) = (tile / tl.tw, tile % tl.tw);
    let (mi, mj) = (m.min(oh - ty * m), m.min(ow - tx * m));
    // tmp[y][j] = sum_i at[i][y] dy[i][j]
    for j in 0..m {
        let px = |i: usize| ((ty * m + i) * ow + tx * m + j) * oc;
        let from = offsets(|i| (i < mi && j < mj).then(|| px(i)));
        let to = offsets(|y| Some((y * T + j) * oc));
        transform(OneD::OutputAdjoint, (dy, &from), (tmp, &to), oc, false);
    }
    // dm[y][x] = sum_j at[j][x] tmp[y][j]
    for y in 0..T {
        let from = offsets(|j| (j < m).then_some((y * T + j) * oc));
        let to = offsets(|x| Some(((y * T + x) * tiles + t) * oc));
        transform(OneD::OutputAdjoint, (tmp, &from), (dm, &to), oc, false);
    }
}

/// The output gradients' transforms of `images` of `slot`.
#[inline(always)]
fn output_grad_tiles(
    tl: &Tiling,
    dy: &[f32],
    (slot, images): (usize, Range<usize>),
    dm: &mut [f32],
    tmp: &mut [f32],
) {
    let i = tl.conv.input;
    let len = tl.conv.out_h() * tl.conv.out_w() * tl.out_c;
    let tiles = images.len() * tl.per_image();
    for (n, img) in images.enumerate() {
        let src = &dy[(slot * i.n + img) * len..][..len];
        for tile in 0..tl.per_image() {
            let t = n * tl.per_image() + tile;
            output_grad_tile(tl, src, tile, (dm, t, tiles), &mut tmp[..POS * tl.out_c]);
        }
    }
}

/// Row `t` of each point's `tiles x in_c` input-tile gradient in `dv`
/// added onto the image's pixels under tile `(ty, tx)`: the adjoint of
/// [`input_tile`]. `tmp` is `POS * in_c`.
#[inline(always)]
fn input_grad_tile(
    tl: &Tiling,
    (dv, t, tiles): (&[f32], usize, usize),
    tile: usize,
    img: &mut [f32],
    tmp: &mut [f32],
) {
    let (c, i) = (tl.in_c, tl.conv.input);
    let (ty, tx) = (tile / tl.tw, tile % tl.tw);
    let y0 = (ty * tl.m) as isize - tl.conv.pad as isize;
    let x0 = (tx * tl.m) as isize - tl.conv.pad as isize;
    let row_inside = |k: usize| (0..i.h as isize).contains(&(y0 + k as isize));
    // tmp[k][x] = sum_y bt[y][k] dv[y][x]
    for x in 0..T {
        let from = offsets(|y| Some(((y * T + x) * tiles + t) * c));
        let to = offsets(|k| row_inside(k).then_some((k * T + x) * c));
        transform(OneD::InputAdjoint, (dv, &from), (tmp, &to), c, false);
    }
    // img[k][l] += sum_x bt[x][l] tmp[k][x]
    for k in (0..T).filter(|&k| row_inside(k)) {
        let iy = (y0 + k as isize) as usize;
        let from = offsets(|x| Some((k * T + x) * c));
        let to = offsets(|l| {
            let ix = x0 + l as isize;
            (0..i.w as isize)
                .contains(&ix)
                .then(|| (iy * i.w + ix as usize) * c)
        });
        transform(OneD::InputAdjoint, (tmp, &from), (img, &to), c, true);
    }
}

/// Images per task of the output or the input's gradient: what fits the
/// cache, fewer where that leaves a thread idle.
fn task_images(ctx: &CpuCtx, tl: &Tiling) -> usize {
    let i = tl.conv.input;
    let per_thread = i.n.div_ceil(ctx.threads().div_ceil(i.slots.max(1)).max(1));
    tl.chunk_images().min(per_thread).max(1)
}

widest_fn! {
    /// The output of `images` of slot `s` into `out`: their tiles'
    /// transforms, the 64 products with the filters' `u`, and back.
    fn forward_chunk(
        tl: &Tiling,
        x: &[f32],
        u: &[f32],
        bias: Option<&[f32]>,
        s: usize,
        images: Range<usize>,
        out: &mut [f32],
        scratch: &mut [f32],
    ) {
        let (oc, cin) = (tl.out_c, tl.in_c);
        let pixels = tl.conv.out_h() * tl.conv.out_w();
        let tiles = images.len() * tl.per_image();
        let mut pad = Vec::new();
        let (v, rest) = scratch.split_at_mut(tiles * POS * cin);
        let (mm, rest) = rest.split_at_mut(tiles * POS * oc);
        input_tiles(tl, x, (s, images), v, rest);
        for pos in 0..POS {
            let a = Strided {
                data: &v[pos * tiles * cin..][..tiles * cin],
                rs: cin,
                ks: 1,
                runs: None,
            };
            let b = (&u[pos * cin * oc..][..cin * oc], oc);
            let c = (&mut mm[pos * tiles * oc..][..tiles * oc], oc);
            product((tiles, oc, cin), a, b, c, false, &mut pad);
        }
        let tmp = &mut rest[..POS * oc];
        for (n, dst) in out.chunks_exact_mut(pixels * oc).enumerate() {
            for tile in 0..tl.per_image() {
                let t = n * tl.per_image() + tile;
                output_tile(tl, (&*mm, t, tiles), bias, tmp, dst, tile);
            }
        }
    }
}

/// `y = conv(x, w) (+ bias)` per slot, a chunk of images per task.
pub(crate) fn conv2d(
    ctx: &CpuCtx,
    tf: &Transforms,
    op: &ConvGemm,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
) {
    let tl = Tiling::new(tf, op);
    let (i, oc) = (tl.conv.input, op.out_c);
    let (pixels, patch, ub) = (
        tl.conv.out_h() * tl.conv.out_w(),
        tl.conv.patch(),
        POS * tl.in_c * oc,
    );
    let u = filter_transforms(ctx, tf, op, w, false);
    let tasks = super::conv::slot_chunks(&i, task_images(ctx, &tl));
    let outs = super::conv::chunk_outputs(y, &tasks, i.n, pixels * oc);
    par::run(ctx, tasks.iter().zip(outs), |((s, images), out)| {
        let bias = op
            .bias
            .then(|| &w[s * op.weight_stride + patch * oc..][..oc]);
        let u = &u[s * ub..][..ub];
        with_scratch(tl.scratch_len(images.len()), |scratch| {
            forward_chunk(&tl, x, u, bias, *s, images.clone(), out, scratch)
        });
    });
}

widest_fn! {
    /// The input's gradient of `images` of slot `s` into `out` (whole
    /// images, added to when `accumulate`).
    fn data_grad_chunk(
        tl: &Tiling,
        dy: &[f32],
        ut: &[f32],
        accumulate: bool,
        s: usize,
        images: Range<usize>,
        out: &mut [f32],
        scratch: &mut [f32],
    ) {
        let (oc, cin) = (tl.out_c, tl.in_c);
        let tiles = images.len() * tl.per_image();
        let mut pad = Vec::new();
        let (dv, rest) = scratch.split_at_mut(tiles * POS * cin);
        let (dm, rest) = rest.split_at_mut(tiles * POS * oc);
        output_grad_tiles(tl, dy, (s, images), dm, rest);
        for pos in 0..POS {
            let a = Strided {
                data: &dm[pos * tiles * oc..][..tiles * oc],
                rs: oc,
                ks: 1,
                runs: None,
            };
            let b = (&ut[pos * oc * cin..][..oc * cin], cin);
            let c = (&mut dv[pos * tiles * cin..][..tiles * cin], cin);
            product((tiles, cin, oc), a, b, c, false, &mut pad);
        }
        let tmp = &mut rest[..POS * cin];
        for (n, img) in out.chunks_exact_mut(tl.conv.input.image_len()).enumerate() {
            if !accumulate {
                img.fill(0.0);
            }
            for tile in 0..tl.per_image() {
                let t = n * tl.per_image() + tile;
                input_grad_tile(tl, (&*dv, t, tiles), tile, img, tmp);
            }
        }
    }
}

/// `dx = conv^T(dy, w)` per slot (added to `dx` when `accumulate_dx`), a
/// chunk of whole images per task, since tiles overlap.
pub(crate) fn conv2d_data_grad(
    ctx: &CpuCtx,
    tf: &Transforms,
    op: &ConvGemm,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
) {
    let tl = Tiling::new(tf, op);
    let (i, ub) = (tl.conv.input, POS * tl.in_c * op.out_c);
    let ut = filter_transforms(ctx, tf, op, w, true);
    let image_len = i.image_len();
    let tasks = super::conv::slot_chunks(&i, task_images(ctx, &tl));
    let outs = super::conv::chunk_outputs(dx, &tasks, i.n, image_len);
    par::run(ctx, tasks.iter().zip(outs), |((s, images), out)| {
        let ut = &ut[s * ub..][..ub];
        with_scratch(tl.scratch_len(images.len()), |scratch| {
            data_grad_chunk(
                &tl,
                dy,
                ut,
                op.accumulate_dx,
                *s,
                images.clone(),
                out,
                scratch,
            )
        });
    });
}

widest_fn! {
    /// `du[pos] (+)= v[pos]^T . dm[pos]` over `images` of slot `s`: the
    /// filter transforms' gradient, overwritten unless `accumulate`.
    fn filter_grad_chunk(
        tl: &Tiling,
        x: &[f32],
        dy: &[f32],
        s: usize,
        images: Range<usize>,
        accumulate: bool,
        du: &mut [f32],
        scratch: &mut [f32],
    ) {
        let (oc, cin) = (tl.out_c, tl.in_c);
        let tiles = images.len() * tl.per_image();
        let mut pad = Vec::new();
        let (v, rest) = scratch.split_at_mut(tiles * POS * cin);
        let (dm, rest) = rest.split_at_mut(tiles * POS * oc);
        input_tiles(tl, x, (s, images.clone()), v, rest);
        output_grad_tiles(tl, dy, (s, images), dm, rest);
        for pos in 0..POS {
            // du[ci][co] = sum over tiles of v[t][ci] dm[t][co]
            let a = Strided {
                data: &v[pos * tiles * cin..][..tiles * cin],
                rs: 1,
                ks: cin,
                runs: None,
            };
            let b = (&dm[pos * tiles * oc..][..tiles * oc], oc);
            let c = (&mut du[pos * cin * oc..][..cin * oc], oc);
            product((cin, oc, tiles), a, b, c, accumulate, &mut pad);
        }
    }
}

widest_fn! {
    /// A group's weight gradient `part` from its filter transforms'
    /// gradient `du`, and with a bias, the column sums of its `dy` rows.
    fn filter_grad_finish(
        tf: &Transforms,
        du: &[f32],
        block: usize,
        dy_bias: Option<(&[f32], usize)>,
        part: &mut [f32],
    ) {
        let r = tf.r;
        // tmp[a][x] = sum_y g[y][a] du[y][x]; dw[a][b] = sum_x tmp[a][x] g[x][b]
        let mut tmp = vec![0.0f32; r * T * block];
        for (ax, dst) in tmp.chunks_exact_mut(block).enumerate() {
            let (a, x) = (ax / T, ax % T);
            combine(dst, T, |y| tf.g[y * r + a], |y| &du[(y * T + x) * block..][..block]);
        }
        for (ab, dst) in part[..r * r * block].chunks_exact_mut(block).enumerate() {
            let (a, b) = (ab / r, ab % r);
            combine(dst, T, |x| tf.g[x * r + b], |x| &tmp[(a * T + x) * block..][..block]);
        }
        if let Some((dy, oc)) = dy_bias {
            let db = &mut part[r * r * block..][..oc];
            db.fill(0.0);
            for g in dy.chunks_exact(oc) {
                add_assign(db, g);
            }
        }
    }
}

/// `dw = conv_w^T(x, dy)` per slot (overwritten; with a bias, its
/// gradient, the column sums of `dy`, after the weights): each of a
/// slot's image groups sums its chunks' 64 products `v^T . dm` in order,
/// transforms the sum back to the filter's shape, and the groups' partial
/// gradients are added in order.
pub(crate) fn conv2d_filter_grad(
    ctx: &CpuCtx,
    tf: &Transforms,
    op: &ConvGemm,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) {
    let tl = Tiling::new(tf, op);
    let (i, oc) = (tl.conv.input, op.out_c);
    let (pixels, block) = (tl.conv.out_h() * tl.conv.out_w(), tl.in_c * oc);
    let per = tl.chunk_images();
    // A group's finish costs about as much as the products of 8 tiles:
    // with few tiles an image (small images), fewer, larger groups.
    let min_images = MIN_TILES_PER_GROUP.div_ceil(tl.per_image());
    super::conv::sum_over_image_groups(ctx, op, min_images, dw, |s, images, part| {
        let mut du = vec![0.0f32; POS * block];
        for (k, lo) in images.clone().step_by(per).enumerate() {
            let chunk = lo..(lo + per).min(images.end);
            let accumulate = k > 0;
            with_scratch(tl.scratch_len(chunk.len()), |scratch| {
                filter_grad_chunk(&tl, x, dy, s, chunk, accumulate, &mut du, scratch)
            });
        }
        let rows = (s * i.n + images.start) * pixels * oc..(s * i.n + images.end) * pixels * oc;
        let dy_bias = op.bias.then(|| (&dy[rows], oc));
        filter_grad_finish(tf, &du, block, dy_bias, part);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transforms compute a correlation: for random 1-D inputs `d`
    /// (8) and filters `g` (`r`), `at . ((g . w) * (bt . d))` is each
    /// output's sum of `w[k] * d[i + k]`, to f32's rounding of the
    /// transforms' coefficients. F(6, 3) checks the construction beyond
    /// the one size in use.
    #[test]
    fn transforms_compute_a_correlation() {
        for r in [3, 5] {
            let tf = Transforms::build(r);
            let m = T + 1 - r;
            assert_eq!(tf.m, m);
            let mut seed = 12345u64;
            let mut next = || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
            };
            for _ in 0..50 {
                let d: Vec<f64> = (0..T).map(|_| next()).collect();
                let w: Vec<f64> = (0..r).map(|_| next()).collect();
                let gw: Vec<f64> = (0..T)
                    .map(|y| (0..r).map(|a| tf.g[y * r + a] as f64 * w[a]).sum())
                    .collect();
                let bd: Vec<f64> = (0..T)
                    .map(|y| (0..T).map(|k| tf.bt[y][k] as f64 * d[k]).sum())
                    .collect();
                for i in 0..m {
                    let got: f64 = (0..T).map(|y| tf.at[i][y] as f64 * gw[y] * bd[y]).sum();
                    let want: f64 = (0..r).map(|k| w[k] * d[i + k]).sum();
                    assert!(
                        (got - want).abs() < 1e-5,
                        "r {r} output {i}: {got} against {want}"
                    );
                }
            }
        }
    }

    /// The written-out transforms of F(4, 5) equal the products with the
    /// matrices that Toom-Cook builds, and the adjoints their transposes.
    #[test]
    fn written_out_transforms_match_the_matrices() {
        let tf = Transforms::build(5);
        let block = |seed: usize| -> Block {
            std::array::from_fn(|k| {
                std::array::from_fn(|j| {
                    (((seed + 31 * k + 7 * j) * 2654435761) % 2001) as f32 / 1000.0 - 1.0
                })
            })
        };
        let apply = |mat: &Mat, rows: usize, transposed: bool, x: &Block| -> Vec<f64> {
            (0..rows)
                .flat_map(|r| {
                    (0..LANES).map(move |j| {
                        (0..T)
                            .map(|k| {
                                let c = if transposed { mat[k][r] } else { mat[r][k] };
                                c as f64 * x[k][j] as f64
                            })
                            .sum::<f64>()
                    })
                })
                .collect()
        };
        let flat = |b: &Block, rows: usize| -> Vec<f64> {
            b[..rows].iter().flatten().map(|&v| v as f64).collect()
        };
        for seed in 0..20 {
            let x = block(seed);
            // The output's adjoint reads rows 0-3 only.
            let mut x4 = x;
            x4[4..].iter_mut().for_each(|r| r.fill(0.0));
            let run = |f: fn(&Block, &mut Block), x: &Block| {
                let mut out = [[0.0f32; LANES]; T];
                f(x, &mut out);
                out
            };
            let cases: [(&str, Vec<f64>, Vec<f64>); 4] = [
                (
                    "input",
                    flat(&run(input_1d, &x), T),
                    apply(&tf.bt, T, false, &x),
                ),
                (
                    "input adjoint",
                    flat(&run(input_adjoint_1d, &x), T),
                    apply(&tf.bt, T, true, &x),
                ),
                (
                    "output",
                    flat(&run(output_1d, &x), 4),
                    apply(&tf.at, 4, false, &x),
                ),
                (
                    "output adjoint",
                    flat(&run(output_adjoint_1d, &x4), T),
                    apply(&tf.at, T, true, &x4),
                ),
            ];
            for (what, got, want) in cases {
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() < 1e-5 * (1.0 + w.abs()),
                        "{what}: {g} against {w}"
                    );
                }
            }
        }
    }

    use super::super::conv::square_conv as conv;

    #[test]
    fn winograd_only_where_it_measured_faster() {
        assert!(pays(&conv(32, 5, 1), 64));
        assert!(pays(&conv(16, 5, 1), 16));
        // Too few channels on either side.
        assert!(!pays(&conv(8, 5, 1), 32));
        assert!(!pays(&conv(3, 5, 1), 32));
        assert!(!pays(&conv(32, 5, 1), 8));
        // Other kernels and strides.
        assert!(!pays(&conv(32, 3, 1), 64));
        assert!(!pays(&conv(32, 7, 1), 64));
        assert!(!pays(&conv(32, 5, 2), 64));
    }
}
