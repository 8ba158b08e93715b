//! Splitting one operation into tasks for a lane's thread pool.
//!
//! Tasks never cross a slot boundary, so per-slot scalars are looked up
//! once per task, and small operations stay on the calling thread: on a
//! 2-core machine a pool hand-off costs more than a 32K-element loop.

use rayon::prelude::*;

use super::CpuCtx;

/// Below this many elements per task an element-wise op is not split.
pub(crate) const MIN_ELEMS_PER_TASK: usize = 1 << 16;

/// A raw output pointer shared by tasks that write disjoint ranges.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub *mut f32);
// SAFETY: every user hands each task a disjoint range of the pointee.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    pub fn new(s: &mut [f32]) -> Self {
        SyncPtr(s.as_mut_ptr())
    }
    pub fn ptr(self) -> *mut f32 {
        self.0
    }
    /// # Safety
    /// `off..off + len` must lie in the original slice, and no other live
    /// reference may overlap it.
    pub unsafe fn slice<'a>(self, off: usize, len: usize) -> &'a mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(off), len) }
    }
}

/// Runs `f` on every task, on the pool when there is more than one.
pub(crate) fn run<T: Sync>(ctx: &CpuCtx, tasks: &[T], f: impl Fn(&T) + Sync + Send) {
    match &ctx.pool {
        Some(pool) if tasks.len() > 1 => pool.install(|| tasks.par_iter().for_each(&f)),
        _ => tasks.iter().for_each(f),
    }
}

/// A range `start..end` of elements inside slot `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub slot: usize,
    pub start: usize,
    pub end: usize,
}

/// Cuts `slots` segments of `per_slot` elements into at most `ctx.threads`
/// (or one per slot, if more) tasks of at least `min` elements each.
pub(crate) fn segments(ctx: &CpuCtx, slots: usize, per_slot: usize, min: usize) -> Vec<Segment> {
    let total = slots * per_slot;
    let parts = (total / min.max(1)).clamp(1, ctx.threads.max(1));
    let chunk = total.div_ceil(parts).max(1);
    let mut out = Vec::with_capacity(parts + slots);
    for slot in 0..slots {
        let mut start = 0;
        while start < per_slot {
            let end = (start + chunk).min(per_slot);
            out.push(Segment { slot, start, end });
            start = end;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_every_slot_once() {
        let ctx = CpuCtx::new(4).unwrap();
        for (slots, per, min) in [
            (1, 10, 1),
            (3, 1000, 100),
            (5, 7, 1),
            (2, 1 << 20, 1 << 16),
            (1, 0, 1),
        ] {
            let segs = segments(&ctx, slots, per, min);
            let mut covered = vec![0usize; slots * per];
            for s in &segs {
                assert!(s.start < s.end && s.end <= per);
                for i in s.start..s.end {
                    covered[s.slot * per + i] += 1;
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "{slots} {per} {min}");
        }
    }
}
