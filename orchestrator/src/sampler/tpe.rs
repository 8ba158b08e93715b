//! The Tree-structured Parzen Estimator (Bergstra et al., 2011), in the
//! family of Optuna's `TPESampler`.
//!
//! After `startup_trials` random proposals, finished trials are split into a
//! good group (the best `gamma(n) = min(ceil(0.1 n), 25)`) and a bad one.
//! For each active parameter, in order (so conditional parameters only see
//! trials where they were active), a Parzen estimator is fitted to each group:
//! a truncated Gaussian mixture over the parameter's range (in log space for
//! `log` parameters, rounded to the step for stepped ones), with a wide prior
//! component; or, for a categorical, a smoothed histogram. Candidates are
//! drawn from the good density and the one with the largest ratio
//! `l(x) / g(x)` wins. Trials still pending (running or paused) count as bad
//! observations, a constant liar, so that parallel proposals spread out.

use rand::{RngExt, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution as _, Normal};

use super::random::draw;
use super::{Sampler, TrialRecord};
use crate::space::{Distribution, ParamValue, Params, SearchSpace};
use crate::study::Direction;

#[derive(Debug, Clone)]
pub struct TpeSampler {
    pub seed: u64,
    pub direction: Direction,
    pub startup_trials: usize,
    pub candidates: usize,
    pub prior_weight: f64,
}

impl TpeSampler {
    pub fn new(seed: u64, direction: Direction) -> Self {
        TpeSampler {
            seed,
            direction,
            startup_trials: 10,
            candidates: 24,
            prior_weight: 1.0,
        }
    }
}

/// The size of the good group among `n` observations.
pub fn gamma(n: usize) -> usize {
    (n as f64 * 0.1).ceil().min(25.0) as usize
}

/// A truncated Gaussian mixture on `[low, high]`.
struct Mixture {
    mus: Vec<f64>,
    sigmas: Vec<f64>,
    weights: Vec<f64>,
    low: f64,
    high: f64,
}

fn normal_cdf(x: f64) -> f64 {
    0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

/// Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7), enough for densities.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    if x >= 0.0 { y } else { -y }
}

impl Mixture {
    /// Optuna-style bandwidths: each point's distance to its farther
    /// neighbour, clipped to `[range / min(100, n + 1), range]`, plus a prior
    /// component at the centre with the whole range as its width.
    fn fit(points: &[f64], low: f64, high: f64, prior_weight: f64) -> Self {
        let range = (high - low).max(1e-12);
        let mut mus: Vec<f64> = points.to_vec();
        mus.push(0.5 * (low + high));
        let mut order: Vec<usize> = (0..mus.len()).collect();
        order.sort_by(|&a, &b| mus[a].total_cmp(&mus[b]));
        let n = mus.len();
        let min_sigma = range / (100.0f64).min(n as f64 + 1.0);
        let mut sigmas = vec![range; n];
        for (rank, &i) in order.iter().enumerate() {
            let left = if rank > 0 {
                mus[i] - mus[order[rank - 1]]
            } else {
                mus[i] - low
            };
            let right = if rank + 1 < n {
                mus[order[rank + 1]] - mus[i]
            } else {
                high - mus[i]
            };
            sigmas[i] = left.max(right).clamp(min_sigma, range);
        }
        sigmas[n - 1] = range;
        let mut weights = vec![1.0; n];
        weights[n - 1] = prior_weight;
        let total: f64 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= total);
        Mixture {
            mus,
            sigmas,
            weights,
            low,
            high,
        }
    }

    fn sample(&self, rng: &mut StdRng) -> f64 {
        let u: f64 = rng.random_range(0.0..1.0);
        let mut acc = 0.0;
        let mut k = self.weights.len() - 1;
        for (i, w) in self.weights.iter().enumerate() {
            acc += w;
            if u < acc {
                k = i;
                break;
            }
        }
        let normal = Normal::new(self.mus[k], self.sigmas[k]).expect("positive sigma");
        for _ in 0..100 {
            let x = normal.sample(rng);
            if (self.low..=self.high).contains(&x) {
                return x;
            }
        }
        rng.random_range(self.low..=self.high)
    }

    fn log_pdf(&self, x: f64) -> f64 {
        let p: f64 = (0..self.mus.len())
            .map(|k| {
                let (mu, s) = (self.mus[k], self.sigmas[k]);
                let mass =
                    (normal_cdf((self.high - mu) / s) - normal_cdf((self.low - mu) / s)).max(1e-12);
                let z = (x - mu) / s;
                self.weights[k] * (-0.5 * z * z).exp()
                    / (s * (2.0 * std::f64::consts::PI).sqrt() * mass)
            })
            .sum();
        p.max(1e-300).ln()
    }
}

/// A numeric parameter's transformed bounds and its value map.
fn bounds(d: &Distribution) -> (f64, f64, bool) {
    match *d {
        Distribution::Float { low, high, log, .. } if log => (low.ln(), high.ln(), true),
        Distribution::Float { low, high, .. } => (low, high, false),
        // Ints spread half a step beyond their ends, so that each value gets its share.
        Distribution::Int {
            low,
            high,
            log: true,
            ..
        } => ((low as f64 - 0.5).ln(), (high as f64 + 0.5).ln(), true),
        Distribution::Int {
            low, high, step, ..
        } => (
            low as f64 - 0.5 * step as f64,
            high as f64 + 0.5 * step as f64,
            false,
        ),
        Distribution::Categorical { .. } => (0.0, 0.0, false),
    }
}

