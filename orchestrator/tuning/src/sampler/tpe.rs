//! The Tree-structured Parzen Estimator (Bergstra et al., 2011), in the
//! family of Optuna's `TPESampler`.
//!
//! After `startup_trials` random proposals, finished trials are split into a
//! good group (the best `gamma(n) = min(ceil(0.1 n), 25)`) and a bad one.
//! For each active parameter, in order (so conditional parameters only see
//! trials where they were active), a Parzen estimator is fitted to each group:
//! a truncated Gaussian mixture over the parameter's range (in log space for
//! `log` parameters), with a wide prior component; or, for a categorical, a
//! smoothed histogram. Candidates are drawn from the good density and the
//! one with the largest ratio `l(x) / g(x)` wins.
//!
//! Where we differ from Optuna, on purpose (measured over 300 seeds in
//! `bench samplers`; see `docs/benchmarks/samplers.md`):
//! - the narrowest kernel of an estimator over `n` observations is
//!   `range / min(100, (n + 2)^e)`, not Optuna's `range / min(100, n +
//!   2)`: `e` is 1.15 for a continuous dimension of a study of one
//!   objective, 1.25 for a discrete one or a study of several. The good
//!   group holds few observations (5 at 50 trials), so Optuna's clip
//!   keeps its kernels a seventh of the range wide, too wide to close in
//!   on an optimum. An exponent of 1.5 closed in faster still, but got
//!   stuck in the local minima of Levy-5, and so did 1.25 on continuous
//!   spaces, over 500 seeds with trials in flight;
//! - a discrete dimension's kernels stay at least half a cell wide, so
//!   that a level's neighbours keep some mass (without it, the narrower
//!   clip left a sixth of the ordinal runs stuck on a wrong level);
//! - the good observations' kernels are weighted by rank, from
//!   [`BEST_WEIGHT`] for the best down to 1 for the worst of the group.
//!
//! Integers and stepped floats are discrete, as in Optuna 5.0's
//! `_BatchedDiscreteTruncNormDistributions`: a kernel's probability of a
//! value is its Gaussian mass over the value's cell `[v - step/2, v +
//! step/2]` (in log space for a log integer), not its density at `v`, and
//! candidates are rounded to the grid before they are compared. With few
//! levels and many observations the kernels grow narrower than a cell, and
//! a density at the point would call a level dozens of times likelier than
//! its mass does.
//!
//! On a space where every parameter is discrete (a grid), no proposal
//! repeats a trial while the grid has room: the random start draws again
//! (up to [`REDRAWS`] times), jointly sampled candidates that were tried
//! are passed over, and parameters sampled one at a time (several
//! objectives) give the best combination of their candidates not yet
//! tried, by summed `log l - log g`. Optuna repeats them. On the digits
//! MLP's 675-point grid, where late in a study most per-parameter draws
//! land on tried configurations, this raised our multi-objective TPE's
//! hypervolume on 74-79 of 100 seeds (`docs/benchmarks/fronts.md`).
//!
//! Trials still pending (running, or paused other than at a rung) are
//! judged before the split.
//! Each takes the value a Gaussian process fitted on the finished trials
//! predicts for it (the kriging believer, [`super::gp`]): a pending trial
//! that looks good then draws the next proposals near it, as its result
//! most likely will. From [`WIDEN_BELIEVED_FROM`] pending on, a believed
//! trial's kernel is measured against the finished trials only, and made
//! [`BELIEVED_WIDTH`] times as wide, so that many believed trials beside
//! the best ones do not close the good density on one basin. On a space
//! where every parameter is discrete, a lone pending trial counts as a bad
//! observation instead (a constant liar, as Optuna's `constant_liar`), so
//! that two proposals spread out over the few levels; from
//! [`BELIEVE_ON_GRIDS_FROM`] pending on, they are believed there too.
//! Measured at 1-16 trials in flight in
//! `docs/benchmarks/concurrency.md`. Pruned trials are results, not
//! pending ones: as in Optuna's TPE they count toward the random start and
//! rank after every finished trial, the furthest first (the runner
//! reports a trial paused below a rung's cut as pruned there until it is
//! promoted); failed ones count as bad.

use rand::{RngExt, rngs::StdRng};
use rand_distr::{Distribution as _, Normal};

use super::random::draw;
use super::{Sampler, Stopped, TrialRecord};
use crate::objective::Direction;
use crate::pareto;
use crate::space::{Distribution, ParamValue, Params, SearchSpace};

