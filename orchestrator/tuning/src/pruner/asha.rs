//! Asynchronous successive halving (Li et al., 2020) and Hyperband brackets.

use std::collections::BTreeMap;

use super::{Curves, Decision, Pruner, at_least, best_first, value_at};
use crate::TrialNumber;
use crate::objective::Direction;

/// ASHA with rungs at `min_resource * eta^k` report steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Asha {
    pub min_resource: u64,
    pub reduction_factor: u64,
    /// Trials that compete (all trials when `None`): Hyperband's brackets.
    members: Option<Vec<TrialNumber>>,
}

impl Asha {
    pub fn new(min_resource: u64, reduction_factor: u64) -> Self {
        Asha {
            min_resource: min_resource.max(1),
            reduction_factor: reduction_factor.max(2),
            members: None,
        }
    }

    /// The step of rung `k`.
    pub fn rung_step(&self, k: usize) -> u64 {
        self.min_resource
            .saturating_mul(self.reduction_factor.saturating_pow(k as u32))
    }

    /// The rung whose step is exactly `step`, if any.
    pub fn rung_at(&self, step: u64) -> Option<usize> {
        (0..64)
            .map(|k| (k, self.rung_step(k)))
            .take_while(|(_, s)| *s <= step)
            .find(|(_, s)| *s == step)
            .map(|(k, _)| k)
    }

    fn competes(&self, trial: TrialNumber) -> bool {
        self.members.as_ref().is_none_or(|m| m.contains(&trial))
    }

    /// Values of the competing trials that reached rung `k`.
    fn rung_values(&self, k: usize, curves: &Curves) -> Vec<f64> {
        let step = self.rung_step(k);
        curves
            .iter()
            .filter(|(t, _)| self.competes(**t))
            .filter_map(|(_, c)| c.values.get(&step).copied())
            .collect()
    }

    /// Whether `value` is in the top `1/eta` of `values` (itself included);
    /// with fewer than `eta` values, only the best continues.
    fn promotable(&self, value: f64, values: Vec<f64>, direction: Direction) -> bool {
        let sorted = best_first(direction, values);
        if sorted.is_empty() || !value.is_finite() {
            return false;
        }
        let idx = (sorted.len() as u64 / self.reduction_factor).saturating_sub(1) as usize;
        at_least(direction, value, sorted[idx.min(sorted.len() - 1)])
    }
}

impl Pruner for Asha {
    fn name(&self) -> &'static str {
        "asha"
    }

    fn decide(
        &self,
        trial: TrialNumber,
        step: u64,
        curves: &Curves,
        direction: Direction,
    ) -> Decision {
        let Some(k) = self.rung_at(step) else {
            return Decision::Continue;
        };
        let Some(value) = value_at(curves, trial, step) else {
            return Decision::Continue;
        };
        if !value.is_finite() {
            return Decision::Prune;
        }
        if self.promotable(value, self.rung_values(k, curves), direction) {
            Decision::Continue
        } else {
            Decision::Pause { rung: k }
        }
    }

    fn promotions(
        &self,
        paused: &BTreeMap<TrialNumber, usize>,
        curves: &Curves,
        direction: Direction,
    ) -> Vec<TrialNumber> {
        paused
            .iter()
            .filter(|(t, _)| self.competes(**t))
            .filter(|&(t, &k)| {
                let value = value_at(curves, *t, self.rung_step(k));
                value.is_some_and(|v| self.promotable(v, self.rung_values(k, curves), direction))
            })
            .map(|(t, _)| *t)
            .collect()
    }

    fn rung(&self, _trial: TrialNumber, step: u64) -> Option<usize> {
        self.rung_at(step)
    }
}

/// Hyperband as brackets of ASHA: bracket `s` starts at `min_resource *
/// eta^s`; trial `n` goes to bracket `n mod brackets`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hyperband {
    pub min_resource: u64,
    pub max_resource: u64,
    pub reduction_factor: u64,
}

impl Hyperband {
    pub fn new(min_resource: u64, max_resource: u64, reduction_factor: u64) -> Self {
        Hyperband {
            min_resource: min_resource.max(1),
            max_resource: max_resource.max(min_resource.max(1)),
            reduction_factor: reduction_factor.max(2),
        }
    }

    pub fn brackets(&self) -> usize {
        let ratio = self.max_resource as f64 / self.min_resource as f64;
        (ratio.ln() / (self.reduction_factor as f64).ln()).floor() as usize + 1
    }

    pub fn bracket_of(&self, trial: TrialNumber) -> usize {
        trial.0.rem_euclid(self.brackets() as i64) as usize
    }

    fn asha_for(&self, trial: TrialNumber, curves: &Curves) -> Asha {
        let s = self.bracket_of(trial);
        let members = curves
            .keys()
            .copied()
            .chain([trial])
            .filter(|t| self.bracket_of(*t) == s)
            .collect();
        Asha {
            min_resource: self.min_resource * self.reduction_factor.pow(s as u32),
            reduction_factor: self.reduction_factor,
            members: Some(members),
        }
    }
}

