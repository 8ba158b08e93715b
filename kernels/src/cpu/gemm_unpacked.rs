//! Products whose operands already sit in cache, multiplied without
//! packing them first: Winograd's 64 products per chunk of tiles, the
//! direct convolutions' products with image rows read in place, and the
//! patch form's output from a chunk's patch rows.
//!
//! Why not `matrixmultiply`: it copies both operands into packed panels on
//! every call. For a product whose inner dimension is a convolution's
//! channels (16-64) that copy costs about as much as the multiplication
//! (in a profile of `cnn-32`, 16% of an iteration packing beside 37% in
//! the kernel). Here the right operand's rows are read as they lie (an
//! `in_c x out_c` filter block or a chunk's gradient rows, all in L1 or
//! L2) and the left one's elements are broadcast where they lie.
//!
//! Each element of `C` is `0 + a_0 b_0 + a_1 b_1 + ...` in order of the
//! inner index, multiplied and added without fusing, then added to `C` or
//! stored: its bits depend on neither the vector width nor where the
//! element falls in a register block, so a row's result does not depend
//! on how many rows share the call.

/// Rows and columns of `C` held in registers: 4 x 16 is 4 AVX-512 or 8
/// AVX registers of sums, leaving room for a row of `B` and a broadcast;
/// 4 rows, since a chunk's tiles come 4 or 16 an image and image rows are
/// 4-64 pixels wide.
const MR: usize = 4;
const NR: usize = 16;

/// A strided operand: element `(r, k)` is `data[r * rs + k * ks]`, or
/// with `runs = Some((run, jump))`, the inner index cut into runs of `run`
/// steps, each `jump` after the last: `data[r * rs + (k / run) * jump +
/// (k % run) * ks]` (a convolution's kernel rows, one image row apart).
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub ks: usize,
    pub runs: Option<(usize, usize)>,
}

impl Strided<'_> {
    /// Where element `(r, k)` lies in `data`.
    #[inline(always)]
    fn at(&self, r: usize, k: usize) -> usize {
        match self.runs {
            Some((run, jump)) => r * self.rs + (k / run) * jump + (k % run) * self.ks,
            None => r * self.rs + k * self.ks,
        }
    }
}

/// `C = A . B` (or `C += A . B` with `accumulate`) for `C` `rows x cols`
/// (row-major, `ldc` apart), `A` `rows x k` (strided) and `B` `k x cols`
/// (row-major, `ldb` apart).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn product(
    (rows, cols, k): (usize, usize, usize),
    a: Strided<'_>,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
    pad: &mut Vec<f32>,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(k == 0 || a.data.len() > a.at(rows - 1, k - 1));
    assert!(a.runs.is_none_or(|(run, _)| run > 0));
    assert!(b.len() >= k.saturating_sub(1) * ldb + cols || k == 0);
    assert!(c.len() >= (rows - 1) * ldc + cols);
    for r0 in (0..rows).step_by(MR) {
        let mr = MR.min(rows - r0);
        for j0 in (0..cols).step_by(NR) {
            let nr = NR.min(cols - j0);
            if mr == MR && nr == NR {
                let a = Strided {
                    data: &a.data[r0 * a.rs..],
                    ..a
                };
                // SAFETY: the asserts above bound every element the block
                // reads (rows r0..r0 + MR of A, columns j0..j0 + NR of B)
                // and writes.
                unsafe {
                    block(
                        k,
                        a,
                        &b[j0..],
                        ldb,
                        &mut c[r0 * ldc + j0..],
                        ldc,
                        accumulate,
                    )
                };
            } else {
                edge(
                    k,
                    (r0, mr),
                    (j0, nr),
                    a,
                    (b, ldb),
                    (c, ldc),
                    accumulate,
                    pad,
                );
            }
        }
    }
}

/// One `MR x NR` block of `C` from `k` steps.
///
/// # Safety
/// `a` must hold `(MR - 1) * rs + (k - 1) * ks + 1` elements, `b`
/// `(k - 1) * ldb + NR`, and `c` `(MR - 1) * ldc + NR`.
#[inline(always)]
// Index loops on purpose (see the comment in the body).
#[allow(clippy::needless_range_loop)]
unsafe fn block(
    k: usize,
    a: Strided<'_>,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let mut acc = [[0.0f32; NR]; MR];
    let (ap, bp) = (a.data.as_ptr(), b.as_ptr());
    let (run, jump) = a.runs.unwrap_or((k.max(1), 0));
    let (mut kk, mut base) = (0, 0);
    // Plain index loops throughout: iterator adapters here can be left as
    // calls that write the sums in pieces.
    while kk < k {
        for i in 0..run.min(k - kk) {
            // SAFETY: in bounds by the caller's contract.
            let bv: [f32; NR] = unsafe { *(bp.add((kk + i) * ldb) as *const [f32; NR]) };
            for r in 0..MR {
                let av = unsafe { *ap.add(r * a.rs + base + i * a.ks) };
                for j in 0..NR {
                    acc[r][j] += av * bv[j];
                }
            }
        }
        kk += run;
        base += jump;
    }
    for r in 0..MR {
        // SAFETY: `c` holds `(MR - 1) * ldc + NR` elements.
        let row = unsafe { &mut *(c.as_mut_ptr().add(r * ldc) as *mut [f32; NR]) };
        if accumulate {
            for j in 0..NR {
                row[j] += acc[r][j];
            }
        } else {
            *row = acc[r];
        }
    }
}

