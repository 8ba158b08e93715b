//! A Gaussian-process regressor with a Matern-5/2 kernel and one length
//! scale per dimension (automatic relevance determination), as Optuna 5.0's
//! `GPSampler` builds it.
//!
//! Inputs are normalised to `[0, 1]`; a categorical dimension holds the
//! choice's index and contributes the Hamming distance (0 or 1) instead of
//! a squared difference. The kernel is `scale * matern52(r)` with
//! `r = sum_j lambda_j * sqd_j`, where `lambda_j` is the inverse squared
//! length scale. Kernel parameters are fitted by maximum a posteriori:
//! the marginal likelihood times Optuna's priors (a gamma prior on the
//! scale and on the noise, a prior pushing each `lambda_j` towards 1),
//! minimised over their logarithms by L-BFGS with the exact gradient.
//!
//! Unlike Optuna's zero prior mean, the prior mean is a constant fitted by
//! generalised least squares (`1' C^-1 y / 1' C^-1 1`, the maximum of the
//! likelihood for given kernel parameters, as BoTorch's learned constant
//! mean). Clustered good trials count about once there, so far from the data
//! the posterior reverts to a typical value rather than the average of
//! the standardised values. With a zero mean, that average lies above
//! most trials of an objective with a few deep wells, and the corners of
//! the box looked promising: on Hartmann-6, seed 4 spent 18 of its first 60
//! trials on corners.

use argmin::core::{CostFunction, Error as ArgminError, Executor, Gradient};
use argmin::solver::linesearch::MoreThuenteLineSearch;
use argmin::solver::quasinewton::LBFGS;
use nalgebra::{Cholesky, DMatrix, DVector};

use super::LastEvaluation;

/// The smallest noise variance of the standardised objective. Optuna's
/// `DEFAULT_MINIMUM_NOISE_VAR` is 1e-6, a noise deviation of a thousandth
/// of the objective's spread: near the optimum of a deterministic
/// objective that blurs the last digits the search is after (Branin's
/// median at 50 trials sat 3.7e-5 above its minimum, 2.7e-5 with 1e-8, over
/// 60 seeds). 1e-8 still keeps the kernel matrix positive definite in
/// double precision; a noisy objective's fitted noise lies far above both.
pub const MINIMUM_NOISE: f64 = 1e-8;

/// `matern52(r)` for a squared distance `r`, and its derivative in `r`.
pub fn matern52(r: f64) -> (f64, f64) {
    let s = (5.0 * r).sqrt();
    let e = (-s).exp();
    (e * (5.0 / 3.0 * r + s + 1.0), -5.0 / 6.0 * (s + 1.0) * e)
}

/// The kernel's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelParams {
    /// One per dimension: `1 / length_scale^2`.
    pub inverse_squared_lengthscales: Vec<f64>,
    pub scale: f64,
    pub noise: f64,
}

impl KernelParams {
    /// Optuna's starting point: every parameter 1.
    pub fn initial(dims: usize) -> Self {
        KernelParams {
            inverse_squared_lengthscales: vec![1.0; dims],
            scale: 1.0,
            noise: 1.0,
        }
    }

    pub fn length_scales(&self) -> Vec<f64> {
        self.inverse_squared_lengthscales
            .iter()
            .map(|l| 1.0 / l.sqrt())
            .collect()
    }

    /// `[ln lambda.., ln scale, ln(noise - MINIMUM_NOISE)]`, the
    /// coordinates the fit moves in (they keep every parameter positive).
    fn raw(&self) -> Vec<f64> {
        let mut raw: Vec<f64> = self
            .inverse_squared_lengthscales
            .iter()
            .map(|l| l.ln())
            .collect();
        raw.push(self.scale.ln());
        // As Optuna: start a hair above the minimum, not on it.
        raw.push((self.noise - 0.99 * MINIMUM_NOISE).ln());
        raw
    }

    fn from_raw(raw: &[f64]) -> Self {
        let d = raw.len() - 2;
        KernelParams {
            inverse_squared_lengthscales: raw[..d].iter().map(|r| r.exp()).collect(),
            scale: raw[d].exp(),
            noise: raw[d + 1].exp() + MINIMUM_NOISE,
        }
    }
}

