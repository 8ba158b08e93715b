//! Splitting one operation into tasks for a lane's thread pool.
//!
//! Tasks never cross a slot boundary, so per-slot scalars are looked up
//! once per task, and small operations stay on the calling thread: on a
//! 2-core machine a pool hand-off costs more than a 32K-element loop.

use rayon::prelude::*;

use super::CpuCtx;

/// Below this many elements per task an element-wise op is not split.
pub(crate) const MIN_ELEMS_PER_TASK: usize = 1 << 16;

/// Cuts `buf` into the given ranges, which must be in increasing order and
/// disjoint, as mutable slices: each task then owns its output, checked by
/// the borrow checker instead of promised in an `unsafe` block. Lazy, so
/// that an op run on one thread allocates nothing for it.
pub(crate) fn split_ranges<I: Iterator<Item = std::ops::Range<usize>>>(
    buf: &mut [f32],
    ranges: impl IntoIterator<IntoIter = I>,
) -> SplitRanges<'_, I> {
    SplitRanges {
        rest: buf,
        at: 0,
        ranges: ranges.into_iter(),
    }
}

/// The iterator of [`split_ranges`].
pub(crate) struct SplitRanges<'a, I> {
    rest: &'a mut [f32],
    at: usize,
    ranges: I,
}

impl<'a, I: Iterator<Item = std::ops::Range<usize>>> Iterator for SplitRanges<'a, I> {
    type Item = &'a mut [f32];

    fn next(&mut self) -> Option<&'a mut [f32]> {
        let r = self.ranges.next()?;
        assert!(
            r.start >= self.at && r.start <= r.end,
            "ranges out of order"
        );
        let (_, tail) = std::mem::take(&mut self.rest).split_at_mut(r.start - self.at);
        let (piece, tail) = tail.split_at_mut(r.end - r.start);
        self.rest = tail;
        self.at = r.end;
        Some(piece)
    }
}

/// Runs `f` on every task: on the pool when the context may use more than
/// one of its threads and there is more than one task, else in order on
/// this thread (allocating nothing). Where the context uses fewer threads
/// than its pool has, the tasks are dealt into that many runs, each run in
/// order, so that no more threads than that work at once.
pub(crate) fn run<T: Send>(
    ctx: &CpuCtx,
    tasks: impl Iterator<Item = T>,
    f: impl Fn(T) + Sync + Send,
) {
    match &ctx.pool {
        Some(pool) if ctx.threads > 1 => {
            let tasks: Vec<T> = tasks.collect();
            if tasks.len() <= 1 {
                tasks.into_iter().for_each(f)
            } else if ctx.threads >= pool.current_num_threads() || tasks.len() <= ctx.threads {
                pool.install(|| tasks.into_par_iter().for_each(&f))
            } else {
                let runs = deal(tasks, ctx.threads);
                pool.install(|| {
                    runs.into_par_iter()
                        .for_each(|run| run.into_iter().for_each(&f))
                })
            }
        }
        _ => tasks.for_each(f),
    }
}

/// `tasks` dealt round-robin into `runs` runs, so that each run gets
/// tasks from all along the list (neighbouring tasks are alike in size).
fn deal<T>(tasks: Vec<T>, runs: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..runs).map(|_| Vec::new()).collect();
    for (i, t) in tasks.into_iter().enumerate() {
        out[i % runs].push(t);
    }
    out
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
    segments_of(ctx, slots, |_| per_slot, min)
}

/// As [`segments`], slot `s` holding `len_of(s)` elements.
pub(crate) fn segments_of(
    ctx: &CpuCtx,
    slots: usize,
    len_of: impl Fn(usize) -> usize,
    min: usize,
) -> Vec<Segment> {
    let total: usize = (0..slots).map(&len_of).sum();
    let parts = (total / min.max(1)).clamp(1, ctx.threads.max(1));
    let chunk = total.div_ceil(parts).max(1);
    let mut out = Vec::with_capacity(parts + slots);
    for slot in 0..slots {
        let (mut start, len) = (0, len_of(slot));
        while start < len {
            let end = (start + chunk).min(len);
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

    #[test]
    fn a_context_never_works_on_more_threads_than_it_was_set_to() {
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let mut ctx = CpuCtx::new(4).unwrap();
        for threads in [1, 2, 3, 4, 9] {
            ctx.set_threads(threads);
            assert_eq!(ctx.threads(), threads.min(4));
            let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let seen = Mutex::new(Vec::new());
            run(&ctx, 0..40, |t| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
                seen.lock().unwrap().push(t);
                now.fetch_sub(1, Ordering::SeqCst);
            });
            let mut seen = seen.into_inner().unwrap();
            seen.sort();
            assert_eq!(seen, (0..40).collect::<Vec<_>>(), "every task once");
            assert!(most.into_inner() <= ctx.threads(), "{threads} threads");
        }
    }

    #[test]
    fn split_ranges_cuts_disjoint_slices_and_refuses_overlaps() {
        let mut v: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let got: Vec<Vec<f32>> = split_ranges(&mut v, [1..3, 3..3, 5..9])
            .map(|p| p.to_vec())
            .collect();
        assert_eq!(got, vec![vec![1.0, 2.0], vec![], vec![5.0, 6.0, 7.0, 8.0]]);
        let overlap = std::panic::catch_unwind(move || {
            let mut v = vec![0.0f32; 10];
            split_ranges(&mut v, [0..4, 3..5]).count()
        });
        assert!(overlap.is_err());
    }
}
