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
    /// Sample the unconditional parameters jointly, from mixtures of
    /// product kernels (Optuna 5's default for one objective); conditional
    /// ones are then sampled one at a time.
    pub multivariate: bool,
}

impl TpeSampler {
    pub fn new(seed: u64, direction: Direction) -> Self {
        TpeSampler {
            seed,
            direction,
            startup_trials: 10,
            candidates: 24,
            prior_weight: 1.0,
            multivariate: true,
        }
    }
}

/// The size of the good group among `n` observations.
pub fn gamma(n: usize) -> usize {
    (n as f64 * 0.1).ceil().min(25.0) as usize
}

/// One dimension of a Parzen estimator: a kernel per observation plus a
/// prior kernel (the last), weighted by the estimator's shared weights.
enum Kernels {
    /// Truncated Gaussians on `[low, high]` (in the parameter's space).
    Numeric {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        low: f64,
        high: f64,
    },
    /// A probability row per kernel over the choices.
    Categorical { rows: Vec<Vec<f64>> },
}

/// An index drawn with probability proportional to `weights` (which sum to 1).
fn pick(weights: &[f64], rng: &mut StdRng) -> usize {
    let u: f64 = rng.random_range(0.0..1.0);
    let mut acc = 0.0;
    weights
        .iter()
        .position(|w| {
            acc += w;
            u < acc
        })
        .unwrap_or(weights.len() - 1)
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

impl Kernels {
    /// Optuna's bandwidths: each observation's distance to its farther
    /// neighbouring observation (the outermost ones use their one inner
    /// neighbour), clipped to `[range / min(100, n + 2), range]`; then a
    /// prior kernel at the centre as wide as the range.
    fn numeric(points: &[f64], low: f64, high: f64) -> Self {
        let range = (high - low).max(1e-12);
        let n = points.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| points[a].total_cmp(&points[b]));
        let with_ends: Vec<f64> = std::iter::once(low)
            .chain(order.iter().map(|&i| points[i]))
            .chain(std::iter::once(high))
            .collect();
        let mut sorted_sigmas: Vec<f64> = (1..=n)
            .map(|i| (with_ends[i] - with_ends[i - 1]).max(with_ends[i + 1] - with_ends[i]))
            .collect();
        if n >= 2 {
            sorted_sigmas[0] = with_ends[2] - with_ends[1];
            sorted_sigmas[n - 1] = with_ends[n] - with_ends[n - 1];
        }
        let min_sigma = range / (100.0f64).min(1.0 + (n + 1) as f64);
        let mut sigmas = vec![0.0; n];
        for (rank, &i) in order.iter().enumerate() {
            sigmas[i] = sorted_sigmas[rank].clamp(min_sigma, range);
        }
        let mut mus = points.to_vec();
        mus.push(0.5 * (low + high));
        sigmas.push(range);
        Kernels::Numeric {
            mus,
            sigmas,
            low,
            high,
        }
    }

    /// Optuna's categorical kernels: `prior_weight / kernels` on every
    /// choice plus 1 on the observed one, normalised; the prior is uniform.
    fn categorical(observed: &[usize], choices: usize, prior_weight: f64) -> Self {
        let kernels = observed.len() + 1;
        let base = prior_weight / kernels as f64;
        let mut rows: Vec<Vec<f64>> = observed
            .iter()
            .map(|&o| {
                let mut r = vec![base; choices];
                r[o] += 1.0;
                let sum: f64 = r.iter().sum();
                r.into_iter().map(|x| x / sum).collect()
            })
            .collect();
        rows.push(vec![1.0 / choices as f64; choices]);
        Kernels::Categorical { rows }
    }

    fn sample(&self, k: usize, rng: &mut StdRng) -> f64 {
        match self {
            Kernels::Numeric {
                mus,
                sigmas,
                low,
                high,
            } => {
                let normal = Normal::new(mus[k], sigmas[k]).expect("positive sigma");
                for _ in 0..100 {
                    let x = normal.sample(rng);
                    if (*low..=*high).contains(&x) {
                        return x;
                    }
                }
                rng.random_range(*low..=*high)
            }
            Kernels::Categorical { rows } => pick(&rows[k], rng) as f64,
        }
    }

    fn log_pdf(&self, k: usize, x: f64) -> f64 {
        match self {
            Kernels::Numeric {
                mus,
                sigmas,
                low,
                high,
            } => {
                let (mu, s) = (mus[k], sigmas[k]);
                let mass = (normal_cdf((high - mu) / s) - normal_cdf((low - mu) / s)).max(1e-12);
                let z = (x - mu) / s;
                -0.5 * z * z - (s * (2.0 * std::f64::consts::PI).sqrt() * mass).ln()
            }
            Kernels::Categorical { rows } => rows[k][x as usize].max(1e-300).ln(),
        }
    }
}

/// A Parzen estimator over one or more dimensions: a mixture of products.
struct Estimator {
    weights: Vec<f64>,
    dims: Vec<Kernels>,
}

impl Estimator {
    fn sample(&self, rng: &mut StdRng) -> Vec<f64> {
        let k = pick(&self.weights, rng);
        self.dims.iter().map(|d| d.sample(k, rng)).collect()
    }

    fn log_pdf(&self, x: &[f64]) -> f64 {
        let terms: Vec<f64> = (0..self.weights.len())
            .map(|k| {
                self.weights[k].ln()
                    + self
                        .dims
                        .iter()
                        .zip(x)
                        .map(|(d, &xi)| d.log_pdf(k, xi))
                        .sum::<f64>()
            })
            .collect();
        let max = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        max + terms.iter().map(|t| (t - max).exp()).sum::<f64>().ln()
    }
}

