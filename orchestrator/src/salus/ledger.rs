//! Device memory accounting and lane placement.

use std::collections::BTreeMap;

use workers::Footprint;

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

    /// Bytes admitting `fp` would add (its persistent part and, the first
    /// time, its shared data), not counting any arena growth.
    pub fn admission_cost(&self, fp: &Footprint, shared_key: &str) -> u64 {
        fp.persistent_bytes as u64 + self.shared_cost(shared_key, fp.shared_bytes as u64)
    }

    /// Makes `job` resident, with `extra_arena` more bytes for its lane's
    /// arena (0 when the lane's arena already fits it).
    pub fn admit(
        &mut self,
        job: JobId,
        fp: &Footprint,
        shared_key: &str,
        lane: LaneId,
        arena_bytes: u64,
    ) -> Result<(), NoRoom> {
        let arena_growth = arena_bytes.saturating_sub(self.arenas.get(&lane).copied().unwrap_or(0));
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
        let arena = self.arenas.entry(lane).or_insert(0);
        *arena = (*arena).max(arena_bytes);
        Ok(())
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
    /// Join an existing lane whose arena already fits the job.
    Join(LaneId),
    /// Nothing fits now: wait in the queue.
    Wait,
}

/// Salus' placement: a new lane when there is a free lane slot and memory
/// for its arena; else the best-fitting existing lane (the smallest arena
/// that fits the job's ephemeral bytes); else wait.
pub fn place(
    ledger: &MemoryLedger,
    lanes: &[LaneId],
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
    lanes
        .iter()
        .filter_map(|&l| ledger.arena(l).filter(|&a| a >= eph).map(|a| (a, l)))
        .min()
        .map_or(Placement::Wait, |(_, l)| Placement::Join(l))
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
        l.admit(1, &fp(100, 50, 200), "digits", 0, 50).unwrap();
        l.admit(2, &fp(100, 50, 200), "digits", 0, 50).unwrap();
        let s = l.snapshot();
        assert_eq!(
            (s.persistent, s.arenas, s.shared, s.used(), s.free()),
            (200, 50, 200, 450, 550)
        );
        // A larger arena on the same lane grows it; the data set is counted once.
        l.admit(3, &fp(100, 80, 200), "digits", 0, 80).unwrap();
        assert_eq!(l.snapshot().used(), 300 + 80 + 200);
        // 420 bytes are free: 420 persistent plus a 10-byte arena do not fit.
        let err = l.admit(4, &fp(420, 10, 0), "other", 1, 10).unwrap_err();
        assert_eq!(
            err,
            NoRoom {
                needed: 430,
                free: 420
            }
        );
        assert!(!l.is_resident(4));
        l.release(1, "digits");
        l.release(2, "digits");
        l.release(3, "digits");
        assert_eq!(
            l.snapshot().shared,
            0,
            "the data set goes with its last user"
        );
        l.release_lane(0);
        assert_eq!(l.snapshot().used(), 0);
    }

    #[test]
    fn placement_opens_lanes_then_best_fits() {
        let mut l = MemoryLedger::new(10_000);
        assert_eq!(
            place(&l, &[], 2, &fp(100, 300, 0), "d"),
            Placement::NewLane { arena_bytes: 300 }
        );
        l.admit(1, &fp(100, 300, 0), "d", 0, 300).unwrap();
        l.admit(2, &fp(100, 900, 0), "d", 1, 900).unwrap();
        // Lanes are full: the smallest arena that fits wins.
        assert_eq!(
            place(&l, &[0, 1], 2, &fp(100, 250, 0), "d"),
            Placement::Join(0)
        );
        assert_eq!(
            place(&l, &[0, 1], 2, &fp(100, 500, 0), "d"),
            Placement::Join(1)
        );
        assert_eq!(
            place(&l, &[0, 1], 2, &fp(100, 2000, 0), "d"),
            Placement::Wait
        );
        // Memory short for the persistent part: wait.
        assert_eq!(
            place(&l, &[0, 1], 4, &fp(9_000, 10, 0), "d"),
            Placement::Wait
        );
        // 8600 bytes free: room for the job but not for a new 250-byte arena, so join the best fit.
        assert_eq!(
            place(&l, &[0, 1], 4, &fp(8_500, 250, 0), "d"),
            Placement::Join(0)
        );
        assert_eq!(
            place(&l, &[0, 1], 4, &fp(8_000, 250, 0), "d"),
            Placement::NewLane { arena_bytes: 250 }
        );
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
