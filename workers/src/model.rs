//! The model templates: an MLP, `input -> depth x (Linear -> activation ->
//! dropout) -> output`, optionally behind a convolutional network
//! ([`ConvNetSpec`]) whose features are the MLP's input (its "head").
//!
//! A slot's parameters are one flat vector: the convolution units first,
//! then the head's layers. Batch norm's running statistics are not
//! parameters (no optimizer touches them); they are a second per-slot
//! vector, [`ModelSpec::n_running`] long.

use kernels::{Activation, PoolKind, Precision};
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

/// The shape of a model. Two trials with equal specs can share a kernel launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelSpec {
    /// Inputs of the MLP head: the data's features, or the conv net's.
    pub input: usize,
    pub hidden: Vec<usize>,
    pub output: usize,
    pub activation: Activation,
    pub loss: LossKind,
    /// The convolutional network in front of the head, for image data.
    pub conv: Option<ConvNetSpec>,
    /// The arithmetic of every GEMM (`[train] precision`): part of the
    /// shape, so that trials of different precisions never fuse.
    pub precision: Precision,
}

/// The height, width and channels of an image; pixels are stored
/// channels-last (HWC), one image per data row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageShape {
    pub h: usize,
    pub w: usize,
    pub c: usize,
}

impl ImageShape {
    pub fn len(&self) -> usize {
        self.h * self.w * self.c
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Display for ImageShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.c, self.h, self.w)
    }
}

/// A small convolutional network: stages of `conv -> (batch norm) ->
/// activation` units at a constant size ("same" padding, stride 1), a
/// `2x2` pooling after each stage while the image is at least `2x2`, and
/// then either the flattened pixels or their global average as the head's
/// input. A stage's first unit changes the channel count; each further
/// block is one more unit, or with `residual` two units whose input is
/// added back before the second activation (a ResNet basic block).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvNetSpec {
    pub image: ImageShape,
    /// Output channels of each stage.
    pub stages: Vec<usize>,
    pub blocks_per_stage: usize,
    /// Square kernel size (odd, so "same" padding is symmetric).
    pub kernel: usize,
    pub residual: bool,
    pub batch_norm: bool,
    pub pool: PoolKind,
    /// Global average pooling before the head instead of flattening.
    pub global_pool: bool,
    /// Random crops and flips of the training images (never of the
    /// validation images). Part of the spec because it adds a buffer and
    /// trials fuse only with the same pipeline.
    pub augment: Option<Augment>,
}

/// Training-time augmentation (see [`kernels::AugmentSlot`]): random crops
/// from the image padded by `crop` zeros, and horizontal flips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Augment {
    pub crop: usize,
    pub flip: bool,
}

/// Where a conv unit reads its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitInput {
    /// The data's images.
    Data,
    /// Unit `j`'s activations.
    Unit(usize),
    /// Unit `j`'s activations after pooling.
    Pooled(usize),
}

/// One `conv -> (batch norm) -> (+ skip) -> activation` unit and where its
/// parameters lie in a slot's vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvUnit {
    pub input: UnitInput,
    /// The input image (of one sample).
    pub in_shape: ImageShape,
    pub out_c: usize,
    pub kernel: usize,
    /// Weights, `(kernel, kernel, in_c) x out_c` row-major.
    pub w_off: usize,
    /// The bias (`out_c`), or batch norm's `[gamma; out_c]` then `[beta; out_c]`.
    pub b_off: usize,
    /// Batch norm's running statistics in the running vector.
    pub running_off: Option<usize>,
    /// The unit whose activations are added before this unit's activation.
    pub skip: Option<usize>,
    /// Whether a pooling of this unit's output follows.
    pub pooled: bool,
}

impl ConvUnit {
    /// Output image of one sample (the same size as the input).
    pub fn out_shape(&self) -> ImageShape {
        ImageShape {
            c: self.out_c,
            ..self.in_shape
        }
    }
    /// Parameters: weights and bias, or weights and scale and shift.
    pub fn n_params(&self) -> usize {
        self.kernel * self.kernel * self.in_shape.c * self.out_c
            + if self.running_off.is_some() {
                2 * self.out_c
            } else {
                self.out_c
            }
    }
    /// The image after this unit's pooling.
    pub fn pooled_shape(&self) -> ImageShape {
        let o = self.out_shape();
        ImageShape {
            h: o.h / 2,
            w: o.w / 2,
            c: o.c,
        }
    }
}

