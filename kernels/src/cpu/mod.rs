//! The CPU backend: buffers are `Vec<f32>`, a context is a lane's thread pool.

/// Defines `fn $name(args)` that runs its body compiled for the widest
/// vectors the CPU has (the build targets baseline x86-64, 4 wide, and a
/// closure passed into a `#[target_feature]` function is not compiled with
/// its features). For bodies whose arithmetic is element-wise, unfused
/// multiplies and adds, so that every width gives the same bits. (Adam's
/// update, `optim.rs`, dispatches by hand: its test calls each width.)
macro_rules! widest_fn {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx($($arg: $ty),*) {
                    body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx") {
                    // SAFETY: the CPU has AVX.
                    return unsafe { avx($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

mod activation_pool;
mod conv;
mod direct;
mod elementwise;
mod gemm;
mod gemm_unpacked;
mod loss;
mod optim;
mod par;
mod vector;
mod winograd;

use std::sync::Arc;

use crate::backend::{Backend, DeviceKind, Moments, View, ViewMut, by_patches};
use crate::error::{
    KernelError, Result, check_augment, check_batch_norm, check_classes, check_conv,
    check_conv_gemm, check_dropout, check_gemm, check_gemm_grouped, check_param_run, check_pool,
    check_range, check_tiled_pool, shape_err,
};
use crate::ops::{
    ADAM_STEP_WORDS, Activation, ActivationOp, AdamSlot, AugmentSlot, BatchNorm, Batched, Conv2d,
    ConvGemm, DROPOUT_STEP_WORDS, DropoutSlot, Gemm, GroupedGemm, Loss, ParamRun, Pool2d,
    Precision, STATS_LEN, SgdSlot, Slots, round_bf16,
};

/// The CPU device.
#[derive(Debug, Clone, Default)]
pub struct CpuBackend {
    memory_bytes: Option<usize>,
    /// `N` of `cpu:N`, where a run splits the machine into several CPU
    /// devices (each a Salus core with its own lanes and threads).
    index: Option<usize>,
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend::default()
    }
    /// A CPU device that reports `bytes` of memory instead of the RAM it finds.
    pub fn with_memory(bytes: usize) -> Self {
        CpuBackend {
            memory_bytes: Some(bytes),
            index: None,
        }
    }
    /// CPU device `cpu:index` of several in one run.
    pub fn numbered(index: usize) -> Self {
        CpuBackend {
            memory_bytes: None,
            index: Some(index),
        }
    }
}

/// A CPU buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuBuf(Vec<f32>);

impl CpuBuf {
    pub fn as_slice(&self) -> &[f32] {
        &self.0
    }
}

/// A CPU execution context: `threads` host threads for intra-op parallelism.
#[derive(Clone)]
pub struct CpuCtx {
    pool: Option<Arc<rayon::ThreadPool>>,
    /// Threads the ops split work over now: at most the pool's.
    threads: usize,
}

impl CpuCtx {
    pub fn new(threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let pool = if threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("salus-cpu-{i}"))
                .build()
                .map_err(|e| KernelError::device("building the CPU thread pool", e))?;
            Some(Arc::new(pool))
        } else {
            None
        };
        Ok(CpuCtx { pool, threads })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The threads the context was made with.
    pub fn pool_threads(&self) -> usize {
        self.pool.as_ref().map_or(1, |p| p.current_num_threads())
    }

    /// Splits work over `threads` of the pool's threads from now on.
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.clamp(1, self.pool_threads());
    }
}

/// Total RAM from /proc/meminfo, or 4 GiB when it cannot be read.
fn system_memory() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(4 << 30)
}

/// `len` zeros from the allocator's `calloc`, where `vec![0.0; len]` with
/// a fallible reservation would write every zero itself: fresh pages are
/// zero already, so a large buffer costs nothing until it is used (the
/// convolutions' patch buffer, say, which the CPU's chunked convolutions
/// never touch). `None` when the allocation fails.
fn zeroed(len: usize) -> Option<Vec<f32>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(len).ok()?;
    // SAFETY: the layout has a non-zero size; all-zero bits are 0.0f32; the
    // pointer comes from the global allocator with exactly the layout a
    // `Vec<f32>` of capacity `len` frees it with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<f32>();
        (!p.is_null()).then(|| Vec::from_raw_parts(p, len, len))
    }
}

