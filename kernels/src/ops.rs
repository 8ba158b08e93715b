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

/// The arithmetic of a GEMM's products; everything else (element-wise ops,
/// losses, the optimizer, the weights themselves) stays fp32.
///
/// - `Fp32`: fp32 inputs and accumulation; on CUDA with TF32 off.
/// - `Tf32`: CUDA only: inputs rounded to TF32 (10-bit mantissa) on the
///   tensor cores, fp32 accumulation (`CUBLAS_COMPUTE_32F_FAST_TF32`).
/// - `Bf16`: inputs rounded to bfloat16 (8-bit mantissa, fp32's exponent
///   range, so no loss scaling is needed), fp32 accumulation: cuBLAS's
///   `CUBLAS_COMPUTE_32F_FAST_16BF` on CUDA, the same rounding (to
///   nearest, ties to even) before an fp32 GEMM on the CPU, so that the
///   two backends can be compared. The weights stay fp32 (master weights),
///   and so does the optimizer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    #[default]
    Fp32,
    Tf32,
    Bf16,
}

impl Precision {
    pub const ALL: [Precision; 3] = [Precision::Fp32, Precision::Tf32, Precision::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The relative spacing of the format's inputs: half an ulp at 1, the
    /// most one rounding moves a value, relatively.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Precision::Fp32 => f64::from(f32::EPSILON) / 2.0,
            Precision::Tf32 => 2f64.powi(-11),
            Precision::Bf16 => 2f64.powi(-8),
        }
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as an f32. NaN stays
/// NaN; infinities and values past bfloat16's largest stay or become
/// infinite, as a conversion to bfloat16 does.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    f32::from_bits((bits.wrapping_add(0x7fff + lsb)) & 0xffff_0000)
}

/// A row-major GEMM, optionally strided-batched:
/// `C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b]` for `b < batch`,
/// where `op(A)` is `m x k`, `op(B)` is `k x n` and `C` is `m x n`,
/// contiguous unless [`Gemm::leading`] gives the rows a longer pitch. A
/// stride of 0 shares one operand across the batch.
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
    /// Elements from one stored row of A, B and C to the next (the stored
    /// matrix: `k x m` for a transposed A); 0, the default, for contiguous
    /// rows. Read them through [`Gemm::lds`].
    pub ld_a: usize,
    pub ld_b: usize,
    pub ld_c: usize,
    /// The arithmetic of its products ([`Precision`]).
    pub precision: Precision,
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
            ld_a: 0,
            ld_b: 0,
            ld_c: 0,
            precision: Precision::Fp32,
        }
    }
    /// Rows of A, B and C stored `ld_a`, `ld_b` and `ld_c` apart (a
    /// matrix inside a larger one).
    pub fn leading(mut self, ld_a: usize, ld_b: usize, ld_c: usize) -> Self {
        self.ld_a = ld_a;
        self.ld_b = ld_b;
        self.ld_c = ld_c;
        self
    }
    /// The row length of each stored operand when contiguous.
    fn rows_of(&self) -> (usize, usize) {
        (
            if self.trans_a { self.m } else { self.k },
            if self.trans_b { self.k } else { self.n },
        )
    }
    /// The leading dimensions of A, B and C in effect (see `ld_a`).
    pub fn lds(&self) -> (usize, usize, usize) {
        let (row_a, row_b) = self.rows_of();
        let or = |ld: usize, row: usize| if ld == 0 { row } else { ld };
        (
            or(self.ld_a, row_a),
            or(self.ld_b, row_b),
            or(self.ld_c, self.n),
        )
    }
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
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
        let (row_a, row_b) = self.rows_of();
        let (ld_a, ld_b, ld_c) = self.lds();
        // A stored matrix of `rows` rows of `len` elements, `ld` apart.
        let span = |rows: usize, len: usize, ld: usize| match rows * len {
            0 => 0,
            _ => (rows - 1) * ld + len,
        };
        (
            last * self.stride_a + span(self.m * self.k / row_a.max(1), row_a, ld_a),
            last * self.stride_b + span(self.k * self.n / row_b.max(1), row_b, ld_b),
            last * self.stride_c + span(self.m, self.n, ld_c),
        )
    }
    /// Floating-point operations of the whole call.
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batch) as f64
    }
}