#[derive(Debug, Clone)]
pub struct TpeSampler {
    pub seed: u64,
    /// One per objective; with several, trials are ranked by Pareto front.
    pub directions: Vec<Direction>,
    pub startup_trials: usize,
    pub candidates: usize,
    pub prior_weight: f64,
    /// Sample the unconditional parameters jointly, from mixtures of
    /// product kernels (Optuna 5's default for one objective); conditional
    /// ones are then sampled one at a time.
    pub multivariate: bool,
    /// How trials still pending are judged.
    pub pending: Pending,
}

/// How TPE judges the trials still pending (running or paused) when it
/// proposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pending {
    /// [`Pending::Believe`] where the space has a continuous parameter or
    /// `BELIEVE_ON_GRIDS_FROM` trials are pending (and the study has one
    /// objective), else [`Pending::Lie`].
    #[default]
    Auto,
    /// Each takes the value a Gaussian process fitted on the finished
    /// trials predicts for it (the kriging believer). One objective only.
    Believe,
    /// Each counts as a bad observation (the constant liar, Optuna's
    /// `constant_liar`).
    Lie,
}

impl TpeSampler {
    pub fn new(seed: u64, direction: Direction) -> Self {
        Self::multi(seed, vec![direction])
    }

    /// TPE for a study of several objectives (Optuna's multi-objective
    /// TPE): the good group is chosen by Pareto front, and its kernels
    /// weigh the same; with several, parameters are sampled one at a time
    /// (Optuna's default).
    pub fn multi(seed: u64, directions: Vec<Direction>) -> Self {
        TpeSampler {
            seed,
            startup_trials: 10,
            candidates: 24,
            prior_weight: 1.0,
            multivariate: directions.len() == 1,
            pending: Pending::Auto,
            directions,
        }
    }
}

/// How the good group's kernels are weighted: the best one's weight over
/// the worst one's, linear in rank between.
pub const BEST_WEIGHT: f64 = 3.0;

/// The narrowest kernel among `n` observations is `range / min(100, (n +
/// 2)^CLIP_EXPONENT)`; Optuna's magic clip has an exponent of 1.
pub const CLIP_EXPONENT: f64 = 1.25;

/// The clip's exponent for a continuous dimension of a study of one
/// objective: wider than [`CLIP_EXPONENT`], whose narrow kernels settled
/// in Levy-5's local minima (`docs/benchmarks/concurrency.md`).
pub const CONTINUOUS_CLIP_EXPONENT: f64 = 1.15;

/// From this many pending trials on, a believed trial's kernel is
/// [`BELIEVED_WIDTH`] times as wide as its distance to the finished
/// trials beside it, and it does not narrow theirs. At 8 in flight seven
/// believed trials lie where earlier proposals drew them, beside the good
/// group's best points: narrowed among themselves, they closed the good
/// density on one basin where nothing new was known (Levy-5 stayed in a
/// local basin on 41% of seeds, against 34% with this; measured in
/// `docs/benchmarks/concurrency.md`). Below it, so at the CPU's default
/// of one trial pending, believed trials are kernels like the others.
pub const WIDEN_BELIEVED_FROM: usize = 3;

/// How much wider a believed trial's kernel is than its distance to the
/// finished trials beside it (see [`WIDEN_BELIEVED_FROM`]), for the doubt
/// in its value.
pub const BELIEVED_WIDTH: f64 = 1.5;

/// A discrete dimension's kernels are at least this many cells wide.
pub const MIN_CELLS: f64 = 0.5;

/// The narrowest kernel of an estimator over `n` observations on a range
/// of `range` (in the kernels' coordinates) with `levels` values if the
/// dimension is discrete, for a clip of `exponent`.
pub fn min_bandwidth(range: f64, n: usize, levels: Option<f64>, exponent: f64) -> f64 {
    let clip = range / (100.0f64).min(((n + 2) as f64).powf(exponent));
    levels.map_or(clip, |l| clip.max(MIN_CELLS * range / l))
}

/// The weights of the good group's observations, given each one's rank
/// in the group (0 for the best).
pub fn good_weights(ranks: &[usize]) -> Vec<f64> {
    let n = ranks.len();
    ranks
        .iter()
        .map(|&r| 1.0 + (BEST_WEIGHT - 1.0) * (n - 1 - r) as f64 / (n.max(2) - 1) as f64)
        .collect()
}

/// The size of the good group among `n` observations.
pub fn gamma(n: usize) -> usize {
    (n as f64 * 0.1).ceil().min(25.0) as usize
}

/// The value grid of a discrete numeric dimension: integers and stepped
/// floats, in the parameter's own units.
#[derive(Debug, Clone, Copy)]
struct Grid {
    low: f64,
    high: f64,
    step: f64,
    log: bool,
}