fn src<'a>(
    op: &'static str,
    what: &'static str,
    v: View<'a, CpuBuf>,
    n: usize,
) -> Result<&'a [f32]> {
    check_range(op, what, v.off, n, v.buf.0.len())?;
    Ok(&v.buf.0[v.off..v.off + n])
}

fn dst<'a>(
    op: &'static str,
    what: &'static str,
    v: ViewMut<'a, CpuBuf>,
    n: usize,
) -> Result<&'a mut [f32]> {
    check_range(op, what, v.off, n, v.buf.0.len())?;
    Ok(&mut v.buf.0[v.off..v.off + n])
}

impl Backend for CpuBackend {
    type Buf = CpuBuf;
    type Ctx = CpuCtx;
    type HostThreads = Option<Arc<rayon::ThreadPool>>;
    type Graph = ();

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn name(&self) -> String {
        format!(
            "cpu ({} threads)",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )
    }

    fn label(&self) -> String {
        self.index.map_or("cpu".into(), |i| format!("cpu:{i}"))
    }

    fn memory_bytes(&self) -> usize {
        self.memory_bytes.unwrap_or_else(system_memory)
    }

    fn new_ctx(&self, threads: usize) -> Result<CpuCtx> {
        CpuCtx::new(threads)
    }

    fn set_threads(&self, ctx: &mut CpuCtx, threads: usize) {
        ctx.set_threads(threads);
    }

    fn host_threads(&self, ctx: &CpuCtx) -> Self::HostThreads {
        ctx.pool.clone()
    }

