//! Seeded synthetic data sets, for tests and benchmarks of any size.

use rand::{SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, StandardNormal};

use super::{Dataset, ImageShape, Task};

fn normal(rng: &mut StdRng) -> f32 {
    StandardNormal.sample(rng)
}

/// Gaussian clusters, one per class, in the first `informative` features;
/// the other features are noise. The same arguments give the same data.
pub fn synthetic_classification(
    rows: usize,
    features: usize,
    classes: usize,
    informative: usize,
    seed: u64,
) -> Dataset {
    let informative = informative.clamp(1, features.max(1));
    let classes = classes.max(2);
    let mut rng = StdRng::seed_from_u64(seed);
    let centroids: Vec<f32> = (0..classes * informative)
        .map(|_| 1.5 * normal(&mut rng))
        .collect();
    let (mut x, mut y) = (
        Vec::with_capacity(rows * features),
        Vec::with_capacity(rows),
    );
    for r in 0..rows {
        let c = r % classes;
        for f in 0..features {
            let centre = if f < informative {
                centroids[c * informative + f]
            } else {
                0.0
            };
            x.push(centre + normal(&mut rng));
        }
        y.push(c as f32);
    }
    Dataset {
        name: format!("synthetic-classification:{rows}x{features}:{classes}:{informative}:{seed}"),
        rows,
        features,
        image: None,
        x,
        y,
        task: Task::Classification { classes },
        classes: (0..classes).map(|c| c.to_string()).collect(),
    }
}

/// `y = x_inf . w + sin(x_0) + noise * N(0, 1)`, over `informative` features.
pub fn synthetic_regression(
    rows: usize,
    features: usize,
    informative: usize,
    noise: f32,
    seed: u64,
) -> Dataset {
    let informative = informative.clamp(1, features.max(1));
    let mut rng = StdRng::seed_from_u64(seed);
    let w: Vec<f32> = (0..informative).map(|_| normal(&mut rng)).collect();
    let (mut x, mut y) = (
        Vec::with_capacity(rows * features),
        Vec::with_capacity(rows),
    );
    for _ in 0..rows {
        let row: Vec<f32> = (0..features).map(|_| normal(&mut rng)).collect();
        let linear: f32 = row[..informative].iter().zip(&w).map(|(a, b)| a * b).sum();
        y.push(linear + row[0].sin() + noise * normal(&mut rng));
        x.extend(row);
    }
    Dataset {
        name: format!("synthetic-regression:{rows}x{features}:{informative}:{noise}:{seed}"),
        rows,
        features,
        image: None,
        x,
        y,
        task: Task::Regression { targets: 1 },
        classes: Vec::new(),
    }
}

/// Images of `shape` in `classes` classes: each class is a smooth random
/// pattern (a sum of a few plane waves per channel), shifted by up to a
/// quarter of the image, plus pixel noise, so that a class is a shape to
/// find rather than fixed pixels to read. The same arguments give the same
/// data.
pub fn synthetic_images(rows: usize, shape: ImageShape, classes: usize, seed: u64) -> Dataset {
    let classes = classes.max(2);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1a6e_0000_0000_0001);
    const WAVES: usize = 3;
    // Per class and channel: WAVES (frequency y, frequency x, phase) triples.
    let waves: Vec<[f32; 3]> = (0..classes * shape.c * WAVES)
        .map(|_| {
            let f = |rng: &mut StdRng| 0.5 + 1.5 * normal(rng).abs();
            [
                f(&mut rng),
                f(&mut rng),
                std::f32::consts::TAU * normal(&mut rng),
            ]
        })
        .collect();
    let (h, w, c) = (shape.h, shape.w, shape.c);
    let max_shift = (h.min(w) / 4) as i64;
    let (mut x, mut y) = (
        Vec::with_capacity(rows * shape.len()),
        Vec::with_capacity(rows),
    );
    for r in 0..rows {
        let class = r % classes;
        let shift = |rng: &mut StdRng| {
            (normal(rng).abs() * max_shift as f32 * 0.5).min(max_shift as f32) as i64
        };
        let (sy, sx) = (shift(&mut rng), shift(&mut rng));
        for py in 0..h as i64 {
            for px in 0..w as i64 {
                for ch in 0..c {
                    let (u, v) = ((py - sy) as f32 / h as f32, (px - sx) as f32 / w as f32);
                    let base = (class * c + ch) * WAVES;
                    let signal: f32 = waves[base..base + WAVES]
                        .iter()
                        .map(|[fy, fx, ph]| (std::f32::consts::TAU * (fy * u + fx * v) + ph).sin())
                        .sum();
                    x.push(signal + 0.8 * normal(&mut rng));
                }
            }
        }
        y.push(class as f32);
    }
    Dataset {
        name: format!("synthetic-images:{rows}x{shape}:{classes}:{seed}"),
        rows,
        features: shape.len(),
        image: Some(shape),
        x,
        y,
        task: Task::Classification { classes },
        classes: (0..classes).map(|c| c.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_data_other_seed_other_data() {
        assert_eq!(
            synthetic_classification(50, 5, 3, 2, 1),
            synthetic_classification(50, 5, 3, 2, 1)
        );
        assert_ne!(
            synthetic_classification(50, 5, 3, 2, 1).x,
            synthetic_classification(50, 5, 3, 2, 2).x
        );
        assert_eq!(
            synthetic_regression(40, 4, 2, 0.1, 3),
            synthetic_regression(40, 4, 2, 0.1, 3)
        );
        let d = synthetic_regression(40, 4, 2, 0.1, 3);
        assert_eq!(
            (d.x.len(), d.y.len(), d.task),
            (160, 40, Task::Regression { targets: 1 })
        );
    }
}
