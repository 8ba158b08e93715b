//! Samplers propose the next trial's parameters.
//!
//! A [`Sampler`] sees the search space and the trials so far, and returns
//! parameters for every active hyper-parameter, or `None` when it has
//! nothing left to propose (an exhausted grid). The same seed gives the
//! same sequence.

mod gp;
mod grid;
mod nsga2;
mod qmc;
pub mod random;
mod tpe;

pub use gp::GpSampler;
pub use grid::GridSampler;
pub use nsga2::{Nsga2Sampler, POPULATION as NSGA2_POPULATION};
pub use qmc::{QmcSampler, from_unit};
pub use random::RandomSampler;
pub use tpe::{Pending, TpeSampler, gamma};

use crate::space::{Params, SearchSpace};

/// The random stream of one proposal: a function of the sampler's seed,
/// the history's length and a per-sampler `salt`, so a resumed study (the
/// same history) proposes what it would have.
pub(crate) fn proposal_rng(seed: u64, history_len: usize, salt: u64) -> rand::rngs::StdRng {
    let stream = kernels::rng::mix64(seed ^ kernels::rng::mix64(history_len as u64 + salt));
    <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(stream)
}

/// A trial the sampler may learn from.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialRecord {
    pub params: Params,
    /// The objective, for finished trials (the first, where there are several).
    pub value: Option<f64>,
    /// Every objective, in the study's order, for a COMPLETE trial of a
    /// study of several objectives; empty otherwise.
    pub values: Vec<f64>,
    /// How far it breaks the study's constraints: the sum of their
    /// positive values (0: feasible, or no constraints).
    pub violation: f64,
    /// How a trial that has no value stopped; `None` while it runs
    /// (pending), and for a finished one.
    pub stopped: Option<Stopped>,
}

/// How a trial ended without a value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stopped {
    /// Pruned after reporting `value` at `step`, its last report (`step`
    /// -1 and NaN where it reported nothing); also a trial paused below a
    /// rung's promotion cut, which Optuna's successive halving would have
    /// pruned, until it is promoted.
    Pruned { step: i64, value: f64 },
    /// Failed (diverged, refused, crashed).
    Failed,
}

impl TrialRecord {
    /// Still running or paused: no value, and it did not stop without one.
    pub fn is_pending(&self) -> bool {
        self.value.is_none() && self.stopped.is_none()
    }
}

/// Proposes parameters; TPE and the others implement this too.
pub trait Sampler: Send {
    fn name(&self) -> &'static str;
    /// Parameters for the next trial, given the trials so far.
    fn propose(&mut self, space: &SearchSpace, history: &[TrialRecord]) -> Option<Params>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{Choice, Condition, Distribution, Param, ParamValue};

    fn param(name: &str, dist: Distribution) -> Param {
        Param {
            name: name.into(),
            dist,
            condition: None,
        }
    }

    fn space() -> SearchSpace {
        let opt = Distribution::Categorical {
            choices: vec![Choice::Str("sgd".into()), Choice::Str("adam".into())],
        };
        let mut momentum = param(
            "momentum",
            Distribution::Float {
                low: 0.0,
                high: 0.9,
                log: false,
                step: Some(0.45),
            },
        );
        momentum.condition = Some(Condition {
            parent: "optimizer".into(),
            values: vec![Choice::Str("sgd".into())],
        });
        SearchSpace::new(vec![
            param("optimizer", opt),
            momentum,
            param(
                "width",
                Distribution::Int {
                    low: 32,
                    high: 512,
                    log: true,
                    step: 1,
                },
            ),
            param(
                "lr",
                Distribution::Float {
                    low: 1e-4,
                    high: 1e-1,
                    log: true,
                    step: None,
                },
            ),
            param(
                "depth",
                Distribution::Int {
                    low: 1,
                    high: 3,
                    log: false,
                    step: 1,
                },
            ),
        ])
        .unwrap()
    }

