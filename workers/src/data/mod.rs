//! Data sets: the built-in digits, seeded synthetic generators, CSV and
//! `.npy` files, image files (`.npy` images, MNIST's IDX, CIFAR-10), and
//! the seeded train/validation split.
//!
//! Every loader produces a [`Dataset`]: a dense row-major `f32` feature
//! matrix and a target matrix (class indices as `f32` for classification,
//! one column per target for regression). Loaders never panic on bad input:
//! they return [`crate::WorkerError::Data`] naming the file and, where the
//! format has them, the line and column.

mod csv;
mod digits;
mod images;
mod npy;
mod split;
mod synthetic;

pub use self::csv::{load_csv, parse_csv};
pub use digits::{digit_images, digits};
pub use images::{
    IdxArray, ImageLayout, load_cifar10, load_idx, load_npy_images, parse_cifar10, parse_idx,
};
pub use npy::{NpyArray, load_npy, load_npy_pair, parse_npy};
pub use split::{SplitData, split};
pub use synthetic::{synthetic_classification, synthetic_images, synthetic_regression};

pub use crate::model::ImageShape;

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
    /// The shape of each row, when rows are images: `features = h * w * c`,
    /// pixels channels-last (HWC).
    pub image: Option<ImageShape>,
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
