//! The CUDA backend, through cudarc: cuBLAS for GEMM, NVRTC-compiled
//! kernels (`kernels/cu/ops.cu`) for everything else.
//!
//! # Design
//!
//! * **One context per lane.** A [`CudaCtx`] owns one stream, one cuBLAS
//!   handle bound to it, a pinned staging buffer for downloads (swap-out and
//!   metrics) and a small device buffer for gather indices. A lane's host
//!   thread is the thread that drives its context, so
//!   [`Backend::enter`] runs the closure in place.
//! * **We order the streams.** cudarc's automatic event tracking is turned
//!   off: each buffer is used by one lane at a time, and the Salus core
//!   hands buffers between lanes only at iteration boundaries, after
//!   [`Backend::sync`]. Tracking cost about 20% on small trials.
//! * **Events signal iteration ends.** [`Backend::sync`] records an event
//!   with blocking sync on the lane's stream and waits on it, so the lane
//!   thread sleeps instead of spinning, and the core's scheduling loop,
//!   which runs elsewhere, never waits on the device.
//! * **Memory.** Buffers come from the driver's stream-ordered pool
//!   (`cuMemAllocAsync`) on one allocation stream, synchronised after each
//!   allocation so any lane may use the buffer next. How much the trials may
//!   take is the ledger's business: [`Backend::memory_bytes`] reports the
//!   device's free memory at start-up.
//! * **Nothing panics without CUDA.** With `dynamic-loading`, cudarc panics
//!   when a library is missing, so [`probe`] checks for the driver, cuBLAS
//!   and NVRTC before the first call and [`CudaBackend::new`] returns
//!   [`KernelError::Unavailable`] instead.

mod module;
mod params;

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::result as blas;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::result as drv;
use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError,
    LaunchConfig, PinnedHostSlice, PushKernelArg,
};

use crate::backend::{Backend, DeviceKind, View, ViewMut};
use crate::error::{KernelError, Result, check_dropout, check_range, shape_err};
use crate::ops::{Activation, AdamSlot, Batched, DropoutSlot, Gemm, STATS_LEN, SgdSlot};
use module::KernelSet;
pub use module::{MAX_SLOTS, OPS_CU};
use params::SlotParams;

const THREADS: u32 = 256;
/// Enough blocks to fill an H200 several times; the kernels stride over the rest.
const MAX_BLOCKS: usize = 8192;

/// Counts the CUDA devices, or says why CUDA cannot be used here.
pub fn probe() -> std::result::Result<usize, String> {
    // SAFETY: these only try to open the shared libraries.
    let (driver, cublas, nvrtc) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err("the CUDA driver library (libcuda.so) was not found".into());
    }
    if !cublas {
        return Err(
            "cuBLAS (libcublas.so) was not found; set LD_LIBRARY_PATH to the CUDA lib64 folder"
                .into(),
        );
    }
    if !nvrtc {
        return Err(
            "NVRTC (libnvrtc.so) was not found; set LD_LIBRARY_PATH to the CUDA lib64 folder"
                .into(),
        );
    }
    match CudaContext::device_count() {
        Ok(0) => Err("the CUDA driver reports no device".into()),
        Ok(n) => Ok(n as usize),
        Err(e) => Err(format!("the CUDA driver failed to start: {e}")),
    }
}

fn dev(e: DriverError) -> KernelError {
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        KernelError::OutOfMemory { requested: 0 }
    } else {
        KernelError::Device(e.to_string())
    }
}

fn blas_err(e: cudarc::cublas::result::CublasError) -> KernelError {
    KernelError::Device(format!("cuBLAS: {e:?}"))
}

/// Device 0 for a test, or `None` after printing why the test is skipped
/// on CUDA. With `SALUS_TUNE_REQUIRE_CUDA` set, a missing device fails the
/// test instead, so that a GPU run cannot pass by skipping.
#[doc(hidden)]
pub fn device_for_test(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("SALUS_TUNE_REQUIRE_CUDA").is_some() => {
            panic!("{test}: CUDA is required (SALUS_TUNE_REQUIRE_CUDA) but unavailable: {e}")
        }
        Err(e) => {
            eprintln!("{test}: skipped on CUDA: {e}");
            None
        }
    }
}