/// A conv net laid out: its units, and the head's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvPlan {
    pub units: Vec<ConvUnit>,
    /// Parameters of all units (the head's start in a slot's vector).
    pub n_params: usize,
    /// Running-statistics words of all units.
    pub n_running: usize,
    /// The image the head reads (before global pooling).
    pub last: ImageShape,
    /// Features the head reads.
    pub features: usize,
}

impl ConvNetSpec {
    /// Lays out the units (see the type's docs).
    pub fn plan(&self) -> ConvPlan {
        let mut units: Vec<ConvUnit> = Vec::new();
        let (mut shape, mut input) = (self.image, UnitInput::Data);
        let (mut off, mut running) = (0, 0);
        let mut push = |units: &mut Vec<ConvUnit>, input, shape: ImageShape, out_c, skip| {
            let unit = ConvUnit {
                input,
                in_shape: shape,
                out_c,
                kernel: self.kernel,
                w_off: off,
                b_off: off + self.kernel * self.kernel * shape.c * out_c,
                running_off: self.batch_norm.then_some(running),
                skip,
                pooled: false,
            };
            off += unit.n_params();
            if self.batch_norm {
                running += 2 * out_c;
            }
            units.push(unit);
            UnitInput::Unit(units.len() - 1)
        };
        for &channels in &self.stages {
            input = push(&mut units, input, shape, channels, None);
            shape.c = channels;
            for _ in 1..self.blocks_per_stage.max(1) {
                if self.residual {
                    let block_in = units.len() - 1;
                    let mid = push(&mut units, input, shape, channels, None);
                    input = push(&mut units, mid, shape, channels, Some(block_in));
                } else {
                    input = push(&mut units, input, shape, channels, None);
                }
            }
            if shape.h >= 2 && shape.w >= 2 {
                let last = units.len() - 1;
                units[last].pooled = true;
                shape = units[last].pooled_shape();
                input = UnitInput::Pooled(last);
            }
        }
        let features = if self.global_pool {
            shape.c
        } else {
            shape.len()
        };
        ConvPlan {
            units,
            n_params: off,
            n_running: running,
            last: shape,
            features,
        }
    }
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

impl ModelSpec {
    pub fn layers(&self) -> Vec<Layer> {
        let dims: Vec<usize> = std::iter::once(self.input)
            .chain(self.hidden.iter().copied())
            .chain(std::iter::once(self.output))
            .collect();
        let mut off = self.conv_params();
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

    /// The conv net laid out, when there is one.
    pub fn conv_plan(&self) -> Option<ConvPlan> {
        self.conv.as_ref().map(ConvNetSpec::plan)
    }

    fn conv_params(&self) -> usize {
        self.conv_plan().map_or(0, |p| p.n_params)
    }

    /// Features of one data row: the image's pixels, or the head's input.
    pub fn data_features(&self) -> usize {
        self.conv.as_ref().map_or(self.input, |c| c.image.len())
    }

    /// Parameters of one slot (weights and biases, scales and shifts).
    pub fn n_params(&self) -> usize {
        self.conv_params()
            + self
                .layers()
                .iter()
                .map(|l| l.fan_in * l.fan_out + l.fan_out)
                .sum::<usize>()
    }

    /// Running-statistics words of one slot (batch norm's).
    pub fn n_running(&self) -> usize {
        self.conv_plan().map_or(0, |p| p.n_running)
    }

    /// Multiply-adds of one sample's forward pass.
    pub fn macs_per_sample(&self) -> usize {
        let conv: usize = self.conv_plan().map_or(0, |p| {
            p.units
                .iter()
                .map(|u| {
                    let o = u.out_shape();
                    o.h * o.w * u.kernel * u.kernel * u.in_shape.c * u.out_c
                })
                .sum()
        });
        conv + self
            .layers()
            .iter()
            .map(|l| l.fan_in * l.fan_out)
            .sum::<usize>()
    }

    /// Training FLOPs of one iteration at `batch` (6 x batch x multiply-adds
    /// per sample: forward, and the two backward products).
    pub fn flops_per_iteration(&self, batch: usize) -> f64 {
        6.0 * (batch * self.macs_per_sample()) as f64
    }

    /// Initial running statistics: mean 0, variance 1 (as PyTorch).
    pub fn init_running(&self) -> Vec<f32> {
        let mut v = vec![0.0f32; self.n_running()];
        if let Some(plan) = self.conv_plan() {
            for u in &plan.units {
                if let Some(r) = u.running_off {
                    v[r + u.out_c..r + 2 * u.out_c].fill(1.0);
                }
            }
        }
        v
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

    /// A conv net's initial parameters, PyTorch's defaults for `Conv2d` and
    /// `Linear`: weights and biases uniform in +-1/sqrt(fan_in) (its
    /// Kaiming-uniform with a = sqrt(5)); batch norm's scale 1 and shift 0.
    /// With He-normal weights and zero biases the same net ended 1.4 to 4.8
    /// points below PyTorch's after 3 epochs on the digits (medians over 5
    /// seeds at 3 learning rates, scripts/cnn-parity.sh); with these, within
    /// 0.6 points, inside the seeds' spread.
    fn init_params_torch(&self, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1417_0000_0000_0001);
        let mut p = vec![0.0f32; self.n_params()];
        if let Some(plan) = self.conv_plan() {
            for u in &plan.units {
                let fan_in = u.kernel * u.kernel * u.in_shape.c;
                let bound = 1.0 / (fan_in as f32).sqrt();
                p[u.w_off..u.b_off]
                    .iter_mut()
                    .for_each(|v| *v = rng.random_range(-bound..bound));
                if u.running_off.is_some() {
                    p[u.b_off..u.b_off + u.out_c].fill(1.0); // gamma
                }
            }
        }
        for l in self.layers() {
            let bound = 1.0 / (l.fan_in as f32).sqrt();
            p[l.w_off..l.b_off]
                .iter_mut()
                .for_each(|v| *v = rng.random_range(-bound..bound));
            p[l.b_off..l.b_off + l.fan_out]
                .iter_mut()
                .for_each(|v| *v = rng.random_range(-bound..bound));
        }
        p
    }

    /// Initial parameters. An MLP: He-normal for ReLU and GELU layers,
    /// Xavier-uniform for tanh, sigmoid and the output layer; zero biases.
    /// A conv net: PyTorch's defaults (`ModelSpec::init_params_torch`).
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        if self.conv.is_some() {
            return self.init_params_torch(seed);
        }
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1417_0000_0000_0001);
        let mut p = vec![0.0f32; self.n_params()];
        let relu_like = matches!(self.activation, Activation::Relu | Activation::Gelu);
        if let Some(plan) = self.conv_plan() {
            for u in &plan.units {
                let fan_in = u.kernel * u.kernel * u.in_shape.c;
                let w = &mut p[u.w_off..u.b_off];
                if relu_like {
                    let normal =
                        Normal::new(0.0, (2.0 / fan_in as f32).sqrt()).expect("positive std");
                    w.iter_mut().for_each(|v| *v = normal.sample(&mut rng));
                } else {
                    let limit = (6.0 / (fan_in + u.kernel * u.kernel * u.out_c) as f32).sqrt();
                    w.iter_mut()
                        .for_each(|v| *v = rng.random_range(-limit..limit));
                }
                if u.running_off.is_some() {
                    p[u.b_off..u.b_off + u.out_c].fill(1.0); // gamma
                }
            }
        }
        let layers = self.layers();
        for (i, l) in layers.iter().enumerate() {
            let w = &mut p[l.w_off..l.b_off];
            let he = i + 1 < layers.len() && relu_like;
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
        let spec = ModelSpec {
            precision: Default::default(),
            input: 3,
            hidden: vec![4, 5],
            output: 2,
            activation: Activation::Relu,
            loss: LossKind::CrossEntropy,
            conv: None,
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
