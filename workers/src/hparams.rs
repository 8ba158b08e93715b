//! The hyper-parameters of one trial, and how they map to per-slot scalars.

use kernels::{AdamSlot, DropoutSlot, SgdSlot};

/// An optimizer and its own settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    Sgd {
        momentum: f32,
        nesterov: bool,
    },
    Adam {
        beta1: f32,
        beta2: f32,
        eps: f32,
    },
    /// Adam with decoupled weight decay.
    AdamW {
        beta1: f32,
        beta2: f32,
        eps: f32,
    },
}

/// Optimizers whose state has the same layout, so their trials can fuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptimizerFamily {
    /// One state vector (velocity).
    Sgd,
    /// Two state vectors (first and second moments).
    Adam,
}

impl Optimizer {
    pub fn adam() -> Self {
        Optimizer::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
    pub fn family(&self) -> OptimizerFamily {
        match self {
            Optimizer::Sgd { .. } => OptimizerFamily::Sgd,
            Optimizer::Adam { .. } | Optimizer::AdamW { .. } => OptimizerFamily::Adam,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "sgd",
            Optimizer::Adam { .. } => "adam",
            Optimizer::AdamW { .. } => "adamw",
        }
    }
}

impl OptimizerFamily {
    /// State vectors per parameter.
    pub fn state_vectors(self) -> usize {
        match self {
            OptimizerFamily::Sgd => 1,
            OptimizerFamily::Adam => 2,
        }
    }
}

/// What may differ between trials of one fused group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotHparams {
    pub optimizer: Optimizer,
    pub lr: f32,
    pub weight_decay: f32,
    /// Dropout probability after each hidden activation.
    pub dropout: f32,
    /// Seeds initialisation, shuffling and dropout.
    pub seed: u64,
}

impl SlotHparams {
    pub(crate) fn sgd_slot(&self) -> SgdSlot {
        match self.optimizer {
            Optimizer::Sgd { momentum, nesterov } => SgdSlot {
                lr: self.lr,
                momentum,
                weight_decay: self.weight_decay,
                nesterov,
            },
            _ => unreachable!("SGD slot of an Adam trial"),
        }
    }
    /// The Adam scalars that stay fixed; the step's own come from the step block.
    pub(crate) fn adam_slot(&self) -> AdamSlot {
        let (beta1, beta2, eps, decoupled) = match self.optimizer {
            Optimizer::Adam { beta1, beta2, eps } => (beta1, beta2, eps, false),
            Optimizer::AdamW { beta1, beta2, eps } => (beta1, beta2, eps, true),
            Optimizer::Sgd { .. } => unreachable!("Adam slot of an SGD trial"),
        };
        AdamSlot {
            lr: self.lr,
            beta1,
            beta2,
            eps,
            weight_decay: self.weight_decay,
            decoupled,
        }
    }
    /// Dropout for hidden layer `layer`; its step is the 0-based iteration.
    pub fn dropout_slot(&self, layer: usize) -> DropoutSlot {
        DropoutSlot::new(
            self.dropout,
            kernels::rng::mix64(self.seed ^ ((0xd0 + layer as u64) << 32)),
        )
    }

    /// Every value a kernel takes by value from this slot, as bits: part of
    /// a captured graph's key.
    pub(crate) fn key_bits(&self) -> [u64; 8] {
        let (o, a, b, c) = match self.optimizer {
            Optimizer::Sgd { momentum, nesterov } => (0, momentum, nesterov as u32 as f32, 0.0),
            Optimizer::Adam { beta1, beta2, eps } => (1, beta1, beta2, eps),
            Optimizer::AdamW { beta1, beta2, eps } => (2, beta1, beta2, eps),
        };
        let f = |x: f32| x.to_bits() as u64;
        [
            o,
            f(a),
            f(b),
            f(c),
            f(self.lr),
            f(self.weight_decay),
            f(self.dropout),
            self.seed,
        ]
    }
}
