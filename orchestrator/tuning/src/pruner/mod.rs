//! Early stopping: at each report point, a pruner decides whether a trial
//! continues, pauses (below the promotion cut, kept for later), or is
//! pruned. Every pruner is a pure function of the trials' learning curves,
//! so it is tested on hand-built curves without training anything.
//!
//! * [`Asha`]: asynchronous successive halving. Rungs at `min_resource *
//!   eta^k` report steps; a trial reaching a rung continues if it is in the
//!   top `1/eta` of the trials seen at that rung, else it pauses there and
//!   may be promoted later, as more trials reach the rung.
//! * [`Hyperband`]: several ASHA brackets with different minimum resources;
//!   a trial belongs to one bracket and competes only within it.
//! * [`Median`]: prunes a trial whose value at a step is worse than the
//!   median of earlier trials' values at that step, after warm-up.
//!
//! [`priority`] turns a trial's rung and rank into the priority the Salus
//! core's `priority` policy serves.

mod asha;
mod median;

pub use asha::{Asha, Hyperband};
pub use median::Median;

use std::collections::BTreeMap;

use crate::TrialNumber;
use crate::objective::Direction;

/// A trial's intermediate values, by report step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Curve {
    pub values: BTreeMap<u64, f64>,
    /// Finished (complete or pruned): its curve no longer grows.
    pub finished: bool,
}

/// Every trial's curve, by trial number.
pub type Curves = BTreeMap<TrialNumber, Curve>;

/// What `trial` reported at `step`, if it did.
pub fn value_at(curves: &Curves, trial: TrialNumber, step: u64) -> Option<f64> {
    curves
        .get(&trial)
        .and_then(|c| c.values.get(&step).copied())
}

/// What a trial does after a report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    Continue,
    /// Below the promotion cut at `rung`: wait there, resident or swapped out.
    Pause {
        rung: usize,
    },
    Prune,
}

/// An early-stopping rule.
pub trait Pruner: Send {
    fn name(&self) -> &'static str;
    /// The decision for `trial` after it reported at `step`.
    fn decide(
        &self,
        trial: TrialNumber,
        step: u64,
        curves: &Curves,
        direction: Direction,
    ) -> Decision;
    /// Paused trials (with their rung) that may now continue.
    fn promotions(
        &self,
        paused: &BTreeMap<TrialNumber, usize>,
        curves: &Curves,
        direction: Direction,
    ) -> Vec<TrialNumber> {
        let _ = (paused, curves, direction);
        Vec::new()
    }
    /// The rung a trial that reported at `step` has reached, if rungs apply.
    fn rung(&self, trial: TrialNumber, step: u64) -> Option<usize> {
        let _ = (trial, step);
        None
    }
}

/// Never stops anything.
pub struct NoPruner;

impl Pruner for NoPruner {
    fn name(&self) -> &'static str {
        "none"
    }
    fn decide(&self, _: TrialNumber, _: u64, _: &Curves, _: Direction) -> Decision {
        Decision::Continue
    }
}

/// `a` ranks at or above `b`.
pub(crate) fn at_least(direction: Direction, a: f64, b: f64) -> bool {
    match direction {
        Direction::Maximize => a >= b,
        Direction::Minimize => a <= b,
    }
}

/// Sorts values best first.
pub(crate) fn best_first(direction: Direction, mut v: Vec<f64>) -> Vec<f64> {
    v.retain(|x| x.is_finite());
    match direction {
        Direction::Maximize => v.sort_by(|a, b| b.total_cmp(a)),
        Direction::Minimize => v.sort_by(f64::total_cmp),
    }
    v
}

/// A trial's scheduling priority: its rung first, then its rank among the
/// trials at that rung (`rank` 0 is the best of `of`). Higher runs first.
pub fn priority(rung: usize, rank: usize, of: usize) -> f64 {
    rung as f64
        + if of > 1 {
            1.0 - rank as f64 / (of - 1) as f64
        } else {
            1.0
        } * 0.999
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_orders_by_rung_then_rank() {
        assert!(priority(2, 5, 6) > priority(1, 0, 6), "a higher rung wins");
        assert!(priority(1, 0, 6) > priority(1, 1, 6));
        assert!(priority(1, 5, 6) >= 1.0 && priority(1, 0, 6) < 2.0);
        assert_eq!(priority(0, 0, 1), priority(0, 0, 1));
    }
}