/// A grouped GEMM: a strided batch (`base`, its `batch` ignored) whose
/// members each have their own `(m, n, k)`, all inside the pitches and
/// strides of `base` (the layout of the largest member: `base`'s own sizes
/// give its pitches unless [`Gemm::leading`] sets them), or inside pitches
/// of their own (`pitches`: each member's `(ld_a, ld_b, ld_c)`). Trials of
/// different widths in one group multiply this way, each member exactly as
/// alone.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupedGemm<'a> {
    pub base: Gemm,
    pub sizes: &'a [(usize, usize, usize)],
    pub pitches: Option<&'a [(usize, usize, usize)]>,
}

impl GroupedGemm<'_> {
    /// Member `i` as a GEMM of its own, its operands at offsets
    /// `i * stride` from the group's.
    pub fn member(&self, i: usize) -> Gemm {
        let (m, n, k) = self.sizes[i];
        // The layout's pitches, whatever the member's own sizes, unless
        // the member has its own.
        let (ld_a, ld_b, ld_c) = match self.pitches {
            Some(p) => p[i],
            None => self.base.lds(),
        };
        Gemm {
            m,
            n,
            k,
            batch: 1,
            ld_a,
            ld_b,
            ld_c,
            ..self.base
        }
    }
    /// Elements of A, B and C that the call touches, counted from each
    /// view's offset.
    pub fn extents(&self) -> (usize, usize, usize) {
        let b = &self.base;
        (0..self.sizes.len()).fold((0, 0, 0), |(ea, eb, ec), i| {
            let (a, bb, c) = self.member(i).extents();
            (
                ea.max(i * b.stride_a + a),
                eb.max(i * b.stride_b + bb),
                ec.max(i * b.stride_c + c),
            )
        })
    }
    /// Floating-point operations of the whole call.
    pub fn flops(&self) -> f64 {
        self.sizes
            .iter()
            .map(|&(m, n, k)| 2.0 * (m * n * k) as f64)
            .sum()
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

/// The parameters an optimizer step updates: `len` of them in each slot,
/// at the same place in every slot, slots `stride` apart. A whole group laid
/// out `[slot][n]` is `len = stride = n`; one layer of it is that layer's
/// length with `stride = n`, so that a layer's step can run as soon as its
/// gradients are done (see the workers' `OptimizerOrder`).
///
/// With `lens`, slot `s` steps only the first `lens[s]` (at most `len`) of
/// its run: a group of mixed shapes steps each slot's own parameters,
/// which lie at the start of each layer's block, and not the padding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamRun<'a, S> {
    pub len: usize,
    pub stride: usize,
    pub settings: &'a [S],
    pub lens: Option<&'a [usize]>,
}

impl<'a, S> ParamRun<'a, S> {
    /// All `n` parameters of every slot, slots back to back.
    pub fn whole(n: usize, settings: &'a [S]) -> Self {
        ParamRun {
            len: n,
            stride: n,
            settings,
            lens: None,
        }
    }

    /// How many parameters slot `s` steps from the run's start.
    pub fn len_of(&self, s: usize) -> usize {
        self.lens.map_or(self.len, |l| l[s].min(self.len))
    }

    /// Elements a buffer must hold from the run's start: the last slot's
    /// run ends there (0 with no slots).
    pub fn extent(&self) -> usize {
        match self.settings.len() {
            0 => 0,
            k => (k - 1) * self.stride + self.len,
        }
    }