    fn enter<R: Send>(&self, host: &Self::HostThreads, f: impl FnOnce() -> R + Send) -> R {
        match host {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    fn sync(&self, _ctx: &mut CpuCtx) -> Result<()> {
        Ok(())
    }

    fn alloc_zeroed(&self, len: usize) -> Result<CpuBuf> {
        zeroed(len)
            .map(CpuBuf)
            .ok_or(KernelError::OutOfMemory { requested: len * 4 })
    }

    fn buf_len(&self, buf: &CpuBuf) -> usize {
        buf.0.len()
    }

    fn upload(&self, _ctx: &mut CpuCtx, s: &[f32], d: ViewMut<'_, CpuBuf>) -> Result<()> {
        dst("upload", "dst", d, s.len())?.copy_from_slice(s);
        Ok(())
    }

    fn download(&self, _ctx: &mut CpuCtx, s: View<'_, CpuBuf>, d: &mut [f32]) -> Result<()> {
        d.copy_from_slice(src("download", "src", s, d.len())?);
        Ok(())
    }

    fn stage_step(&self, ctx: &mut CpuCtx, words: &[f32], d: ViewMut<'_, CpuBuf>) -> Result<()> {
        self.upload(ctx, words, d)
    }

    fn buf_addr(&self, buf: &CpuBuf) -> usize {
        buf.0.as_ptr() as usize
    }

    fn copy(
        &self,
        _ctx: &mut CpuCtx,
        len: usize,
        s: View<'_, CpuBuf>,
        d: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        dst("copy", "dst", d, len)?.copy_from_slice(src("copy", "src", s, len)?);
        Ok(())
    }

    fn copy_within(
        &self,
        _ctx: &mut CpuCtx,
        len: usize,
        buf: &mut CpuBuf,
        src: usize,
        dst: usize,
    ) -> Result<()> {
        crate::error::check_apart(len, src, dst, buf.0.len())?;
        buf.0.copy_within(src..src + len, dst);
        Ok(())
    }

    fn fill(
        &self,
        _ctx: &mut CpuCtx,
        len: usize,
        value: f32,
        d: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        dst("fill", "dst", d, len)?.fill(value);
        Ok(())
    }

    fn gemm(
        &self,
        ctx: &mut CpuCtx,
        g: &Gemm,
        a: View<'_, CpuBuf>,
        b: View<'_, CpuBuf>,
        c: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        if !check_gemm(g)? {
            return Ok(());
        }
        let (ea, eb, ec) = g.extents();
        let a = src("gemm", "A", a, ea)?;
        let b = src("gemm", "B", b, eb)?;
        let c = dst("gemm", "C", c, ec)?;
        match g.precision {
            Precision::Fp32 => gemm::gemm(ctx, g, a, b, c),
            // Rounded copies of the inputs, then the fp32 GEMM: what cuBLAS's
            // FAST_16BF compute does, so the backends can be compared.
            Precision::Bf16 => {
                let round = |x: &[f32]| x.iter().map(|&v| round_bf16(v)).collect::<Vec<f32>>();
                gemm::gemm(ctx, g, &round(a), &round(b), c)
            }
            Precision::Tf32 => {
                return Err(KernelError::Precision {
                    op: "gemm",
                    precision: g.precision.name(),
                    backend: "CPU",
                });
            }
        }
        Ok(())
    }

    fn gemm_grouped(
        &self,
        ctx: &mut CpuCtx,
        g: &GroupedGemm<'_>,
        a: View<'_, CpuBuf>,
        b: View<'_, CpuBuf>,
        c: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        check_gemm_grouped(g)?;
        let (ea, eb, ec) = g.extents();
        let a = src("gemm_grouped", "A", a, ea)?;
        let b = src("gemm_grouped", "B", b, eb)?;
        let c = dst("gemm_grouped", "C", c, ec)?;
        match g.base.precision {
            Precision::Fp32 => gemm::gemm_grouped(ctx, g, a, b, c),
            Precision::Bf16 => {
                let round = |x: &[f32]| x.iter().map(|&v| round_bf16(v)).collect::<Vec<f32>>();
                gemm::gemm_grouped(ctx, g, &round(a), &round(b), c)
            }
            Precision::Tf32 => {
                return Err(KernelError::Precision {
                    op: "gemm_grouped",
                    precision: g.base.precision.name(),
                    backend: "CPU",
                });
            }
        }
        Ok(())
    }

    fn gather_rows(
        &self,
        ctx: &mut CpuCtx,
        cols: usize,
        rows: usize,
        idx: View<'_, CpuBuf>,
        s: View<'_, CpuBuf>,
        d: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "gather_rows";
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let idx = src(OP, "idx", idx, rows)?;
        let s = &s.buf.0[s.off.min(s.buf.0.len())..];
        elementwise::gather_rows(ctx, cols, idx, s, dst(OP, "dst", d, rows * cols)?);
        Ok(())
    }

    fn bias_add(
        &self,
        ctx: &mut CpuCtx,
        shape: Batched,
        bias_stride: usize,
        x: ViewMut<'_, CpuBuf>,
        bias: View<'_, CpuBuf>,
    ) -> Result<()> {
        if shape.is_empty() {
            return Ok(());
        }
        let bias = src(
            "bias_add",
            "bias",
            bias,
            (shape.slots - 1) * bias_stride + shape.cols,
        )?;
        elementwise::bias_add(
            ctx,
            shape,
            bias_stride,
            dst("bias_add", "x", x, shape.len())?,
            bias,
        );
        Ok(())
    }

    fn col_sum(
        &self,
        ctx: &mut CpuCtx,
        shape: Batched,
        db_stride: usize,
        dy: View<'_, CpuBuf>,
        db: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        if shape.slots == 0 || shape.cols == 0 {
            return Ok(());
        }
        if shape.slots > 1 && db_stride < shape.cols {
            return Err(shape_err("col_sum", "db_stride < cols"));
        }
        let dy = src("col_sum", "dy", dy, shape.len())?;
        let db = dst(
            "col_sum",
            "db",
            db,
            (shape.slots - 1) * db_stride + shape.cols,
        )?;
        elementwise::col_sum(ctx, shape, db_stride, dy, db);
        Ok(())
    }

    fn activation(
        &self,
        ctx: &mut CpuCtx,
        op: ActivationOp,
        x: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        elementwise::activation(
            ctx,
            op.activation,
            src("activation", "x", x, op.n)?,
            dst("activation", "y", y, op.n)?,
        );
        Ok(())
    }

    fn activation_backward(
        &self,
        ctx: &mut CpuCtx,
        op: ActivationOp,
        x: View<'_, CpuBuf>,
        y: View<'_, CpuBuf>,
        dy: View<'_, CpuBuf>,
        dx: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "activation_backward";
        let n = op.n;
        let (x, y, dy) = (
            src(OP, "x", x, n)?,
            src(OP, "y", y, n)?,
            src(OP, "dy", dy, n)?,
        );
        let dx = dst(OP, "dx", dx, n)?;
        elementwise::activation_backward(ctx, op.activation, x, y, dy, dx);
        Ok(())
    }

    fn dropout(
        &self,
        ctx: &mut CpuCtx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CpuBuf>,
        x: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        self.dropout_like("dropout", ctx, slots, steps, x, y)
    }

    fn dropout_backward(
        &self,
        ctx: &mut CpuCtx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CpuBuf>,
        dy: View<'_, CpuBuf>,
        dx: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        self.dropout_like("dropout_backward", ctx, slots, steps, dy, dx)
    }

    fn softmax_xent(
        &self,
        ctx: &mut CpuCtx,
        loss: &Loss,
        logits: View<'_, CpuBuf>,
        labels: View<'_, CpuBuf>,
        dlogits: Option<ViewMut<'_, CpuBuf>>,
        stats: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "softmax_xent";
        let shape = loss.shape;
        check_classes(shape)?;
        if shape.slots == 0 {
            return Ok(());
        }
        let logits = src(OP, "logits", logits, shape.len())?;
        let labels = src(
            OP,
            "labels",
            labels,
            (shape.slots - 1) * loss.target_stride + shape.rows,
        )?;
        let dlogits = dlogits
            .map(|d| dst(OP, "dlogits", d, shape.len()))
            .transpose()?;
        let stats = dst(OP, "stats", stats, shape.slots * STATS_LEN)?;
        loss::softmax_xent(ctx, loss, logits, labels, dlogits, stats);
        Ok(())
    }

    fn mse(
        &self,
        ctx: &mut CpuCtx,
        loss: &Loss,
        pred: View<'_, CpuBuf>,
        target: View<'_, CpuBuf>,
        dpred: Option<ViewMut<'_, CpuBuf>>,
        stats: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "mse";
        let shape = loss.shape;
        if shape.slots == 0 {
            return Ok(());
        }
        let pred = src(OP, "pred", pred, shape.len())?;
        let target = src(
            OP,
            "target",
            target,
            (shape.slots - 1) * loss.target_stride + shape.per_slot(),
        )?;
        let dpred = dpred
            .map(|d| dst(OP, "dpred", d, shape.len()))
            .transpose()?;
        let stats = dst(OP, "stats", stats, shape.slots * STATS_LEN)?;
        loss::mse(ctx, loss, pred, target, dpred, stats);
        Ok(())
    }

    fn sgd_step(
        &self,
        ctx: &mut CpuCtx,
        run: ParamRun<'_, SgdSlot>,
        params: ViewMut<'_, CpuBuf>,
        grads: View<'_, CpuBuf>,
        velocity: Option<ViewMut<'_, CpuBuf>>,
    ) -> Result<()> {
        const OP: &str = "sgd_step";
        check_param_run(OP, &run)?;
        let extent = run.extent();
        if velocity.is_none() && run.settings.iter().any(|s| s.momentum != 0.0) {
            return Err(shape_err(
                OP,
                "a slot has momentum but no velocity buffer was given",
            ));
        }
        let velocity = velocity
            .map(|v| dst(OP, "velocity", v, extent))
            .transpose()?;
        optim::sgd(
            ctx,
            run,
            dst(OP, "params", params, extent)?,
            src(OP, "grads", grads, extent)?,
            velocity,
        );
        Ok(())
    }

    fn adam_step(
        &self,
        ctx: &mut CpuCtx,
        run: ParamRun<'_, AdamSlot>,
        scalars: View<'_, CpuBuf>,
        params: ViewMut<'_, CpuBuf>,
        grads: View<'_, CpuBuf>,
        moments: Moments<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "adam_step";
        check_param_run(OP, &run)?;
        let extent = run.extent();
        let words = run.settings.len() * ADAM_STEP_WORDS;
        let scalars = src(OP, "scalars", scalars, words)?;
        let (p, g) = (
            dst(OP, "params", params, extent)?,
            src(OP, "grads", grads, extent)?,
        );
        let (m, v) = (
            dst(OP, "m", moments.m, extent)?,
            dst(OP, "v", moments.v, extent)?,
        );
        optim::adam(ctx, run, scalars, p, g, m, v);
        Ok(())
    }

    fn im2col(
        &self,
        ctx: &mut CpuCtx,
        c: &Conv2d,
        x: View<'_, CpuBuf>,
        cols: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "im2col";
        check_conv(OP, c)?;
        if c.input.is_empty() {
            return Ok(());
        }
        let x = src(OP, "x", x, c.input.extent())?;
        conv::im2col(ctx, c, x, dst(OP, "cols", cols, c.cols_len())?);
        Ok(())
    }

    fn col2im(
        &self,
        ctx: &mut CpuCtx,
        c: &Conv2d,
        cols: View<'_, CpuBuf>,
        dx: ViewMut<'_, CpuBuf>,
        accumulate: bool,
    ) -> Result<()> {
        const OP: &str = "col2im";
        check_conv(OP, c)?;
        if c.input.is_empty() {
            return Ok(());
        }
        let cols = src(OP, "cols", cols, c.cols_len())?;
        conv::col2im(ctx, c, cols, dst(OP, "dx", dx, c.input.len())?, accumulate);
        Ok(())
    }

    fn conv2d(
        &self,
        ctx: &mut CpuCtx,
        op: &ConvGemm,
        x: View<'_, CpuBuf>,
        w: View<'_, CpuBuf>,
        cols: ViewMut<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "conv2d";
        let g = op.forward();
        if op.precision != Precision::Fp32 {
            // Rounded inputs go through the GEMM's own path.
            return by_patches::conv2d(self, ctx, op, x, w, cols, y);
        }
        check_conv_gemm(OP, op)?;
        if !check_gemm(&g)? {
            return Ok(());
        }
        let x = src(OP, "x", x, op.conv.input.extent())?;
        let w = src(OP, "w", w, op.weights_extent())?;
        let y = dst(OP, "y", y, op.out_len())?;
        match winograd::Transforms::for_op(op) {
            Some(tf) => winograd::conv2d(ctx, tf, op, x, w, y),
            None if direct::pays(&op.conv) => direct::conv2d(ctx, op, x, w, y),
            None => conv::conv2d(ctx, op, x, w, y),
        }
        Ok(())
    }

    fn conv2d_filter_grad(
        &self,
        ctx: &mut CpuCtx,
        op: &ConvGemm,
        x: View<'_, CpuBuf>,
        dy: View<'_, CpuBuf>,
        cols: ViewMut<'_, CpuBuf>,
        dw: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "conv2d_filter_grad";
        let g = op.filter_grad();
        if op.precision != Precision::Fp32 {
            return by_patches::conv2d_filter_grad(self, ctx, op, x, dy, cols, dw);
        }
        check_conv_gemm(OP, op)?;
        if !check_gemm(&g)? {
            return Ok(());
        }
        let x = src(OP, "x", x, op.conv.input.extent())?;
        let dy = src(OP, "dy", dy, op.out_len())?;
        let dw = dst(OP, "dw", dw, op.weights_extent())?;
        match winograd::Transforms::for_op(op) {
            Some(tf) => winograd::conv2d_filter_grad(ctx, tf, op, x, dy, dw),
            None if direct::pays(&op.conv) => {
                direct::conv2d_filter_grad(ctx, op, x, direct::OutputGrad::Given(dy), dw)
            }
            None => conv::conv2d_filter_grad(ctx, op, x, dy, dw),
        }
        Ok(())
    }

    fn conv2d_data_grad(
        &self,
        ctx: &mut CpuCtx,
        op: &ConvGemm,
        dy: View<'_, CpuBuf>,
        w: View<'_, CpuBuf>,
        cols: ViewMut<'_, CpuBuf>,
        dx: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "conv2d_data_grad";
        let accumulate = op.accumulate_dx;
        let g = op.data_grad();
        if op.precision != Precision::Fp32 {
            return by_patches::conv2d_data_grad(self, ctx, op, dy, w, cols, dx);
        }
        check_conv_gemm(OP, op)?;
        if op.conv.input.is_empty() {
            return Ok(());
        }
        let dx = dst(OP, "dx", dx, op.conv.input.len())?;
        if !check_gemm(&g)? {
            // No products (no output channels, say): a gradient of zeros.
            if !accumulate {
                dx.fill(0.0);
            }
            return Ok(());
        }
        let dy = src(OP, "dy", dy, op.out_len())?;
        let w = src(OP, "w", w, g.extents().1)?;
        match winograd::Transforms::for_op(op) {
            Some(tf) => winograd::conv2d_data_grad(ctx, tf, op, dy, w, dx),
            None => conv::conv2d_data_grad(ctx, op, dy, w, dx),
        }
        Ok(())
    }

    fn pool2d(
        &self,
        ctx: &mut CpuCtx,
        p: &Pool2d,
        x: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "pool2d";
        check_pool(OP, p)?;
        if p.input.is_empty() {
            return Ok(());
        }
        let x = src(OP, "x", x, p.input.extent())?;
        conv::pool2d(ctx, p, x, dst(OP, "y", y, p.output().len())?);
        Ok(())
    }

    fn pool2d_backward(
        &self,
        ctx: &mut CpuCtx,
        p: &Pool2d,
        x: View<'_, CpuBuf>,
        dy: View<'_, CpuBuf>,
        dx: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "pool2d_backward";
        check_pool(OP, p)?;
        if p.input.is_empty() {
            return Ok(());
        }
        let x = src(OP, "x", x, p.input.extent())?;
        let dy = src(OP, "dy", dy, p.output().len())?;
        conv::pool2d_backward(ctx, p, x, dy, dst(OP, "dx", dx, p.input.len())?);
        Ok(())
    }

    fn pools_activations(&self) -> bool {
        true
    }

    fn activation_pool2d(
        &self,
        ctx: &mut CpuCtx,
        act: Activation,
        p: &Pool2d,
        x: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "activation_pool2d";
        check_tiled_pool(OP, p)?;
        if p.input.is_empty() {
            return Ok(());
        }
        let x = src(OP, "x", x, p.input.extent())?;
        activation_pool::forward(ctx, act, p, x, dst(OP, "y", y, p.output().len())?);
        Ok(())
    }

    fn activation_pool2d_backward(
        &self,
        ctx: &mut CpuCtx,
        act: Activation,
        p: &Pool2d,
        x: View<'_, CpuBuf>,
        dy: View<'_, CpuBuf>,
        dx: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "activation_pool2d_backward";
        check_tiled_pool(OP, p)?;
        if p.input.is_empty() {
            return Ok(());
        }
        let x = src(OP, "x", x, p.input.extent())?;
        let dy = src(OP, "dy", dy, p.output().len())?;
        let dx = dst(OP, "dx", dx, p.input.len())?;
        activation_pool::backward(ctx, act, p, x, dy, dx);
        Ok(())
    }

    fn conv2d_filter_grad_through_pool(
        &self,
        ctx: &mut CpuCtx,
        op: &ConvGemm,
        act: Activation,
        pool: &Pool2d,
        x: View<'_, CpuBuf>,
        z: View<'_, CpuBuf>,
        dp: View<'_, CpuBuf>,
        cols: ViewMut<'_, CpuBuf>,
        dw: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "conv2d_filter_grad_through_pool";
        check_conv_gemm(OP, op)?;
        check_tiled_pool(OP, pool)?;
        let c = op.conv;
        if pool.input
            != crate::ops::Images::packed(c.input.slots, c.input.n, c.out_h(), c.out_w(), op.out_c)
        {
            return Err(shape_err(
                OP,
                "the pooling must read the convolution's packed output",
            ));
        }
        let direct = op.precision == Precision::Fp32
            && winograd::Transforms::for_op(op).is_none()
            && direct::pays(&op.conv);
        if !direct || op.conv.input.is_empty() {
            // Elsewhere the output's gradient is made whole, then used.
            let mut dy = CpuBuf(vec![0.0; op.out_len()]);
            self.activation_pool2d_backward(ctx, act, pool, z, dp, crate::at_mut(&mut dy, 0))?;
            return self.conv2d_filter_grad(ctx, op, x, crate::at(&dy, 0), cols, dw);
        }
        let x = src(OP, "x", x, op.conv.input.extent())?;
        let z = src(OP, "z", z, pool.input.extent())?;
        let dp = src(OP, "dp", dp, pool.output().len())?;
        let dw = dst(OP, "dw", dw, op.weights_extent())?;
        let dy = direct::OutputGrad::ThroughPool { act, pool, z, dp };
        direct::conv2d_filter_grad(ctx, op, x, dy, dw);
        Ok(())
    }

    fn batch_norm_train(
        &self,
        ctx: &mut CpuCtx,
        bn: &BatchNorm,
        x: View<'_, CpuBuf>,
        params: View<'_, CpuBuf>,
        running: ViewMut<'_, CpuBuf>,
        saved: ViewMut<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "batch_norm_train";
        check_batch_norm(OP, bn, true)?;
        if bn.shape.is_empty() {
            return Ok(());
        }
        let n = bn.shape.len();
        conv::batch_norm_train(
            ctx,
            bn,
            src(OP, "x", x, n)?,
            src(OP, "params", params, bn.params_extent())?,
            dst(OP, "running", running, bn.running_extent())?,
            dst(OP, "saved", saved, bn.saved_len())?,
            dst(OP, "y", y, n)?,
        );
        Ok(())
    }

    fn batch_norm_eval(
        &self,
        ctx: &mut CpuCtx,
        bn: &BatchNorm,
        x: View<'_, CpuBuf>,
        params: View<'_, CpuBuf>,
        running: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "batch_norm_eval";
        check_batch_norm(OP, bn, false)?;
        if bn.shape.is_empty() {
            return Ok(());
        }
        let n = bn.shape.len();
        conv::batch_norm_eval(
            ctx,
            bn,
            src(OP, "x", x, n)?,
            src(OP, "params", params, bn.params_extent())?,
            src(OP, "running", running, bn.running_extent())?,
            dst(OP, "y", y, n)?,
        );
        Ok(())
    }

    fn batch_norm_backward(
        &self,
        ctx: &mut CpuCtx,
        bn: &BatchNorm,
        x: View<'_, CpuBuf>,
        params: View<'_, CpuBuf>,
        saved: View<'_, CpuBuf>,
        dy: View<'_, CpuBuf>,
        dx: ViewMut<'_, CpuBuf>,
        dparams: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "batch_norm_backward";
        check_batch_norm(OP, bn, true)?;
        if bn.shape.is_empty() {
            return Ok(());
        }
        let n = bn.shape.len();
        conv::batch_norm_backward(
            ctx,
            bn,
            src(OP, "x", x, n)?,
            src(OP, "params", params, bn.params_extent())?,
            src(OP, "saved", saved, bn.saved_len())?,
            src(OP, "dy", dy, n)?,
            dst(OP, "dx", dx, n)?,
            dst(OP, "dparams", dparams, bn.params_extent())?,
        );
        Ok(())
    }

    fn add(
        &self,
        ctx: &mut CpuCtx,
        n: usize,
        x: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        conv::add(ctx, src("add", "x", x, n)?, dst("add", "y", y, n)?);
        Ok(())
    }
    fn augment(
        &self,
        ctx: &mut CpuCtx,
        images: &crate::ops::Images,
        slots: &[AugmentSlot],
        steps: View<'_, CpuBuf>,
        x: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        const OP: &str = "augment";
        check_augment(OP, images, slots)?;
        let n = images.len();
        let steps = src(OP, "steps", steps, slots.len() * DROPOUT_STEP_WORDS)?;
        conv::augment(
            ctx,
            images,
            slots,
            steps,
            src(OP, "x", x, n)?,
            dst(OP, "y", y, n)?,
        );
        Ok(())
    }
}

impl CpuBackend {
    /// Dropout forward and backward: the same op, the mask recomputed.
    fn dropout_like(
        &self,
        op: &'static str,
        ctx: &mut CpuCtx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CpuBuf>,
        x: View<'_, CpuBuf>,
        y: ViewMut<'_, CpuBuf>,
    ) -> Result<()> {
        let (per_slot, settings) = (slots.n, slots.settings);
        check_dropout(op, per_slot, settings)?;
        let n = slots.total();
        let steps = src(op, "steps", steps, settings.len() * DROPOUT_STEP_WORDS)?;
        elementwise::dropout(
            ctx,
            per_slot,
            settings,
            steps,
            src(op, "x", x, n)?,
            dst(op, "y", y, n)?,
        );
        Ok(())
    }
}
