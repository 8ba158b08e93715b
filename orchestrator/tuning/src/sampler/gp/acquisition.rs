//! Log expected improvement and its maximisation over a mixed space.
//!
//! `log EI` (Ament et al., 2023) stays finite and keeps a useful gradient
//! where the improvement is vanishingly small, far from the data, where
//! plain EI underflows to 0 and is flat. It is maximised as Optuna 5.0's
//! `optimize_acqf_mixed` does: 2048 scrambled Sobol points, then local
//! searches from the best of them, from 8 more drawn with probability
//! `exp(f - f_max)`, and from a step off the best trial so far. A local search
//! alternates L-BFGS over the continuous dimensions with a search along
//! each discrete one (every value when there are at most 16, else Brent's
//! method on the interpolated values) until no step improves.

use argmin::core::{CostFunction, Error as ArgminError, Executor, Gradient};
use argmin::solver::brent::BrentOpt;
use argmin::solver::linesearch::MoreThuenteLineSearch;
use argmin::solver::quasinewton::LBFGS;
use rand::{RngExt, rngs::StdRng};

use super::LastEvaluation;
use super::regressor::Regressor;

const SQRT_2: f64 = std::f64::consts::SQRT_2;
/// `ln sqrt(2 pi)`.
const LOG_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// `ln h(z)` with `h(z) = z Phi(z) + phi(z)`, the expected improvement
/// of a standard normal over `-z`, and its derivative `Phi(z) / h(z)`.
///
/// For `z < -25` the direct sum cancels to nothing; there `h(z) = phi(z)
/// (1 + z R(z))` with `R = Phi / phi` (Mills' ratio of `-z`), whose
/// asymptotic series in `u = 1 / z^2` is exact to double precision at
/// that range. Hand-rolled because `libm` has no `erfcx`.
pub fn log_h(z: f64) -> (f64, f64) {
    if z >= -25.0 {
        let cdf = 0.5 * libm::erfc(-z / SQRT_2);
        let pdf = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let h = z * cdf + pdf;
        (h.ln(), cdf / h)
    } else {
        let u = 1.0 / (z * z);
        // 1 + z R(z) = u (1 - 3u + 15u^2 - 105u^3 + 945u^4 - ...).
        let tail = u * (1.0 - 3.0 * u + 15.0 * u * u - 105.0 * u.powi(3) + 945.0 * u.powi(4));
        // R(z) = -(1/z) (1 - u + 3u^2 - 15u^3 + 105u^4 - ...).
        let mills = -(1.0 / z) * (1.0 - u + 3.0 * u * u - 15.0 * u.powi(3) + 105.0 * u.powi(4));
        (-0.5 * z * z - LOG_SQRT_2PI + tail.ln(), mills / tail)
    }
}

/// Log expected improvement over `threshold` of the regressor's posterior.
pub struct LogEi<'a> {
    pub gp: &'a Regressor,
    pub threshold: f64,
}

/// Keeps `sigma` off zero at the data, as Optuna's `stabilizing_noise`.
const STABILIZING_NOISE: f64 = 1e-12;

impl LogEi<'_> {
    pub fn value(&self, x: &[f64]) -> f64 {
        let (mean, var) = self.gp.posterior(x);
        self.of_posterior(mean, var)
    }

    /// The values at each of `xs` (one batch through the regressor).
    pub fn values(&self, xs: &[Vec<f64>]) -> Vec<f64> {
        super::in_parallel(xs, |part| {
            self.gp
                .posteriors(part)
                .into_iter()
                .map(|(mean, var)| self.of_posterior(mean, var))
                .collect()
        })
    }

    fn of_posterior(&self, mean: f64, var: f64) -> f64 {
        let sigma = (var + STABILIZING_NOISE).sqrt();
        log_h((mean - self.threshold) / sigma).0 + sigma.ln()
    }

    /// The value and its gradient in `x`.
    pub fn value_with_gradient(&self, x: &[f64]) -> (f64, Vec<f64>) {
        let (mean, var, dmean, dvar) = self.gp.posterior_with_gradient(x);
        let v = var + STABILIZING_NOISE;
        let sigma = v.sqrt();
        let z = (mean - self.threshold) / sigma;
        let (lh, dlh) = log_h(z);
        // d/dx [ln h(z) + ln sigma], with dz = dmean / sigma - z dsigma / sigma
        // and dsigma = dvar / (2 sigma).
        let grad = dmean
            .iter()
            .zip(&dvar)
            .map(|(dm, dv)| {
                let dsigma = dv / (2.0 * sigma);
                dlh * (dm / sigma - z * dsigma / sigma) + dsigma / sigma
            })
            .collect();
        (lh + sigma.ln(), grad)
    }
}