/// One CUDA device.
#[derive(Clone)]
pub struct CudaBackend {
    cu: Arc<CudaContext>,
    kernels: Arc<KernelSet>,
    alloc: Arc<CudaStream>,
    name: String,
    free_at_start: usize,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.name)
    }
}

impl CudaBackend {
    /// Opens device `ordinal`, compiling the kernels on first use.
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = probe().map_err(KernelError::Unavailable)?;
        if ordinal >= count {
            return Err(KernelError::Unavailable(format!(
                "cuda:{ordinal} does not exist; this machine has {count} CUDA device(s), cuda:0..cuda:{}",
                count - 1
            )));
        }
        let cu = CudaContext::new(ordinal).map_err(dev)?;
        // SAFETY: every buffer is used by one stream at a time, and lanes
        // hand buffers over only after `sync` (see the module docs).
        unsafe { cu.disable_event_tracking() };
        keep_pool_memory(&cu);
        let kernels = module::kernels(&cu)?;
        let alloc = cu.new_stream().map_err(dev)?;
        let name = cu.name().map_err(dev)?;
        let (free, _total) = cu.mem_get_info().map_err(dev)?;
        Ok(CudaBackend {
            cu,
            kernels,
            alloc,
            name: format!("cuda:{ordinal} ({name})"),
            free_at_start: free,
        })
    }

    fn bind(&self) -> Result<()> {
        self.cu.bind_to_thread().map_err(dev)
    }
}

/// Lets the device's default memory pool keep what trials free, so that a
/// swap-in after a swap-out reuses it instead of going back to the driver
/// (the pool's default is to release everything at each synchronisation).
fn keep_pool_memory(cu: &Arc<CudaContext>) {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut keep = u64::MAX;
    // SAFETY: out-pointers to locals; a failure only costs speed.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, cu.cu_device()) == sys::CUresult::CUDA_SUCCESS
        {
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            );
        }
    }
}

/// A device buffer of `f32`.
pub struct CudaBuf {
    mem: CudaSlice<f32>,
    len: usize,
}

impl CudaBuf {
    fn ptr(&self, stream: &CudaStream, off: usize) -> u64 {
        let (p, _no_sync) = self.mem.device_ptr(stream);
        p + (off * 4) as u64
    }
}

/// A lane's execution context: stream, cuBLAS handle, staging buffers.
pub struct CudaCtx {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    done: CudaEvent,
    staging: Option<PinnedHostSlice<f32>>,
    idx: Option<CudaSlice<u32>>,
}

fn view_ptr(
    op: &'static str,
    what: &'static str,
    v: View<'_, CudaBuf>,
    n: usize,
    s: &CudaStream,
) -> Result<u64> {
    check_range(op, what, v.off, n, v.buf.len)?;
    Ok(v.buf.ptr(s, v.off))
}

fn view_mut_ptr(
    op: &'static str,
    what: &'static str,
    v: ViewMut<'_, CudaBuf>,
    n: usize,
    s: &CudaStream,
) -> Result<u64> {
    check_range(op, what, v.off, n, v.buf.len)?;
    Ok(v.buf.ptr(s, v.off))
}

/// A 1-D grid over `n` elements, `slots` deep in y.
fn grid(n: usize, slots: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, slots as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One launch of a kernel with the given arguments, in order.
macro_rules! launch {
    ($stream:expr, $f:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let mut b = $stream.launch_builder($f);
        $( b.arg($arg); )+
        // SAFETY: every pointer was bounds-checked against its buffer, and
        // the arguments match the kernel's signature in ops.cu.
        unsafe { b.launch($cfg) }.map(|_| ()).map_err(dev)
    }};
}

