//! Which way a study's metric is better. Below the samplers, pruners,
//! storage and study file, which all compare values.

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Minimize,
    Maximize,
}

impl Direction {
    /// Optuna's spelling in `study_directions.direction`.
    pub fn optuna(self) -> &'static str {
        match self {
            Direction::Minimize => "MINIMIZE",
            Direction::Maximize => "MAXIMIZE",
        }
    }

    /// Whether `a` is better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Direction::Minimize => a < b,
            Direction::Maximize => a > b,
        }
    }

    /// `v` as a value to minimise: negated when maximising.
    pub fn minimised(self, v: f64) -> f64 {
        match self {
            Direction::Minimize => v,
            Direction::Maximize => -v,
        }
    }
}
