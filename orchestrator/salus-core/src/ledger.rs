//! Device memory accounting and lane placement.

use std::collections::BTreeMap;

use training::Footprint;

use super::{JobId, LaneId};

/// Why a job cannot be admitted now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    pub needed: u64,
    pub free: u64,
}

/// The exact accounting at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSnapshot {
    pub budget: u64,
    pub persistent: u64,
    pub arenas: u64,
    pub shared: u64,
    pub resident_jobs: usize,
    pub lanes: usize,
}

impl LedgerSnapshot {
    pub fn used(&self) -> u64 {
        self.persistent + self.arenas + self.shared
    }
    pub fn free(&self) -> u64 {
        self.budget.saturating_sub(self.used())
    }
}

/// Tracks every byte the core has placed on the device, and keeps
/// `persistent + arenas + shared <= budget` true: nothing is admitted that
/// would break it, so no job ever runs out of memory.
#[derive(Debug, Clone)]
pub struct MemoryLedger {
    budget: u64,
    persistent: BTreeMap<JobId, u64>,
    arenas: BTreeMap<LaneId, u64>,
    /// Data sets shared by the jobs that use them: key -> (bytes, users).
    shared: BTreeMap<String, (u64, usize)>,
}

impl MemoryLedger {
    pub fn new(budget: u64) -> Self {
        MemoryLedger {
            budget,
            persistent: BTreeMap::new(),
            arenas: BTreeMap::new(),
            shared: BTreeMap::new(),
        }
    }

    /// A CUDA device's budget: its free memory less a reserve for the
    /// context and libraries (a tenth, at least 512 MiB).
    pub fn cuda_budget(free: u64) -> u64 {
        free.saturating_sub((free / 10).max(512 << 20))
    }

    /// A CPU budget: the configured bytes, else half the RAM.
    pub fn cpu_budget(configured: Option<u64>, ram: u64) -> u64 {
        configured.unwrap_or(ram / 2)
    }

    pub fn snapshot(&self) -> LedgerSnapshot {
        LedgerSnapshot {
            budget: self.budget,
            persistent: self.persistent.values().sum(),
            arenas: self.arenas.values().sum(),
            shared: self.shared.values().map(|(b, _)| b).sum(),
            resident_jobs: self.persistent.len(),
            lanes: self.arenas.len(),
        }
    }

    pub fn free(&self) -> u64 {
        self.snapshot().free()
    }

    fn shared_cost(&self, key: &str, bytes: u64) -> u64 {
        if self.shared.contains_key(key) {
            0
        } else {
            bytes
        }
    }

    /// Bytes `fp` needs on an empty device: its persistent part, one
    /// iteration's workspace and its shared data. More than the budget
    /// means it can never be admitted.
    pub fn alone_cost(fp: &Footprint) -> u64 {
        (fp.persistent_bytes + fp.ephemeral_bytes + fp.shared_bytes) as u64
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes admitting `fp` would add (its persistent part and, the first
    /// time, its shared data), not counting any arena growth.
    pub fn admission_cost(&self, fp: &Footprint, shared_key: &str) -> u64 {
        fp.persistent_bytes as u64 + self.shared_cost(shared_key, fp.shared_bytes as u64)
    }

    /// Makes `job` resident on `lane`, growing the lane's arena by
    /// `arena_growth` bytes (0 when the lane already holds a workspace of
    /// the job's shape).
    pub fn admit(
        &mut self,
        job: JobId,
        fp: &Footprint,
        shared_key: &str,
        lane: LaneId,
        arena_growth: u64,
    ) -> Result<(), NoRoom> {
        let needed = self.admission_cost(fp, shared_key) + arena_growth;
        let free = self.free();
        if needed > free {
            return Err(NoRoom { needed, free });
        }
        self.persistent.insert(job, fp.persistent_bytes as u64);
        let entry = self
            .shared
            .entry(shared_key.to_string())
            .or_insert((fp.shared_bytes as u64, 0));
        entry.1 += 1;
        *self.arenas.entry(lane).or_insert(0) += arena_growth;
        Ok(())
    }

    /// Accounts resident `job` on `lane` with a footprint it measured: its
    /// persistent bytes as given, and the lane's arena grown to hold its
    /// ephemeral bytes (a lane runs one job at a time, so its arena is the
    /// largest need among its jobs). May leave the ledger over budget: the
    /// memory is in use whatever the plan was, and nothing more is
    /// admitted until it is back under.
    pub fn refit(&mut self, job: JobId, lane: LaneId, fp: &Footprint) {
        if let Some(p) = self.persistent.get_mut(&job) {
            *p = fp.persistent_bytes as u64;
        }
        let arena = self.arenas.entry(lane).or_insert(0);
        *arena = (*arena).max(fp.ephemeral_bytes as u64);
    }

    /// Shrinks a lane's arena by `bytes` (a workspace it no longer needs);
    /// the lane closes when its arena is empty.
    pub fn shrink_arena(&mut self, lane: LaneId, bytes: u64) {
        if let Some(a) = self.arenas.get_mut(&lane) {
            *a = a.saturating_sub(bytes);
            if *a == 0 {
                self.arenas.remove(&lane);
            }
        }
    }

    /// Releases a job's persistent memory (finished, or swapped out), and
    /// its shared data when no resident job uses it any more.
    pub fn release(&mut self, job: JobId, shared_key: &str) {
        if self.persistent.remove(&job).is_some()
            && let Some(e) = self.shared.get_mut(shared_key)
        {
            e.1 -= 1;
            if e.1 == 0 {
                self.shared.remove(shared_key);
            }
        }
    }

    /// Frees a lane's arena (the lane is released).
    pub fn release_lane(&mut self, lane: LaneId) {
        self.arenas.remove(&lane);
    }

    pub fn arena(&self, lane: LaneId) -> Option<u64> {
        self.arenas.get(&lane).copied()
    }

    pub fn is_resident(&self, job: JobId) -> bool {
        self.persistent.contains_key(&job)
    }
}

/// Where a new job goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Open a new lane with an arena of this many bytes.
    NewLane { arena_bytes: u64 },
    /// Join an existing lane, growing its arena by `arena_growth` bytes.
    Join { lane: LaneId, arena_growth: u64 },
    /// Nothing fits now: wait in the queue.
    Wait,
}

/// An open lane, as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneLoad {
    pub lane: LaneId,
    /// Jobs assigned to it.
    pub jobs: usize,
    /// Whether it already holds a workspace of the new job's shape.
    pub has_shape: bool,
}