fn act_code(a: Activation) -> i32 {
    match a {
        Activation::Relu => 0,
        Activation::Gelu => 1,
        Activation::Tanh => 2,
        Activation::Sigmoid => 3,
    }
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Ctx = CudaCtx;
    type HostThreads = ();

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda(self.cu.ordinal())
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn memory_bytes(&self) -> usize {
        self.free_at_start
    }

    fn new_ctx(&self, _threads: usize) -> Result<CudaCtx> {
        self.bind()?;
        let stream = self.cu.new_stream().map_err(dev)?;
        let blas = CudaBlas::new(stream.clone()).map_err(blas_err)?;
        let done = self
            .cu
            .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(dev)?;
        Ok(CudaCtx {
            stream,
            blas,
            done,
            staging: None,
            idx: None,
        })
    }

    fn host_threads(&self, _ctx: &CudaCtx) {}

    fn enter<R: Send>(&self, _host: &(), f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    fn sync(&self, ctx: &mut CudaCtx) -> Result<()> {
        self.bind()?;
        ctx.done.record(&ctx.stream).map_err(dev)?;
        ctx.done.synchronize().map_err(dev)
    }

    fn alloc_zeroed(&self, len: usize) -> Result<CudaBuf> {
        self.bind()?;
        let mem = self
            .alloc
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| match dev(e) {
                KernelError::OutOfMemory { .. } => KernelError::OutOfMemory { requested: len * 4 },
                other => other,
            })?;
        // Any lane may use the buffer next; it must exist (and be zero) first.
        self.alloc.synchronize().map_err(dev)?;
        Ok(CudaBuf { mem, len })
    }

    fn buf_len(&self, buf: &CudaBuf) -> usize {
        buf.len
    }

    fn upload(&self, ctx: &mut CudaCtx, src: &[f32], dst: ViewMut<'_, CudaBuf>) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let d = view_mut_ptr("upload", "dst", dst, src.len(), &ctx.stream)?;
        // SAFETY: `d` holds `src.len()` elements. A pageable source is copied
        // out before the call returns, so `src` may go away afterwards.
        unsafe { drv::memcpy_htod_async(d, src, ctx.stream.cu_stream()) }.map_err(dev)
    }

    fn download(&self, ctx: &mut CudaCtx, src: View<'_, CudaBuf>, dst: &mut [f32]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = view_ptr("download", "src", src, dst.len(), &ctx.stream)?;
        // Through a pinned buffer: swap-outs are the big downloads, and
        // pinned memory copies at full bus speed.
        if ctx.staging.as_ref().is_none_or(|p| p.len() < dst.len()) {
            let len = dst.len().next_power_of_two().max(1 << 16);
            // SAFETY: the contents are written by the copy below before reading.
            let pinned = unsafe { self.cu.alloc_pinned_with_flags::<f32>(len, 0) }.map_err(dev)?;
            ctx.staging = Some(pinned);
        }
        let staging = ctx.staging.as_mut().expect("staging buffer was just made");
        let host = staging.as_mut_ptr().map_err(dev)?;
        // SAFETY: the staging buffer holds at least `dst.len()` elements and
        // is owned by this context; the stream is synchronised before reading.
        unsafe {
            let window = std::slice::from_raw_parts_mut(host, dst.len());
            drv::memcpy_dtoh_async(window, s, ctx.stream.cu_stream()).map_err(dev)?;
            ctx.stream.synchronize().map_err(dev)?;
            dst.copy_from_slice(window);
        }
        Ok(())
    }

    fn copy(
        &self,
        ctx: &mut CudaCtx,
        len: usize,
        src: View<'_, CudaBuf>,
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = view_ptr("copy", "src", src, len, &ctx.stream)?;
        let d = view_mut_ptr("copy", "dst", dst, len, &ctx.stream)?;
        // SAFETY: both ranges were checked.
        unsafe { drv::memcpy_dtod_async(d, s, len * 4, ctx.stream.cu_stream()) }.map_err(dev)
    }

    fn fill(
        &self,
        ctx: &mut CudaCtx,
        len: usize,
        value: f32,
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let d = view_mut_ptr("fill", "dst", dst, len, &ctx.stream)?;
        // SAFETY: the range was checked.
        unsafe { sys::cuMemsetD32Async(d, value.to_bits(), len, ctx.stream.cu_stream()) }
            .result()
            .map_err(dev)
    }

    fn gemm(
        &self,
        ctx: &mut CudaCtx,
        g: &Gemm,
        a: View<'_, CudaBuf>,
        b: View<'_, CudaBuf>,
        c: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if g.batch == 0 || g.m == 0 || g.n == 0 {
            return Ok(());
        }
        if g.batch > 1 && g.stride_c < g.m * g.n {
            return Err(shape_err(
                "gemm",
                "batched outputs overlap (stride_c < m * n)",
            ));
        }
        self.bind()?;
        let (ea, eb, ec) = g.extents();
        let s = &ctx.stream;
        let pa = view_ptr("gemm", "A", a, ea, s)? as *const f32;
        let pb = view_ptr("gemm", "B", b, eb, s)? as *const f32;
        let pc = view_mut_ptr("gemm", "C", c, ec, s)? as *mut f32;
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
        // swap the operands and keep each one's own transpose flag.
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let lda = if g.trans_a { g.m } else { g.k } as i32;
        let ldb = if g.trans_b { g.k } else { g.n } as i32;
        let (m, n, k) = (g.n as i32, g.m as i32, g.k as i32);
        let h = *ctx.blas.handle();
        // SAFETY: the three extents were checked; alpha and beta are host
        // scalars, read before the call returns.
        unsafe {
            if g.batch == 1 {
                blas::sgemm(
                    h,
                    op(g.trans_b),
                    op(g.trans_a),
                    m,
                    n,
                    k,
                    &g.alpha,
                    pb,
                    ldb,
                    pa,
                    lda,
                    &g.beta,
                    pc,
                    g.n as i32,
                )
            } else {
                blas::sgemm_strided_batched(
                    h,
                    op(g.trans_b),
                    op(g.trans_a),
                    m,
                    n,
                    k,
                    &g.alpha,
                    pb,
                    ldb,
                    g.stride_b as i64,
                    pa,
                    lda,
                    g.stride_a as i64,
                    &g.beta,
                    pc,
                    g.n as i32,
                    g.stride_c as i64,
                    g.batch as i32,
                )
            }
        }
        .map_err(blas_err)
    }

    fn gather_rows(
        &self,
        ctx: &mut CudaCtx,
        cols: usize,
        idx: &[u32],
        src: View<'_, CudaBuf>,
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if idx.is_empty() || cols == 0 {
            return Ok(());
        }
        let rows = (src.buf.len - src.off.min(src.buf.len)) / cols;
        if let Some(&bad) = idx.iter().find(|&&i| i as usize >= rows) {
            return Err(shape_err(
                "gather_rows",
                format!("row index {bad} >= {rows} rows"),
            ));
        }
        self.bind()?;
        let s = &ctx.stream;
        let ps = view_ptr("gather_rows", "src", src, rows * cols, s)?;
        let pd = view_mut_ptr("gather_rows", "dst", dst, idx.len() * cols, s)?;
        if ctx.idx.as_ref().is_none_or(|b| b.len() < idx.len()) {
            let len = idx.len().next_power_of_two().max(1024);
            ctx.idx = Some(s.alloc_zeros::<u32>(len).map_err(dev)?);
        }
        let ib = ctx.idx.as_ref().expect("index buffer was just made");
        let (pi, _no_sync) = ib.device_ptr(s);
        // SAFETY: the index buffer holds at least `idx.len()` entries; a
        // pageable source is copied out before the call returns.
        unsafe { drv::memcpy_htod_async(pi, idx, s.cu_stream()) }.map_err(dev)?;
        let (nrows, cols) = (idx.len() as u64, cols as u64);
        launch!(
            s,
            &self.kernels.gather_rows,
            grid(idx.len() * cols as usize, 1),
            &nrows,
            &cols,
            &pi,
            &ps,
            &pd
        )
    }

    fn bias_add(
        &self,
        ctx: &mut CudaCtx,
        shape: Batched,
        bias_stride: usize,
        x: ViewMut<'_, CudaBuf>,
        bias: View<'_, CudaBuf>,
    ) -> Result<()> {
        if shape.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let nb = (shape.slots - 1) * bias_stride + shape.cols;
        let pb = view_ptr("bias_add", "bias", bias, nb, s)?;
        let px = view_mut_ptr("bias_add", "x", x, shape.len(), s)?;
        let (sl, r, c, bs) = (
            shape.slots as u64,
            shape.rows as u64,
            shape.cols as u64,
            bias_stride as u64,
        );
        launch!(
            s,
            &self.kernels.bias_add,
            grid(shape.len(), 1),
            &sl,
            &r,
            &c,
            &bs,
            &px,
            &pb
        )
    }

    fn col_sum(
        &self,
        ctx: &mut CudaCtx,
        shape: Batched,
        db_stride: usize,
        dy: View<'_, CudaBuf>,
        db: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if shape.slots == 0 || shape.cols == 0 {
            return Ok(());
        }
        if shape.slots > 1 && db_stride < shape.cols {
            return Err(shape_err("col_sum", "db_stride < cols"));
        }
        self.bind()?;
        let s = &ctx.stream;
        let pdy = view_ptr("col_sum", "dy", dy, shape.len(), s)?;
        let ndb = (shape.slots - 1) * db_stride + shape.cols;
        let pdb = view_mut_ptr("col_sum", "db", db, ndb, s)?;
        let (sl, r, c, st) = (
            shape.slots as u64,
            shape.rows as u64,
            shape.cols as u64,
            db_stride as u64,
        );
        launch!(
            s,
            &self.kernels.col_sum,
            grid(shape.slots * shape.cols, 1),
            &sl,
            &r,
            &c,
            &st,
            &pdy,
            &pdb
        )
    }

    fn activation(
        &self,
        ctx: &mut CudaCtx,
        act: Activation,
        n: usize,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr("activation", "x", x, n, s)?;
        let py = view_mut_ptr("activation", "y", y, n, s)?;
        let (code, n64) = (act_code(act), n as u64);
        launch!(
            s,
            &self.kernels.activation,
            grid(n, 1),
            &code,
            &n64,
            &px,
            &py
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn activation_backward(
        &self,
        ctx: &mut CudaCtx,
        act: Activation,
        n: usize,
        x: View<'_, CudaBuf>,
        y: View<'_, CudaBuf>,
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "activation_backward";
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let (px, py, pdy) = (
            view_ptr(OP, "x", x, n, s)?,
            view_ptr(OP, "y", y, n, s)?,
            view_ptr(OP, "dy", dy, n, s)?,
        );
        let pdx = view_mut_ptr(OP, "dx", dx, n, s)?;
        let (code, n64) = (act_code(act), n as u64);
        launch!(
            s,
            &self.kernels.activation_backward,
            grid(n, 1),
            &code,
            &n64,
            &px,
            &py,
            &pdy,
            &pdx
        )
    }

    fn dropout(
        &self,
        ctx: &mut CudaCtx,
        per_slot: usize,
        slots: &[DropoutSlot],
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        self.dropout_like("dropout", ctx, per_slot, slots, x, y)
    }

    fn dropout_backward(
        &self,
        ctx: &mut CudaCtx,
        per_slot: usize,
        slots: &[DropoutSlot],
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        self.dropout_like("dropout_backward", ctx, per_slot, slots, dy, dx)
    }

    fn softmax_xent(
        &self,
        ctx: &mut CudaCtx,
        shape: Batched,
        label_stride: usize,
        logits: View<'_, CudaBuf>,
        labels: View<'_, CudaBuf>,
        dlogits: Option<ViewMut<'_, CudaBuf>>,
        stats: ViewMut<'_, CudaBuf>,
        accumulate: bool,
    ) -> Result<()> {
        let k = self.kernels.clone();
        self.loss(
            "softmax_xent",
            &k.softmax_xent,
            ctx,
            shape,
            label_stride,
            shape.rows,
            [logits, labels],
            dlogits,
            stats,
            accumulate,
        )
    }

    fn mse(
        &self,
        ctx: &mut CudaCtx,
        shape: Batched,
        target_stride: usize,
        pred: View<'_, CudaBuf>,
        target: View<'_, CudaBuf>,
        dpred: Option<ViewMut<'_, CudaBuf>>,
        stats: ViewMut<'_, CudaBuf>,
        accumulate: bool,
    ) -> Result<()> {
        let k = self.kernels.clone();
        self.loss(
            "mse",
            &k.mse,
            ctx,
            shape,
            target_stride,
            shape.per_slot(),
            [pred, target],
            dpred,
            stats,
            accumulate,
        )
    }

    fn sgd_step(
        &self,
        ctx: &mut CudaCtx,
        n: usize,
        slots: &[SgdSlot],
        params: ViewMut<'_, CudaBuf>,
        grads: View<'_, CudaBuf>,
        velocity: Option<ViewMut<'_, CudaBuf>>,
    ) -> Result<()> {
        const OP: &str = "sgd_step";
        let total = n * slots.len();
        if velocity.is_none() && slots.iter().any(|s| s.momentum != 0.0) {
            return Err(shape_err(
                OP,
                "a slot has momentum but no velocity buffer was given",
            ));
        }
        if total == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let pp = view_mut_ptr(OP, "params", params, total, s)?;
        let pg = view_ptr(OP, "grads", grads, total, s)?;
        let pv = velocity
            .map(|v| view_mut_ptr(OP, "velocity", v, total, s))
            .transpose()?;
        let n64 = n as u64;
        for (c, chunk) in slots.chunks(MAX_SLOTS).enumerate() {
            let off = (c * MAX_SLOTS * n * 4) as u64;
            let ps = SlotParams::pack(chunk, params::sgd);
            let (p, g, v) = (pp + off, pg + off, pv.map_or(0, |v| v + off));
            launch!(
                s,
                &self.kernels.sgd_step,
                grid(n, chunk.len()),
                &n64,
                &ps,
                &p,
                &g,
                &v
            )?;
        }
        Ok(())
    }

    fn adam_step(
        &self,
        ctx: &mut CudaCtx,
        n: usize,
        slots: &[AdamSlot],
        params: ViewMut<'_, CudaBuf>,
        grads: View<'_, CudaBuf>,
        m: ViewMut<'_, CudaBuf>,
        v: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "adam_step";
        if let Some(s) = slots.iter().find(|s| s.step == 0) {
            return Err(shape_err(
                OP,
                format!("step must start at 1, got {}", s.step),
            ));
        }
        let total = n * slots.len();
        if total == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let pp = view_mut_ptr(OP, "params", params, total, s)?;
        let pg = view_ptr(OP, "grads", grads, total, s)?;
        let pm = view_mut_ptr(OP, "m", m, total, s)?;
        let pv = view_mut_ptr(OP, "v", v, total, s)?;
        let n64 = n as u64;
        for (c, chunk) in slots.chunks(MAX_SLOTS).enumerate() {
            let off = (c * MAX_SLOTS * n * 4) as u64;
            let ps = SlotParams::pack(chunk, params::adam);
            let (p, g, m, v) = (pp + off, pg + off, pm + off, pv + off);
            launch!(
                s,
                &self.kernels.adam_step,
                grid(n, chunk.len()),
                &n64,
                &ps,
                &p,
                &g,
                &m,
                &v
            )?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// Dropout forward and backward: the same kernel, the mask recomputed.
    fn dropout_like(
        &self,
        op: &'static str,
        ctx: &mut CudaCtx,
        per_slot: usize,
        slots: &[DropoutSlot],
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        check_dropout(op, slots)?;
        let n = per_slot * slots.len();
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr(op, "x", x, n, s)?;
        let py = view_mut_ptr(op, "y", y, n, s)?;
        let per = per_slot as u64;
        for (c, chunk) in slots.chunks(MAX_SLOTS).enumerate() {
            let off = (c * MAX_SLOTS * per_slot * 4) as u64;
            let ps = SlotParams::pack(chunk, params::dropout);
            let (x, y) = (px + off, py + off);
            launch!(
                s,
                &self.kernels.dropout,
                grid(per_slot, chunk.len()),
                &per,
                &ps,
                &x,
                &y
            )?;
        }
        Ok(())
    }

    /// The losses: one block per slot. `target_len` is the per-slot length
    /// of the labels (cross-entropy) or targets (MSE).
    #[allow(clippy::too_many_arguments)]
    fn loss(
        &self,
        op: &'static str,
        f: &CudaFunction,
        ctx: &mut CudaCtx,
        shape: Batched,
        target_stride: usize,
        target_len: usize,
        [pred, target]: [View<'_, CudaBuf>; 2],
        grad: Option<ViewMut<'_, CudaBuf>>,
        stats: ViewMut<'_, CudaBuf>,
        accumulate: bool,
    ) -> Result<()> {
        if shape.slots == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let pp = view_ptr(op, "pred", pred, shape.len(), s)?;
        let nt = (shape.slots - 1) * target_stride + target_len;
        let pt = view_ptr(op, "target", target, nt, s)?;
        let pg = grad
            .map(|g| view_mut_ptr(op, "grad", g, shape.len(), s))
            .transpose()?
            .unwrap_or(0);
        let ps = view_mut_ptr(op, "stats", stats, shape.slots * STATS_LEN, s)?;
        let (r, c, ts, acc) = (
            shape.rows as u64,
            shape.cols as u64,
            target_stride as u64,
            accumulate as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: (shape.slots as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(s, f, cfg, &r, &c, &ts, &pp, &pt, &pg, &ps, &acc)
    }
}
