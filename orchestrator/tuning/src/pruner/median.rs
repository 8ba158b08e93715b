//! The median stopping rule.

use super::{Curves, Decision, Pruner, at_least, value_at};
use crate::TrialNumber;
use crate::objective::Direction;

/// Prunes a trial whose value at a step is worse than the median of the
/// values other trials reported at that step, once `startup_trials` trials
/// have finished and the step is past `warmup_steps`.
#[derive(Debug, Clone, PartialEq)]
pub struct Median {
    pub startup_trials: usize,
    pub warmup_steps: u64,
}

impl Pruner for Median {
    fn name(&self) -> &'static str {
        "median"
    }

    fn decide(
        &self,
        trial: TrialNumber,
        step: u64,
        curves: &Curves,
        direction: Direction,
    ) -> Decision {
        if step <= self.warmup_steps
            || curves.values().filter(|c| c.finished).count() < self.startup_trials
        {
            return Decision::Continue;
        }
        let Some(value) = value_at(curves, trial, step) else {
            return Decision::Continue;
        };
        if !value.is_finite() {
            return Decision::Prune;
        }
        let mut others: Vec<f64> = curves
            .iter()
            .filter(|(t, _)| **t != trial)
            .filter_map(|(_, c)| c.values.get(&step).copied())
            .filter(|v| v.is_finite())
            .collect();
        if others.is_empty() {
            return Decision::Continue;
        }
        others.sort_by(f64::total_cmp);
        let n = others.len();
        let median = if n % 2 == 1 {
            others[n / 2]
        } else {
            0.5 * (others[n / 2 - 1] + others[n / 2])
        };
        if at_least(direction, value, median) {
            Decision::Continue
        } else {
            Decision::Prune
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(number: i64) -> TrialNumber {
        TrialNumber(number)
    }
    use crate::pruner::Curve;

    fn curve(points: &[(u64, f64)], finished: bool) -> Curve {
        Curve {
            values: points.iter().copied().collect(),
            finished,
        }
    }

    #[test]
    fn prunes_below_the_median_after_warm_up_and_startup() {
        let m = Median {
            startup_trials: 2,
            warmup_steps: 1,
        };
        let mut c = Curves::new();
        c.insert(n(0), curve(&[(1, 0.5), (2, 0.6), (3, 0.7)], true));
        c.insert(n(1), curve(&[(1, 0.4), (2, 0.8), (3, 0.9)], true));
        c.insert(n(2), curve(&[(1, 0.1), (2, 0.65)], false));
        // Step 1 is warm-up.
        assert_eq!(
            m.decide(n(2), 1, &c, Direction::Maximize),
            Decision::Continue
        );
        // Step 2: median of 0.6 and 0.8 is 0.7; 0.65 is below.
        assert_eq!(m.decide(n(2), 2, &c, Direction::Maximize), Decision::Prune);
        // Minimising, the same value is better than the median.
        assert_eq!(
            m.decide(n(2), 2, &c, Direction::Minimize),
            Decision::Continue
        );
        // Too few finished trials: no pruning yet.
        let strict = Median {
            startup_trials: 3,
            warmup_steps: 0,
        };
        assert_eq!(
            strict.decide(n(2), 2, &c, Direction::Maximize),
            Decision::Continue
        );
    }
}
