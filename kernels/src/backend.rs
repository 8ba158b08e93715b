//! The `Backend` trait: what every compute device provides.
//!
//! Buffers are device handles (`Backend::Buf`), never host slices, so the
//! same model code drives the CPU and CUDA. Every operation runs on an
//! execution context (`Backend::Ctx`): a Salus lane's thread pool on the
//! CPU, a stream and BLAS handle on CUDA. Operations on one context run in
//! order; `sync` waits for them.

use crate::error::{KernelError, Result};
use crate::ops::{
    Activation, ActivationOp, AdamSlot, AugmentSlot, BatchNorm, Batched, Conv2d, ConvGemm,
    DropoutSlot, Gemm, GroupedGemm, Loss, ParamRun, Pool2d, SgdSlot, Slots,
};

/// What kind of device a backend drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Cuda(usize),
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKind::Cpu => write!(f, "cpu"),
            DeviceKind::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// A read-only window into a device buffer, starting at element `off`.
pub struct View<'a, T> {
    pub buf: &'a T,
    pub off: usize,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for View<'_, T> {}

/// A writable window into a device buffer, starting at element `off`.
pub struct ViewMut<'a, T> {
    pub buf: &'a mut T,
    pub off: usize,
}

/// Adam's two moment buffers, updated in place.
pub struct Moments<'a, T> {
    pub m: ViewMut<'a, T>,
    pub v: ViewMut<'a, T>,
}

/// `buf` from element `off` on.
pub fn at<T>(buf: &T, off: usize) -> View<'_, T> {
    View { buf, off }
}

/// `buf` from element `off` on, writable.
pub fn at_mut<T>(buf: &mut T, off: usize) -> ViewMut<'_, T> {
    ViewMut { buf, off }
}

/// A grouped GEMM as one [`Backend::gemm`] per member.
pub fn gemm_each<B: Backend + ?Sized>(
    backend: &B,
    ctx: &mut B::Ctx,
    g: &GroupedGemm<'_>,
    a: View<'_, B::Buf>,
    b: View<'_, B::Buf>,
    c: ViewMut<'_, B::Buf>,
) -> Result<()> {
    let l = &g.base;
    for i in 0..g.sizes.len() {
        let (a, b) = (
            at(a.buf, a.off + i * l.stride_a),
            at(b.buf, b.off + i * l.stride_b),
        );
        let c = at_mut(&mut *c.buf, c.off + i * l.stride_c);
        backend.gemm(ctx, &g.member(i), a, b, c)?;
    }
    Ok(())
}

