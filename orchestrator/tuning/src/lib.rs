//! Tuning: what a study searches and how it decides, as pure functions of
//! the trials seen so far.
//!
//! * [`space`]: parameters, their domains and their encoding in Optuna's
//!   `trial_params` form.
//! * [`sampler`]: random, grid, QMC, TPE and a Gaussian process, each a
//!   function from the history to the next point.
//! * [`pruner`]: the median rule and ASHA's rungs, from the curves to a
//!   stop-or-go decision and a priority for the scheduler.
//! * [`pbt`]: population-based training's exploit and explore.
//! * [`objective`]: which way the metric is better.
//!
//! This crate knows no storage, no study file and no device: the study
//! builds its sampler and pruner from these parts (see `ARCHITECTURE.md`).

pub mod objective;
pub mod pareto;
pub mod pbt;
pub mod pruner;
pub mod sampler;
pub mod space;

/// `trials.number`: a trial's place in its study, from 0 (Optuna's
/// numbering). Storage reads and writes it as an `INTEGER`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct TrialNumber(pub i64);

impl std::fmt::Display for TrialNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