/// Optuna's `default_weights`: older observations weigh less once there are
/// more than 25 (a linear ramp from `1/n`), the newest 25 weigh 1.
pub fn observation_weights(n: usize) -> Vec<f64> {
    if n < 25 {
        return vec![1.0; n];
    }
    let ramp = n - 25;
    (0..ramp)
        .map(|i| {
            if ramp == 1 {
                1.0 / n as f64
            } else {
                1.0 / n as f64 + (1.0 - 1.0 / n as f64) * i as f64 / (ramp - 1) as f64
            }
        })
        .chain(std::iter::repeat_n(1.0, 25))
        .collect()
}

/// A numeric parameter's transformed bounds and its value map.
fn bounds(d: &Distribution) -> (f64, f64, bool) {
    match *d {
        Distribution::Float { low, high, log, .. } if log => (low.ln(), high.ln(), true),
        Distribution::Float {
            low,
            high,
            step: Some(s),
            ..
        } => (low - 0.5 * s, high + 0.5 * s, false),
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
    /// Trials whose values for every parameter in `names` are known, split
    /// into `(good, bad)` groups, each in trial order; pending trials are bad.
    fn split(
        &self,
        names: &[&str],
        history: &[TrialRecord],
    ) -> (Vec<Vec<ParamValue>>, Vec<Vec<ParamValue>>) {
        let values = |t: &TrialRecord| {
            names
                .iter()
                .map(|n| t.params.get(*n).copied())
                .collect::<Option<Vec<_>>>()
        };
        let mut done: Vec<(usize, f64, Vec<ParamValue>)> = history
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((i, t.value.filter(|v| v.is_finite())?, values(t)?)))
            .collect();
        match self.direction {
            Direction::Minimize => done.sort_by(|a, b| a.1.total_cmp(&b.1)),
            Direction::Maximize => done.sort_by(|a, b| b.1.total_cmp(&a.1)),
        }
        let n_good = gamma(done.len());
        let bad_done = done.split_off(n_good);
        let mut good: Vec<(usize, Vec<ParamValue>)> =
            done.into_iter().map(|x| (x.0, x.2)).collect();
        let mut bad: Vec<(usize, Vec<ParamValue>)> =
            bad_done.into_iter().map(|x| (x.0, x.2)).collect();
        // The constant liar: pending trials count as bad.
        bad.extend(
            history
                .iter()
                .enumerate()
                .filter(|(_, t)| t.value.is_none())
                .filter_map(|(i, t)| Some((i, values(t)?))),
        );
        good.sort_by_key(|x| x.0);
        bad.sort_by_key(|x| x.0);
        (
            good.into_iter().map(|x| x.1).collect(),
            bad.into_iter().map(|x| x.1).collect(),
        )
    }

    fn estimator(&self, dists: &[&Distribution], obs: &[Vec<ParamValue>]) -> Estimator {
        let mut weights = observation_weights(obs.len());
        weights.push(self.prior_weight);
        let total: f64 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= total);
        let dims = dists
            .iter()
            .enumerate()
            .map(|(j, d)| match d {
                Distribution::Categorical { choices } => Kernels::categorical(
                    &obs.iter()
                        .map(|o| o[j].internal() as usize)
                        .collect::<Vec<_>>(),
                    choices.len(),
                    self.prior_weight,
                ),
                _ => {
                    let (low, high, _) = bounds(d);
                    Kernels::numeric(
                        &obs.iter().map(|o| to_space(d, o[j])).collect::<Vec<_>>(),
                        low,
                        high,
                    )
                }
            })
            .collect();
        Estimator { weights, dims }
    }

    /// Samples `names` jointly: the candidate with the largest `l(x) / g(x)`.
    fn sample_joint(
        &self,
        dists: &[&Distribution],
        names: &[&str],
        history: &[TrialRecord],
        rng: &mut StdRng,
    ) -> Option<Vec<ParamValue>> {
        let (good, bad) = self.split(names, history);
        if good.is_empty() {
            return None;
        }
        let (l, g) = (self.estimator(dists, &good), self.estimator(dists, &bad));
        let best = (0..self.candidates).map(|_| l.sample(rng)).max_by(|a, b| {
            (l.log_pdf(a) - g.log_pdf(a)).total_cmp(&(l.log_pdf(b) - g.log_pdf(b)))
        })?;
        Some(
            dists
                .iter()
                .zip(best)
                .map(|(d, x)| match d {
                    Distribution::Categorical { .. } => ParamValue::Choice(x as usize),
                    _ => from_space(d, x),
                })
                .collect(),
        )
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
        if finished >= self.startup_trials && self.multivariate {
            let joint: Vec<&crate::space::Param> = space
                .params()
                .iter()
                .filter(|p| p.condition.is_none())
                .collect();
            let dists: Vec<&Distribution> = joint.iter().map(|p| &p.dist).collect();
            let names: Vec<&str> = joint.iter().map(|p| p.name.as_str()).collect();
            if let Some(values) = self.sample_joint(&dists, &names, history, &mut rng) {
                params.extend(names.iter().map(|n| n.to_string()).zip(values));
            }
        }
        for p in space.params() {
            if params.contains_key(&p.name) || !space.is_active(p, &params) {
                continue;
            }
            let v = if finished < self.startup_trials {
                None
            } else {
                self.sample_joint(&[&p.dist], &[p.name.as_str()], history, &mut rng)
                    .map(|v| v[0])
            };
            params.insert(p.name.clone(), v.unwrap_or_else(|| draw(&mut rng, &p.dist)));
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
        // Uniform sampling puts 20% of the samples there; TPE at least 60%.
        assert!(
            near >= 24,
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