/// One dimension of the normalised space, as the optimiser sees it.
#[derive(Debug, Clone)]
pub enum Axis {
    Continuous,
    /// The normalised values it may take, ascending.
    Discrete {
        values: Vec<f64>,
        categorical: bool,
    },
}

/// How far inside the box a local search starts: there the map's slope
/// is about a fifth of its largest.
const EDGE: f64 = 0.01;

/// Most values searched one by one; a longer axis gets Brent's method.
const MAX_EXHAUSTIVE: usize = 16;
const LOCAL_SEARCHES: usize = 10;
/// How far (normalised) the search from the best trial starts off it.
const WARM_STEP: f64 = 1e-3;
const MAX_ROUNDS: usize = 100;

/// The continuous part of a point, for L-BFGS: coordinate `w_j` maps to
/// `x_j = (1 - cos(pi l_j w_j)) / 2`, which keeps `x_j` in `[0, 1]`
/// without bounds in the solver (argmin's L-BFGS has none) and stays
/// smooth, so that the line search converges (a reflecting, piecewise
/// linear map made it cycle). Scaling by the length scale `l_j` makes
/// every direction about equally curved, as Optuna's preconditioning
/// does. The map is flat on the boundary, so a start there would never
/// move: starts are moved [`EDGE`] inside first.
struct Continuous<'a> {
    acq: &'a LogEi<'a>,
    base: &'a [f64],
    dims: &'a [usize],
    scales: &'a [f64],
    /// The last coordinates with the negated value and gradient there
    /// (argmin asks for the two separately at each point).
    last: LastEvaluation<(f64, Vec<f64>)>,
}

impl Continuous<'_> {
    /// The negated value and its gradient in `w`.
    fn at(&self, w: &[f64]) -> (f64, Vec<f64>) {
        self.last.get(w, || {
            let (v, g) = self.acq.value_with_gradient(&self.point(w));
            let gw = self
                .dims
                .iter()
                .zip(w)
                .zip(self.scales)
                .map(|((&j, &wj), &l)| {
                    let pl = std::f64::consts::PI * l;
                    -g[j] * 0.5 * pl * (pl * wj).sin()
                })
                .collect();
            (-v, gw)
        })
    }

    fn point(&self, w: &[f64]) -> Vec<f64> {
        let mut x = self.base.to_vec();
        for ((&j, &wj), &l) in self.dims.iter().zip(w).zip(self.scales) {
            x[j] = 0.5 * (1.0 - (std::f64::consts::PI * l * wj).cos());
        }
        x
    }

    fn coordinates(&self, x: &[f64], edge: f64) -> Vec<f64> {
        self.dims
            .iter()
            .zip(self.scales)
            .map(|(&j, &l)| {
                (1.0 - 2.0 * x[j].clamp(edge, 1.0 - edge)).acos() / (std::f64::consts::PI * l)
            })
            .collect()
    }
}

impl CostFunction for Continuous<'_> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, w: &Vec<f64>) -> Result<f64, ArgminError> {
        Ok(self.at(w).0)
    }
}

impl Gradient for Continuous<'_> {
    type Param = Vec<f64>;
    type Gradient = Vec<f64>;
    fn gradient(&self, w: &Vec<f64>) -> Result<Vec<f64>, ArgminError> {
        Ok(self.at(w).1)
    }
}

/// Piecewise-linear interpolation of the acquisition along one discrete
/// axis, for Brent's method (negated: argmin minimises).
struct Along<'a> {
    acq: &'a LogEi<'a>,
    base: &'a [f64],
    axis: usize,
    values: &'a [f64],
    /// Values already computed, by index (shared by the copies Brent's
    /// method and the caller hold).
    cache: &'a std::cell::RefCell<std::collections::HashMap<usize, f64>>,
}

impl Along<'_> {
    fn at_index(&self, i: usize) -> f64 {
        *self.cache.borrow_mut().entry(i).or_insert_with(|| {
            let mut x = self.base.to_vec();
            x[self.axis] = self.values[i];
            -self.acq.value(&x)
        })
    }

    fn nearest(&self, t: f64) -> usize {
        let right = self
            .values
            .partition_point(|&v| v < t)
            .clamp(1, self.values.len() - 1);
        if (t - self.values[right - 1]).abs() < (t - self.values[right]).abs() {
            right - 1
        } else {
            right
        }
    }
}

impl CostFunction for Along<'_> {
    type Param = f64;
    type Output = f64;
    fn cost(&self, t: &f64) -> Result<f64, ArgminError> {
        let v = self.values;
        let right = v.partition_point(|&x| x < *t).clamp(1, v.len() - 1);
        let left = right - 1;
        let w = ((v[right] - t) / (v[right] - v[left])).clamp(0.0, 1.0);
        Ok(w * self.at_index(left) + (1.0 - w) * self.at_index(right))
    }
}

