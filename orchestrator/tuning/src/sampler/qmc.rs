//! Scrambled Sobol quasi-random sampling.
//!
//! Trial `n` takes point `n` of an Owen-scrambled Sobol sequence (Burley's
//! hash-based scrambling, seeded), one dimension per parameter of the space
//! in order, mapped through each distribution's inverse CDF. The points fill
//! the space more evenly than independent random draws. A resumed study
//! continues the sequence, since the point index is the number of trials so
//! far.

use super::random::draw;
use super::{Sampler, TrialRecord};
use crate::space::{Distribution, ParamValue, Params, SearchSpace};

/// Most trials with distinct Sobol points; later ones draw at random.
pub const MAX_POINTS: usize = 1 << 16;

#[derive(Debug, Clone)]
pub struct QmcSampler {
    pub seed: u64,
}

/// The value of `d` at quantile `u` in `[0, 1)`.
pub fn from_unit(d: &Distribution, u: f64) -> ParamValue {
    let u = u.clamp(0.0, 1.0 - 1e-12);
    match *d {
        Distribution::Float {
            low,
            high,
            log: true,
            ..
        } => ParamValue::Float(
            (low.ln() + u * (high.ln() - low.ln()))
                .exp()
                .clamp(low, high),
        ),
        Distribution::Float {
            low,
            high,
            step: Some(s),
            ..
        } => {
            let n = ((high - low) / s + 1e-9).floor();
            ParamValue::Float(low + (u * (n + 1.0)).floor().min(n) * s)
        }
        Distribution::Float { low, high, .. } => ParamValue::Float(low + u * (high - low)),
        Distribution::Int {
            low,
            high,
            log: true,
            ..
        } => {
            let x = ((low as f64 - 0.5).ln()
                + u * ((high as f64 + 0.5).ln() - (low as f64 - 0.5).ln()))
            .exp();
            ParamValue::Int((x.round() as i64).clamp(low, high))
        }
        Distribution::Int {
            low, high, step, ..
        } => {
            let n = (high - low) / step;
            ParamValue::Int(low + ((u * (n + 1) as f64).floor() as i64).min(n) * step)
        }
        Distribution::Categorical { ref choices } => {
            ParamValue::Choice(((u * choices.len() as f64) as usize).min(choices.len() - 1))
        }
    }
}

impl Sampler for QmcSampler {
    fn name(&self) -> &'static str {
        "qmc"
    }

    fn propose(&mut self, space: &SearchSpace, history: &[TrialRecord]) -> Option<Params> {
        let index = history.len();
        let seed = kernels::rng::mix64(self.seed) as u32;
        let mut fallback = None;
        let mut params = Params::new();
        for (dim, p) in space.params().iter().enumerate() {
            if !space.is_active(p, &params) {
                continue;
            }
            let v = if index < MAX_POINTS && (dim as u32) < sobol_burley::NUM_DIMENSIONS {
                from_unit(
                    &p.dist,
                    sobol_burley::sample(index as u32, dim as u32, seed) as f64,
                )
            } else {
                let rng = fallback.get_or_insert_with(|| {
                    <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(kernels::rng::mix64(
                        self.seed ^ index as u64,
                    ))
                });
                draw(rng, &p.dist)
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

    fn unit_square() -> SearchSpace {
        let f = || Distribution::Float {
            low: 0.0,
            high: 1.0,
            log: false,
            step: None,
        };
        SearchSpace::new(vec![
            Param {
                name: "x".into(),
                dist: f(),
                condition: None,
            },
            Param {
                name: "y".into(),
                dist: f(),
                condition: None,
            },
        ])
        .unwrap()
    }

    /// The most points falling in one cell of an 8 x 8 grid.
    fn worst_cell(s: &mut dyn Sampler, n: usize) -> usize {
        let space = unit_square();
        let mut h: Vec<TrialRecord> = Vec::new();
        let mut cells = [0usize; 64];
        for _ in 0..n {
            let p = s.propose(&space, &h).unwrap();
            let (x, y) = (p["x"].internal(), p["y"].internal());
            cells[(x * 8.0) as usize * 8 + (y * 8.0) as usize] += 1;
            h.push(TrialRecord {
                params: p,
                value: None,
                values: Vec::new(),
                violation: 0.0,
                stopped: None,
            });
        }
        cells.into_iter().max().unwrap()
    }

    #[test]
    fn sobol_points_fill_the_space_more_evenly_than_random_ones() {
        // 64 points in 64 cells: a (0, 2)-sequence puts exactly one in each.
        assert_eq!(worst_cell(&mut QmcSampler { seed: 3 }, 64), 1);
        assert!(worst_cell(&mut RandomSampler::new(3), 64) >= 3);
    }

    #[test]
    fn values_follow_each_distribution_and_the_seed() {
        let d = Distribution::Categorical {
            choices: vec![Choice::Int(1), Choice::Int(2), Choice::Int(3)],
        };
        assert_eq!(
            (from_unit(&d, 0.0), from_unit(&d, 0.5), from_unit(&d, 0.999)),
            (
                ParamValue::Choice(0),
                ParamValue::Choice(1),
                ParamValue::Choice(2)
            )
        );
        let i = Distribution::Int {
            low: 10,
            high: 20,
            log: false,
            step: 5,
        };
        assert_eq!(
            (from_unit(&i, 0.0), from_unit(&i, 0.4), from_unit(&i, 0.99)),
            (
                ParamValue::Int(10),
                ParamValue::Int(15),
                ParamValue::Int(20)
            )
        );
        let l = Distribution::Float {
            low: 1e-4,
            high: 1.0,
            log: true,
            step: None,
        };
        assert!((from_unit(&l, 0.5).internal() - 1e-2).abs() < 1e-9);
        let space = unit_square();
        let a = QmcSampler { seed: 1 }.propose(&space, &[]).unwrap();
        assert_eq!(a, QmcSampler { seed: 1 }.propose(&space, &[]).unwrap());
        assert_ne!(a, QmcSampler { seed: 2 }.propose(&space, &[]).unwrap());
    }
}