    /// Whether the runs of consecutive slots overlap.
    pub fn overlaps(&self) -> bool {
        self.settings.len() > 1 && self.len > self.stride
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
/// recomputes it; a padded slot's padding is set to 0. The `step` changes
/// every iteration, so it is not here: the ops read it from the lane's
/// step block (see [`StepWords`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutSlot {
    pub p: f32,
    pub seed: u64,
    /// Where the slot's rows lie when they are padded to a wider layout
    /// (a group of mixed widths); `None` when they are contiguous.
    pub rows: Option<RowsWithin>,
}

impl DropoutSlot {
    /// A slot whose rows are contiguous.
    pub fn new(p: f32, seed: u64) -> Self {
        DropoutSlot {
            p,
            seed,
            rows: None,
        }
    }

    /// The same slot with rows of `width` elements laid `stride` apart.
    pub fn within(self, width: usize, stride: usize) -> Self {
        DropoutSlot {
            rows: Some(RowsWithin { width, stride }),
            ..self
        }
    }

    /// The mask index of element `i` of the slot's buffer: its index in
    /// the slot's own contiguous rows, so that a padded slot draws the
    /// mask it draws alone; `None` for padding.
    #[inline(always)]
    pub fn mask_index(&self, i: usize) -> Option<usize> {
        match self.rows {
            None => Some(i),
            Some(RowsWithin { width, stride }) => {
                let (row, col) = (i / stride, i % stride);
                (col < width).then_some(row * width + col)
            }
        }
    }
}

/// Rows of `width` elements, `stride` elements apart (`width <= stride`):
/// a slot's activations in the layout of its group's widest member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsWithin {
    pub width: usize,
    pub stride: usize,
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

/// `slots x n` images of `h x w x c`, channels last (NHWC): image `i` of
/// slot `s` starts at element `s * slot_stride + i * h * w * c`. A slot
/// stride of 0 shares one batch across the slots (validation data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Images {
    pub slots: usize,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub slot_stride: usize,
}

impl Images {
    /// Images of one slot, packed back to back (`slot_stride = n * h * w * c`).
    pub fn packed(slots: usize, n: usize, h: usize, w: usize, c: usize) -> Self {
        Images {
            slots,
            n,
            h,
            w,
            c,
            slot_stride: n * h * w * c,
        }
    }
    /// Elements of one image.
    pub fn image_len(&self) -> usize {
        self.h * self.w * self.c
    }
    /// Elements of one slot's images.
    pub fn per_slot(&self) -> usize {
        self.n * self.image_len()
    }
    /// Elements of every slot, packed.
    pub fn len(&self) -> usize {
        self.slots * self.per_slot()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Elements a view of these images must hold, from its offset.
    pub fn extent(&self) -> usize {
        if self.is_empty() {
            0
        } else {
            (self.slots - 1) * self.slot_stride + self.per_slot()
        }
    }
}

/// A 2-D convolution as GEMM: [`crate::Backend::im2col`] lays each output
/// pixel's receptive field out as one row of `kh * kw * c` values (kernel
/// row, kernel column, channel), so that the convolution is the product of
/// that `n * out_h * out_w x patch` matrix with a `patch x out_channels`
/// weight matrix, and its output is NHWC again. Dilation 1; `pad` zeros on
/// every side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2d {
    pub input: Images,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad: usize,
}

impl Conv2d {
    pub fn out_h(&self) -> usize {
        (self.input.h + 2 * self.pad).saturating_sub(self.kh) / self.stride.max(1) + 1
    }
    pub fn out_w(&self) -> usize {
        (self.input.w + 2 * self.pad).saturating_sub(self.kw) / self.stride.max(1) + 1
    }
    /// Columns of the patch matrix: one receptive field.
    pub fn patch(&self) -> usize {
        self.kh * self.kw * self.input.c
    }
    /// Rows of one slot's patch matrix: output pixels of all its images.
    pub fn out_rows(&self) -> usize {
        self.input.n * self.out_h() * self.out_w()
    }
    /// Elements of the whole patch matrix, every slot.
    pub fn cols_len(&self) -> usize {
        self.input.slots * self.out_rows() * self.patch()
    }
}