fn to_space(d: &Distribution, v: ParamValue) -> f64 {
    let (_, _, log) = bounds(d);
    let x = v.internal();
    if log { x.ln() } else { x }
}

fn from_space(d: &Distribution, x: f64) -> ParamValue {
    let (_, _, log) = bounds(d);
    let raw = if log { x.exp() } else { x };
    match *d {
        Distribution::Float {
            low,
            high,
            step: Some(s),
            ..
        } => ParamValue::Float((low + ((raw - low) / s).round() * s).clamp(low, high)),
        Distribution::Float { low, high, .. } => ParamValue::Float(raw.clamp(low, high)),
        Distribution::Int {
            low, high, step, ..
        } => ParamValue::Int(
            (low + ((raw - low as f64) / step as f64).round() as i64 * step).clamp(low, high),
        ),
        Distribution::Categorical { .. } => unreachable!("numeric only"),
    }
}

impl TpeSampler {
    /// Observations of `name`: `(good, bad)` in the parameter's space.
    fn split(&self, name: &str, history: &[TrialRecord]) -> (Vec<ParamValue>, Vec<ParamValue>) {
        let mut done: Vec<(f64, ParamValue)> = history
            .iter()
            .filter_map(|t| Some((t.value?, *t.params.get(name)?)))
            .filter(|(v, _)| v.is_finite())
            .collect();
        match self.direction {
            Direction::Minimize => done.sort_by(|a, b| a.0.total_cmp(&b.0)),
            Direction::Maximize => done.sort_by(|a, b| b.0.total_cmp(&a.0)),
        }
        let n_good = gamma(done.len());
        let good = done[..n_good].iter().map(|x| x.1).collect();
        let mut bad: Vec<ParamValue> = done[n_good..].iter().map(|x| x.1).collect();
        // The constant liar: pending trials count as bad.
        bad.extend(
            history
                .iter()
                .filter(|t| t.value.is_none())
                .filter_map(|t| t.params.get(name).copied()),
        );
        (good, bad)
    }

    fn sample_param(
        &self,
        d: &Distribution,
        good: &[ParamValue],
        bad: &[ParamValue],
        rng: &mut StdRng,
    ) -> ParamValue {
        if let Distribution::Categorical { choices } = d {
            let k = choices.len();
            let hist = |obs: &[ParamValue]| -> Vec<f64> {
                let mut w = vec![self.prior_weight / k as f64; k];
                obs.iter().for_each(|v| w[v.internal() as usize] += 1.0);
                let total: f64 = w.iter().sum();
                w.into_iter().map(|x| x / total).collect()
            };
            let (l, g) = (hist(good), hist(bad));
            let best = (0..self.candidates)
                .map(|_| {
                    let u: f64 = rng.random_range(0.0..1.0);
                    let mut acc = 0.0;
                    l.iter()
                        .position(|p| {
                            acc += p;
                            u < acc
                        })
                        .unwrap_or(k - 1)
                })
                .max_by(|&a, &b| (l[a].ln() - g[a].ln()).total_cmp(&(l[b].ln() - g[b].ln())))
                .unwrap_or(0);
            return ParamValue::Choice(best);
        }
        let (low, high, _) = bounds(d);
        let to = |obs: &[ParamValue]| obs.iter().map(|v| to_space(d, *v)).collect::<Vec<_>>();
        let l = Mixture::fit(&to(good), low, high, self.prior_weight);
        let g = Mixture::fit(&to(bad), low, high, self.prior_weight);
        let x = (0..self.candidates)
            .map(|_| l.sample(rng))
            .max_by(|&a, &b| {
                (l.log_pdf(a) - g.log_pdf(a)).total_cmp(&(l.log_pdf(b) - g.log_pdf(b)))
            })
            .unwrap_or(0.5 * (low + high));
        from_space(d, x)
    }
}

