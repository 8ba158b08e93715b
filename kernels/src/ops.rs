//! Shapes and per-slot scalars that describe one backend operation.
//!
//! Every operation is *batched*: it serves `slots` same-shape trials in one
//! call, each slot with its own scalars (learning rate, dropout `p`, ...).
//! A single trial is the case `slots == 1`. Fused execution is built on this.

/// Number of `f32` statistics a loss op writes per slot.
///
/// Layout per slot: `[loss_sum, metric_sum, rows, 0]`, where `loss_sum` is
/// the sum of per-row losses and `metric_sum` is the number of correct
/// predictions (cross-entropy) or the sum of squared errors (MSE).
pub const STATS_LEN: usize = 4;

/// A row-major GEMM, optionally strided-batched:
/// `C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b]` for `b < batch`,
/// where `op(A)` is `m x k`, `op(B)` is `k x n` and `C` is `m x n`, all
/// contiguous. A stride of 0 shares one operand across the batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl Gemm {
    /// A single (non-batched) `C = op(A) op(B)`.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Gemm {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            batch: 1,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
        }
    }
    pub fn trans_a(mut self) -> Self {
        self.trans_a = true;
        self
    }
    pub fn trans_b(mut self) -> Self {
        self.trans_b = true;
        self
    }
    pub fn beta(mut self, beta: f32) -> Self {
        self.beta = beta;
        self
    }
    /// Batched over `batch` slots with the given element strides.
    pub fn batched(
        mut self,
        batch: usize,
        stride_a: usize,
        stride_b: usize,
        stride_c: usize,
    ) -> Self {
        self.batch = batch;
        self.stride_a = stride_a;
        self.stride_b = stride_b;
        self.stride_c = stride_c;
        self
    }
    /// Elements of A, B and C that the call touches, counted from each view's offset.
    pub fn extents(&self) -> (usize, usize, usize) {
        let last = self.batch.saturating_sub(1);
        (
            last * self.stride_a + self.m * self.k,
            last * self.stride_b + self.k * self.n,
            last * self.stride_c + self.m * self.n,
        )
    }
    /// Floating-point operations of the whole call.
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batch) as f64
    }
}

/// `slots` matrices of `rows x cols`, stored back to back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batched {
    pub slots: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Batched {
    pub fn new(slots: usize, rows: usize, cols: usize) -> Self {
        Batched { slots, rows, cols }
    }
    pub fn per_slot(&self) -> usize {
        self.rows * self.cols
    }
    pub fn len(&self) -> usize {
        self.slots * self.rows * self.cols
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Element-wise activation functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    Relu,
    /// GELU, tanh approximation (as PyTorch's `approximate="tanh"`).
    Gelu,
    Tanh,
    Sigmoid,
}

impl Activation {
    pub const ALL: [Activation; 4] = [
        Activation::Relu,
        Activation::Gelu,
        Activation::Tanh,
        Activation::Sigmoid,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::Tanh => "tanh",
            Activation::Sigmoid => "sigmoid",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// Inverted dropout of one slot: keep with probability `1 - p`, scale by `1 / (1 - p)`.
/// The mask is a pure function of `(seed, step, index)`, so backward recomputes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutSlot {
    pub p: f32,
    pub seed: u64,
    pub step: u64,
}

/// SGD scalars of one slot (PyTorch semantics, no dampening).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdSlot {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
}

/// Adam / AdamW scalars of one slot. `step` is the 1-based step being taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamSlot {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// AdamW: weight decay applied to the weights, not added to the gradient.
    pub decoupled: bool,
    pub step: u64,
}

impl AdamSlot {
    /// Bias corrections `(1 - beta1^t, 1 - beta2^t)`, computed in f64.
    pub fn bias_corrections(&self) -> (f64, f64) {
        let t = self.step.min(i32::MAX as u64) as i32;
        (
            1.0 - (self.beta1 as f64).powi(t),
            1.0 - (self.beta2 as f64).powi(t),
        )
    }
}
