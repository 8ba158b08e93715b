//! The built-in `digits` data set (see `workers/data/README.md`).

use std::io::Read;

use super::{Dataset, ImageShape, Task};

const DIGITS_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");

/// The 1797 8x8 handwritten digits of UCI / scikit-learn, 10 classes.
pub fn digits() -> Dataset {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_GZ)
        .read_to_string(&mut text)
        .expect("the embedded digits data decompresses");
    let (mut x, mut y) = (Vec::with_capacity(1797 * 64), Vec::with_capacity(1797));
    for line in text.lines().filter(|l| !l.is_empty()) {
        let mut values = line.split(',').map(|v| {
            v.trim()
                .parse::<f32>()
                .expect("embedded digits are numbers")
        });
        x.extend(values.by_ref().take(64));
        y.push(values.next().expect("embedded digits have a label"));
    }
    Dataset {
        name: "digits".into(),
        rows: y.len(),
        features: 64,
        image: None,
        x,
        y,
        task: Task::Classification { classes: 10 },
        classes: (0..10).map(|c| c.to_string()).collect(),
    }
}

/// The same digits as `1 x 8 x 8` images, for convolutional models. Its
/// own name, so that trials on the two never fuse (their standardisation
/// differs: per channel here, per pixel there).
pub fn digit_images() -> Dataset {
    Dataset {
        name: "digits-images".into(),
        image: Some(ImageShape { h: 8, w: 8, c: 1 }),
        ..digits()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn digits_has_the_documented_shape() {
        let d = super::digits();
        assert_eq!((d.rows, d.features, d.x.len()), (1797, 64, 1797 * 64));
        assert!(d.x.iter().all(|&v| (0.0..=16.0).contains(&v)));
        let mut counts = [0usize; 10];
        d.labels().for_each(|l| counts[l] += 1);
        assert!(
            counts.iter().all(|&c| (170..=185).contains(&c)),
            "{counts:?}"
        );
    }
}