impl Sampler for TpeSampler {
    fn name(&self) -> &'static str {
        "tpe"
    }

    fn propose(&mut self, space: &SearchSpace, history: &[TrialRecord]) -> Option<Params> {
        let stream =
            kernels::rng::mix64(self.seed ^ kernels::rng::mix64(history.len() as u64 + 0x7e7e));
        let mut rng = StdRng::seed_from_u64(stream);
        let finished = history
            .iter()
            .filter(|t| t.value.is_some_and(f64::is_finite))
            .count();
        let mut params = Params::new();
        for p in space.params() {
            if !space.is_active(p, &params) {
                continue;
            }
            let v = if finished < self.startup_trials {
                draw(&mut rng, &p.dist)
            } else {
                let (good, bad) = self.split(&p.name, history);
                if good.is_empty() {
                    draw(&mut rng, &p.dist)
                } else {
                    self.sample_param(&p.dist, &good, &bad, &mut rng)
                }
            };
            params.insert(p.name.clone(), v);
        }
        Some(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::RandomSampler;
    use crate::space::{Choice, Param};

    fn space(params: Vec<(&str, Distribution)>) -> SearchSpace {
        SearchSpace::new(
            params
                .into_iter()
                .map(|(n, d)| Param {
                    name: n.into(),
                    dist: d,
                    condition: None,
                })
                .collect(),
        )
        .unwrap()
    }

    /// Runs `n` sequential trials of `f` and returns the history.
    fn optimise(
        s: &mut dyn Sampler,
        space: &SearchSpace,
        n: usize,
        f: impl Fn(&Params) -> f64,
    ) -> Vec<TrialRecord> {
        let mut h: Vec<TrialRecord> = Vec::new();
        for _ in 0..n {
            let p = s.propose(space, &h).unwrap();
            let v = f(&p);
            h.push(TrialRecord {
                params: p,
                value: Some(v),
            });
        }
        h
    }

    #[test]
    fn concentrates_near_the_optimum_of_a_1d_function() {
        let sp = space(vec![(
            "x",
            Distribution::Float {
                low: 0.0,
                high: 1.0,
                log: false,
                step: None,
            },
        )]);
        let f = |p: &Params| (p["x"].internal() - 0.3).powi(2);
        let h = optimise(&mut TpeSampler::new(1, Direction::Minimize), &sp, 80, f);
        let late: Vec<f64> = h[40..]
            .iter()
            .map(|t| (t.params["x"].internal() - 0.3).abs())
            .collect();
        let near = late.iter().filter(|d| **d < 0.1).count();
        assert!(
            near >= 30,
            "{near} of 40 late samples within 0.1 of the optimum"
        );
        let r = optimise(&mut RandomSampler::new(1), &sp, 80, f);
        let near_random = r[40..]
            .iter()
            .filter(|t| (t.params["x"].internal() - 0.3).abs() < 0.1)
            .count();
        assert!(near > 2 * near_random, "TPE {near} vs random {near_random}");
    }

    #[test]
    fn handles_log_int_and_categorical_and_is_deterministic() {
        let sp = space(vec![
            (
                "lr",
                Distribution::Float {
                    low: 1e-5,
                    high: 1.0,
                    log: true,
                    step: None,
                },
            ),
            (
                "width",
                Distribution::Int {
                    low: 8,
                    high: 512,
                    log: true,
                    step: 1,
                },
            ),
            (
                "opt",
                Distribution::Categorical {
                    choices: vec![
                        Choice::Str("a".into()),
                        Choice::Str("b".into()),
                        Choice::Str("c".into()),
                    ],
                },
            ),
        ]);
        // Best at lr = 1e-3, width = 64, opt = "c".
        let f = |p: &Params| {
            (p["lr"].internal().log10() + 3.0).powi(2)
                + ((p["width"].internal()).log2() - 6.0).powi(2)
                + if p["opt"] == ParamValue::Choice(2) {
                    0.0
                } else {
                    1.0
                }
        };
        let a = optimise(&mut TpeSampler::new(3, Direction::Minimize), &sp, 60, f);
        let b = optimise(&mut TpeSampler::new(3, Direction::Minimize), &sp, 60, f);
        assert_eq!(a, b, "the same seed gives the same sequence");
        for t in &a {
            for p in sp.params() {
                assert!(p.dist.contains(t.params[&p.name]), "{:?}", t.params);
            }
        }
        let best = |h: &[TrialRecord]| {
            h.iter()
                .map(|t| t.value.unwrap())
                .fold(f64::INFINITY, f64::min)
        };
        let r = optimise(&mut RandomSampler::new(3), &sp, 60, f);
        assert!(
            best(&a) < best(&r),
            "TPE {} vs random {}",
            best(&a),
            best(&r)
        );
        let late_c = a[30..]
            .iter()
            .filter(|t| t.params["opt"] == ParamValue::Choice(2))
            .count();
        assert!(
            late_c >= 18,
            "the good category dominates late: {late_c} of 30"
        );
    }

    #[test]
    fn pending_trials_push_proposals_apart() {
        let sp = space(vec![(
            "x",
            Distribution::Float {
                low: 0.0,
                high: 1.0,
                log: false,
                step: None,
            },
        )]);
        let f = |p: &Params| (p["x"].internal() - 0.5).powi(2);
        let mut s = TpeSampler::new(5, Direction::Minimize);
        let mut h = optimise(&mut s, &sp, 30, f);
        // Four proposals in a row with none finished: each sees the others as pending.
        let mut xs = Vec::new();
        for _ in 0..4 {
            let p = s.propose(&sp, &h).unwrap();
            xs.push(p["x"].internal());
            h.push(TrialRecord {
                params: p,
                value: None,
            });
        }
        xs.sort_by(f64::total_cmp);
        assert!(
            xs.windows(2).all(|w| w[1] - w[0] > 1e-9),
            "distinct proposals: {xs:?}"
        );
        assert!(gamma(10) == 1 && gamma(100) == 10 && gamma(1000) == 25);
    }
}