/// A convolution as a product with its patch matrix: each slot's images
/// (`conv`) times that slot's `patch x out_c` weights, `weight_stride`
/// apart, into packed `pixels x out_c` outputs. The three passes are
/// [`ConvGemm::forward`], [`ConvGemm::filter_grad`] and
/// [`ConvGemm::data_grad`]: what a backend without a fused convolution
/// runs after `im2col` (or before `col2im`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvGemm {
    pub conv: Conv2d,
    pub out_c: usize,
    pub weight_stride: usize,
    pub precision: Precision,
    /// Whether the input's gradient is added onto what its buffer holds
    /// (a unit read by two others) instead of overwriting it, as GEMM's beta.
    pub accumulate_dx: bool,
    /// Whether each slot's weights are followed by a bias of `out_c`, the
    /// weights' last row as if every patch ended with a 1: `conv2d` adds
    /// it, `conv2d_filter_grad` writes its gradient after the weights'.
    pub bias: bool,
}

impl ConvGemm {
    /// `y = cols . w` per slot.
    pub fn forward(&self) -> Gemm {
        let (m, patch) = (self.conv.out_rows(), self.conv.patch());
        Gemm::new(m, self.out_c, patch)
            .batched(
                self.conv.input.slots,
                m * patch,
                self.weight_stride,
                m * self.out_c,
            )
            .precision(self.precision)
    }
    /// `dw = cols^T . dy` per slot (overwriting `dw`).
    pub fn filter_grad(&self) -> Gemm {
        let (m, patch) = (self.conv.out_rows(), self.conv.patch());
        Gemm::new(patch, self.out_c, m)
            .trans_a()
            .batched(
                self.conv.input.slots,
                m * patch,
                m * self.out_c,
                self.weight_stride,
            )
            .precision(self.precision)
    }
    /// `dcols = dy . w^T` per slot.
    pub fn data_grad(&self) -> Gemm {
        let (m, patch) = (self.conv.out_rows(), self.conv.patch());
        Gemm::new(m, patch, self.out_c)
            .trans_b()
            .batched(
                self.conv.input.slots,
                m * self.out_c,
                self.weight_stride,
                m * patch,
            )
            .precision(self.precision)
    }
    /// Rows of one slot's weights: one per patch column, and the bias.
    pub fn weight_rows(&self) -> usize {
        self.conv.patch() + usize::from(self.bias)
    }
    /// Elements of one slot's weights, the bias included.
    pub fn weights_len(&self) -> usize {
        self.weight_rows() * self.out_c
    }
    /// Elements the weights' view must hold, from its offset.
    pub fn weights_extent(&self) -> usize {
        self.conv.input.slots.saturating_sub(1) * self.weight_stride + self.weights_len()
    }
    /// Elements of the packed output (and of its gradient).
    pub fn out_len(&self) -> usize {
        self.conv.input.slots * self.conv.out_rows() * self.out_c
    }
}

/// Max or average.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// The largest value; its gradient goes to the first largest input of
    /// the window (row-major), as PyTorch's.
    Max,
    /// The mean of the window (no padding, so every window is full).
    Avg,
}

/// Pooling over `kh x kw` windows `stride` apart, without padding. Global
/// average pooling is `kh = h`, `kw = w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool2d {
    pub input: Images,
    pub kind: PoolKind,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
}

impl Pool2d {
    pub fn out_h(&self) -> usize {
        self.input.h.saturating_sub(self.kh) / self.stride.max(1) + 1
    }
    pub fn out_w(&self) -> usize {
        self.input.w.saturating_sub(self.kw) / self.stride.max(1) + 1
    }
    /// The output images, packed.
    pub fn output(&self) -> Images {
        let i = self.input;
        Images::packed(i.slots, i.n, self.out_h(), self.out_w(), i.c)
    }
    /// Whether the windows tile the images: each pixel in exactly one
    /// window (2x2 windows 2 apart on even sizes).
    pub fn tiles(&self) -> bool {
        self.stride == self.kh
            && self.stride == self.kw
            && self.out_h() * self.kh == self.input.h
            && self.out_w() * self.kw == self.input.w
    }
}

