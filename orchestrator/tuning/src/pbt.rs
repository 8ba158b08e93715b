//! Population-based training's decisions (Jaderberg et al., 2017), as pure
//! functions of the population's standing.
//!
//! At each exploit point (a generation) the members are ranked by their
//! latest value. Each member of the bottom quantile *exploits*: it takes
//! the state of a member drawn from the top quantile, and that donor's
//! parameters, and then *explores*: each parameter that may mutate is
//! resampled from its distribution (with `resample_probability`), or else
//! perturbed (a float or an int multiplied by one of the factors, a
//! categorical moved to a neighbouring choice) and kept within its range.
//!
//! Ray Tune's `PopulationBasedTraining` names the same knobs; where we
//! differ: decisions are synchronous (every member reaches a generation
//! before any exploits, as Ray's `synch=True`), so a population's schedule
//! is a function of the study seed alone; perturbed values are clipped to
//! the searched range; and the two quantiles may differ.

use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::TrialNumber;
use crate::objective::Direction;
use crate::sampler::random::draw;
use crate::space::{Distribution, ParamValue, Params, SearchSpace};

/// `[pbt]`: how a population explores and exploits.
#[derive(Debug, Clone, PartialEq)]
pub struct PbtConfig {
    /// Members trained at once (the study's trials).
    pub population: usize,
    /// Iterations between exploit points; `None`: at every report point.
    pub interval: Option<u64>,
    /// The bottom fraction that exploits (Ray's `quantile_fraction`).
    pub exploit_quantile: f64,
    /// The top fraction donors are drawn from.
    pub donor_quantile: f64,
    /// Chance that an explored parameter is drawn anew rather than perturbed.
    pub resample_probability: f64,
    /// What a float or int is multiplied by, one drawn per parameter.
    pub factors: Vec<f64>,
    /// The searched parameters that may mutate.
    pub mutate: Vec<String>,
}

impl PbtConfig {
    /// Ray Tune's defaults: a quarter exploits, from the top quarter; a
    /// quarter of explored values resampled; factors 1.2 and 0.8.
    pub fn new(population: usize, mutate: Vec<String>) -> Self {
        PbtConfig {
            population,
            interval: None,
            exploit_quantile: 0.25,
            donor_quantile: 0.25,
            resample_probability: 0.25,
            factors: vec![1.2, 0.8],
            mutate,
        }
    }
}

/// A member's standing at a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    pub number: TrialNumber,
    /// Its latest value (not finite: it ranks last).
    pub value: f64,
    pub params: Params,
}

/// One exploit and its explore.
#[derive(Debug, Clone, PartialEq)]
pub struct Exploit {
    pub receiver: TrialNumber,
    pub donor: TrialNumber,
    /// The receiver's parameters before, and what it continues with.
    pub old: Params,
    pub new: Params,
    /// The parameters drawn anew rather than perturbed.
    pub resampled: Vec<String>,
}

/// How many members a quantile holds: `ceil(n * q)`, at most half the
/// population (so that no member both gives and takes), as Ray's.
pub fn quantile_size(n: usize, q: f64) -> usize {
    ((n as f64 * q).ceil() as usize).min(n / 2)
}

/// The members best first: by value in `direction`, values that are not
/// finite last, ties by trial number.
pub fn rank(members: &[Standing], direction: Direction) -> Vec<&Standing> {
    let mut ranked: Vec<&Standing> = members.iter().collect();
    ranked.sort_by(|a, b| {
        let key = |s: &Standing| {
            if !s.value.is_finite() {
                f64::INFINITY
            } else if direction == Direction::Maximize {
                -s.value
            } else {
                s.value
            }
        };
        key(a).total_cmp(&key(b)).then(a.number.cmp(&b.number))
    });
    ranked
}

/// The exploits of generation `generation`: a pure function of the
/// members' standing, the configuration and the seed.
pub fn generation(
    cfg: &PbtConfig,
    space: &SearchSpace,
    direction: Direction,
    members: &[Standing],
    seed: u64,
    generation: u64,
) -> Vec<Exploit> {
    let ranked = rank(members, direction);
    let n = ranked.len();
    let (bottom, top) = (
        quantile_size(n, cfg.exploit_quantile),
        quantile_size(n, cfg.donor_quantile),
    );
    if bottom == 0 || top == 0 {
        return Vec::new();
    }
    let stream = kernels::rng::mix64(seed ^ kernels::rng::mix64(0x9b7 ^ generation));
    let mut rng = StdRng::seed_from_u64(stream);
    // Worst first, so that the draws' order is fixed.
    ranked[n - bottom..]
        .iter()
        .rev()
        .map(|receiver| {
            let donor = ranked[rng.random_range(0..top)];
            let (new, resampled) = explore(cfg, space, &donor.params, &mut rng);
            Exploit {
                receiver: receiver.number,
                donor: donor.number,
                old: receiver.params.clone(),
                new,
                resampled,
            }
        })
        .collect()
}

