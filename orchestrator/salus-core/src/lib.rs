//! The embedded Salus core of salus-tune. It depends on `kernels` and
//! `training` only: it knows no study file, sampler or storage (see
//! `ARCHITECTURE.md` at the repository root).
//!
//! Salus (Yu & Chowdhury, MLSys 2020) shares one device between training
//! jobs with two primitives: fast switching at iteration boundaries, and
//! memory sharing that keeps a job's *persistent* memory (weights, optimizer
//! state) resident while *ephemeral* memory (activations, gradients) lives
//! in per-lane arenas that jobs on a lane take turns using.
//!
//! This crate holds the core's pure parts, each testable without a device:
//!
//! * [`ledger::MemoryLedger`]: the admission rule
//!   `sum(persistent of resident jobs) + sum(lane arenas) + shared data <= budget`,
//!   and [`ledger::place`], Salus' lane placement. A lane's arena is the
//!   workspaces of the shapes it serves (one per shape, reused by every job
//!   of that shape on the lane), so the best fit is a lane that already
//!   holds the job's shape.
//! * [`policy`]: `pack`, `fair`, `srtf`, `fifo` and `priority` as functions
//!   from the runnable jobs' state to the job a lane runs next.
//!
//! * [`fusion`]: how many trials of one shape may run as one fused group.
//!
//! [`core::SalusCore`] is the executor that drives lanes with these decisions,
//! and [`devices::DeviceCores`] runs one core per device of a machine.

pub mod core;
pub mod devices;
pub mod fusion;
pub mod ledger;
pub mod policy;

/// Identifies a job inside the core: a trial running alone, or a fused
/// group. The core numbers jobs from 0 in submission order (the cores of
/// one process share the count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u64);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {}", self.0)
    }
}
/// Identifies a lane.
pub type LaneId = usize;