/// Squared distance of one dimension: Hamming for a categorical.
fn sqd(a: f64, b: f64, categorical: bool) -> f64 {
    if categorical {
        if a == b { 0.0 } else { 1.0 }
    } else {
        (a - b) * (a - b)
    }
}

/// Training inputs with their per-dimension squared distances.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub x: Vec<Vec<f64>>,
    pub categorical: Vec<bool>,
    /// `columns[j][i] = x[i][j]`: a kernel row's distances are sums over
    /// whole columns.
    columns: Vec<Vec<f64>>,
    /// `pair_sqd[j][p]`: dimension `j`'s squared distance of pair `p`, the
    /// pairs `b <= a` row by row (`p = a (a + 1) / 2 + b`). One contiguous
    /// run per dimension, so that the kernel's distances and the fit's
    /// gradient are sums of whole rows, which the compiler vectorises.
    pair_sqd: Vec<Vec<f64>>,
}

impl Inputs {
    pub fn new(x: Vec<Vec<f64>>, categorical: Vec<bool>) -> Self {
        let columns: Vec<Vec<f64>> = (0..categorical.len())
            .map(|j| x.iter().map(|p| p[j]).collect())
            .collect();
        let pair_sqd = columns
            .iter()
            .zip(&categorical)
            .map(|(col, &cat)| {
                let mut row = Vec::with_capacity(col.len() * (col.len() + 1) / 2);
                for (a, &va) in col.iter().enumerate() {
                    row.extend(col[..=a].iter().map(|&vb| sqd(va, vb, cat)));
                }
                row
            })
            .collect();
        Inputs {
            x,
            categorical,
            columns,
            pair_sqd,
        }
    }

    /// `r_i = sum_j lambda_j sqd(x_j, x_ij)` for every training point `i`.
    fn scaled_distances(&self, x: &[f64], lambda: &[f64]) -> Vec<f64> {
        let mut r = vec![0.0; self.len()];
        for (((col, &xj), &l), &cat) in self
            .columns
            .iter()
            .zip(x)
            .zip(lambda)
            .zip(&self.categorical)
        {
            for (r, &c) in r.iter_mut().zip(col) {
                *r += l * sqd(xj, c, cat);
            }
        }
        r
    }

    fn len(&self) -> usize {
        self.x.len()
    }

    fn dims(&self) -> usize {
        self.categorical.len()
    }

    /// The Matern-5/2 value and derivative of every pair of inputs.
    fn pair_kernel(&self, lambda: &[f64]) -> PairKernel {
        let pairs = self.len() * (self.len() + 1) / 2;
        let mut r = vec![0.0; pairs];
        for (s, l) in self.pair_sqd.iter().zip(lambda) {
            for (r, s) in r.iter_mut().zip(s) {
                *r += l * s;
            }
        }
        let (value, slope) = r.into_iter().map(matern52).unzip();
        PairKernel { value, slope }
    }

    /// The kernel matrix plus the noise on its diagonal.
    fn covariance(&self, p: &KernelParams, k: &PairKernel) -> DMatrix<f64> {
        let n = self.len();
        let mut c = DMatrix::zeros(n, n);
        // The pairs come in the order of `pair_sqd`: row a, b = 0..=a.
        let mut values = k.value.iter();
        for a in 0..n {
            for b in 0..=a {
                let v = p.scale * values.next().expect("one value per pair");
                c[(a, b)] = v;
                c[(b, a)] = v;
            }
            c[(a, a)] += p.noise;
        }
        c
    }
}