/// The donor's parameters, each one that may mutate resampled or
/// perturbed; and the names of those resampled.
pub fn explore(
    cfg: &PbtConfig,
    space: &SearchSpace,
    donor: &Params,
    rng: &mut StdRng,
) -> (Params, Vec<String>) {
    let mut new = donor.clone();
    let mut resampled = Vec::new();
    for p in space.params() {
        let Some(&value) = donor.get(&p.name) else {
            continue;
        };
        if !cfg.mutate.contains(&p.name) {
            continue;
        }
        let v = if rng.random::<f64>() < cfg.resample_probability {
            resampled.push(p.name.clone());
            draw(rng, &p.dist)
        } else {
            perturb(&p.dist, value, cfg, rng)
        };
        new.insert(p.name.clone(), v);
    }
    (new, resampled)
}

/// A value moved a little: a float or int times a factor, kept in range
/// (and on its step); a choice moved one place up or down.
fn perturb(
    dist: &Distribution,
    value: ParamValue,
    cfg: &PbtConfig,
    rng: &mut StdRng,
) -> ParamValue {
    match (dist, value) {
        (Distribution::Categorical { choices }, ParamValue::Choice(i)) => {
            let up = rng.random::<bool>();
            let j = if up {
                (i + 1).min(choices.len() - 1)
            } else {
                i.saturating_sub(1)
            };
            ParamValue::Choice(j)
        }
        (
            Distribution::Float {
                low, high, step, ..
            },
            ParamValue::Float(x),
        ) => {
            let f = cfg.factors[rng.random_range(0..cfg.factors.len())];
            let y = (x * f).clamp(*low, *high);
            let (low, high) = (*low, *high);
            ParamValue::Float(match *step {
                Some(s) => (low + ((y - low) / s).round() * s).clamp(low, high),
                None => y,
            })
        }
        (
            Distribution::Int {
                low, high, step, ..
            },
            ParamValue::Int(x),
        ) => {
            let f = cfg.factors[rng.random_range(0..cfg.factors.len())];
            let (low, high, step) = (*low, *high, *step);
            let y = (x as f64 * f).round() as i64;
            // At least one step away where the factor would leave it put.
            let y = if y == x && f > 1.0 {
                x + step
            } else if y == x && f < 1.0 {
                x - step
            } else {
                y
            };
            ParamValue::Int(low + ((y.clamp(low, high) - low) / step) * step)
        }
        (_, v) => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{Choice, Param};

    fn space() -> SearchSpace {
        SearchSpace::new(vec![
            Param {
                name: "lr".into(),
                dist: Distribution::Float {
                    low: 1e-4,
                    high: 1e-1,
                    log: true,
                    step: None,
                },
                condition: None,
            },
            Param {
                name: "width".into(),
                dist: Distribution::Int {
                    low: 8,
                    high: 64,
                    log: false,
                    step: 1,
                },
                condition: None,
            },
            Param {
                name: "act".into(),
                dist: Distribution::Categorical {
                    choices: vec![
                        Choice::Str("a".into()),
                        Choice::Str("b".into()),
                        Choice::Str("c".into()),
                    ],
                },
                condition: None,
            },
        ])
        .unwrap()
    }

    fn member(number: i64, value: f64, lr: f64) -> Standing {
        let mut params = Params::new();
        params.insert("lr".into(), ParamValue::Float(lr));
        params.insert("width".into(), ParamValue::Int(32));
        params.insert("act".into(), ParamValue::Choice(1));
        Standing {
            number: TrialNumber(number),
            value,
            params,
        }
    }

    fn cfg() -> PbtConfig {
        PbtConfig::new(8, vec!["lr".into(), "act".into()])
    }

    #[test]
    fn quantiles_are_ray_s_and_never_overlap() {
        assert_eq!(quantile_size(8, 0.25), 2);
        assert_eq!(quantile_size(5, 0.25), 2);
        assert_eq!(quantile_size(4, 0.5), 2);
        assert_eq!(quantile_size(3, 0.5), 1);
        assert_eq!(quantile_size(1, 0.25), 0);
        assert_eq!(quantile_size(10, 0.9), 5);
    }

    #[test]
    fn the_worst_quarter_copies_from_the_best_quarter() {
        // Values 0..8 maximised: 7 and 6 are best, 0 and 1 worst.
        let members: Vec<Standing> = (0..8)
            .map(|i| member(i, i as f64, 0.001 * (i + 1) as f64))
            .collect();
        let out = generation(&cfg(), &space(), Direction::Maximize, &members, 7, 1);
        let receivers: Vec<i64> = out.iter().map(|e| e.receiver.0).collect();
        assert_eq!(receivers, vec![0, 1], "worst first");
        for e in &out {
            assert!(matches!(e.donor.0, 6 | 7), "{e:?}");
            let donor = &members[e.donor.0 as usize];
            assert_eq!(e.old, members[e.receiver.0 as usize].params);
            // Not mutable: copied from the donor.
            assert_eq!(e.new["width"], donor.params["width"]);
        }
        // Minimised, the roles turn around.
        let out = generation(&cfg(), &space(), Direction::Minimize, &members, 7, 1);
        let receivers: Vec<i64> = out.iter().map(|e| e.receiver.0).collect();
        assert_eq!(receivers, vec![7, 6]);
        assert!(out.iter().all(|e| e.donor.0 <= 1));
    }

    #[test]
    fn a_diverged_member_ranks_last() {
        let mut members: Vec<Standing> = (0..4).map(|i| member(i, i as f64, 0.01)).collect();
        members[3].value = f64::NAN;
        let ranked = rank(&members, Direction::Maximize);
        assert_eq!(ranked.last().unwrap().number, TrialNumber(3));
        let ranked = rank(&members, Direction::Minimize);
        assert_eq!(ranked.last().unwrap().number, TrialNumber(3));
    }

    #[test]
    fn decisions_are_a_function_of_the_seed_and_generation() {
        let members: Vec<Standing> = (0..8).map(|i| member(i, i as f64, 0.01)).collect();
        let a = generation(&cfg(), &space(), Direction::Maximize, &members, 3, 2);
        let b = generation(&cfg(), &space(), Direction::Maximize, &members, 3, 2);
        assert_eq!(a, b);
        let differ = (0..20u64)
            .any(|g| generation(&cfg(), &space(), Direction::Maximize, &members, 3, g) != a);
        assert!(differ, "another generation draws otherwise");
    }

    #[test]
    fn explored_values_are_perturbed_by_a_factor_or_resampled_within_range() {
        let space = space();
        let cfg = cfg();
        let mut donor = member(0, 1.0, 0.01).params;
        let (mut perturbed, mut resampled) = (0, 0);
        for seed in 0..400u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (new, drawn) = explore(&cfg, &space, &donor, &mut rng);
            let ParamValue::Float(lr) = new["lr"] else {
                panic!("a float")
            };
            assert!((1e-4..=1e-1).contains(&lr));
            if drawn.contains(&"lr".to_string()) {
                resampled += 1;
            } else {
                perturbed += 1;
                let ratio = lr / 0.01;
                assert!(
                    (ratio - 1.2).abs() < 1e-12 || (ratio - 0.8).abs() < 1e-12,
                    "{ratio}"
                );
            }
            let ParamValue::Choice(c) = new["act"] else {
                panic!("a choice")
            };
            if !drawn.contains(&"act".to_string()) {
                assert!(c == 0 || c == 2, "a neighbour of choice 1: {c}");
            }
            assert_eq!(new["width"], ParamValue::Int(32), "width may not mutate");
        }
        // About a quarter resampled.
        assert!((60..140).contains(&resampled), "{resampled} of 400");
        assert!(perturbed > 250);
        // At the top of its range a value stays there.
        donor.insert("lr".into(), ParamValue::Float(0.1));
        let cfg_up = PbtConfig {
            factors: vec![1.2],
            resample_probability: 0.0,
            ..cfg
        };
        let (new, _) = explore(&cfg_up, &space, &donor, &mut StdRng::seed_from_u64(1));
        assert_eq!(new["lr"], ParamValue::Float(0.1));
    }

    #[test]
    fn an_int_moves_at_least_one_step() {
        let dist = Distribution::Int {
            low: 1,
            high: 10,
            log: false,
            step: 1,
        };
        let cfg = PbtConfig {
            factors: vec![1.2],
            ..cfg()
        };
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(
            perturb(&dist, ParamValue::Int(2), &cfg, &mut rng),
            ParamValue::Int(3)
        );
        assert_eq!(
            perturb(&dist, ParamValue::Int(10), &cfg, &mut rng),
            ParamValue::Int(10)
        );
        let down = PbtConfig {
            factors: vec![0.8],
            ..cfg
        };
        assert_eq!(
            perturb(&dist, ParamValue::Int(2), &down, &mut rng),
            ParamValue::Int(1)
        );
        assert_eq!(
            perturb(&dist, ParamValue::Int(1), &down, &mut rng),
            ParamValue::Int(1)
        );
    }
}