/// Batch normalisation over `shape` (`rows` = images x pixels, `cols` =
/// channels, NHWC). Each slot's learned scale and shift (`[gamma; c]` then
/// `[beta; c]`) lie `param_stride` apart, its running mean and variance
/// (`[mean; c]` then `[var; c]`) `running_stride` apart. As PyTorch's
/// `BatchNorm2d`: training normalises by the batch's biased variance and
/// moves the running variance towards the unbiased one by `momentum`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNorm {
    pub shape: Batched,
    pub param_stride: usize,
    pub running_stride: usize,
    pub momentum: f32,
    pub eps: f32,
}

/// Words a slot's saved batch statistics take: `[mean; c]` then `[1 / std; c]`.
impl BatchNorm {
    pub fn saved_len(&self) -> usize {
        self.shape.slots * 2 * self.shape.cols
    }
    pub fn params_extent(&self) -> usize {
        (self.shape.slots.max(1) - 1) * self.param_stride + 2 * self.shape.cols
    }
    pub fn running_extent(&self) -> usize {
        (self.shape.slots.max(1) - 1) * self.running_stride + 2 * self.shape.cols
    }
}

/// Training-time augmentation of one slot's images: a random crop of the
/// image padded by `pad` zeros on every side (a shift of up to `pad`
/// pixels each way) and, with `flip`, a horizontal flip half the time. The
/// draws are a pure function of `(seed, step, image)`, so a trial's
/// augmented batches are the same however it is scheduled, swapped or
/// resumed. The step comes from the lane's step block, as dropout's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AugmentSlot {
    pub seed: u64,
    pub pad: usize,
    pub flip: bool,
}

/// Keeps augmentation's draws apart from dropout's under the same seed.
pub const AUGMENT_STREAM: u64 = 0xa6a6_0000_0000_0001;

impl AugmentSlot {
    /// Image `image`'s shift `(dy, dx)` in `-pad..=pad` and whether it is
    /// flipped, at `step`.
    #[inline]
    pub fn draw(&self, step: u64, image: u64) -> (isize, isize, bool) {
        let seed = self.seed ^ AUGMENT_STREAM;
        let span = 2 * self.pad as u64 + 1;
        let shift = |k: u64| {
            let u = crate::rng::uniform(seed, step, 3 * image + k);
            ((u * span as f32) as u64).min(span - 1) as isize - self.pad as isize
        };
        let flip = self.flip && crate::rng::uniform(seed, step, 3 * image + 2) < 0.5;
        (shift(0), shift(1), flip)
    }
}

#[cfg(test)]
mod precision_tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_with_ties_to_even() {
        // 1 + 2^-8 is halfway between 1 and the next bfloat16 (1 + 2^-7):
        // ties go to the even one, 1; just above halfway goes up.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(
            round_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)),
            1.0 + 2f32.powi(-7)
        );
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round_bf16(-3.0), -3.0);
        assert_eq!(round_bf16(0.1), f32::from_bits(0x3dcd_0000));
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
        // Past bfloat16's largest finite value: infinite, as a conversion.
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        // Every result has no bits below bfloat16's mantissa.
        for x in [1.2345f32, -7.5e-20, 3.3e30, 1e-40] {
            assert_eq!(round_bf16(x).to_bits() & 0xffff, 0, "{x}");
        }
        // Within the unit roundoff, relatively (normal numbers).
        for x in [1.2345f32, -7.5e-20, 3.3e30] {
            let u = Precision::Bf16.unit_roundoff() as f32;
            assert!((round_bf16(x) - x).abs() <= x.abs() * u, "{x}");
        }
    }

    #[test]
    fn precision_names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(Precision::from_name(p.name()), Some(p));
        }
        assert_eq!(Precision::from_name("fp16"), None);
        assert_eq!(Precision::default(), Precision::Fp32);
    }
}
