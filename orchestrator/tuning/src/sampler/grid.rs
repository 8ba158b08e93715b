//! Exhaustive search over discrete values, in a seeded order.

use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};

use super::{Sampler, TrialRecord};
use crate::space::{Params, SearchSpace};

/// Proposes each point of the grid once, then `None`.
#[derive(Debug)]
pub struct GridSampler {
    seed: u64,
    points: Option<Vec<Params>>,
}

impl GridSampler {
    /// Fails when a dimension is a continuous float with no `step`.
    pub fn new(space: &SearchSpace, seed: u64) -> Result<Self, String> {
        if let Some(p) = space.params().iter().find(|p| p.dist.grid().is_none()) {
            return Err(format!(
                "{}: the grid sampler needs a step (or choices) for every parameter; this one is continuous",
                p.name
            ));
        }
        Ok(GridSampler { seed, points: None })
    }

    /// Every point: the product of all active dimensions, children expanded
    /// only where their condition holds.
    pub fn points(space: &SearchSpace) -> Vec<Params> {
        let mut points = vec![Params::new()];
        for p in space.params() {
            let values = p.dist.grid().unwrap_or_default();
            points = points
                .into_iter()
                .flat_map(|pt| {
                    if space.is_active(p, &pt) {
                        values
                            .iter()
                            .map(|&v| {
                                let mut next = pt.clone();
                                next.insert(p.name.clone(), v);
                                next
                            })
                            .collect::<Vec<_>>()
                    } else {
                        vec![pt]
                    }
                })
                .collect();
        }
        points
    }
}

impl Sampler for GridSampler {
    fn name(&self) -> &'static str {
        "grid"
    }

    fn propose(&mut self, space: &SearchSpace, history: &[TrialRecord]) -> Option<Params> {
        let seed = self.seed;
        let points = self.points.get_or_insert_with(|| {
            let mut pts = Self::points(space);
            pts.shuffle(&mut StdRng::seed_from_u64(seed));
            pts
        });
        // The first point no earlier trial (of this run or a resumed one) has taken.
        points
            .iter()
            .find(|pt| !history.iter().any(|t| &t.params == *pt))
            .cloned()
    }
}