impl Pruner for Hyperband {
    fn name(&self) -> &'static str {
        "hyperband"
    }

    fn decide(
        &self,
        trial: TrialNumber,
        step: u64,
        curves: &Curves,
        direction: Direction,
    ) -> Decision {
        self.asha_for(trial, curves)
            .decide(trial, step, curves, direction)
    }

    fn promotions(
        &self,
        paused: &BTreeMap<TrialNumber, usize>,
        curves: &Curves,
        direction: Direction,
    ) -> Vec<TrialNumber> {
        let mut out: Vec<TrialNumber> = paused
            .keys()
            .filter(|t| {
                self.asha_for(**t, curves)
                    .promotions(&BTreeMap::from([(**t, paused[*t])]), curves, direction)
                    .contains(t)
            })
            .copied()
            .collect();
        out.sort();
        out
    }

    fn rung(&self, trial: TrialNumber, step: u64) -> Option<usize> {
        self.asha_for(trial, &Curves::new()).rung_at(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(number: i64) -> TrialNumber {
        TrialNumber(number)
    }
    use crate::pruner::Curve;

    fn curves(rows: &[(i64, &[(u64, f64)])]) -> Curves {
        rows.iter()
            .map(|(t, pts)| {
                (
                    n(*t),
                    Curve {
                        values: pts.iter().copied().collect(),
                        finished: false,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn rungs_are_geometric() {
        let a = Asha::new(1, 3);
        assert_eq!((a.rung_step(0), a.rung_step(1), a.rung_step(2)), (1, 3, 9));
        assert_eq!(
            (a.rung_at(1), a.rung_at(3), a.rung_at(9), a.rung_at(4)),
            (Some(0), Some(1), Some(2), None)
        );
    }

    #[test]
    fn only_the_top_third_continues_at_a_rung() {
        let a = Asha::new(1, 3);
        // Nine trials at rung 0 (step 1), maximising: the top 9/3 = 3 continue.
        let rows: Vec<(i64, Vec<(u64, f64)>)> = (0..9).map(|t| (t, vec![(1, t as f64)])).collect();
        let c = curves(
            &rows
                .iter()
                .map(|(t, v)| (*t, v.as_slice()))
                .collect::<Vec<_>>(),
        );
        let continuing: Vec<i64> = (0..9)
            .filter(|&t| a.decide(n(t), 1, &c, Direction::Maximize) == Decision::Continue)
            .collect();
        assert_eq!(continuing, vec![6, 7, 8]);
        assert_eq!(
            a.decide(n(2), 1, &c, Direction::Maximize),
            Decision::Pause { rung: 0 }
        );
        // Minimising reverses it.
        let continuing: Vec<i64> = (0..9)
            .filter(|&t| a.decide(n(t), 1, &c, Direction::Minimize) == Decision::Continue)
            .collect();
        assert_eq!(continuing, vec![0, 1, 2]);
        // Steps between rungs always continue.
        let c2 = curves(&[(0, &[(2, 0.0)])]);
        assert_eq!(
            a.decide(n(0), 2, &c2, Direction::Maximize),
            Decision::Continue
        );
    }

    #[test]
    fn asynchronous_promotion_as_better_trials_arrive_elsewhere() {
        let a = Asha::new(2, 2);
        // The first trial at a rung is the best of one: it continues.
        let c = curves(&[(0, &[(2, 0.5)])]);
        assert_eq!(
            a.decide(n(0), 2, &c, Direction::Maximize),
            Decision::Continue
        );
        // A worse second trial pauses at rung 0 (top 2/2 = 1 continues).
        let c = curves(&[(0, &[(2, 0.5)]), (1, &[(2, 0.3)])]);
        assert_eq!(
            a.decide(n(1), 2, &c, Direction::Maximize),
            Decision::Pause { rung: 0 }
        );
        // Two more, weaker still: now the top 4/2 = 2 includes trial 1, which is promoted.
        let c = curves(&[
            (0, &[(2, 0.5)]),
            (1, &[(2, 0.3)]),
            (2, &[(2, 0.1)]),
            (3, &[(2, 0.2)]),
        ]);
        let paused = BTreeMap::from([(n(1), 0), (n(2), 0), (n(3), 0)]);
        assert_eq!(a.promotions(&paused, &c, Direction::Maximize), vec![n(1)]);
        // A NaN at a rung is pruned.
        let c = curves(&[(0, &[(2, f64::NAN)])]);
        assert_eq!(a.decide(n(0), 2, &c, Direction::Maximize), Decision::Prune);
    }

    #[test]
    fn hyperband_brackets_compete_separately() {
        let h = Hyperband::new(1, 9, 3);
        assert_eq!(h.brackets(), 3);
        assert_eq!(
            (h.bracket_of(n(0)), h.bracket_of(n(1)), h.bracket_of(n(5))),
            (0, 1, 2)
        );
        // Bracket 0 has rungs at 1, 3, 9; bracket 1 at 3, 9; bracket 2 at 9.
        assert_eq!(
            (
                h.rung(n(0), 1),
                h.rung(n(1), 1),
                h.rung(n(1), 3),
                h.rung(n(2), 9)
            ),
            (Some(0), None, Some(0), Some(0))
        );
        // Trial 3 (bracket 0) is compared with 0 and 6 only, not with the better trial 1.
        let c = curves(&[
            (0, &[(1, 0.1)]),
            (1, &[(1, 0.9), (3, 0.9)]),
            (3, &[(1, 0.5)]),
            (6, &[(1, 0.2)]),
        ]);
        assert_eq!(
            h.decide(n(3), 1, &c, Direction::Maximize),
            Decision::Continue,
            "the top 3/3 = 1 of bracket 0 is trial 3"
        );
        assert_eq!(
            h.decide(n(0), 1, &c, Direction::Maximize),
            Decision::Pause { rung: 0 }
        );
    }
}
