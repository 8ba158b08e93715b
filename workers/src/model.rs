//! The MLP template: `input -> depth x (Linear -> activation -> dropout) -> output`.

use kernels::Activation;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, Normal};

/// The training loss, which follows the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossKind {
    /// Softmax cross-entropy; reports accuracy and log-loss.
    CrossEntropy,
    /// Mean squared error; reports RMSE and R².
    Mse,
}

/// The shape of an MLP. Two trials with equal specs can share a kernel launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MlpSpec {
    pub input: usize,
    pub hidden: Vec<usize>,
    pub output: usize,
    pub activation: Activation,
    pub loss: LossKind,
}

/// Where one linear layer's weights (`fan_in x fan_out`, row-major) and
/// bias live inside a slot's flat parameter vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layer {
    pub fan_in: usize,
    pub fan_out: usize,
    pub w_off: usize,
    pub b_off: usize,
}

impl MlpSpec {
    pub fn layers(&self) -> Vec<Layer> {
        let dims: Vec<usize> = std::iter::once(self.input)
            .chain(self.hidden.iter().copied())
            .chain(std::iter::once(self.output))
            .collect();
        let mut off = 0;
        dims.windows(2)
            .map(|w| {
                let l = Layer {
                    fan_in: w[0],
                    fan_out: w[1],
                    w_off: off,
                    b_off: off + w[0] * w[1],
                };
                off += w[0] * w[1] + w[1];
                l
            })
            .collect()
    }

    /// Parameters of one slot (weights and biases).
    pub fn n_params(&self) -> usize {
        self.layers()
            .iter()
            .map(|l| l.fan_in * l.fan_out + l.fan_out)
            .sum()
    }

    /// Multiply-adds of one sample's forward pass.
    pub fn macs_per_sample(&self) -> usize {
        self.layers().iter().map(|l| l.fan_in * l.fan_out).sum()
    }

    /// Widest activation, for the backward scratch buffers.
    pub fn max_width(&self) -> usize {
        self.hidden
            .iter()
            .copied()
            .chain([self.input, self.output])
            .max()
            .unwrap_or(0)
    }

    /// Initial parameters: He-normal for ReLU and GELU layers, Xavier-uniform
    /// for tanh, sigmoid and the output layer; zero biases.
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1417_0000_0000_0001);
        let mut p = vec![0.0f32; self.n_params()];
        let layers = self.layers();
        for (i, l) in layers.iter().enumerate() {
            let w = &mut p[l.w_off..l.b_off];
            let he = i + 1 < layers.len()
                && matches!(self.activation, Activation::Relu | Activation::Gelu);
            if he {
                let normal =
                    Normal::new(0.0, (2.0 / l.fan_in as f32).sqrt()).expect("positive std");
                w.iter_mut().for_each(|v| *v = normal.sample(&mut rng));
            } else {
                let limit = (6.0 / (l.fan_in + l.fan_out) as f32).sqrt();
                w.iter_mut()
                    .for_each(|v| *v = rng.random_range(-limit..limit));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_packs_weights_then_bias_per_layer() {
        let spec = MlpSpec {
            input: 3,
            hidden: vec![4, 5],
            output: 2,
            activation: Activation::Relu,
            loss: LossKind::CrossEntropy,
        };
        let l = spec.layers();
        assert_eq!(l.len(), 3);
        assert_eq!(
            (l[0].w_off, l[0].b_off, l[1].w_off, l[1].b_off, l[2].w_off),
            (0, 12, 16, 36, 41)
        );
        assert_eq!(spec.n_params(), 12 + 4 + 20 + 5 + 10 + 2);
        assert_eq!(spec.macs_per_sample(), 12 + 20 + 10);
        let p = spec.init_params(1);
        assert_eq!(p, spec.init_params(1));
        assert!(p[12..16].iter().all(|&b| b == 0.0));
        let limit = (6.0f32 / 7.0).sqrt();
        assert!(p[41..51].iter().all(|v| v.abs() <= limit));
    }
}
