//! Shapes and per-slot scalars that describe one backend operation.
//!
//! Every operation is *batched*: it serves `slots` same-shape trials in one
//! call, each slot with its own scalars (learning rate, dropout `p`, ...).
//! A single trial is the case `slots == 1`. Fused execution is built on this.

/// Number of `f32` statistics a loss op writes per slot.
///
/// Layout per slot: `[loss_sum, metric_sum, rows, bad_labels]`, where
/// `loss_sum` is the sum of per-row losses, `metric_sum` is the number of
/// correct predictions (cross-entropy) or the sum of squared errors (MSE),
/// and `bad_labels` counts cross-entropy labels that are not a class index
/// (their rows add no loss and no gradient). Loaders validate labels, so a
/// non-zero count means the data on the device is corrupt.
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

/// A loss over `shape` (`cols` = classes or outputs): predictions against
/// targets that lie `target_stride` apart per slot (0 shares one set), the
/// per-slot statistics ([`STATS_LEN`]) added into the output unless
/// `accumulate` is false, when they overwrite it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    pub shape: Batched,
    pub target_stride: usize,
    pub accumulate: bool,
}

/// An element-wise activation over `n` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationOp {
    pub activation: Activation,
    pub n: usize,
}

/// The slots a per-slot op serves: `n` elements in each slot, and each
/// slot's own settings (dropout `p`, Adam's hyper-parameters, ...).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slots<'a, S> {
    pub n: usize,
    pub settings: &'a [S],
}

impl<S> Slots<'_, S> {
    /// Elements over all slots.
    pub fn total(&self) -> usize {
        self.n * self.settings.len()
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
/// The mask is a pure function of `(seed, step, index)`, so backward
/// recomputes it. The `step` changes every iteration, so it is not here: the
/// ops read it from the lane's step block (see [`StepWords`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutSlot {
    pub p: f32,
    pub seed: u64,
}

/// SGD scalars of one slot (PyTorch semantics, no dampening).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdSlot {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
}

/// Adam / AdamW scalars of one slot that stay fixed from step to step. The
/// bias corrections change every step: the ops read them from the lane's
/// step block ([`AdamSlot::step_scalars`], [`StepWords`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamSlot {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// AdamW: weight decay applied to the weights, not added to the gradient.
    pub decoupled: bool,
}

/// Words of one slot's Adam scalars in a step block: `[step_size, inv_sqrt_bc2]`.
pub const ADAM_STEP_WORDS: usize = 2;
/// Words of one slot's dropout step in a step block: the `u64`, low word first.
pub const DROPOUT_STEP_WORDS: usize = 2;

impl AdamSlot {
    /// Bias corrections `(1 - beta1^t, 1 - beta2^t)` of the 1-based step
    /// `t`, computed in f64.
    pub fn bias_corrections(&self, t: u64) -> (f64, f64) {
        let t = t.min(i32::MAX as u64) as i32;
        (
            1.0 - (self.beta1 as f64).powi(t),
            1.0 - (self.beta2 as f64).powi(t),
        )
    }
    /// What step `t` (1-based) reads from the step block:
    /// `[lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t)]`, computed in f64.
    pub fn step_scalars(&self, t: u64) -> [f32; ADAM_STEP_WORDS] {
        let (bc1, bc2) = self.bias_corrections(t);
        [(self.lr as f64 / bc1) as f32, (1.0 / bc2.sqrt()) as f32]
    }
}

/// The values that change every iteration, as 32-bit words in one device
/// buffer (a lane's *step block*): batch indices, dropout steps and Adam's
/// bias corrections. The host writes them once per step with one copy
/// ([`crate::Backend::stage_step`]) and the kernels read them by slot, so
/// that an iteration's launches are the same from one step to the next and
/// can be captured once as a CUDA graph.
///
/// Words are stored in `f32` buffers bit for bit (`f32::from_bits`): an
/// index or a step is never read as a float.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepWords {
    words: Vec<f32>,
}

impl StepWords {
    pub fn new() -> Self {
        Self::default()
    }
    /// Clears the words, keeping the allocation.
    pub fn clear(&mut self) {
        self.words.clear();
    }
    /// Appends row indices; returns their offset in words.
    pub fn push_indices(&mut self, idx: &[u32]) -> usize {
        let off = self.words.len();
        self.words.extend(idx.iter().map(|&i| f32::from_bits(i)));
        off
    }
    /// Appends one dropout step per slot; returns their offset in words.
    pub fn push_dropout_steps(&mut self, steps: impl IntoIterator<Item = u64>) -> usize {
        let off = self.words.len();
        for s in steps {
            self.words.push(f32::from_bits(s as u32));
            self.words.push(f32::from_bits((s >> 32) as u32));
        }
        off
    }
    /// Appends one slot's Adam scalars per `(slot, 1-based step)`; returns their offset.
    pub fn push_adam(&mut self, slots: impl IntoIterator<Item = (AdamSlot, u64)>) -> usize {
        let off = self.words.len();
        for (s, t) in slots {
            self.words.extend(s.step_scalars(t));
        }
        off
    }
    pub fn as_slice(&self) -> &[f32] {
        &self.words
    }
    pub fn len(&self) -> usize {
        self.words.len()
    }
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// A word of a step block as the index or step it holds.
#[inline(always)]
pub fn word(w: f32) -> u32 {
    w.to_bits()
}

/// Slot `s`'s dropout step from the words of a step block.
#[inline(always)]
pub fn dropout_step(words: &[f32], s: usize) -> u64 {
    word(words[s * DROPOUT_STEP_WORDS]) as u64
        | (word(words[s * DROPOUT_STEP_WORDS + 1]) as u64) << 32
}
