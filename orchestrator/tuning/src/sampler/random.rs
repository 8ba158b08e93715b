//! Independent uniform sampling (log-uniform where asked), seeded.

use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::{Sampler, TrialRecord};
use crate::space::{Distribution, ParamValue, Params, SearchSpace};

/// Each proposal draws from a generator seeded by `(seed, number of trials
/// so far)`, so a resumed study continues the same sequence.
#[derive(Debug)]
pub struct RandomSampler {
    seed: u64,
}

impl RandomSampler {
    pub fn new(seed: u64) -> Self {
        RandomSampler { seed }
    }
}

/// One draw from `dist`.
pub fn draw(rng: &mut StdRng, dist: &Distribution) -> ParamValue {
    match *dist {
        Distribution::Float {
            low,
            high,
            log: true,
            ..
        } => ParamValue::Float(
            rng.random_range(low.ln()..=high.ln())
                .exp()
                .clamp(low, high),
        ),
        Distribution::Float {
            low,
            high,
            step: Some(s),
            ..
        } => {
            let n = ((high - low) / s + 1e-9).floor() as u64;
            ParamValue::Float(low + rng.random_range(0..=n) as f64 * s)
        }
        Distribution::Float { low, high, .. } => ParamValue::Float(if low == high {
            low
        } else {
            rng.random_range(low..high)
        }),
        Distribution::Int {
            low,
            high,
            log: true,
            ..
        } => {
            // Uniform in log space over [low - 0.5, high + 0.5], then rounded: each integer gets its log-width.
            let x = rng
                .random_range((low as f64 - 0.5).ln()..=(high as f64 + 0.5).ln())
                .exp();
            ParamValue::Int((x.round() as i64).clamp(low, high))
        }
        Distribution::Int {
            low, high, step, ..
        } => ParamValue::Int(low + rng.random_range(0..=(high - low) / step) * step),
        Distribution::Categorical { ref choices } => {
            ParamValue::Choice(rng.random_range(0..choices.len()))
        }
    }
}

impl Sampler for RandomSampler {
    fn name(&self) -> &'static str {
        "random"
    }

    fn propose(&mut self, space: &SearchSpace, history: &[TrialRecord]) -> Option<Params> {
        let stream = kernels::rng::mix64(self.seed ^ kernels::rng::mix64(history.len() as u64 + 1));
        let mut rng = StdRng::seed_from_u64(stream);
        let mut params = Params::new();
        for p in space.params() {
            if space.is_active(p, &params) {
                params.insert(p.name.clone(), draw(&mut rng, &p.dist));
            }
        }
        Some(params)
    }
}