/// L-BFGS over the `dims` of `base`, from `base` moved `edge` inside the
/// box; the point it ends at.
fn continuous_search(
    acq: &LogEi,
    base: &[f64],
    dims: &[usize],
    scales: &[f64],
    edge: f64,
) -> Option<Vec<f64>> {
    let problem = || Continuous {
        acq,
        base,
        dims,
        scales,
        last: LastEvaluation::new(),
    };
    let w0 = problem().coordinates(base, edge);
    let solver = LBFGS::new(MoreThuenteLineSearch::new(), 10)
        .with_tolerance_grad(1e-2)
        .ok()?;
    let r = Executor::new(problem(), solver)
        .configure(|s| s.param(w0).max_iters(200))
        .run()
        .ok()?;
    Some(problem().point(&r.state.best_param?))
}

/// Maximises `acq` from one start; returns the point and its value.
fn local_search(acq: &LogEi, axes: &[Axis], scales: &[f64], start: Vec<f64>) -> (Vec<f64>, f64) {
    let continuous: Vec<usize> = (0..axes.len())
        .filter(|&j| matches!(axes[j], Axis::Continuous))
        .collect();
    let cont_scales: Vec<f64> = continuous.iter().map(|&j| scales[j]).collect();
    let mut x = start;
    let mut f = acq.value(&x);
    // The last axis that changed the point; `None` for the continuous part.
    let mut last_changed: Option<usize> = None;
    for _ in 0..MAX_ROUNDS {
        if !continuous.is_empty() {
            // A start on a face of the box searches that face too: the
            // map is flat there, so its boundary coordinates stay put,
            // where a start moved inside may not find its way back.
            let on_face = continuous.iter().any(|&j| x[j] <= 0.0 || x[j] >= 1.0);
            let edges: &[f64] = if on_face { &[EDGE, 0.0] } else { &[EDGE] };
            for &edge in edges {
                let found = continuous_search(acq, &x, &continuous, &cont_scales, edge);
                if let Some(p) = found {
                    let fp = acq.value(&p);
                    if fp > f {
                        (x, f, last_changed) = (p, fp, None);
                    }
                }
            }
        }
        for (j, axis) in axes.iter().enumerate() {
            let Axis::Discrete {
                values,
                categorical,
            } = axis
            else {
                continue;
            };
            if last_changed == Some(j) {
                return (x, f);
            }
            if values.len() < 2 {
                continue;
            }
            let best = if *categorical || values.len() <= MAX_EXHAUSTIVE {
                values
                    .iter()
                    .filter(|&&v| v != x[j])
                    .map(|&v| {
                        let mut p = x.clone();
                        p[j] = v;
                        let fp = acq.value(&p);
                        (p, fp)
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1))
            } else {
                let cache = Default::default();
                let along = || Along {
                    acq,
                    base: &x,
                    axis: j,
                    values,
                    cache: &cache,
                };
                let tol = values
                    .windows(2)
                    .map(|w| w[1] - w[0])
                    .fold(f64::INFINITY, f64::min)
                    / 4.0;
                let brent =
                    BrentOpt::new(values[0], values[values.len() - 1]).set_tolerance(tol, tol);
                Executor::new(along(), brent)
                    .configure(|s| s.max_iters(100))
                    .run()
                    .ok()
                    .and_then(|r| r.state.best_param)
                    .map(|t| {
                        let i = along().nearest(t);
                        let mut p = x.clone();
                        p[j] = values[i];
                        let fp = -along().at_index(i);
                        (p, fp)
                    })
            };
            if let Some((p, fp)) = best.filter(|(_, fp)| *fp > f) {
                (x, f, last_changed) = (p, fp, Some(j));
            }
        }
        if last_changed.is_none() {
            return (x, f);
        }
    }
    (x, f)
}

