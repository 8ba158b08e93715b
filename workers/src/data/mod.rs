//! Data sets: the built-in digits, seeded synthetic generators, CSV and
//! `.npy` files, and the seeded train/validation split.
//!
//! Every loader produces a [`Dataset`]: a dense row-major `f32` feature
//! matrix and a target matrix (class indices as `f32` for classification,
//! one column per target for regression). Loaders never panic on bad input:
//! they return [`crate::WorkerError::Data`] naming the file and, where the
//! format has them, the line and column.

mod csv;
mod digits;
mod npy;
mod split;
mod synthetic;

pub use self::csv::{load_csv, parse_csv};
pub use digits::digits;
pub use npy::{NpyArray, load_npy, load_npy_pair, parse_npy};
pub use split::{SplitData, split};
pub use synthetic::{synthetic_classification, synthetic_regression};

/// What a data set's targets are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    Classification { classes: usize },
    Regression { targets: usize },
}

/// Classification or regression, before the number of classes is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskKind {
    Classification,
    Regression,
}

impl Task {
    /// Columns of the target matrix.
    pub fn target_cols(&self) -> usize {
        match *self {
            Task::Classification { .. } => 1,
            Task::Regression { targets } => targets,
        }
    }
    /// Width of the model's output layer.
    pub fn outputs(&self) -> usize {
        match *self {
            Task::Classification { classes } => classes,
            Task::Regression { targets } => targets,
        }
    }
    pub fn kind(&self) -> TaskKind {
        match self {
            Task::Classification { .. } => TaskKind::Classification,
            Task::Regression { .. } => TaskKind::Regression,
        }
    }
}

/// A whole data set in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Identifies the data for fusion: trials fuse only on the same data.
    pub name: String,
    pub rows: usize,
    pub features: usize,
    /// `rows x features`, row-major.
    pub x: Vec<f32>,
    /// `rows x task.target_cols()`, row-major.
    pub y: Vec<f32>,
    pub task: Task,
    /// Class names in index order, for classification.
    pub classes: Vec<String>,
}

impl Dataset {
    /// Labels of a classification data set as indices.
    pub fn labels(&self) -> impl Iterator<Item = usize> + '_ {
        self.y.iter().map(|&v| v as usize)
    }
}