/// The Matern-5/2 value and derivative (in `r`) of each pair `b <= a`,
/// indexed as [`Inputs`] indexes its pairs: the kernel is symmetric, so
/// each pair's distance and exponential are computed once, and the fit
/// uses them for the matrix and for the gradient.
struct PairKernel {
    value: Vec<f64>,
    slope: Vec<f64>,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `A B`, with either operand transposed, through `matrixmultiply`'s
/// GEMM: nalgebra's own product took 4x as long on these sizes.
fn product(
    a: &DMatrix<f64>,
    a_transposed: bool,
    b: &DMatrix<f64>,
    b_transposed: bool,
) -> DMatrix<f64> {
    // A column-major `r x c` matrix has strides (1, r); its transpose (r, 1).
    let shape = |m: &DMatrix<f64>, t: bool| {
        let (r, c) = (m.nrows(), m.ncols());
        if t {
            (c, r, r as isize, 1)
        } else {
            (r, c, 1, r as isize)
        }
    };
    let (m, k, rsa, csa) = shape(a, a_transposed);
    let (k2, n, rsb, csb) = shape(b, b_transposed);
    assert_eq!(k, k2, "inner dimensions");
    let mut c = DMatrix::zeros(m, n);
    // SAFETY: the shapes and strides above describe exactly the buffers
    // of `a` and `b`, and `c` is a fresh m x n column-major buffer.
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            0.0,
            c.as_mut_ptr(),
            1,
            m as isize,
        );
    }
    c
}

/// A covariance's Cholesky factor `L`, kept as `L^-1`: the fit's gradient
/// needs all of `C^-1 = L^-T L^-1`, and the acquisition scores thousands
/// of points against one factor, so both become GEMMs.
#[derive(Debug, Clone)]
struct Factor {
    /// `L^-1`, lower triangular.
    l_inv: DMatrix<f64>,
    /// `ln det C / 2 = sum ln L_ii`.
    log_det_half: f64,
}

impl Factor {
    /// `None` where `c` is not positive definite.
    fn new(c: DMatrix<f64>) -> Option<Self> {
        let chol = Cholesky::new(c)?;
        let l = chol.l_dirty();
        let n = l.nrows();
        let ls = l.as_slice();
        // L^-1 by forward substitution, one column at a time, from its
        // diagonal down. Hand-rolled: nalgebra solves against the whole
        // identity, zeros included, which took 3x as long at 100 trials.
        let mut inv = DMatrix::zeros(n, n);
        for (j, col) in inv.as_mut_slice().chunks_exact_mut(n).enumerate() {
            col[j] = 1.0;
            for k in j..n {
                let xk = col[k] / ls[k * n + k];
                col[k] = xk;
                for (c, &lv) in col[k + 1..].iter_mut().zip(&ls[k * n + k + 1..(k + 1) * n]) {
                    *c -= lv * xk;
                }
            }
        }
        Some(Factor {
            l_inv: inv,
            log_det_half: (0..n).map(|i| ls[i * n + i].ln()).sum(),
        })
    }

    /// `C^-1`.
    fn inverse(&self) -> DMatrix<f64> {
        product(&self.l_inv, true, &self.l_inv, false)
    }

    /// `C^-1 y`.
    fn solve(&self, y: &DVector<f64>) -> DVector<f64> {
        self.l_inv.tr_mul(&(&self.l_inv * y))
    }
}

/// The negative log posterior of the kernel parameters (up to a
/// constant) and its gradient in the raw coordinates; `None` where the
/// covariance is not positive definite.
pub fn negative_log_posterior(inputs: &Inputs, y: &[f64], raw: &[f64]) -> Option<(f64, Vec<f64>)> {
    let (n, d) = (inputs.len(), inputs.dims());
    let p = KernelParams::from_raw(raw);
    let lambda = &p.inverse_squared_lengthscales;
    let kernel = inputs.pair_kernel(lambda);
    let factor = Factor::new(inputs.covariance(&p, &kernel))?;
    let yv = DVector::from_column_slice(y);
    // The constant mean maximises the likelihood for these kernel
    // parameters, so the gradient below (taken at a fixed mean) is also
    // the gradient of this profile likelihood.
    let yv = yv.add_scalar(-gls_mean(&factor, &yv));
    let alpha = factor.solve(&yv);
    let log_likelihood = -factor.log_det_half - 0.5 * yv.dot(&alpha);
    // Optuna's priors (`default_log_prior`), without their constants.
    let log_prior = -lambda.iter().map(|l| 0.1 / l + 0.1 * l).sum::<f64>()
        + (p.scale.ln() - p.scale)
        + (0.1 * p.noise.ln() - 30.0 * p.noise);
    let loss = -log_likelihood - log_prior;

    // d(log likelihood)/dC = (alpha alpha^T - C^-1) / 2 per pair; C is
    // symmetric, so each pair off the diagonal counts twice.
    let inverse = factor.inverse();
    let mut w = Vec::with_capacity(kernel.value.len());
    for a in 0..n {
        w.extend((0..=a).map(|b| {
            let twice = if a == b { 0.5 } else { 1.0 };
            // C^-1 is symmetric: (b, a) reads down column a.
            twice * (alpha[a] * alpha[b] - inverse[(b, a)])
        }));
    }
    let w_slope: Vec<f64> = w.iter().zip(&kernel.slope).map(|(w, s)| w * s).collect();
    let mut grad: Vec<f64> = inputs
        .pair_sqd
        .iter()
        .zip(lambda)
        .map(|(s, l)| -p.scale * l * dot(&w_slope, s))
        .collect();
    grad.push(-p.scale * dot(&w, &kernel.value));
    grad.push(0.0);
    let noise_raw = raw[d + 1].exp();
    grad[d + 1] -= 0.5
        * (0..n)
            .map(|a| alpha[a] * alpha[a] - inverse[(a, a)])
            .sum::<f64>()
        * noise_raw;
    // Minus the prior's derivatives.
    for j in 0..d {
        grad[j] -= 0.1 / lambda[j] - 0.1 * lambda[j];
    }
    grad[d] -= 1.0 - p.scale;
    grad[d + 1] -= (0.1 / p.noise - 30.0) * noise_raw;
    Some((loss, grad))
}

