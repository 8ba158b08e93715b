//! The seeded train/validation split, with standardisation fitted on the
//! training part only (so nothing of the validation rows leaks into it).

use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};

use super::{Dataset, ImageShape, Task};
use crate::error::{Result, WorkerError};

/// A split, standardised data set, ready to upload to a device.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitData {
    /// The data set's name with the split's parameters: equal names mean equal data.
    pub name: String,
    pub task: Task,
    pub features: usize,
    /// The shape of each row, when rows are images (see [`super::Dataset::image`]).
    pub image: Option<ImageShape>,
    pub n_train: usize,
    pub n_val: usize,
    pub train_x: Vec<f32>,
    pub train_y: Vec<f32>,
    pub val_x: Vec<f32>,
    pub val_y: Vec<f32>,
    /// Per feature column; for images, each pixel column holds its
    /// channel's statistics (images are standardised per channel).
    pub feature_mean: Vec<f32>,
    pub feature_std: Vec<f32>,
    /// Regression targets are standardised too; metrics are reported in the
    /// original units through these. Empty for classification.
    pub target_mean: Vec<f32>,
    pub target_std: Vec<f32>,
}

impl SplitData {
    pub fn target_cols(&self) -> usize {
        self.task.target_cols()
    }
}

/// Splits `ds` into training and validation parts, stratified by class for
/// classification, deterministic for a given `seed`.
pub fn split(ds: &Dataset, val_fraction: f64, seed: u64) -> Result<SplitData> {
    if !(val_fraction > 0.0 && val_fraction < 1.0) {
        return Err(WorkerError::Config(format!(
            "validation fraction must be in (0, 1), got {val_fraction}"
        )));
    }
    let mut rng = StdRng::seed_from_u64(seed ^ SPLIT_STREAM);
    let mut val_idx = Vec::new();
    let mut train_idx = Vec::new();
    let mut take = |mut group: Vec<usize>, rng: &mut StdRng| {
        group.shuffle(rng);
        let n_val = ((group.len() as f64 * val_fraction).round() as usize).min(group.len());
        val_idx.extend_from_slice(&group[..n_val]);
        train_idx.extend_from_slice(&group[n_val..]);
    };
    match ds.task {
        Task::Classification { classes } => {
            let mut groups = vec![Vec::new(); classes];
            for (i, l) in ds.labels().enumerate() {
                groups[l.min(classes - 1)].push(i);
            }
            groups.into_iter().for_each(|g| take(g, &mut rng));
        }
        Task::Regression { .. } => take((0..ds.rows).collect(), &mut rng),
    }
    if train_idx.is_empty() || val_idx.is_empty() {
        return Err(WorkerError::Config(format!(
            "{} rows cannot be split into non-empty training and validation parts at fraction {val_fraction}",
            ds.rows
        )));
    }
    train_idx.sort_unstable();
    val_idx.sort_unstable();

    let f = ds.features;
    let t = ds.task.target_cols();
    let gather = |idx: &[usize], src: &[f32], cols: usize| -> Vec<f32> {
        idx.iter()
            .flat_map(|&i| src[i * cols..(i + 1) * cols].iter().copied())
            .collect()
    };
    let (mut train_x, mut val_x) = (gather(&train_idx, &ds.x, f), gather(&val_idx, &ds.x, f));
    let (mut train_y, mut val_y) = (gather(&train_idx, &ds.y, t), gather(&val_idx, &ds.y, t));
    let (feature_mean, feature_std) = match ds.image {
        // Per channel: pixels of one channel share a mean and a std.
        Some(img) => {
            let (m, s) = standardise(&mut train_x, &mut val_x, img.c);
            let per_pixel = |v: &[f32]| (0..f).map(|i| v[i % img.c]).collect::<Vec<f32>>();
            (per_pixel(&m), per_pixel(&s))
        }
        None => standardise(&mut train_x, &mut val_x, f),
    };
    let (target_mean, target_std) = match ds.task {
        Task::Regression { .. } => standardise(&mut train_y, &mut val_y, t),
        Task::Classification { .. } => (Vec::new(), Vec::new()),
    };
    Ok(SplitData {
        name: format!("{}|val={val_fraction}|seed={seed}", ds.name),
        task: ds.task,
        features: f,
        image: ds.image,
        n_train: train_idx.len(),
        n_val: val_idx.len(),
        train_x,
        train_y,
        val_x,
        val_y,
        feature_mean,
        feature_std,
        target_mean,
        target_std,
    })
}

// Keeps the split's stream apart from other users of the same seed.
const SPLIT_STREAM: u64 = 0x5eed_5111_7000_0001;

/// Fits per-column mean and std on `train` and applies them to both parts.
fn standardise(train: &mut [f32], val: &mut [f32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = (train.len() / cols.max(1)).max(1) as f64;
    let mut mean = vec![0.0f64; cols];
    let mut var = vec![0.0f64; cols];
    for row in train.chunks_exact(cols) {
        row.iter().zip(&mut mean).for_each(|(&v, m)| *m += v as f64);
    }
    mean.iter_mut().for_each(|m| *m /= rows);
    for row in train.chunks_exact(cols) {
        row.iter()
            .zip(&mean)
            .zip(&mut var)
            .for_each(|((&v, m), s)| *s += (v as f64 - m).powi(2));
    }
    let std: Vec<f64> = var
        .iter()
        .map(|s| (s / rows).sqrt())
        .map(|s| if s < 1e-12 { 1.0 } else { s })
        .collect();
    for part in [train, val] {
        for row in part.chunks_exact_mut(cols) {
            for ((v, m), s) in row.iter_mut().zip(&mean).zip(&std) {
                *v = ((*v as f64 - m) / s) as f32;
            }
        }
    }
    (
        mean.iter().map(|&m| m as f32).collect(),
        std.iter().map(|&s| s as f32).collect(),
    )
}