/// Salus' placement: a new lane while there is a free lane slot and memory
/// for its arena; else the best-fitting existing lane, which (with arenas
/// as per-shape workspaces) is one that already holds the job's shape, so
/// its arena need not grow (the least loaded such lane); else the least
/// loaded lane that memory lets grow; else wait.
pub fn place(
    ledger: &MemoryLedger,
    lanes: &[LaneLoad],
    max_lanes: usize,
    fp: &Footprint,
    shared_key: &str,
) -> Placement {
    let cost = ledger.admission_cost(fp, shared_key);
    let free = ledger.free();
    if cost > free {
        return Placement::Wait;
    }
    let eph = fp.ephemeral_bytes as u64;
    if lanes.len() < max_lanes && cost + eph <= free {
        return Placement::NewLane { arena_bytes: eph };
    }
    if let Some(l) = lanes
        .iter()
        .filter(|l| l.has_shape)
        .min_by_key(|l| (l.jobs, l.lane))
    {
        return Placement::Join {
            lane: l.lane,
            arena_growth: 0,
        };
    }
    if cost + eph > free {
        return Placement::Wait;
    }
    lanes
        .iter()
        .min_by_key(|l| (l.jobs, l.lane))
        .map_or(Placement::Wait, |l| Placement::Join {
            lane: l.lane,
            arena_growth: eph,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(persistent: usize, ephemeral: usize, shared: usize) -> Footprint {
        Footprint {
            persistent_bytes: persistent,
            ephemeral_bytes: ephemeral,
            shared_bytes: shared,
        }
    }

    #[test]
    fn admission_keeps_the_rule_and_accounts_exactly() {
        let mut l = MemoryLedger::new(1000);
        l.admit(JobId(1), &fp(100, 50, 200), "digits", 0, 50)
            .unwrap();
        l.admit(JobId(2), &fp(100, 50, 200), "digits", 0, 0)
            .unwrap();
        let s = l.snapshot();
        assert_eq!(
            (s.persistent, s.arenas, s.shared, s.used(), s.free()),
            (200, 50, 200, 450, 550)
        );
        // Another shape on the same lane grows its arena; the data set is counted once.
        l.admit(JobId(3), &fp(100, 80, 200), "digits", 0, 80)
            .unwrap();
        assert_eq!(l.snapshot().used(), 300 + 130 + 200);
        // 370 bytes are free: 370 persistent plus a 10-byte arena do not fit.
        let err = l
            .admit(JobId(4), &fp(370, 10, 0), "other", 1, 10)
            .unwrap_err();
        assert_eq!(
            err,
            NoRoom {
                needed: 380,
                free: 370
            }
        );
        assert!(!l.is_resident(JobId(4)));
        l.release(JobId(1), "digits");
        l.release(JobId(2), "digits");
        l.release(JobId(3), "digits");
        assert_eq!(
            l.snapshot().shared,
            0,
            "the data set goes with its last user"
        );
        l.shrink_arena(0, 50);
        assert_eq!(l.arena(0), Some(80));
        l.shrink_arena(0, 80);
        assert_eq!(l.arena(0), None, "an empty arena closes the lane");
        assert_eq!(l.snapshot().used(), 0);
    }

    #[test]
    fn a_measured_footprint_replaces_the_declared_one() {
        let mut l = MemoryLedger::new(1000);
        l.admit(JobId(1), &fp(100, 0, 0), "external", 0, 0).unwrap();
        l.admit(JobId(2), &fp(100, 0, 0), "external", 0, 0).unwrap();
        // Job 1 measured 300 persistent bytes and a 200-byte peak above them.
        l.refit(JobId(1), 0, &fp(300, 200, 0));
        let s = l.snapshot();
        assert_eq!((s.persistent, s.arenas, s.free()), (400, 200, 400));
        // Job 2's smaller ephemeral need does not shrink the lane's arena.
        l.refit(JobId(2), 0, &fp(150, 50, 0));
        assert_eq!((l.snapshot().persistent, l.arena(0)), (450, Some(200)));
        // Over budget: recorded as it is, and nothing fits until it is back.
        l.refit(JobId(2), 0, &fp(900, 50, 0));
        assert_eq!(l.free(), 0);
        assert!(l.admit(JobId(3), &fp(1, 0, 0), "external", 1, 0).is_err());
        // A job not resident is not counted.
        l.refit(JobId(9), 0, &fp(5000, 0, 0));
        assert_eq!(l.snapshot().resident_jobs, 2);
    }

    #[test]
    fn placement_prefers_a_lane_with_the_shape_then_a_new_lane_then_growth() {
        let l = MemoryLedger::new(10_000);
        let load = |lane, jobs, has_shape| LaneLoad {
            lane,
            jobs,
            has_shape,
        };
        assert_eq!(
            place(&l, &[], 2, &fp(100, 300, 0), "d"),
            Placement::NewLane { arena_bytes: 300 }
        );
        // A free lane slot comes first, even when a lane holds the shape.
        assert_eq!(
            place(&l, &[load(1, 1, true)], 2, &fp(100, 300, 0), "d"),
            Placement::NewLane { arena_bytes: 300 }
        );
        assert_eq!(
            place(
                &l,
                &[load(0, 3, false), load(1, 1, true)],
                2,
                &fp(100, 300, 0),
                "d"
            ),
            Placement::Join {
                lane: 1,
                arena_growth: 0
            }
        );
        assert_eq!(
            place(&l, &[load(0, 3, false)], 2, &fp(100, 300, 0), "d"),
            Placement::NewLane { arena_bytes: 300 }
        );
        assert_eq!(
            place(
                &l,
                &[load(0, 3, false), load(1, 2, false)],
                2,
                &fp(100, 300, 0),
                "d"
            ),
            Placement::Join {
                lane: 1,
                arena_growth: 300
            }
        );
        // Memory short for the persistent part, or for any growth: wait.
        assert_eq!(
            place(&l, &[load(0, 1, true)], 4, &fp(10_001, 10, 0), "d"),
            Placement::Wait
        );
        assert_eq!(
            place(&l, &[load(0, 1, false)], 4, &fp(9_900, 200, 0), "d"),
            Placement::Wait
        );
        // ... unless a lane already holds the shape.
        assert_eq!(
            place(&l, &[load(0, 1, true)], 4, &fp(9_900, 200, 0), "d"),
            Placement::Join {
                lane: 0,
                arena_growth: 0
            }
        );
    }

    #[test]
    fn a_job_larger_than_the_whole_budget_is_told_apart() {
        let l = MemoryLedger::new(1000);
        let fits = fp(600, 200, 200);
        let never = fp(600, 200, 201);
        assert_eq!(MemoryLedger::alone_cost(&fits), 1000);
        assert!(MemoryLedger::alone_cost(&fits) <= l.budget());
        assert!(MemoryLedger::alone_cost(&never) > l.budget());
    }

    #[test]
    fn budgets_leave_a_reserve() {
        assert_eq!(
            MemoryLedger::cuda_budget(100 << 30),
            (100u64 << 30) - (10 << 30)
        );
        assert_eq!(
            MemoryLedger::cuda_budget(1 << 30),
            (1u64 << 30) - (512 << 20)
        );
        assert_eq!(MemoryLedger::cpu_budget(None, 24 << 30), 12 << 30);
        assert_eq!(MemoryLedger::cpu_budget(Some(5), 24 << 30), 5);
    }
}