/// The generalised-least-squares constant mean `1' C^-1 y / 1' C^-1 1`.
fn gls_mean(factor: &Factor, y: &DVector<f64>) -> f64 {
    let ones = DVector::from_element(y.len(), 1.0);
    let c1 = factor.solve(&ones);
    c1.dot(y) / c1.sum()
}

struct Fit<'a> {
    inputs: &'a Inputs,
    y: &'a [f64],
    /// The last point and its value and gradient: argmin asks for the
    /// cost and the gradient at each point separately, and both need the
    /// same factorisation.
    last: LastEvaluation<Option<(f64, Vec<f64>)>>,
}

impl Fit<'_> {
    fn at(&self, raw: &[f64]) -> Option<(f64, Vec<f64>)> {
        self.last
            .get(raw, || negative_log_posterior(self.inputs, self.y, raw))
    }
}

fn not_positive_definite() -> ArgminError {
    ArgminError::msg("kernel matrix not positive definite")
}

impl CostFunction for Fit<'_> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, raw: &Vec<f64>) -> Result<f64, ArgminError> {
        self.at(raw)
            .map(|(v, _)| v)
            .ok_or_else(not_positive_definite)
    }
}

impl Gradient for Fit<'_> {
    type Param = Vec<f64>;
    type Gradient = Vec<f64>;
    fn gradient(&self, raw: &Vec<f64>) -> Result<Vec<f64>, ArgminError> {
        self.at(raw)
            .map(|(_, g)| g)
            .ok_or_else(not_positive_definite)
    }
}

/// A fitted regressor: training data, kernel parameters and the
/// factored covariance.
#[derive(Debug, Clone)]
pub struct Regressor {
    pub inputs: Inputs,
    pub params: KernelParams,
    factor: Factor,
    /// `C^-1`, for the variance's gradient.
    c_inv: DMatrix<f64>,
    /// `C^-1 (y - prior_mean)`.
    alpha: DVector<f64>,
    /// The constant prior mean, by generalised least squares.
    pub prior_mean: f64,
}

impl Regressor {
    /// The regressor with these kernel parameters; `None` where the
    /// covariance is not positive definite.
    pub fn new(inputs: Inputs, y: &[f64], params: KernelParams) -> Option<Self> {
        let kernel = inputs.pair_kernel(&params.inverse_squared_lengthscales);
        let factor = Factor::new(inputs.covariance(&params, &kernel))?;
        let yv = DVector::from_column_slice(y);
        let prior_mean = gls_mean(&factor, &yv);
        let alpha = factor.solve(&yv.add_scalar(-prior_mean));
        Some(Regressor {
            inputs,
            params,
            c_inv: factor.inverse(),
            factor,
            alpha,
            prior_mean,
        })
    }