    #[test]
    fn bad_distributions_and_conditions_are_refused() {
        let f = |low, high, log, step| Distribution::Float {
            low,
            high,
            log,
            step,
        };
        for (dist, want) in [
            (f(1.0, 0.0, false, None), "must not exceed"),
            (f(0.0, 1.0, true, None), "low > 0"),
            (f(0.1, 1.0, true, Some(0.1)), "cannot be combined"),
            (f(0.0, 1.0, false, Some(0.0)), "step must be > 0"),
            (
                Distribution::Int {
                    low: 0,
                    high: 5,
                    log: true,
                    step: 1,
                },
                "low >= 1",
            ),
            (
                Distribution::Categorical { choices: vec![] },
                "must not be empty",
            ),
        ] {
            let err = SearchSpace::new(vec![param("x", dist)]).unwrap_err();
            assert!(err.starts_with("x: ") && err.contains(want), "{err}");
        }
        let mut child = param("m", f(0.0, 1.0, false, None));
        child.condition = Some(Condition {
            parent: "nope".into(),
            values: vec![Choice::Bool(true)],
        });
        assert!(
            SearchSpace::new(vec![child.clone()])
                .unwrap_err()
                .contains("not an earlier parameter")
        );
        let parent = param(
            "nope",
            Distribution::Categorical {
                choices: vec![Choice::Bool(false)],
            },
        );
        assert!(
            SearchSpace::new(vec![parent, child])
                .unwrap_err()
                .contains("'true' is not a choice")
        );
        let x = param("x", f(0.0, 1.0, false, None));
        assert!(
            SearchSpace::new(vec![x.clone(), x])
                .unwrap_err()
                .contains("defined twice")
        );
    }

    #[test]
    fn random_is_seeded_in_range_and_respects_conditions() {
        let space = space();
        let run = |seed| {
            let mut s = RandomSampler::new(seed);
            let mut history: Vec<TrialRecord> = Vec::new();
            for _ in 0..200 {
                let params = s.propose(&space, &history).unwrap();
                history.push(TrialRecord {
                    params,
                    value: None,
                    values: Vec::new(),
                    violation: 0.0,
                    stopped: None,
                });
            }
            history.into_iter().map(|t| t.params).collect::<Vec<_>>()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        // A fresh sampler given the same history (a resumed study) continues the sequence.
        let history: Vec<TrialRecord> = a[..50]
            .iter()
            .map(|p| TrialRecord {
                params: p.clone(),
                value: None,
                values: Vec::new(),
                violation: 0.0,
                stopped: None,
            })
            .collect();
        assert_eq!(
            RandomSampler::new(1).propose(&space, &history).unwrap(),
            a[50]
        );
        for pt in &a {
            for p in space.params() {
                match pt.get(&p.name) {
                    Some(&v) => assert!(p.dist.contains(v), "{} = {v:?}", p.name),
                    None => assert_eq!(p.name, "momentum"),
                }
            }
            let sgd = pt["optimizer"] == ParamValue::Choice(0);
            assert_eq!(pt.contains_key("momentum"), sgd);
        }
        // Log-uniform: about half the draws fall below the geometric mean.
        let below = a
            .iter()
            .filter(|pt| pt["lr"].internal() < (1e-4f64 * 1e-1).sqrt())
            .count();
        assert!(
            (70..=130).contains(&below),
            "{below} of 200 below the geometric mean"
        );
        let depths: std::collections::BTreeSet<i64> =
            a.iter().map(|pt| pt["depth"].internal() as i64).collect();
        assert_eq!(depths.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn grid_covers_each_point_once_then_stops() {
        let continuous = space();
        assert!(GridSampler::new(&continuous, 0).unwrap_err().contains("lr"));
        let mut momentum = param(
            "momentum",
            Distribution::Float {
                low: 0.0,
                high: 0.9,
                log: false,
                step: Some(0.45),
            },
        );
        momentum.condition = Some(Condition {
            parent: "opt".into(),
            values: vec![Choice::Int(0)],
        });
        let space = SearchSpace::new(vec![
            param(
                "opt",
                Distribution::Categorical {
                    choices: vec![Choice::Int(0), Choice::Int(1)],
                },
            ),
            momentum,
            param(
                "batch",
                Distribution::Int {
                    low: 32,
                    high: 96,
                    log: false,
                    step: 32,
                },
            ),
        ])
        .unwrap();
        // opt=0: 3 momenta x 3 batches; opt=1: 3 batches.
        assert_eq!(GridSampler::points(&space).len(), 12);
        let mut s = GridSampler::new(&space, 7).unwrap();
        let mut history = Vec::new();
        while let Some(p) = s.propose(&space, &history) {
            assert!(!history.iter().any(|t: &TrialRecord| t.params == p));
            history.push(TrialRecord {
                params: p,
                value: None,
                values: Vec::new(),
                violation: 0.0,
                stopped: None,
            });
            if history.len() == 5 {
                // A resumed study (a new sampler, the same history) carries on.
                s = GridSampler::new(&space, 7).unwrap();
            }
        }
        assert_eq!(history.len(), 12);
        let order = |seed| {
            let mut s = GridSampler::new(&space, seed).unwrap();
            s.propose(&space, &[])
        };
        assert_eq!(order(3), order(3));
    }
}
