//! Products whose operands already sit in cache, multiplied without
//! packing them first: Winograd's 64 products per chunk of tiles, and the
//! direct convolutions' products with image rows read in place.
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

/// A strided operand: element `(r, k)` is `data[r * rs + k * ks]`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub ks: usize,
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
    assert!(a.data.len() > (rows - 1) * a.rs + k.saturating_sub(1) * a.ks || k == 0);
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
    for kk in 0..k {
        // SAFETY: in bounds by the caller's contract.
        let bv: [f32; NR] = unsafe { *(bp.add(kk * ldb) as *const [f32; NR]) };
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = unsafe { *ap.add(r * a.rs + kk * a.ks) };
            acc.iter_mut().zip(&bv).for_each(|(s, &b)| *s += av * b);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let row = &mut c[r * ldc..][..NR];
        if accumulate {
            row.iter_mut().zip(acc).for_each(|(c, &s)| *c += s);
        } else {
            row.copy_from_slice(acc);
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
            ap[r * k + kk] = a.data[(r0 + r) * a.rs + kk * a.ks];
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
    /// (transposed) left operand and accumulation; and a row's bits do
    /// not depend on the rows beside it.
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
        let mut pad = Vec::new();
        for (accumulate, transposed) in [(false, false), (true, false), (false, true)] {
            let mut c = c0.clone();
            let op = if transposed {
                Strided {
                    data: &at,
                    rs: 1,
                    ks: rows,
                }
            } else {
                Strided {
                    data: &a,
                    rs: k,
                    ks: 1,
                }
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