/// A compute device. See the module docs.
pub trait Backend: Send + Sync + 'static {
    /// A device buffer of `f32`.
    type Buf: Send + Sync + 'static;
    /// An execution context: operations on one context run in order.
    type Ctx: Send + 'static;
    /// A handle to a context's host threads, cheap to clone.
    type HostThreads: Clone + Send + Sync + 'static;
    /// A captured sequence of operations, replayable on a context (a CUDA
    /// graph). Backends without graphs use `()` and never make one.
    type Graph: Send + 'static;

    fn kind(&self) -> DeviceKind;
    /// A human-readable device name.
    fn name(&self) -> String;
    /// The device as `--device` names it: `cpu`, `cpu:1`, `cuda:0`.
    fn label(&self) -> String {
        match self.kind() {
            DeviceKind::Cpu => "cpu".into(),
            DeviceKind::Cuda(n) => format!("cuda:{n}"),
        }
    }
    /// Bytes this device can give to trials (before any reserve).
    fn memory_bytes(&self) -> usize;

    /// A new execution context that may use `threads` host threads
    /// (intra-op parallelism on the CPU; ignored by CUDA).
    fn new_ctx(&self, threads: usize) -> Result<Self::Ctx>;
    /// Lets `ctx` split work over `threads` of the host threads it was
    /// made with (at least one, at most those): a lane alone on the CPU
    /// borrows the cores of idle lanes. No result depends on it: every op
    /// gives the same bits on any number of threads. Ignored by CUDA.
    fn set_threads(&self, _ctx: &mut Self::Ctx, _threads: usize) {}
    /// The host threads of `ctx`, for [`Backend::enter`].
    fn host_threads(&self, ctx: &Self::Ctx) -> Self::HostThreads;
    /// Runs `f` on the context's own host thread, so that the ops it calls
    /// split work without a cross-thread hand-off each time. A lane runs its
    /// iterations inside this.
    fn enter<R: Send>(&self, host: &Self::HostThreads, f: impl FnOnce() -> R + Send) -> R;
    /// Waits until every operation queued on `ctx` has finished.
    fn sync(&self, ctx: &mut Self::Ctx) -> Result<()>;
    /// Whether ops are queued and run later (CUDA), rather than run when
    /// called (the CPU).
    fn asynchronous(&self) -> bool {
        false
    }
    /// Marks the end of what is queued on `ctx` so far, then waits until
    /// everything queued before the previous mark has finished. Called after
    /// each iteration is queued, it keeps one iteration queued behind the one
    /// the device runs, so the device does not idle while the host decides
    /// and launches. Where queuing is synchronous (the CPU), a full sync.
    fn sync_previous(&self, ctx: &mut Self::Ctx) -> Result<()> {
        self.sync(ctx)
    }

    /// A zero-filled buffer of `len` elements.
    fn alloc_zeroed(&self, len: usize) -> Result<Self::Buf>;
    fn buf_len(&self, buf: &Self::Buf) -> usize;
    /// Host to device: `dst[off..off + src.len()] = src`.
    fn upload(&self, ctx: &mut Self::Ctx, src: &[f32], dst: ViewMut<'_, Self::Buf>) -> Result<()>;
    /// Device to host: `dst = src[off..off + dst.len()]`. Synchronous.
    fn download(
        &self,
        ctx: &mut Self::Ctx,
        src: View<'_, Self::Buf>,
        dst: &mut [f32],
    ) -> Result<()>;
    /// This step's values (see [`crate::StepWords`]) into a step block:
    /// `dst[off..off + words.len()] = words`, through the context's fixed
    /// pinned buffer on CUDA (one copy, ordered on the context).
    fn stage_step(
        &self,
        ctx: &mut Self::Ctx,
        words: &[f32],
        dst: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// The buffer's address, for keys that must change whenever a captured
    /// graph would touch other memory.
    fn buf_addr(&self, buf: &Self::Buf) -> usize;

    /// Queues `f`'s operations after everything queued on `ctx` so far,
    /// free to run beside what is queued after them until
    /// [`Backend::join_beside`]. The caller promises that nothing queued
    /// in between touches what `f` writes, or writes what `f` reads. CUDA
    /// queues them on the context's second stream, so that an optimizer
    /// step overlaps the next layer's backward GEMMs (inside a captured
    /// graph too: the fork and join are events); elsewhere they simply run
    /// in order, which gives the same bits.
    fn beside(
        &self,
        ctx: &mut Self::Ctx,
        f: impl FnOnce(&Self, &mut Self::Ctx) -> Result<()>,
    ) -> Result<()>
    where
        Self: Sized,
    {
        f(self, ctx)
    }
    /// Whether [`Backend::beside`] overlaps anything (CUDA); elsewhere it
    /// runs in order, and splitting work to queue it beside costs a little.
    fn beside_overlaps(&self) -> bool {
        false
    }
    /// Makes everything queued on `ctx` from here wait for every
    /// [`Backend::beside`] queued before it.
    fn join_beside(&self, _ctx: &mut Self::Ctx) -> Result<()> {
        Ok(())
    }

    /// Whether this backend can capture and replay graphs.
    fn graphs_supported(&self) -> bool {
        false
    }
    /// Starts capturing the operations queued on `ctx` (thread-local mode:
    /// other lanes' threads go on as usual). Nothing runs until replay.
    fn begin_capture(&self, _ctx: &mut Self::Ctx) -> Result<()> {
        Err(crate::KernelError::Unavailable(format!(
            "{} cannot capture graphs",
            self.kind()
        )))
    }
    /// Ends the capture begun on `ctx` and instantiates it. On error the
    /// capture is abandoned and `ctx` is usable again.
    fn end_capture(&self, _ctx: &mut Self::Ctx) -> Result<Self::Graph> {
        Err(crate::KernelError::Unavailable(format!(
            "{} cannot capture graphs",
            self.kind()
        )))
    }
    /// Queues one replay of `graph` on `ctx`.
    fn replay(&self, _ctx: &mut Self::Ctx, _graph: &Self::Graph) -> Result<()> {
        Err(crate::KernelError::Unavailable(format!(
            "{} cannot replay graphs",
            self.kind()
        )))
    }

    /// Device to device copy of `len` elements within `buf`, from offset
    /// `src` to offset `dst` (two ranges that must not overlap): one
    /// slot of a fused group into another.
    fn copy_within(
        &self,
        ctx: &mut Self::Ctx,
        len: usize,
        buf: &mut Self::Buf,
        src: usize,
        dst: usize,
    ) -> Result<()>;
    /// Device to device copy of `len` elements.
    fn copy(
        &self,
        ctx: &mut Self::Ctx,
        len: usize,
        src: View<'_, Self::Buf>,
        dst: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// Sets `len` elements to `value`.
    fn fill(
        &self,
        ctx: &mut Self::Ctx,
        len: usize,
        value: f32,
        dst: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// Row-major GEMM, single or strided-batched (see [`Gemm`]).
    fn gemm(
        &self,
        ctx: &mut Self::Ctx,
        g: &Gemm,
        a: View<'_, Self::Buf>,
        b: View<'_, Self::Buf>,
        c: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// A grouped GEMM (see [`GroupedGemm`]): member `i`'s operands lie `i`
    /// strides from the views. By default one [`Backend::gemm`] per member
    /// ([`gemm_each`]), each exactly the product alone; the CPU deals all
    /// members' products into one parallel call, CUDA makes it one cuBLAS
    /// grouped GEMM.
    fn gemm_grouped(
        &self,
        ctx: &mut Self::Ctx,
        g: &GroupedGemm<'_>,
        a: View<'_, Self::Buf>,
        b: View<'_, Self::Buf>,
        c: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        gemm_each(self, ctx, g, a, b, c)
    }

    /// `dst[i] = src[idx[i]]` for `i < rows`, rows of `cols` elements. The
    /// indices are step-block words (see [`crate::StepWords`]); a row whose
    /// index lies past the end of `src` is written as zeros (the caller
    /// checks indices on the host before staging them).
    fn gather_rows(
        &self,
        ctx: &mut Self::Ctx,
        cols: usize,
        rows: usize,
        idx: View<'_, Self::Buf>,
        src: View<'_, Self::Buf>,
        dst: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// `x[s][r][c] += bias[s * bias_stride + c]`.
    fn bias_add(
        &self,
        ctx: &mut Self::Ctx,
        shape: Batched,
        bias_stride: usize,
        x: ViewMut<'_, Self::Buf>,
        bias: View<'_, Self::Buf>,
    ) -> Result<()>;
    /// A hidden layer's bias and activation: `x += bias` as
    /// [`Backend::bias_add`], then `y = act(x)` as [`Backend::activation`],
    /// with the same bits. The default is those two ops; CUDA does both in
    /// one pass.
    #[allow(clippy::too_many_arguments)]
    fn bias_activation(
        &self,
        ctx: &mut Self::Ctx,
        shape: Batched,
        bias_stride: usize,
        activation: crate::ops::Activation,
        x: ViewMut<'_, Self::Buf>,
        bias: View<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        let ViewMut { buf, off } = x;
        self.bias_add(
            ctx,
            shape,
            bias_stride,
            ViewMut {
                buf: &mut *buf,
                off,
            },
            bias,
        )?;
        let op = crate::ops::ActivationOp {
            activation,
            n: shape.len(),
        };
        self.activation(ctx, op, View { buf: &*buf, off }, y)
    }
    /// `db[s * db_stride + c] = sum_r dy[s][r][c]`: the bias gradient.
    fn col_sum(
        &self,
        ctx: &mut Self::Ctx,
        shape: Batched,
        db_stride: usize,
        dy: View<'_, Self::Buf>,
        db: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// `y = act(x)` over `op.n` elements.
    fn activation(
        &self,
        ctx: &mut Self::Ctx,
        op: ActivationOp,
        x: View<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// `dx = act'(x) * dy`, given the forward input `x` and output `y`.
    fn activation_backward(
        &self,
        ctx: &mut Self::Ctx,
        op: ActivationOp,
        x: View<'_, Self::Buf>,
        y: View<'_, Self::Buf>,
        dy: View<'_, Self::Buf>,
        dx: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// Inverted dropout over `slots`. `steps` holds each slot's step
    /// ([`crate::DROPOUT_STEP_WORDS`] words per slot, from a step block).
    fn dropout(
        &self,
        ctx: &mut Self::Ctx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, Self::Buf>,
        x: View<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// The backward pass of [`Backend::dropout`] with the same slots and
    /// steps: the mask is recomputed.
    fn dropout_backward(
        &self,
        ctx: &mut Self::Ctx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, Self::Buf>,
        dy: View<'_, Self::Buf>,
        dx: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// Softmax cross-entropy of `logits` against class indices stored as
    /// `f32` (see [`Loss`]). Writes the gradient of the mean loss into
    /// `dlogits` when given; the statistics per slot are `[loss_sum,
    /// correct, rows, bad_labels]` (see [`crate::STATS_LEN`]). Needs at
    /// least one class.
    fn softmax_xent(
        &self,
        ctx: &mut Self::Ctx,
        loss: &Loss,
        logits: View<'_, Self::Buf>,
        labels: View<'_, Self::Buf>,
        dlogits: Option<ViewMut<'_, Self::Buf>>,
        stats: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// Mean squared error, `loss = mean over rows and cols of (pred - target)^2`
    /// (see [`Loss`]). Stats per slot: `[loss_sum over rows, squared error
    /// sum, rows, 0]`.
    fn mse(
        &self,
        ctx: &mut Self::Ctx,
        loss: &Loss,
        pred: View<'_, Self::Buf>,
        target: View<'_, Self::Buf>,
        dpred: Option<ViewMut<'_, Self::Buf>>,
        stats: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// One SGD step over the run's parameters of every slot (the views
    /// start at the run). `velocity` is required when any slot has momentum.
    fn sgd_step(
        &self,
        ctx: &mut Self::Ctx,
        run: ParamRun<'_, SgdSlot>,
        params: ViewMut<'_, Self::Buf>,
        grads: View<'_, Self::Buf>,
        velocity: Option<ViewMut<'_, Self::Buf>>,
    ) -> Result<()>;

    /// One Adam or AdamW step over the run's parameters of every slot (the
    /// views start at the run). `scalars` holds each slot's
    /// [`AdamSlot::step_scalars`] ([`crate::ADAM_STEP_WORDS`] words per
    /// slot, from a step block).
    fn adam_step(
        &self,
        ctx: &mut Self::Ctx,
        run: ParamRun<'_, AdamSlot>,
        scalars: View<'_, Self::Buf>,
        params: ViewMut<'_, Self::Buf>,
        grads: View<'_, Self::Buf>,
        moments: Moments<'_, Self::Buf>,
    ) -> Result<()>;

    // --- convolutional layers (NHWC, see [`Images`](crate::ops::Images)) ---

    /// The patch matrix of a convolution (see [`Conv2d`]):
    /// `cols[s][pixel][(ki, kj, ci)]`, zeros where the window hangs over the
    /// padding. Slot `s` reads its images from `x + s * slot_stride`.
    fn im2col(
        &self,
        ctx: &mut Self::Ctx,
        conv: &Conv2d,
        x: View<'_, Self::Buf>,
        cols: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// The adjoint of [`Backend::im2col`]: every patch value added back onto
    /// the pixel it came from, into packed images `dx` (overwritten, or
    /// added to when `accumulate`).
    fn col2im(
        &self,
        ctx: &mut Self::Ctx,
        conv: &Conv2d,
        cols: View<'_, Self::Buf>,
        dx: ViewMut<'_, Self::Buf>,
        accumulate: bool,
    ) -> Result<()>;
    /// A convolution's output, `y = im2col(x) . w` per slot, plus the bias
    /// where `op.bias` (see [`ConvGemm`]). `cols` is scratch of
    /// `conv.cols_len()` elements. Provided as the patch matrix, one GEMM
    /// and `bias_add`; a backend may fuse them.
    fn conv2d(
        &self,
        ctx: &mut Self::Ctx,
        op: &ConvGemm,
        x: View<'_, Self::Buf>,
        w: View<'_, Self::Buf>,
        cols: ViewMut<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        by_patches::conv2d(self, ctx, op, x, w, cols, y)
    }
    /// The weights' gradient of [`Backend::conv2d`], `dw = im2col(x)^T . dy`
    /// per slot (overwritten), then the bias's, `dy`'s column sums, where
    /// `op.bias`. `cols` is scratch, as for `conv2d`.
    fn conv2d_filter_grad(
        &self,
        ctx: &mut Self::Ctx,
        op: &ConvGemm,
        x: View<'_, Self::Buf>,
        dy: View<'_, Self::Buf>,
        cols: ViewMut<'_, Self::Buf>,
        dw: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        by_patches::conv2d_filter_grad(self, ctx, op, x, dy, cols, dw)
    }
    /// The input's gradient of [`Backend::conv2d`], `col2im(dy . w^T)`, into
    /// packed images `dx` (overwritten, or added to when `op.accumulate_dx`).
    fn conv2d_data_grad(
        &self,
        ctx: &mut Self::Ctx,
        op: &ConvGemm,
        dy: View<'_, Self::Buf>,
        w: View<'_, Self::Buf>,
        cols: ViewMut<'_, Self::Buf>,
        dx: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        by_patches::conv2d_data_grad(self, ctx, op, dy, w, cols, dx)
    }
    /// Max or average pooling of `x` into packed images `y` (see [`Pool2d`]).
    fn pool2d(
        &self,
        ctx: &mut Self::Ctx,
        pool: &Pool2d,
        x: View<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// The gradient of [`Backend::pool2d`] with respect to its input, into
    /// packed images `dx` (overwritten). Max pooling recomputes the argmax
    /// from `x`.
    fn pool2d_backward(
        &self,
        ctx: &mut Self::Ctx,
        pool: &Pool2d,
        x: View<'_, Self::Buf>,
        dy: View<'_, Self::Buf>,
        dx: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// Whether this backend offers [`Backend::activation_pool2d`] and
    /// [`Backend::activation_pool2d_backward`]; where it does not, callers
    /// run the activation and the pooling as two ops.
    fn pools_activations(&self) -> bool {
        false
    }
    /// `y = pool(act(x))` in one pass, for windows that tile the images
    /// ([`Pool2d::tiles`]): the bits of [`Backend::activation`] then
    /// [`Backend::pool2d`], without writing `act(x)`.
    fn activation_pool2d(
        &self,
        _ctx: &mut Self::Ctx,
        _act: Activation,
        _pool: &Pool2d,
        _x: View<'_, Self::Buf>,
        _y: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        Err(KernelError::Unsupported {
            op: "activation_pool2d",
            backend: self.label(),
        })
    }
    /// The gradient of [`Backend::activation_pool2d`] with respect to `x`,
    /// into `dx` (overwritten): the bits of [`Backend::pool2d_backward`]
    /// over `act(x)` then [`Backend::activation_backward`].
    fn activation_pool2d_backward(
        &self,
        _ctx: &mut Self::Ctx,
        _act: Activation,
        _pool: &Pool2d,
        _x: View<'_, Self::Buf>,
        _dy: View<'_, Self::Buf>,
        _dx: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        Err(KernelError::Unsupported {
            op: "activation_pool2d_backward",
            backend: self.label(),
        })
    }
    /// The filter gradient of a convolution whose output `z` went through
    /// [`Backend::activation_pool2d`] (`pool` reads the convolution's
    /// packed output), from the pooled gradient `dp`: the bits of
    /// [`Backend::activation_pool2d_backward`] then
    /// [`Backend::conv2d_filter_grad`], where the backend can do without
    /// writing the output's gradient (on the CPU, the direct form makes it
    /// an image at a time). Offered where [`Backend::pools_activations`]
    /// says so.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_filter_grad_through_pool(
        &self,
        _ctx: &mut Self::Ctx,
        _op: &ConvGemm,
        _act: Activation,
        _pool: &Pool2d,
        _x: View<'_, Self::Buf>,
        _z: View<'_, Self::Buf>,
        _dp: View<'_, Self::Buf>,
        _cols: ViewMut<'_, Self::Buf>,
        _dw: ViewMut<'_, Self::Buf>,
    ) -> Result<()> {
        Err(KernelError::Unsupported {
            op: "conv2d_filter_grad_through_pool",
            backend: self.label(),
        })
    }
    /// Batch norm in training (see [`BatchNorm`]): normalises by the batch's
    /// statistics, saves them (`saved`: per slot `[mean; c]`, `[1/std; c]`)
    /// for the backward pass, and moves the running statistics.
    #[allow(clippy::too_many_arguments)]
    fn batch_norm_train(
        &self,
        ctx: &mut Self::Ctx,
        bn: &BatchNorm,
        x: View<'_, Self::Buf>,
        params: View<'_, Self::Buf>,
        running: ViewMut<'_, Self::Buf>,
        saved: ViewMut<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// Batch norm in evaluation: normalises by the running statistics.
    fn batch_norm_eval(
        &self,
        ctx: &mut Self::Ctx,
        bn: &BatchNorm,
        x: View<'_, Self::Buf>,
        params: View<'_, Self::Buf>,
        running: View<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// The backward pass of [`Backend::batch_norm_train`]: `dx`, and the
    /// scale and shift gradients into `dparams` (laid out as the parameters).
    #[allow(clippy::too_many_arguments)]
    fn batch_norm_backward(
        &self,
        ctx: &mut Self::Ctx,
        bn: &BatchNorm,
        x: View<'_, Self::Buf>,
        params: View<'_, Self::Buf>,
        saved: View<'_, Self::Buf>,
        dy: View<'_, Self::Buf>,
        dx: ViewMut<'_, Self::Buf>,
        dparams: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
    /// `y[i] += x[i]` for `i < n`: residual connections and their gradients.
    fn add(
        &self,
        ctx: &mut Self::Ctx,
        n: usize,
        x: View<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;

    /// Random crops and flips of packed `images` (see [`AugmentSlot`]), one
    /// setting per slot; `steps` holds each slot's step
    /// ([`crate::DROPOUT_STEP_WORDS`] words per slot, from a step block).
    fn augment(
        &self,
        ctx: &mut Self::Ctx,
        images: &crate::ops::Images,
        slots: &[AugmentSlot],
        steps: View<'_, Self::Buf>,
        x: View<'_, Self::Buf>,
        y: ViewMut<'_, Self::Buf>,
    ) -> Result<()>;
}

/// The convolution ops as the whole patch matrix and one GEMM: the
/// `Backend` trait's provided methods, and what a backend that fuses them
/// falls back to where it does not (the CPU in bf16).
pub(crate) mod by_patches {
    use super::{Backend, View, ViewMut, at, at_mut};
    use crate::error::{Result, check_conv_gemm};
    use crate::ops::{Batched, ConvGemm};

    /// The output rows' shape, for the bias.
    fn rows(op: &ConvGemm) -> Batched {
        Batched::new(op.conv.input.slots, op.conv.out_rows(), op.out_c)
    }

    pub(crate) fn conv2d<B: Backend + ?Sized>(
        b: &B,
        ctx: &mut B::Ctx,
        op: &ConvGemm,
        x: View<'_, B::Buf>,
        w: View<'_, B::Buf>,
        cols: ViewMut<'_, B::Buf>,
        y: ViewMut<'_, B::Buf>,
    ) -> Result<()> {
        check_conv_gemm("conv2d", op)?;
        b.im2col(ctx, &op.conv, x, at_mut(cols.buf, cols.off))?;
        b.gemm(
            ctx,
            &op.forward(),
            at(cols.buf, cols.off),
            w,
            at_mut(y.buf, y.off),
        )?;
        if op.bias {
            let bias = at(w.buf, w.off + op.conv.patch() * op.out_c);
            b.bias_add(ctx, rows(op), op.weight_stride, y, bias)?;
        }
        Ok(())
    }

    pub(crate) fn conv2d_filter_grad<B: Backend + ?Sized>(
        b: &B,
        ctx: &mut B::Ctx,
        op: &ConvGemm,
        x: View<'_, B::Buf>,
        dy: View<'_, B::Buf>,
        cols: ViewMut<'_, B::Buf>,
        dw: ViewMut<'_, B::Buf>,
    ) -> Result<()> {
        check_conv_gemm("conv2d_filter_grad", op)?;
        b.im2col(ctx, &op.conv, x, at_mut(cols.buf, cols.off))?;
        b.gemm(
            ctx,
            &op.filter_grad(),
            at(cols.buf, cols.off),
            dy,
            at_mut(dw.buf, dw.off),
        )?;
        if op.bias {
            let db = at_mut(dw.buf, dw.off + op.conv.patch() * op.out_c);
            b.col_sum(ctx, rows(op), op.weight_stride, dy, db)?;
        }
        Ok(())
    }

    pub(crate) fn conv2d_data_grad<B: Backend + ?Sized>(
        b: &B,
        ctx: &mut B::Ctx,
        op: &ConvGemm,
        dy: View<'_, B::Buf>,
        w: View<'_, B::Buf>,
        cols: ViewMut<'_, B::Buf>,
        dx: ViewMut<'_, B::Buf>,
    ) -> Result<()> {
        check_conv_gemm("conv2d_data_grad", op)?;
        b.gemm(ctx, &op.data_grad(), dy, w, at_mut(cols.buf, cols.off))?;
        b.col2im(ctx, &op.conv, at(cols.buf, cols.off), dx, op.accumulate_dx)
    }
}