/// A block at the bottom or right edge: the same block on zero-padded
/// copies, so that each element is summed exactly as inside.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn edge(
    k: usize,
    (r0, mr): (usize, usize),
    (j0, nr): (usize, usize),
    a: Strided<'_>,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
    pad: &mut Vec<f32>,
) {
    pad.clear();
    pad.resize((MR + NR) * k + MR * NR, 0.0);
    let (ap, rest) = pad.split_at_mut(MR * k);
    let (bp, cp) = rest.split_at_mut(k * NR);
    for r in 0..mr {
        for kk in 0..k {
            ap[r * k + kk] = a.data[a.at(r0 + r, kk)];
        }
    }
    for kk in 0..k {
        bp[kk * NR..][..nr].copy_from_slice(&b[kk * ldb + j0..][..nr]);
    }
    for r in 0..mr {
        cp[r * NR..][..nr].copy_from_slice(&c[(r0 + r) * ldc + j0..][..nr]);
    }
    let a = Strided {
        data: ap,
        rs: k,
        ks: 1,
        runs: None,
    };
    // SAFETY: the padded copies are exactly one block's size.
    unsafe { block(k, a, bp, NR, cp, NR, accumulate) };
    for r in 0..mr {
        c[(r0 + r) * ldc + j0..][..nr].copy_from_slice(&cp[r * NR..][..nr]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a float64 product, with edges on both sides, a strided
    /// (transposed) left operand, one in runs, and accumulation; and a
    /// row's bits do not depend on the rows beside it.
    #[test]
    fn products_match_float64_and_rows_are_independent() {
        let (rows, cols, k) = (13, 37, 29);
        let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 250.0;
        let a: Vec<f32> = (0..rows * k).map(val).collect();
        let at: Vec<f32> = (0..k * rows)
            .map(|i| a[(i % rows) * k + i / rows])
            .collect();
        let b: Vec<f32> = (0..k * cols).map(|i| val(i + 3)).collect();
        let c0: Vec<f32> = (0..rows * cols).map(|i| val(i + 11)).collect();
        // The same matrix in runs of 10 columns, 1000 apart, rows 11
        // apart, NaN everywhere else (read by mistake, it would show).
        let (run, jump, rs) = (10, 1000, 11);
        let mut ar = vec![f32::NAN; k.div_ceil(run) * jump];
        for (r, kk) in (0..rows).flat_map(|r| (0..k).map(move |kk| (r, kk))) {
            ar[r * rs + (kk / run) * jump + kk % run] = a[r * k + kk];
        }
        let mut pad = Vec::new();
        for (accumulate, layout) in [(false, 0), (true, 0), (false, 1), (true, 2)] {
            let mut c = c0.clone();
            let transposed = layout == 1;
            let op = match layout {
                0 => Strided {
                    data: &a,
                    rs: k,
                    ks: 1,
                    runs: None,
                },
                1 => Strided {
                    data: &at,
                    rs: 1,
                    ks: rows,
                    runs: None,
                },
                _ => Strided {
                    data: &ar,
                    rs,
                    ks: 1,
                    runs: Some((run, jump)),
                },
            };
            product(
                (rows, cols, k),
                op,
                (&b, cols),
                (&mut c, cols),
                accumulate,
                &mut pad,
            );
            for (r, j) in (0..rows).flat_map(|r| (0..cols).map(move |j| (r, j))) {
                let dot: f64 = (0..k)
                    .map(|kk| a[r * k + kk] as f64 * b[kk * cols + j] as f64)
                    .sum();
                let want = dot
                    + if accumulate {
                        c0[r * cols + j] as f64
                    } else {
                        0.0
                    };
                let got = c[r * cols + j] as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "({r}, {j}): {got} against {want}"
                );
            }
            // Row 7 alone gives the same bits as row 7 among 13.
            let mut one = c0[7 * cols..8 * cols].to_vec();
            let op7 = Strided {
                data: &a[7 * k..],
                rs: k,
                ks: 1,
                runs: None,
            };
            product(
                (1, cols, k),
                op7,
                (&b, cols),
                (&mut one, cols),
                accumulate,
                &mut pad,
            );
            if !transposed {
                assert_eq!(one, c[7 * cols..8 * cols], "accumulate {accumulate}");
            }
        }
    }
}
