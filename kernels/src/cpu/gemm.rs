//! GEMM on the CPU through `matrixmultiply`, split into tasks by hand.
//!
//! `matrixmultiply` runs single-threaded here; parallelism comes from the
//! lane's pool, over batch slots first and, for a lone large product, over
//! row or column blocks of `C`. That keeps `lanes x threads <= cores` under
//! the Salus core's control instead of a hidden global pool.

use super::CpuCtx;
use super::par;
use crate::ops::{Gemm, GroupedGemm};

/// `C`'s pointer, shared by tasks that write disjoint blocks of it. Kept
/// here because a column block of a row-major `C` is strided, so no slice
/// split describes it, and `matrixmultiply` takes raw pointers anyway.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks of one call write disjoint blocks of C (see `gemm`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    // A method, so that closures capture the whole (Send) wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Below this many multiply-adds one product is not split across threads.
pub(crate) const MIN_MACS_PER_TASK: usize = 1 << 18;

#[derive(Clone, Copy)]
struct Task {
    /// One product (`batch` 1) and its operands' offsets.
    g: Gemm,
    at: (usize, usize, usize),
    /// Split along rows of C (`true`) or columns (`false`).
    rows: bool,
    lo: usize,
    hi: usize,
}

/// A strided batch of products, each as its own [`Task`]s.
pub(crate) fn gemm(ctx: &CpuCtx, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    let one = Gemm { batch: 1, ..*g };
    let members = (0..g.batch).map(|i| (one, i));
    run(ctx, g, members, g.batch, (a, b, c));
}

/// A grouped GEMM: the members' products, of their own sizes, in one
/// parallel call. Each member's bits are those of the same product alone:
/// a split into row or column blocks leaves every dot product whole.
pub(crate) fn gemm_grouped(
    ctx: &CpuCtx,
    gg: &GroupedGemm<'_>,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) {
    let members = (0..gg.sizes.len()).map(|i| (gg.member(i), i));
    run(ctx, &gg.base, members, gg.sizes.len(), (a, b, c));
}

/// Deals the products (member `i` at `i` strides of `layout`) into tasks,
/// then runs them on the lane's threads.
fn run(
    ctx: &CpuCtx,
    layout: &Gemm,
    members: impl Iterator<Item = (Gemm, usize)>,
    count: usize,
    (a, b, c): (&[f32], &[f32], &mut [f32]),
) {
    let mut tasks = Vec::with_capacity(count);
    for (g, i) in members {
        if g.m == 0 || g.n == 0 {
            continue;
        }
        let macs = g.m * g.n * g.k;
        let split_rows = g.m >= g.n;
        let extent = if split_rows { g.m } else { g.n };
        let parts = if count >= ctx.threads {
            1
        } else {
            (ctx.threads / count.max(1))
                .min(macs / MIN_MACS_PER_TASK)
                .clamp(1, extent.div_ceil(16).max(1))
        };
        let block = extent.div_ceil(parts).next_multiple_of(16).max(1);
        let at = (
            i * layout.stride_a,
            i * layout.stride_b,
            i * layout.stride_c,
        );
        let mut lo = 0;
        while lo < extent {
            let hi = (lo + block).min(extent);
            tasks.push(Task {
                g,
                at,
                rows: split_rows,
                lo,
                hi,
            });
            lo = hi;
        }
    }
    let out = OutPtr(c.as_mut_ptr());
    let (ap, bp) = (a.as_ptr() as usize, b.as_ptr() as usize);
    par::run(ctx, tasks.iter(), |t| {
        let g = &t.g;
        let (ld_a, ld_b, ld_c) = g.lds();
        let (rsa, csa) = if g.trans_a { (1, ld_a) } else { (ld_a, 1) };
        let (rsb, csb) = if g.trans_b { (1, ld_b) } else { (ld_b, 1) };
        let (a, b) = (ap as *const f32, bp as *const f32);
        let (mut ao, mut bo, mut co) = t.at;
        let (mut m, mut n) = (g.m, g.n);
        if t.rows {
            ao += t.lo * rsa;
            co += t.lo * ld_c;
            m = t.hi - t.lo;
        } else {
            bo += t.lo * csb;
            co += t.lo;
            n = t.hi - t.lo;
        }
        // SAFETY: the backend checked every operand's extent; tasks
        // write disjoint blocks of C.
        unsafe {
            matrixmultiply::sgemm(
                m,
                g.k,
                n,
                g.alpha,
                a.add(ao),
                rsa as isize,
                csa as isize,
                b.add(bo),
                rsb as isize,
                csb as isize,
                g.beta,
                out.get().add(co),
                ld_c as isize,
                1,
            );
        }
    });
}

/// One single-threaded `C = op(A) op(B) + beta * C` over contiguous
/// row-major operands, `(m, n, k)`: the product of a task that is already
/// one of many (the chunked convolutions).
pub(crate) fn sgemm_one(
    (m, n, k): (usize, usize, usize),
    (a, trans_a): (&[f32], bool),
    (b, trans_b): (&[f32], bool),
    beta: f32,
    c: &mut [f32],
) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    let (rsa, csa) = if trans_a { (1, m) } else { (k, 1) };
    let (rsb, csb) = if trans_b { (1, k) } else { (n, 1) };
    // SAFETY: the assert above bounds every element the call touches.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}