    /// Fits the kernel parameters by MAP with L-BFGS (gradient tolerance
    /// 1e-2, as Optuna), from each of `starts` (Optuna's own start, every
    /// parameter 1, when empty), keeping the most probable; the first start
    /// itself where every fit fails.
    pub fn fit(inputs: Inputs, y: &[f64], starts: &[KernelParams]) -> Self {
        let initial = [KernelParams::initial(inputs.dims())];
        let starts = if starts.is_empty() {
            &initial[..]
        } else {
            starts
        };
        let fit_from = |start: &KernelParams| {
            let problem = Fit {
                inputs: &inputs,
                y,
                last: LastEvaluation::new(),
            };
            let solver = LBFGS::new(MoreThuenteLineSearch::new(), 10)
                .with_tolerance_grad(1e-2)
                .ok()?;
            let r = Executor::new(problem, solver)
                .configure(|s| s.param(start.raw()).max_iters(500))
                .run()
                .ok()?;
            let cost = r.state.best_cost;
            let raw = r.state.best_param?;
            (cost.is_finite() && raw.iter().all(|v| v.is_finite()))
                .then(|| (cost, KernelParams::from_raw(&raw)))
        };
        // The starts spread over the cores: the fit is most of a proposal's time.
        let fitted = super::in_parallel(starts, |part| part.iter().map(fit_from).collect())
            .into_iter()
            .flatten()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, p)| p);
        fitted
            .and_then(|p| Regressor::new(inputs.clone(), y, p))
            .or_else(|| Regressor::new(inputs, y, starts[0].clone()))
            .expect("the noise of the starting point keeps the covariance positive definite")
    }

    /// The kernel row between `x` and the training points, and each
    /// entry's derivative factor `scale * matern'(r)`.
    fn kernel_row(&self, x: &[f64]) -> (DVector<f64>, Vec<f64>) {
        let r = self
            .inputs
            .scaled_distances(x, &self.params.inverse_squared_lengthscales);
        let scale = self.params.scale;
        let (k, dk): (Vec<f64>, Vec<f64>) = r
            .into_iter()
            .map(|r| {
                let (m, dm) = matern52(r);
                (scale * m, scale * dm)
            })
            .unzip();
        (DVector::from_vec(k), dk)
    }

    /// The posterior mean and variance of `f(x)`.
    pub fn posterior(&self, x: &[f64]) -> (f64, f64) {
        let (k, _) = self.kernel_row(x);
        let v = &self.factor.l_inv * &k;
        (
            self.prior_mean + k.dot(&self.alpha),
            (self.params.scale - v.dot(&v)).max(0.0),
        )
    }

    /// [`Regressor::posterior`] at each of `xs`, in one GEMM.
    pub fn posteriors(&self, xs: &[Vec<f64>]) -> Vec<(f64, f64)> {
        let n = self.inputs.len();
        // Column a holds x_a's kernel row.
        let mut kt = DMatrix::zeros(n, xs.len());
        for (col, x) in kt.as_mut_slice().chunks_exact_mut(n).zip(xs) {
            let r = self
                .inputs
                .scaled_distances(x, &self.params.inverse_squared_lengthscales);
            for (k, r) in col.iter_mut().zip(r) {
                *k = self.params.scale * matern52(r).0;
            }
        }
        let means = kt.tr_mul(&self.alpha);
        // Column a of L^-1 K^T is L^-1 k_a.
        let v = product(&self.factor.l_inv, false, &kt, false);
        v.as_slice()
            .chunks_exact(n)
            .zip(means.iter())
            .map(|(va, &mean)| {
                let explained: f64 = va.iter().map(|e| e * e).sum();
                (
                    self.prior_mean + mean,
                    (self.params.scale - explained).max(0.0),
                )
            })
            .collect()
    }

    /// The posterior mean and variance with their gradients in `x`
    /// (zero along categorical dimensions, which are not differentiable).
    pub fn posterior_with_gradient(&self, x: &[f64]) -> (f64, f64, Vec<f64>, Vec<f64>) {
        let (k, dk) = self.kernel_row(x);
        let mean = self.prior_mean + k.dot(&self.alpha);
        let c_inv_k = &self.c_inv * &k;
        let var = (self.params.scale - k.dot(&c_inv_k)).max(0.0);
        // d k_i / d x_j = scale * matern'(r_i) * lambda_j * 2 (x_j - X_ij).
        let mean_w: Vec<f64> = dk
            .iter()
            .zip(self.alpha.iter())
            .map(|(d, a)| d * a)
            .collect();
        let var_w: Vec<f64> = dk.iter().zip(c_inv_k.iter()).map(|(d, c)| d * c).collect();
        let (mut dmean, mut dvar) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        for (j, col) in self.inputs.columns.iter().enumerate() {
            if self.inputs.categorical[j] {
                continue;
            }
            let two_l = 2.0 * self.params.inverse_squared_lengthscales[j];
            let (mut m, mut v) = (0.0, 0.0);
            for ((c, mw), vw) in col.iter().zip(&mean_w).zip(&var_w) {
                let diff = x[j] - c;
                m += mw * diff;
                v += vw * diff;
            }
            dmean[j] = two_l * m;
            dvar[j] = -2.0 * two_l * v;
        }
        (mean, var, dmean, dvar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> (Inputs, Vec<f64>) {
        let x: Vec<Vec<f64>> = (0..12)
            .map(|i| {
                let t = i as f64 / 11.0;
                vec![t, (3.7 * t).fract(), (i % 3) as f64]
            })
            .collect();
        let y: Vec<f64> = x
            .iter()
            .map(|p| (6.0 * p[0]).sin() + p[1] * p[1] - 0.5 * p[2])
            .collect();
        (Inputs::new(x, vec![false, false, true]), y)
    }

    /// Fixed kernel parameters for [`data`]'s three dimensions.
    fn data_params(noise: f64) -> KernelParams {
        KernelParams {
            inverse_squared_lengthscales: vec![4.0, 2.0, 1.0],
            scale: 1.5,
            noise,
        }
    }

    #[test]
    fn the_factor_inverts_the_covariance() {
        let (inputs, _) = data();
        let p = data_params(1e-4);
        let c = inputs.covariance(&p, &inputs.pair_kernel(&p.inverse_squared_lengthscales));
        let factor = Factor::new(c.clone()).unwrap();
        let identity = &c * factor.inverse();
        let n = c.nrows();
        assert!((identity - DMatrix::identity(n, n)).abs().max() < 1e-8);
        let y = DVector::from_fn(n, |i, _| (i as f64).sin());
        assert!((&c * factor.solve(&y) - &y).abs().max() < 1e-8);
        let log_det: f64 = c.clone().cholesky().unwrap().determinant().ln();
        assert!((2.0 * factor.log_det_half - log_det).abs() < 1e-9);
    }

    #[test]
    fn batched_posteriors_equal_one_at_a_time() {
        let (inputs, y) = data();
        let gp = Regressor::fit(inputs, &y, &[]);
        let xs: Vec<Vec<f64>> = (0..37)
            .map(|i| {
                vec![
                    (i as f64 * 0.37).fract(),
                    (i as f64 * 0.71).fract(),
                    (i % 3) as f64,
                ]
            })
            .collect();
        for (x, (mean, var)) in xs.iter().zip(gp.posteriors(&xs)) {
            let (m, v) = gp.posterior(x);
            assert!((m - mean).abs() < 1e-12 && (v - var).abs() < 1e-12, "{x:?}");
        }
    }

    #[test]
    fn the_posterior_interpolates_noiseless_data() {
        let (inputs, y) = data();
        let gp = Regressor::new(inputs.clone(), &y, data_params(1e-10)).unwrap();
        for (x, want) in inputs.x.iter().zip(&y) {
            let (mean, var) = gp.posterior(x);
            assert!((mean - want).abs() < 1e-6, "{mean} vs {want}");
            assert!(var < 1e-8, "variance {var} at a training point");
        }
        // Away from the data the variance grows towards the prior's.
        let (_, far) = gp.posterior(&[0.5, 0.5, 7.0]);
        assert!(far > 0.1, "{far}");
    }

    #[test]
    fn the_prior_mean_follows_the_data() {
        // Shifting every value shifts the posterior mean by as much and
        // leaves the variance: the constant mean is fitted, not zero.
        let (inputs, y) = data();
        let p = data_params(1e-6);
        let gp = Regressor::new(inputs.clone(), &y, p.clone()).unwrap();
        let shifted: Vec<f64> = y.iter().map(|v| v + 7.0).collect();
        let moved = Regressor::new(inputs, &shifted, p).unwrap();
        for x in [[0.3, 0.6, 1.0], [0.9, 0.05, 2.0], [4.0, 4.0, 0.0]] {
            let ((m, v), (m7, v7)) = (gp.posterior(&x), moved.posterior(&x));
            assert!((m7 - m - 7.0).abs() < 1e-9, "{x:?}: {m} and {m7}");
            assert!((v7 - v).abs() < 1e-12, "{x:?}: {v} and {v7}");
        }
        // Far from every trial the posterior is the prior: the fitted
        // mean, a weighted average of the values.
        let (far, var) = gp.posterior(&[50.0, 50.0, 9.0]);
        assert!((far - gp.prior_mean).abs() < 1e-9 && (var - 1.5).abs() < 1e-9);
        let (lo, hi) = y
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
                (l.min(*v), h.max(*v))
            });
        assert!(
            lo < gp.prior_mean && gp.prior_mean < hi,
            "{}",
            gp.prior_mean
        );
    }

    #[test]
    fn the_fit_gradient_matches_finite_differences() {
        let (inputs, y) = data();
        for raw in [
            vec![0.0, 0.0, 0.0, 0.0, 0.0],
            vec![1.3, -0.4, 0.2, 0.5, -5.0],
            vec![-1.0, 2.0, -0.5, -0.3, -9.0],
        ] {
            let (_, grad) = negative_log_posterior(&inputs, &y, &raw).unwrap();
            for k in 0..raw.len() {
                let h = 1e-5;
                let at = |dh: f64| {
                    let mut r = raw.clone();
                    r[k] += dh;
                    negative_log_posterior(&inputs, &y, &r).unwrap().0
                };
                let fd = (at(h) - at(-h)) / (2.0 * h);
                assert!(
                    (fd - grad[k]).abs() <= 1e-5 * (1.0 + fd.abs()),
                    "raw {raw:?}, parameter {k}: analytic {} vs finite difference {fd}",
                    grad[k]
                );
            }
        }
    }

    #[test]
    fn the_posterior_gradient_matches_finite_differences() {
        let (inputs, y) = data();
        let gp = Regressor::fit(inputs, &y, &[]);
        for x in [[0.31, 0.77, 1.0], [0.05, 0.4, 2.0], [0.93, 0.12, 0.0]] {
            let (_, _, dmean, dvar) = gp.posterior_with_gradient(&x);
            for j in 0..2 {
                let h = 1e-6;
                let at = |dh: f64| {
                    let mut p = x;
                    p[j] += dh;
                    gp.posterior(&p)
                };
                let (hi, lo) = (at(h), at(-h));
                let (fd_mean, fd_var) = ((hi.0 - lo.0) / (2.0 * h), (hi.1 - lo.1) / (2.0 * h));
                assert!((fd_mean - dmean[j]).abs() < 1e-5 * (1.0 + fd_mean.abs()));
                assert!((fd_var - dvar[j]).abs() < 1e-5 * (1.0 + fd_var.abs()));
            }
            assert_eq!(dmean[2], 0.0, "no gradient along a categorical");
        }
    }

    #[test]
    fn the_fit_improves_the_posterior_and_learns_relevance() {
        // y depends on dimension 0 only: its length scale must come out
        // shorter than the irrelevant dimension's.
        let x: Vec<Vec<f64>> = (0..30)
            .map(|i| vec![(i as f64 * 0.618).fract(), (i as f64 * 0.414).fract()])
            .collect();
        let y: Vec<f64> = x.iter().map(|p| (5.0 * p[0]).sin()).collect();
        let inputs = Inputs::new(x, vec![false, false]);
        let start = KernelParams::initial(2);
        let before = negative_log_posterior(&inputs, &y, &start.raw()).unwrap().0;
        let gp = Regressor::fit(inputs.clone(), &y, &[]);
        let after = negative_log_posterior(&inputs, &y, &gp.params.raw())
            .unwrap()
            .0;
        assert!(after < before - 1.0, "{after} vs {before}");
        let ls = gp.params.length_scales();
        assert!(ls[0] < ls[1], "length scales {ls:?}");
    }
}