impl Grid {
    /// The kernels' coordinate of a value (its log for a log integer).
    fn coord(&self, v: f64) -> f64 {
        if self.log { v.ln() } else { v }
    }

    /// The grid value nearest to coordinate `x`.
    fn round(&self, x: f64) -> f64 {
        let v = if self.log { x.exp() } else { x };
        (self.low + ((v - self.low) / self.step).round() * self.step).clamp(self.low, self.high)
    }
}

/// One dimension of a Parzen estimator: a kernel per observation plus a
/// prior kernel (the last), weighted by the estimator's shared weights.
enum Kernels {
    /// Truncated Gaussians on `[low, high]` (in the parameter's space: its
    /// log for `log` ones; for a discrete one the outer edges of its end
    /// cells). A discrete dimension's points are grid values, a continuous
    /// one's are coordinates.
    Numeric {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        low: f64,
        high: f64,
        grid: Option<Grid>,
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

/// `ln(Phi(b) - Phi(a))` for the standard normal, `a <= b`, accurate in
/// the tails: from the side where the mass is a difference of two small
/// complementary error functions rather than of two numbers near 1.
pub(crate) fn log_gauss_mass(a: f64, b: f64) -> f64 {
    let tail = |lo: f64, hi: f64| 0.5 * (libm::erfc(lo / SQRT_2) - libm::erfc(hi / SQRT_2));
    let mass = if a >= 0.0 {
        tail(a, b)
    } else if b <= 0.0 {
        tail(-b, -a)
    } else {
        1.0 - 0.5 * libm::erfc(-a / SQRT_2) - 0.5 * libm::erfc(b / SQRT_2)
    };
    mass.max(f64::MIN_POSITIVE).ln()
}

const SQRT_2: f64 = std::f64::consts::SQRT_2;

impl Kernels {
    /// Optuna's bandwidths: each observation's distance to its farther
    /// neighbouring observation (the outermost ones use their one inner
    /// neighbour), clipped to `[min_bandwidth, range]` (see
    /// [`min_bandwidth`]: narrower than Optuna's clip); then a prior kernel
    /// at the centre as wide as the range. On a continuous dimension the
    /// neighbours are finished observations only: a point flagged in
    /// `believed` is measured as if it alone joined them, [`BELIEVED_WIDTH`]
    /// times as wide, and is no one's neighbour (no flags: every point is
    /// finished). A discrete one ignores the flags: on grids it won nothing
    /// (`docs/benchmarks/concurrency.md`).
    fn numeric(
        points: &[f64],
        believed: &[bool],
        low: f64,
        high: f64,
        grid: Option<Grid>,
        exponent: f64,
    ) -> Self {
        let range = (high - low).max(1e-12);
        let n = points.len();
        let is_believed = |i: usize| grid.is_none() && believed.get(i).copied().unwrap_or(false);
        let mut order: Vec<usize> = (0..n).filter(|&i| !is_believed(i)).collect();
        order.sort_by(|&a, &b| points[a].total_cmp(&points[b]));
        let m = order.len();
        let with_ends: Vec<f64> = std::iter::once(low)
            .chain(order.iter().map(|&i| points[i]))
            .chain(std::iter::once(high))
            .collect();
        let mut sorted_sigmas: Vec<f64> = (1..=m)
            .map(|i| (with_ends[i] - with_ends[i - 1]).max(with_ends[i + 1] - with_ends[i]))
            .collect();
        if m >= 2 {
            sorted_sigmas[0] = with_ends[2] - with_ends[1];
            sorted_sigmas[m - 1] = with_ends[m] - with_ends[m - 1];
        }
        let mut widths = vec![0.0; n];
        for (rank, &i) in order.iter().enumerate() {
            widths[i] = sorted_sigmas[rank];
        }
        for i in (0..n).filter(|&i| is_believed(i)) {
            let x = points[i];
            // Its place among the finished points: `with_ends[q]` is the
            // one below it (or `low`), `with_ends[q + 1]` the one above.
            let q = with_ends[1..=m].partition_point(|&v| v < x);
            let (below, above) = (x - with_ends[q], with_ends[q + 1] - x);
            let width = match (q, m) {
                (_, 0) => below.max(above),
                (0, _) => above,
                (q, m) if q == m => below,
                _ => below.max(above),
            };
            widths[i] = BELIEVED_WIDTH * width;
        }
        let levels = grid.map(|g| ((g.high - g.low) / g.step).round() + 1.0);
        let min_sigma = min_bandwidth(range, n, levels, exponent);
        let mut sigmas: Vec<f64> = widths.iter().map(|w| w.clamp(min_sigma, range)).collect();
        let mut mus = points.to_vec();
        mus.push(0.5 * (low + high));
        sigmas.push(range);
        Kernels::Numeric {
            mus,
            sigmas,
            low,
            high,
            grid,
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
                grid,
            } => {
                let normal = Normal::new(mus[k], sigmas[k]).expect("positive sigma");
                let x = (0..100)
                    .map(|_| normal.sample(rng))
                    .find(|x| (*low..=*high).contains(x))
                    .unwrap_or_else(|| rng.random_range(*low..=*high));
                grid.map_or(x, |g| g.round(x))
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
                grid,
            } => {
                let (mu, s) = (mus[k], sigmas[k]);
                let inside = log_gauss_mass((low - mu) / s, (high - mu) / s);
                match grid {
                    // The mass of the value's cell, within the truncation.
                    Some(g) => {
                        let left = g.coord(x - 0.5 * g.step).max(*low);
                        let right = g.coord(x + 0.5 * g.step).min(*high);
                        log_gauss_mass((left - mu) / s, (right - mu) / s) - inside
                    }
                    None => {
                        let z = (x - mu) / s;
                        -0.5 * z * z - (s * (2.0 * std::f64::consts::PI).sqrt()).ln() - inside
                    }
                }
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

/// How an estimator weighs its observations' kernels.
#[derive(Clone, Copy)]
enum Weighting<'a> {
    /// [`observation_weights`]: older observations weigh less.
    ByAge,
    /// By age, times [`good_weights`] of each observation's rank.
    ByAgeAndRank(&'a [usize]),
    /// All alike.
    Equal,
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

/// The grid of a discrete numeric parameter (integers, stepped floats).
fn grid(d: &Distribution) -> Option<Grid> {
    match *d {
        Distribution::Int {
            low,
            high,
            step,
            log,
        } => Some(Grid {
            low: low as f64,
            high: high as f64,
            step: step as f64,
            log,
        }),
        Distribution::Float {
            low,
            high,
            step: Some(step),
            log,
        } => Some(Grid {
            low,
            high,
            step,
            log,
        }),
        _ => None,
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

/// Whether `d` takes finitely many values: a categorical, an integer or a
/// stepped float.
fn discrete(d: &Distribution) -> bool {
    matches!(d, Distribution::Categorical { .. }) || grid(d).is_some()
}

/// A parameter's value from an estimator's sample: a categorical's
/// index, a discrete parameter's grid value, or a continuous one's
/// coordinate.
fn value_of(d: &Distribution, x: f64) -> ParamValue {
    match d {
        Distribution::Categorical { .. } => ParamValue::Choice(x as usize),
        _ if grid(d).is_some() => value_on_grid(d, x),
        _ => from_space(d, x),
    }
}

/// A discrete parameter's value from its grid value.
fn value_on_grid(d: &Distribution, v: f64) -> ParamValue {
    match d {
        Distribution::Int { .. } => ParamValue::Int(v.round() as i64),
        _ => ParamValue::Float(v),
    }
}

/// Finished trials split into the good and the bad group (pending ones
/// among the bad), each in trial order.
struct Split {
    good: Vec<Vec<ParamValue>>,
    bad: Vec<Vec<ParamValue>>,
    /// Each good trial's rank in its group, 0 for the best.
    good_ranks: Vec<usize>,
    /// Which of `good` and of `bad` are believed pending trials whose
    /// kernels widen (see [`WIDEN_BELIEVED_FROM`]).
    good_believed: Vec<bool>,
    bad_believed: Vec<bool>,
}

/// Where a pruned trial stopped: its last report's step and value.
fn pruned(t: &TrialRecord) -> Option<(i64, f64)> {
    match t.stopped {
        Some(Stopped::Pruned { step, value }) => Some((step, value)),
        _ => None,
    }
}

/// What one proposal works out once and each of its samplings shares.
#[derive(Default)]
struct Proposal {
    /// The `(good, bad)` groups of each set of finished trials (indices
    /// into the history) met so far.
    ranked: std::collections::HashMap<Vec<usize>, (Vec<usize>, Vec<usize>)>,
    /// By history index: the believed pending trials whose kernels widen
    /// (see [`WIDEN_BELIEVED_FROM`]); empty when none do.
    widened: Vec<bool>,
}

impl TpeSampler {
    /// Whether `t` finished with every objective's value, and finite ones.
    fn finished(&self, t: &TrialRecord) -> bool {
        if self.directions.len() > 1 {
            t.values.len() == self.directions.len() && t.values.iter().all(|v| v.is_finite())
        } else {
            t.value.is_some_and(f64::is_finite)
        }
    }

    /// Whether TPE learns from `t` as a result: finished, or pruned (one
    /// objective; several refuse pruners), as Optuna's TPE counts them.
    fn learned(&self, t: &TrialRecord) -> bool {
        self.finished(t) || (self.directions.len() == 1 && pruned(t).is_some())
    }

    /// The finished trials `done` (indices into `history`) as `(good,
    /// bad)`, the good group best first, as Optuna's TPE splits them: the
    /// good group takes `gamma(n)` trials (`ceil(0.1 n)` with several
    /// objectives) from the feasible ones, by value, or with several
    /// objectives by non-dominated front, the front that does not fit
    /// whole thinned by hypervolume ([`pareto::greedy_subset`]); when too
    /// few are feasible, pruned trials fill it (the furthest first, then
    /// by the value they were pruned at), then the least infeasible.
    fn rank(&self, history: &[TrialRecord], done: Vec<usize>) -> (Vec<usize>, Vec<usize>) {
        let n = done.len();
        let (mut stopped, done_values): (Vec<usize>, Vec<usize>) =
            done.iter().partition(|&&i| pruned(&history[i]).is_some());
        let (mut feasible, mut infeasible): (Vec<usize>, Vec<usize>) = done_values
            .into_iter()
            .partition(|&i| history[i].violation <= 0.0);
        let several = self.directions.len() > 1;
        let n_good = if several {
            (n as f64 * 0.1).ceil() as usize
        } else {
            gamma(n)
        };
        let mut good = if several {
            self.best_by_front(history, &feasible, n_good)
        } else {
            let value = |i: usize| history[i].value.unwrap_or(f64::NAN);
            match self.directions[0] {
                Direction::Minimize => feasible.sort_by(|&a, &b| value(a).total_cmp(&value(b))),
                Direction::Maximize => feasible.sort_by(|&a, &b| value(b).total_cmp(&value(a))),
            }
            feasible.truncate(n_good);
            feasible
        };
        // Pruned trials after the finished ones, as Optuna's TPE ranks
        // them: the furthest first, then by the value they were pruned at
        // (a NaN last).
        let at = |i: usize| pruned(&history[i]).expect("partitioned");
        let direction = self.directions[0];
        let score = |v: f64| {
            if v.is_nan() {
                f64::INFINITY
            } else {
                direction.minimised(v)
            }
        };
        stopped.sort_by(|&a, &b| {
            (at(b).0.cmp(&at(a).0)).then(score(at(a).1).total_cmp(&score(at(b).1)))
        });
        infeasible.sort_by(|&a, &b| history[a].violation.total_cmp(&history[b].violation));
        let room = n_good.saturating_sub(good.len());
        good.extend(stopped.into_iter().chain(infeasible).take(room));
        let bad = done.into_iter().filter(|i| !good.contains(i)).collect();
        (good, bad)
    }

    /// The best `n_good` of `feasible` by non-dominated front, the last
    /// front that does not fit whole thinned by hypervolume up to Optuna's
    /// reference point for it.
    fn best_by_front(
        &self,
        history: &[TrialRecord],
        feasible: &[usize],
        n_good: usize,
    ) -> Vec<usize> {
        let points: Vec<Vec<f64>> = feasible
            .iter()
            .map(|&i| pareto::minimised(&history[i].values, &self.directions))
            .collect();
        let mut good = Vec::with_capacity(n_good);
        for front in pareto::sort_fronts(&points) {
            if good.len() + front.len() <= n_good {
                good.extend(front.iter().map(|&k| feasible[k]));
                continue;
            }
            let members: Vec<Vec<f64>> = front.iter().map(|&k| points[k].clone()).collect();
            let reference = pareto::reference_point(&members);
            let picked = pareto::greedy_subset(&members, n_good - good.len(), &reference);
            good.extend(picked.into_iter().map(|j| feasible[front[j]]));
            break;
        }
        good
    }

    /// Trials whose values for every parameter in `names` are known, split
    /// into `(good, bad)` groups ([`TpeSampler::rank`]), each in trial
    /// order, with each good one's rank in its group (0 for the best);
    /// pending trials are bad. `proposal` keeps the groups of each set of
    /// finished trials for the rest of a proposal: the parameters sampled
    /// one at a time mostly share one, and with several objectives its
    /// hypervolume thinning costs far more than the rest of a parameter.
    fn split(&self, names: &[&str], history: &[TrialRecord], proposal: &mut Proposal) -> Split {
        let values = |t: &TrialRecord| {
            names
                .iter()
                .map(|n| t.params.get(*n).copied())
                .collect::<Option<Vec<_>>>()
        };
        let done: Vec<usize> = (0..history.len())
            .filter(|&i| self.learned(&history[i]) && values(&history[i]).is_some())
            .collect();
        let (good_order, mut bad) = proposal
            .ranked
            .entry(done.clone())
            .or_insert_with(|| self.rank(history, done))
            .clone();
        let mut good: Vec<(usize, usize)> = good_order
            .into_iter()
            .enumerate()
            .map(|(rank, i)| (i, rank))
            .collect();
        // The constant liar: pending trials count as bad (where they were
        // not believed), as failed ones do.
        bad.extend(
            (0..history.len())
                .filter(|&i| history[i].value.is_none() && pruned(&history[i]).is_none()),
        );
        good.sort_by_key(|x| x.0);
        bad.sort();
        bad.retain(|&i| values(&history[i]).is_some());
        let point = |i: usize| values(&history[i]).expect("filtered");
        let widened = |i: usize| proposal.widened.get(i).copied().unwrap_or(false);
        Split {
            good_believed: good.iter().map(|x| widened(x.0)).collect(),
            bad_believed: bad.iter().map(|&i| widened(i)).collect(),
            good_ranks: good.iter().map(|x| x.1).collect(),
            good: good.iter().map(|x| point(x.0)).collect(),
            bad: bad.into_iter().map(point).collect(),
        }
    }

    /// The points of `names` that trials already have (finished or not),
    /// as the estimators' samples hold them; none unless every dimension
    /// is discrete.
    fn tried_points(
        &self,
        dists: &[&Distribution],
        names: &[&str],
        history: &[TrialRecord],
    ) -> Vec<Vec<f64>> {
        if !dists.iter().all(|d| discrete(d)) {
            return Vec::new();
        }
        history
            .iter()
            .filter_map(|t| {
                names
                    .iter()
                    .map(|n| t.params.get(*n).map(|v| v.internal()))
                    .collect::<Option<Vec<f64>>>()
            })
            .collect()
    }

    /// The clip's exponent ([`min_bandwidth`]) of a dimension: the wider
    /// [`CONTINUOUS_CLIP_EXPONENT`] for a continuous one of a study of one
    /// objective; else [`CLIP_EXPONENT`] (on several objectives'
    /// continuous dimensions, over 100 held-out seeds, it was ahead of
    /// Optuna's 1 and level with 1.15 but on DTLZ2, where it was ahead;
    /// `docs/benchmarks/fronts.md`).
    fn clip_exponent(&self, discrete: bool) -> f64 {
        if discrete || self.directions.len() > 1 {
            CLIP_EXPONENT
        } else {
            CONTINUOUS_CLIP_EXPONENT
        }
    }

    /// How the good group's kernels are weighted: `one_objective` with one
    /// objective; equally with several, as Optuna's (`weights_below` of
    /// ones), since neither a rank nor an age within a group of several
    /// fronts says which member matters more.
    fn good_weighting<'a>(&self, one_objective: Weighting<'a>) -> Weighting<'a> {
        if self.directions.len() == 1 {
            one_objective
        } else {
            Weighting::Equal
        }
    }

    /// The Parzen estimator of `obs`, its kernels weighted as `weighting`
    /// says.
    fn estimator(
        &self,
        dists: &[&Distribution],
        obs: &[Vec<ParamValue>],
        weighting: Weighting,
        believed: &[bool],
    ) -> Estimator {
        let mut weights = match weighting {
            Weighting::Equal => vec![1.0; obs.len()],
            Weighting::ByAge => observation_weights(obs.len()),
            Weighting::ByAgeAndRank(ranks) => observation_weights(obs.len())
                .into_iter()
                .zip(good_weights(ranks))
                .map(|(w, r)| w * r)
                .collect(),
        };

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
                    let grid = grid(d);
                    Kernels::numeric(
                        &obs.iter().map(|o| to_space(d, o[j])).collect::<Vec<_>>(),
                        believed,
                        low,
                        high,
                        grid,
                        self.clip_exponent(grid.is_some()),
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
        proposal: &mut Proposal,
    ) -> Option<Vec<ParamValue>> {
        let Split {
            good,
            bad,
            good_ranks,
            good_believed,
            bad_believed,
        } = self.split(names, history, proposal);
        if good.is_empty() {
            return None;
        }
        let l = self.estimator(
            dists,
            &good,
            self.good_weighting(Weighting::ByAgeAndRank(&good_ranks)),
            &good_believed,
        );
        let g = self.estimator(dists, &bad, Weighting::ByAge, &bad_believed);
        let score = |x: &Vec<f64>| l.log_pdf(x) - g.log_pdf(x);
        let best_of = |xs: Vec<Vec<f64>>| {
            xs.into_iter()
                .map(|x| (score(&x), x))
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, x)| x)
        };
        let candidates: Vec<Vec<f64>> = (0..self.candidates).map(|_| l.sample(rng)).collect();
        // Where every dimension is discrete, a point already tried (or
        // running) teaches nothing new: the best untried candidate wins,
        // drawing more when all were tried. Optuna re-proposes them.
        let tried = self.tried_points(dists, names, history);
        let best = if tried.is_empty() {
            best_of(candidates)?
        } else {
            let mut fresh: Vec<Vec<f64>> = candidates
                .iter()
                .filter(|x| !tried.contains(x))
                .cloned()
                .collect();
            for _ in 0..(9 * self.candidates) {
                if !fresh.is_empty() {
                    break;
                }
                let x = l.sample(rng);
                if !tried.contains(&x) {
                    fresh.push(x);
                }
            }
            best_of(fresh).or_else(|| best_of(candidates))?
        };
        Some(
            dists
                .iter()
                .zip(best)
                .map(|(d, x)| value_of(d, x))
                .collect(),
        )
    }

    /// Samples the discrete dimensions `names` one at a time (each from its
    /// own estimators), and proposes the best combination of their
    /// candidates that no trial has: combinations in order of their summed
    /// `log l - log g`, best first, the best of all when every one was
    /// tried. Where the best is untried, that is each dimension's best
    /// candidate, as sampling one at a time gives.
    fn sample_independent_untried(
        &self,
        dists: &[&Distribution],
        names: &[&str],
        history: &[TrialRecord],
        rng: &mut StdRng,
        proposal: &mut Proposal,
    ) -> Option<Vec<ParamValue>> {
        // Each dimension's distinct candidates, best first, with scores.
        let mut levels: Vec<Vec<(f64, f64)>> = Vec::with_capacity(dists.len());
        for (d, name) in dists.iter().zip(names) {
            let Split { good, bad, .. } = self.split(&[name], history, proposal);
            if good.is_empty() {
                return None;
            }
            // Discrete dimensions only: nothing widens (see `Kernels::numeric`).
            let l = self.estimator(&[d], &good, self.good_weighting(Weighting::ByAge), &[]);
            let g = self.estimator(&[d], &bad, Weighting::ByAge, &[]);
            let mut c: Vec<(f64, f64)> = (0..self.candidates)
                .map(|_| {
                    let x = l.sample(rng);
                    (l.log_pdf(&x) - g.log_pdf(&x), x[0])
                })
                .collect();
            c.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.total_cmp(&b.1)));
            c.dedup_by(|a, b| a.1 == b.1);
            levels.push(c);
        }
        let tried = self.tried_points(dists, names, history);
        let point =
            |idx: &[usize]| -> Vec<f64> { idx.iter().zip(&levels).map(|(&i, l)| l[i].1).collect() };
        let score = |idx: &[usize]| -> f64 { idx.iter().zip(&levels).map(|(&i, l)| l[i].0).sum() };
        // Best-first over index tuples (each dimension's list is sorted).
        let start = vec![0; levels.len()];
        let mut best = start.clone();
        let mut heap = std::collections::BinaryHeap::new();
        let mut seen = std::collections::HashSet::new();
        heap.push((OrdF64(score(&start)), start.clone()));
        seen.insert(start);
        for _ in 0..UNTRIED_SEARCH {
            let Some((_, idx)) = heap.pop() else { break };
            if !tried.contains(&point(&idx)) {
                best = idx;
                break;
            }
            for j in 0..idx.len() {
                if idx[j] + 1 < levels[j].len() {
                    let mut next = idx.clone();
                    next[j] += 1;
                    if seen.insert(next.clone()) {
                        heap.push((OrdF64(score(&next)), next));
                    }
                }
            }
        }
        Some(
            dists
                .iter()
                .zip(point(&best))
                .map(|(d, x)| value_of(d, x))
                .collect(),
        )
    }
}

/// How many times the random start draws a configuration again that
/// repeats a trial.
const REDRAWS: usize = 32;

/// Combinations [`TpeSampler::sample_independent_untried`] looks at
/// before it settles for the best (tried) one.
const UNTRIED_SEARCH: usize = 4096;

/// Pending trials from which [`Pending::Auto`] believes them on a space
/// where every parameter is discrete. With one pending, the liar's spread
/// over few levels costs little and keeps two proposals apart; with more,
/// it calls a growing share of the recent history bad and pushes proposals
/// away from where the study is doing well (measured at 2-16 trials in
/// flight, `docs/benchmarks/concurrency.md`).
pub const BELIEVE_ON_GRIDS_FROM: usize = 2;

/// By index into `history`, which of its `pending` trials `believed` (the
/// same history with the believer's values) believed, for their kernels
/// to widen: none below [`WIDEN_BELIEVED_FROM`] pending.
fn widened(pending: usize, history: &[TrialRecord], believed: &[TrialRecord]) -> Vec<bool> {
    if pending < WIDEN_BELIEVED_FROM {
        return Vec::new();
    }
    history
        .iter()
        .zip(believed)
        .map(|(t, b)| t.is_pending() && b.value.is_some())
        .collect()
}

/// An `f64` ordered by `total_cmp`, for the heap.
#[derive(PartialEq)]
struct OrdF64(f64);

impl Eq for OrdF64 {}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Sampler for TpeSampler {
    fn name(&self) -> &'static str {
        "tpe"
    }

    fn propose(&mut self, space: &SearchSpace, history: &[TrialRecord]) -> Option<Params> {
        let mut rng = super::proposal_rng(self.seed, history.len(), 0x7e7e);
        let finished = history.iter().filter(|t| self.learned(t)).count();
        let pending = history.iter().filter(|t| t.is_pending()).count();
        // Measured at 2-16 trials in flight (docs/benchmarks/concurrency.md):
        // believing the regressor wins on continuous problems, and on
        // discrete grids from two pending trials; with one, the liar's
        // spread does as well or better there.
        let believe = self.directions.len() == 1
            && finished >= self.startup_trials
            && match self.pending {
                Pending::Believe => true,
                Pending::Lie => false,
                Pending::Auto => {
                    space
                        .params()
                        .iter()
                        .any(|p| p.condition.is_none() && super::gp::continuous(&p.dist))
                        || pending >= BELIEVE_ON_GRIDS_FROM
                }
            };
        let believed = believe
            .then(|| super::gp::believed(space, history))
            .flatten();
        let mut proposal = Proposal {
            widened: believed
                .as_deref()
                .map_or_else(Vec::new, |b| widened(pending, history, b)),
            ..Proposal::default()
        };
        let history = believed.as_deref().unwrap_or(history);
        let mut params = Params::new();
        let grid_space = space
            .params()
            .iter()
            .all(|p| p.condition.is_none() && discrete(&p.dist));
        if finished < self.startup_trials && grid_space {
            // The random start, drawn again where it repeats a trial (a
            // small grid's trial would learn nothing), up to a bound.
            let draw_all = |rng: &mut StdRng| -> Params {
                space
                    .params()
                    .iter()
                    .map(|p| (p.name.clone(), draw(rng, &p.dist)))
                    .collect()
            };
            let mut params = draw_all(&mut rng);
            for _ in 0..REDRAWS {
                if history.iter().all(|t| t.params != params) {
                    break;
                }
                params = draw_all(&mut rng);
            }
            return Some(params);
        }
        if finished >= self.startup_trials && !self.multivariate && grid_space {
            let dists: Vec<&Distribution> = space.params().iter().map(|p| &p.dist).collect();
            let names: Vec<&str> = space.params().iter().map(|p| p.name.as_str()).collect();
            if let Some(values) =
                self.sample_independent_untried(&dists, &names, history, &mut rng, &mut proposal)
            {
                params.extend(names.iter().map(|n| n.to_string()).zip(values));
            }
        }
        if finished >= self.startup_trials && self.multivariate {
            let joint: Vec<&crate::space::Param> = space
                .params()
                .iter()
                .filter(|p| p.condition.is_none())
                .collect();
            let dists: Vec<&Distribution> = joint.iter().map(|p| &p.dist).collect();
            let names: Vec<&str> = joint.iter().map(|p| p.name.as_str()).collect();
            if let Some(values) =
                self.sample_joint(&dists, &names, history, &mut rng, &mut proposal)
            {
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
                self.sample_joint(
                    &[&p.dist],
                    &[p.name.as_str()],
                    history,
                    &mut rng,
                    &mut proposal,
                )
                .map(|v| v[0])
            };
            params.insert(p.name.clone(), v.unwrap_or_else(|| draw(&mut rng, &p.dist)));
        }
        Some(params)
    }
}

#[cfg(test)]
mod tests;