/// The point that maximises `acq`: local searches from the best of
/// `candidates` (normalised points on the axes' grids), from up to
/// `LOCAL_SEARCHES - 2` more picked with probability `exp(f - f_max)`,
/// and from `warm_start`. A point for which `tried` holds is passed over
/// for the best one that is not (the local optima first, then the
/// candidates); `None` when every one was tried.
pub fn maximise(
    acq: &LogEi,
    axes: &[Axis],
    candidates: Vec<Vec<f64>>,
    warm_start: Option<Vec<f64>>,
    tried: &dyn Fn(&[f64]) -> bool,
    rng: &mut StdRng,
) -> Option<Vec<f64>> {
    let scores = acq.values(&candidates);
    let best = (0..scores.len()).max_by(|&a, &b| scores[a].total_cmp(&scores[b]))?;
    let mut weights: Vec<f64> = scores.iter().map(|s| (s - scores[best]).exp()).collect();
    weights[best] = 0.0;
    let mut starts = vec![candidates[best].clone()];
    let extra = LOCAL_SEARCHES - 1 - usize::from(warm_start.is_some());
    for _ in 0..extra {
        let total: f64 = weights.iter().sum();
        if total.is_nan() || total <= 0.0 {
            break;
        }
        let mut u = rng.random_range(0.0..total);
        let i = weights
            .iter()
            .position(|w| {
                u -= w;
                u < 0.0
            })
            .unwrap_or(weights.len() - 1);
        starts.push(candidates[i].clone());
        weights[i] = 0.0;
    }
    // The best trial is a stationary point of log EI (the variance is
    // at its minimum there), where a gradient search would not move:
    // it starts a step off it.
    starts.extend(warm_start.map(|mut x| {
        for (xj, axis) in x.iter_mut().zip(axes) {
            if matches!(axis, Axis::Continuous) {
                let step = if rng.random_bool(0.5) {
                    WARM_STEP
                } else {
                    -WARM_STEP
                };
                *xj = (*xj + step).clamp(0.0, 1.0);
            }
        }
        x
    }));
    let scales = acq.gp.params.length_scales();
    // The searches are independent.
    let mut found = super::in_parallel(&starts, |part| {
        part.iter()
            .map(|s| local_search(acq, axes, &scales, s.clone()))
            .collect()
    });
    found.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut rest: Vec<(Vec<f64>, f64)> = candidates.into_iter().zip(scores).collect();
    rest.sort_by(|a, b| b.1.total_cmp(&a.1));
    found
        .into_iter()
        .chain(rest)
        .map(|(x, _)| x)
        .find(|x| !tried(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::gp::regressor::{Inputs, KernelParams};

    #[test]
    fn log_h_is_accurate_and_continuous_at_the_switch() {
        // Direct formula where it is accurate.
        for z in [-5.0f64, -1.0, 0.0, 0.7, 3.0] {
            let cdf = 0.5 * libm::erfc(-z / SQRT_2);
            let pdf = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
            assert!((log_h(z).0 - (z * cdf + pdf).ln()).abs() < 1e-12);
        }
        // Both branches agree at the switch, in value and in slope.
        let (a, b) = (log_h(-25.0), log_h(-25.0 - 1e-9));
        assert!((a.0 - b.0).abs() < 1e-6, "{a:?} {b:?}");
        assert!((a.1 - b.1).abs() / a.1 < 1e-6, "{a:?} {b:?}");
        // Far in the tail it stays finite, decreasing and with a slope.
        let mut prev = f64::INFINITY;
        for z in [-30.0, -100.0, -1e3, -1e5] {
            let (v, d) = log_h(z);
            assert!(v.is_finite() && v < prev && d > 0.0, "z {z}: {v} {d}");
            // The slope of ln h approaches -z.
            assert!((d / -z - 1.0).abs() < 0.01, "z {z}: slope {d}");
            prev = v;
        }
    }

    #[test]
    fn the_gradient_of_log_ei_matches_finite_differences() {
        let x: Vec<Vec<f64>> = (0..15)
            .map(|i| vec![(i as f64 * 0.618).fract(), (i as f64 * 0.271).fract()])
            .collect();
        let y: Vec<f64> = x
            .iter()
            .map(|p| -(p[0] - 0.3).powi(2) - (p[1] - 0.6).powi(2))
            .collect();
        let params = KernelParams {
            inverse_squared_lengthscales: vec![8.0, 3.0],
            scale: 0.8,
            noise: 1e-6,
        };
        let gp = Regressor::new(Inputs::new(x, vec![false, false]), &y, params).unwrap();
        let best = y.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        for threshold in [best, best + 0.5, best + 20.0] {
            let acq = LogEi { gp: &gp, threshold };
            for p in [[0.2, 0.9], [0.55, 0.45], [0.97, 0.03]] {
                let (_, g) = acq.value_with_gradient(&p);
                for j in 0..2 {
                    let h = 1e-6;
                    let at = |dh: f64| {
                        let mut q = p;
                        q[j] += dh;
                        acq.value(&q)
                    };
                    let fd = (at(h) - at(-h)) / (2.0 * h);
                    assert!(
                        (fd - g[j]).abs() < 1e-4 * (1.0 + fd.abs()),
                        "threshold {threshold}, {p:?}, dim {j}: {} vs {fd}",
                        g[j]
                    );
                }
            }
        }
    }
}
