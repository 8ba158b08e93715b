//! The CUDA backend, through cudarc: cuBLAS for GEMM, NVRTC-compiled
//! kernels (`kernels/cu/ops.cu`) for everything else.
//!
//! # Design
//!
//! * **One context per lane.** A [`CudaCtx`] owns one stream, one cuBLAS
//!   handle bound to it with a fixed workspace, a fixed pinned staging
//!   buffer for downloads (swap-out and metrics, in chunks), and a pinned
//!   buffer for the step block. A lane's host thread is the thread that
//!   drives its context, so [`Backend::enter`] runs the closure in place.
//! * **We order the streams.** cudarc's automatic event tracking is turned
//!   off: each buffer is used by one lane at a time, and the Salus core
//!   hands buffers between lanes only at iteration boundaries, after
//!   [`Backend::sync`]. Tracking cost about 20% on small trials.
//! * **Events signal iteration ends.** [`Backend::sync`] records an event
//!   with blocking sync on the lane's stream and waits on it, so the lane
//!   thread sleeps instead of spinning, and the core's scheduling loop,
//!   which runs elsewhere, never waits on the device.
//! * **Memory.** [`CudaBuf`] owns its allocation: from the driver's
//!   stream-ordered pool (`cuMemAllocAsync`) on one allocation stream,
//!   synchronised after each allocation so any lane may use the buffer
//!   next, or from `cuMemAlloc` where the pool does not work (some
//!   sandboxes). Its `Drop` binds the context before freeing. How much the
//!   trials may take is the ledger's business: [`Backend::memory_bytes`]
//!   reports the device's free memory at start-up.
//! * **Graphs.** One iteration's launches can be captured on a lane's
//!   stream (thread-local mode) and replayed ([`Backend::begin_capture`]);
//!   per-step values come from the step block, and cuBLAS uses the lane's
//!   fixed workspace, so nothing inside an iteration allocates.
//! * **A second stream for what may overlap.** Each context also owns a
//!   side stream: [`Backend::beside`] forks it from the lane's stream with
//!   an event and queues its closure there (the optimizer step of a layer
//!   whose backward pass is done), and [`Backend::join_beside`], `sync`
//!   and the end of a capture join it back. Inside a capture the fork and
//!   join become graph edges.
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
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaStream, DriverError, LaunchConfig,
    PushKernelArg,
};

use crate::backend::{Backend, DeviceKind, Moments, View, ViewMut, at_mut};
use crate::error::{
    KernelError, Result, check_augment, check_batch_norm, check_classes, check_conv, check_dropout,
    check_gemm, check_gemm_grouped, check_param_run, check_pool, check_range, shape_err,
};
use crate::ops::{
    ADAM_STEP_WORDS, Activation, ActivationOp, AdamSlot, AugmentSlot, BatchNorm, Batched, Conv2d,
    DROPOUT_STEP_WORDS, DropoutSlot, Gemm, GroupedGemm, Loss, ParamRun, Pool2d, PoolKind,
    Precision, STATS_LEN, SgdSlot, Slots,
};
use module::KernelSet;
pub use module::{MAX_SLOTS, OPS_CU, Target};
use params::{ConvGeom, SlotParams};

const THREADS: u32 = 256;
/// Enough blocks to fill an H200 several times; the kernels stride over the rest.
const MAX_BLOCKS: usize = 8192;
/// A lane's pinned staging buffer for downloads, in `f32`s (32 MiB).
/// Larger downloads go through it in chunks, so a swap-out of gigabytes
/// needs no more pinned memory than this.
pub const STAGING_ELEMS: usize = 8 << 20;
/// A lane's cuBLAS workspace (NVIDIA's recommendation for Hopper is 32 MiB).
/// Fixed, so that a captured GEMM never allocates and never moves.
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// The hardware work queues a CUDA context gets when the user has not
/// chosen: the driver's default is 8, and streams beyond that share queues,
/// so independent lanes wait on each other's launches. 32 is the driver's
/// maximum.
pub const DEVICE_CONNECTIONS: &str = "32";

/// Sets `CUDA_DEVICE_MAX_CONNECTIONS` to [`DEVICE_CONNECTIONS`] unless it is
/// set already. The driver reads it when a context is created.
///
/// # Safety
///
/// It writes the environment: call it before any other thread exists.
pub unsafe fn prefer_device_connections() {
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // SAFETY: the caller guarantees no other thread reads the environment.
        unsafe { std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", DEVICE_CONNECTIONS) };
    }
}

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

/// For `map_err`: a failed driver call, named, with the driver's error as
/// its source; running out of memory keeps its own variant.
fn dev(call: &'static str) -> impl FnOnce(DriverError) -> KernelError {
    move |e| {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            KernelError::OutOfMemory { requested: 0 }
        } else {
            KernelError::device(call, e)
        }
    }
}

/// For `map_err`: a failed cuBLAS call, named, with cuBLAS' error as its source.
fn blas_err(call: &'static str) -> impl FnOnce(cudarc::cublas::result::CublasError) -> KernelError {
    move |e| KernelError::device(call, e)
}

/// Device 0 for a test, or `None` when the test is skipped on CUDA; the
/// outcome is recorded (see [`crate::device_tests`]).
#[doc(hidden)]
pub fn device_for_test(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => crate::device_tests::record(test, "cuda", None).then_some(b),
        Err(e) => {
            crate::device_tests::record(test, "cuda", Some(&e.to_string()));
            None
        }
    }
}

/// Where a device's memory comes from, shared by its buffers.
struct Memory {
    cu: Arc<CudaContext>,
    /// The stream allocations and pool frees are ordered on.
    alloc: Arc<CudaStream>,
    /// The stream-ordered pool works here; else `cuMemAlloc`/`cuMemFree`.
    pool: bool,
}

/// One CUDA device.
#[derive(Clone)]
pub struct CudaBackend {
    cu: Arc<CudaContext>,
    kernels: Arc<KernelSet>,
    mem: Arc<Memory>,
    name: String,
    free_at_start: usize,
    /// Why pinned host memory cannot be had, if it cannot: downloads and
    /// step blocks then copy from pageable memory.
    no_pinned: Option<String>,
    /// Why the stream-ordered pool cannot be used, if it cannot.
    no_pool: Option<String>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.name)
    }
}

impl CudaBackend {
    /// Opens device `ordinal`, compiling the kernels on first use. Tries the
    /// stream-ordered memory pool and pinned host memory, and falls back
    /// (`cuMemAlloc`, pageable copies) where either fails: see [`Self::notes`].
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = probe().map_err(KernelError::Unavailable)?;
        if ordinal >= count {
            return Err(KernelError::Unavailable(format!(
                "cuda:{ordinal} does not exist; this machine has {count} CUDA device(s), cuda:0..cuda:{}",
                count - 1
            )));
        }
        let cu = CudaContext::new(ordinal).map_err(dev("cuCtxCreate"))?;
        // SAFETY: every buffer is used by one stream at a time, and lanes
        // hand buffers over only after `sync` (see the module docs).
        unsafe { cu.disable_event_tracking() };
        let kernels = module::kernels(&cu)?;
        let alloc = cu.new_stream().map_err(dev("cuStreamCreate"))?;
        let no_pool = try_pool(&cu, &alloc).err();
        if no_pool.is_none() {
            keep_pool_memory(&cu);
        }
        let no_pinned = Pinned::new(&cu, 1 << 20).err().map(|e| e.to_string());
        let name = cu.name().map_err(dev("cuDeviceGetName"))?;
        let (free, _total) = cu.mem_get_info().map_err(dev("cuMemGetInfo"))?;
        Ok(CudaBackend {
            mem: Arc::new(Memory {
                cu: cu.clone(),
                alloc,
                pool: no_pool.is_none(),
            }),
            cu,
            kernels,
            name: format!("cuda:{ordinal} ({name})"),
            free_at_start: free,
            no_pinned,
            no_pool,
        })
    }

    fn bind(&self) -> Result<()> {
        self.cu.bind_to_thread().map_err(dev("cuCtxSetCurrent"))
    }

    /// What this device runs with, one line each: the kernels' target and
    /// versions, the memory pool and pinned memory (or their fallbacks).
    pub fn notes(&self) -> Vec<String> {
        vec![
            self.kernels.target.to_string(),
            match &self.no_pool {
                None => "memory: stream-ordered pool (cuMemAllocAsync)".into(),
                Some(why) => format!("memory: cuMemAlloc (the stream-ordered pool failed: {why})"),
            },
            match &self.no_pinned {
                None => format!(
                    "copies: pinned staging, up to {} MiB per lane",
                    (STAGING_ELEMS * 4) >> 20
                ),
                Some(why) => format!("copies: pageable (pinned host memory failed: {why})"),
            },
        ]
    }
}

/// Whether a stream-ordered allocation works on this device.
fn try_pool(cu: &Arc<CudaContext>, s: &Arc<CudaStream>) -> std::result::Result<(), String> {
    if !cu.has_async_alloc() {
        return Err("the device reports no memory pool support".into());
    }
    // SAFETY: a 1 MiB allocation freed at once on the same stream.
    unsafe {
        let p = drv::malloc_async(s.cu_stream(), 1 << 20).map_err(|e| e.to_string())?;
        drv::free_async(p, s.cu_stream()).map_err(|e| e.to_string())?;
    }
    s.synchronize().map_err(|e| e.to_string())
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

/// A device buffer of `f32`, owning its allocation.
///
/// **Rule: a buffer is dropped only after every lane that used it has
/// synced** ([`Backend::sync`]). Its memory goes back to the pool on the
/// allocation stream, which is not ordered against the lanes' streams, so
/// a kernel still queued on a lane could otherwise write into memory that
/// the pool has already handed to another job. The Salus core syncs a lane
/// after every step, failed or not.
pub struct CudaBuf {
    ptr: sys::CUdeviceptr,
    len: usize,
    mem: Arc<Memory>,
}

impl CudaBuf {
    fn ptr(&self, off: usize) -> u64 {
        self.ptr + (off * 4) as u64
    }
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        // The driver frees in the context current on this thread, which may
        // be none (a thread that never bound it) or another device's.
        let bound = self.mem.cu.bind_to_thread();
        // SAFETY: `ptr` came from the matching allocator and is freed once;
        // by the rule above no queued work uses it.
        let freed = bound.and_then(|_| unsafe {
            if self.mem.pool {
                drv::free_async(self.ptr, self.mem.alloc.cu_stream())
            } else {
                drv::free_sync(self.ptr)
            }
        });
        if let Err(e) = freed {
            eprintln!(
                "warning: freeing {} bytes of device memory failed: {e}",
                self.len * 4
            );
        }
    }
}

/// Page-locked host memory, owned; freed with its context bound.
struct Pinned {
    ptr: *mut f32,
    len: usize,
    cu: Arc<CudaContext>,
}

// SAFETY: the pointer is owned by this value and used by one lane at a time.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(cu: &Arc<CudaContext>, len: usize) -> std::result::Result<Self, DriverError> {
        cu.bind_to_thread()?;
        // SAFETY: a fresh allocation of `len` f32s, freed in Drop.
        let ptr = unsafe { drv::malloc_host(len * 4, 0) }?.cast::<f32>();
        Ok(Pinned {
            ptr,
            len,
            cu: cu.clone(),
        })
    }
    fn slice(&mut self, n: usize) -> &mut [f32] {
        // SAFETY: `n <= len` is checked by the callers' chunking.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, n.min(self.len)) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.cu.bind_to_thread();
        // SAFETY: allocated by malloc_host and freed once.
        let _ = unsafe { drv::free_host(self.ptr.cast()) };
    }
}

/// One captured iteration, instantiated, and the stream it replays on.
pub struct LaneGraph {
    graph: CudaGraph,
    stream: usize,
}

// SAFETY: a graph is replayed by one lane at a time, with its context bound
// (`CudaGraph` binds it for launch and destruction).
unsafe impl Send for LaneGraph {}

/// A lane's execution context: stream, cuBLAS handle, staging buffers.
pub struct CudaCtx {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// The cuBLAS workspace, fixed for the life of the context.
    _blas_workspace: CudaBuf,
    done: CudaEvent,
    /// [`Backend::sync_previous`]'s two marks, used in turn; `mark` is the
    /// next to record.
    marks: [CudaEvent; 2],
    mark: usize,
    /// Downloads, in chunks of its size (at most [`STAGING_ELEMS`]); made
    /// on first use; `None` where pinned memory cannot be had.
    staging: Option<Pinned>,
    /// The step block's host side, and the event of its last copy (the
    /// buffer is not rewritten before that copy has been made).
    step: Option<Pinned>,
    step_copied: CudaEvent,
    /// Pinning failed once here: copies stay pageable.
    pinning_failed: bool,
    /// [`Backend::beside`]'s stream, its fork from `stream` and its join
    /// back, and whether work queued on it has not been joined yet.
    side: Arc<CudaStream>,
    fork: CudaEvent,
    joined: CudaEvent,
    side_pending: bool,
    /// The device pointer arrays of grouped GEMMs ([`GROUPED_MAX`]
    /// members' A, B and C), made on first use and never moved: a captured
    /// graph writes and reads them in place.
    grouped: Option<CudaBuf>,
    /// cuBLAS's grouped GEMM is missing or failed here once: grouped GEMMs
    /// run one product per member.
    grouped_off: bool,
}

/// Members of one cuBLAS grouped GEMM; a larger group runs in chunks.
const GROUPED_MAX: usize = 1024;

fn view_ptr(
    op: &'static str,
    what: &'static str,
    v: View<'_, CudaBuf>,
    n: usize,
    _s: &CudaStream,
) -> Result<u64> {
    check_range(op, what, v.off, n, v.buf.len)?;
    Ok(v.buf.ptr(v.off))
}

fn view_mut_ptr(
    op: &'static str,
    what: &'static str,
    v: ViewMut<'_, CudaBuf>,
    n: usize,
    _s: &CudaStream,
) -> Result<u64> {
    check_range(op, what, v.off, n, v.buf.len)?;
    Ok(v.buf.ptr(v.off))
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
        unsafe { b.launch($cfg) }.map(|_| ()).map_err(dev(concat!("launching ", stringify!($f))))
    }};
}

/// Slots per batch-norm launch: grid.y is at most 65535.
const MAX_BLOCKS_Y: usize = 65535;

/// `(first slot, slots)` of each batch-norm launch.
fn slot_chunks(slots: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..slots)
        .step_by(MAX_BLOCKS_Y)
        .map(move |first| (first, (slots - first).min(MAX_BLOCKS_Y)))
}

/// Batch norm's reductions: `BN_COLS x BN_ROWS` threads per block (as in
/// ops.cu), a block per 32 channels of a slot.
fn bn_grid(cols: usize, slots: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (cols.div_ceil(32) as u32, slots as u32, 1),
        block_dim: (32, 16, 1),
        shared_mem_bytes: 0,
    }
}

fn pool_code(k: PoolKind) -> i32 {
    match k {
        PoolKind::Max => 0,
        PoolKind::Avg => 1,
    }
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
    type Graph = LaneGraph;

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
        let stream = self.cu.new_stream().map_err(dev("cuStreamCreate"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(blas_err("cublasCreate"))?;
        let workspace = self.alloc_zeroed(BLAS_WORKSPACE_BYTES / 4)?;
        // SAFETY: the workspace outlives the handle (both in the context,
        // the handle dropped first) and is used by this stream only.
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                workspace.ptr as *mut std::ffi::c_void,
                BLAS_WORKSPACE_BYTES,
            )
            .result()
            .map_err(blas_err("cublasSetWorkspace"))?;
        }
        let event = || {
            self.cu
                .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
                .map_err(dev("cuEventCreate"))
        };
        // Events that only order streams: no timing, no blocking sync.
        let order = || self.cu.new_event(None).map_err(dev("cuEventCreate"));
        Ok(CudaCtx {
            side: self.cu.new_stream().map_err(dev("cuStreamCreate"))?,
            fork: order()?,
            joined: order()?,
            side_pending: false,
            done: event()?,
            marks: [event()?, event()?],
            mark: 0,
            step_copied: event()?,
            // Made on first use, so that a lane that never downloads much
            // pins little (a core starts many lanes).
            staging: None,
            step: None,
            pinning_failed: false,
            grouped: None,
            // SAFETY: only looks the symbol up (cuBLAS 12.5 and later).
            grouped_off: !unsafe {
                cudarc::cublas::sys::culib()
                    .get::<unsafe extern "C" fn()>(b"cublasSgemmGroupedBatched")
                    .is_ok()
            },
            stream,
            blas,
            _blas_workspace: workspace,
        })
    }

    fn host_threads(&self, _ctx: &CudaCtx) {}

    fn enter<R: Send>(&self, _host: &(), f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    fn sync(&self, ctx: &mut CudaCtx) -> Result<()> {
        self.bind()?;
        self.join_beside(ctx)?;
        ctx.done.record(&ctx.stream).map_err(dev("cuEventRecord"))?;
        ctx.done.synchronize().map_err(dev("cuEventSynchronize"))
    }

    fn asynchronous(&self) -> bool {
        true
    }

    fn sync_previous(&self, ctx: &mut CudaCtx) -> Result<()> {
        self.bind()?;
        self.join_beside(ctx)?;
        let i = ctx.mark;
        ctx.marks[i]
            .record(&ctx.stream)
            .map_err(dev("cuEventRecord"))?;
        ctx.mark ^= 1;
        // An event never recorded is complete: the first call waits for nothing.
        ctx.marks[ctx.mark]
            .synchronize()
            .map_err(dev("cuEventSynchronize"))
    }

    fn alloc_zeroed(&self, len: usize) -> Result<CudaBuf> {
        self.bind()?;
        let bytes = len.max(1) * 4;
        let oom = |e: DriverError| match dev("cuMemAlloc")(e) {
            KernelError::OutOfMemory { .. } => KernelError::OutOfMemory { requested: bytes },
            other => other,
        };
        let s = self.mem.alloc.cu_stream();
        // SAFETY: a fresh allocation of `bytes`, zeroed before any lane sees
        // it: the allocation stream is synchronised before returning.
        let ptr = unsafe {
            if self.mem.pool {
                let p = drv::malloc_async(s, bytes).map_err(oom)?;
                drv::memset_d8_async(p, 0, bytes, s).map_err(dev("cuMemsetD8Async"))?;
                p
            } else {
                let p = drv::malloc_sync(bytes).map_err(oom)?;
                drv::memset_d8_sync(p, 0, bytes).map_err(dev("cuMemsetD8"))?;
                p
            }
        };
        let buf = CudaBuf {
            ptr,
            len,
            mem: self.mem.clone(),
        };
        // Any lane may use the buffer next; it must exist (and be zero) first.
        self.mem
            .alloc
            .synchronize()
            .map_err(dev("cuStreamSynchronize"))?;
        Ok(buf)
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
        unsafe { drv::memcpy_htod_async(d, src, ctx.stream.cu_stream()) }
            .map_err(dev("cuMemcpyHtoDAsync"))
    }

    fn download(&self, ctx: &mut CudaCtx, src: View<'_, CudaBuf>, dst: &mut [f32]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = view_ptr("download", "src", src, dst.len(), &ctx.stream)?;
        let stream = ctx.stream.cu_stream();
        let want = dst.len().next_power_of_two().clamp(1 << 16, STAGING_ELEMS);
        if self.no_pinned.is_none()
            && !ctx.pinning_failed
            && ctx.staging.as_ref().is_none_or(|p| p.len < want)
        {
            // Grows up to STAGING_ELEMS; where pinning fails, pageable copies
            // from then on (not a failed attempt per download).
            ctx.staging = Pinned::new(&self.cu, want).ok();
            ctx.pinning_failed = ctx.staging.is_none();
        }
        let Some(staging) = ctx.staging.as_mut() else {
            // Pageable: the driver stages it, and returns when it is done.
            // SAFETY: `s` holds `dst.len()` elements; synchronised below.
            unsafe { drv::memcpy_dtoh_async(dst, s, stream) }.map_err(dev("cuMemcpyDtoHAsync"))?;
            return ctx.stream.synchronize().map_err(dev("cuStreamSynchronize"));
        };
        // Through the fixed pinned buffer, a chunk at a time: pinned memory
        // copies at full bus speed, and its size stays bounded.
        let step = staging.len;
        for (i, chunk) in dst.chunks_mut(step).enumerate() {
            let window = staging.slice(chunk.len());
            let from = s + (i * step * 4) as u64;
            // SAFETY: the window holds `chunk.len()` elements of this
            // context's staging buffer; the stream is synchronised before
            // the window is read or written again.
            unsafe { drv::memcpy_dtoh_async(window, from, stream) }
                .map_err(dev("cuMemcpyDtoHAsync"))?;
            ctx.stream
                .synchronize()
                .map_err(dev("cuStreamSynchronize"))?;
            chunk.copy_from_slice(window);
        }
        Ok(())
    }

    fn stage_step(
        &self,
        ctx: &mut CudaCtx,
        words: &[f32],
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if words.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let d = view_mut_ptr("stage_step", "dst", dst, words.len(), &ctx.stream)?;
        if self.no_pinned.is_none()
            && !ctx.pinning_failed
            && ctx.step.as_ref().is_none_or(|p| p.len < words.len())
        {
            // Made once per context at the size a step needs (the old one
            // may still be read by its last copy).
            ctx.step_copied
                .synchronize()
                .map_err(dev("cuEventSynchronize"))?;
            let len = words.len().next_power_of_two().max(1 << 12);
            ctx.step = Pinned::new(&self.cu, len).ok();
            ctx.pinning_failed = ctx.step.is_none();
        }
        let stream = ctx.stream.cu_stream();
        let Some(pinned) = ctx.step.as_mut() else {
            // SAFETY: a pageable source is copied out before the call returns.
            return unsafe { drv::memcpy_htod_async(d, words, stream) }
                .map_err(dev("cuMemcpyHtoDAsync"));
        };
        // The previous step's copy must have read the buffer before it is rewritten.
        ctx.step_copied
            .synchronize()
            .map_err(dev("cuEventSynchronize"))?;
        let host = pinned.slice(words.len());
        host.copy_from_slice(words);
        // SAFETY: `d` holds `words.len()` elements; the pinned source stays
        // untouched until `step_copied` has passed.
        unsafe { drv::memcpy_htod_async(d, host, stream) }.map_err(dev("cuMemcpyHtoDAsync"))?;
        ctx.step_copied
            .record(&ctx.stream)
            .map_err(dev("cuEventRecord"))
    }

    fn buf_addr(&self, buf: &CudaBuf) -> usize {
        buf.ptr as usize
    }

    fn graphs_supported(&self) -> bool {
        true
    }

    fn begin_capture(&self, ctx: &mut CudaCtx) -> Result<()> {
        // Thread-local: other lanes' threads may allocate and synchronise
        // while this one captures.
        ctx.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(dev("cuStreamBeginCapture"))
    }

    fn beside(
        &self,
        ctx: &mut CudaCtx,
        f: impl FnOnce(&Self, &mut CudaCtx) -> Result<()>,
    ) -> Result<()> {
        self.bind()?;
        ctx.fork.record(&ctx.stream).map_err(dev("cuEventRecord"))?;
        ctx.side.wait(&ctx.fork).map_err(dev("cuStreamWaitEvent"))?;
        ctx.side_pending = true;
        // `f`'s kernels launch on `ctx.stream`: point it at the side stream
        // meanwhile. cuBLAS stays bound to the lane's stream, so `f` should
        // be element-wise kernels only (the optimizers are).
        std::mem::swap(&mut ctx.stream, &mut ctx.side);
        let r = f(self, ctx);
        std::mem::swap(&mut ctx.stream, &mut ctx.side);
        r
    }

    fn beside_overlaps(&self) -> bool {
        true
    }

    fn join_beside(&self, ctx: &mut CudaCtx) -> Result<()> {
        if !ctx.side_pending {
            return Ok(());
        }
        self.bind()?;
        ctx.joined.record(&ctx.side).map_err(dev("cuEventRecord"))?;
        ctx.stream
            .wait(&ctx.joined)
            .map_err(dev("cuStreamWaitEvent"))?;
        ctx.side_pending = false;
        Ok(())
    }

    fn end_capture(&self, ctx: &mut CudaCtx) -> Result<LaneGraph> {
        // A capture must end with every forked stream joined back.
        let joined = self.join_beside(ctx);
        let graph = ctx
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(dev("cuStreamEndCapture"));
        joined?;
        match graph? {
            Some(graph) => Ok(LaneGraph {
                graph,
                stream: ctx.stream.cu_stream() as usize,
            }),
            None => Err(KernelError::Unexpected(
                "the capture recorded nothing".into(),
            )),
        }
    }

    fn replay(&self, ctx: &mut CudaCtx, g: &LaneGraph) -> Result<()> {
        // cudarc launches a graph on the stream it was captured on; its
        // buffers (the lane's workspace among them) belong to that lane.
        if g.stream != ctx.stream.cu_stream() as usize {
            return Err(shape_err(
                "replay",
                "a graph replays only on the lane that captured it",
            ));
        }
        self.bind()?;
        g.graph.launch().map_err(dev("cuGraphLaunch"))
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
        unsafe { drv::memcpy_dtod_async(d, s, len * 4, ctx.stream.cu_stream()) }
            .map_err(dev("cuMemcpyDtoDAsync"))
    }

    fn copy_within(
        &self,
        ctx: &mut CudaCtx,
        len: usize,
        buf: &mut CudaBuf,
        src: usize,
        dst: usize,
    ) -> Result<()> {
        crate::error::check_apart(len, src, dst, buf.len)?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let (s, d) = (buf.ptr(src), buf.ptr(dst));
        // SAFETY: both ranges are in the buffer and apart.
        unsafe { drv::memcpy_dtod_async(d, s, len * 4, ctx.stream.cu_stream()) }
            .map_err(dev("cuMemcpyDtoDAsync"))
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
            .map_err(dev("cuMemsetD32Async"))
    }

    fn gemm(
        &self,
        ctx: &mut CudaCtx,
        g: &Gemm,
        a: View<'_, CudaBuf>,
        b: View<'_, CudaBuf>,
        c: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if !check_gemm(g)? {
            return Ok(());
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
        // cuBLAS wants every leading dimension >= 1, also when k == 0
        // (then C = beta * C, as on the CPU).
        let (lda, ldb, ldc) = g.lds();
        let (lda, ldb, ldc) = (lda.max(1) as i32, ldb.max(1) as i32, ldc.max(1) as i32);
        let (m, n, k) = (g.n as i32, g.m as i32, g.k as i32);
        let h = *ctx.blas.handle();
        if g.precision != Precision::Fp32 {
            // TF32 and BF16: fp32 data in and out, the products on the
            // tensor cores in the lower format, fp32 accumulation.
            use cudarc::cublas::sys::{
                cublasComputeType_t as Compute, cublasGemmAlgo_t, cudaDataType,
            };
            let compute = match g.precision {
                Precision::Tf32 => Compute::CUBLAS_COMPUTE_32F_FAST_TF32,
                _ => Compute::CUBLAS_COMPUTE_32F_FAST_16BF,
            };
            let f32t = cudaDataType::CUDA_R_32F;
            let algo = cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP;
            let (alpha, beta) = (
                &g.alpha as *const f32 as *const std::ffi::c_void,
                &g.beta as *const f32 as *const std::ffi::c_void,
            );
            // SAFETY: as below; the compute type reads fp32 data.
            return unsafe {
                blas::gemm_strided_batched_ex(
                    h,
                    op(g.trans_b),
                    op(g.trans_a),
                    m,
                    n,
                    k,
                    alpha,
                    pb as *const std::ffi::c_void,
                    f32t,
                    ldb,
                    g.stride_b as i64,
                    pa as *const std::ffi::c_void,
                    f32t,
                    lda,
                    g.stride_a as i64,
                    beta,
                    pc as *mut std::ffi::c_void,
                    f32t,
                    ldc,
                    g.stride_c as i64,
                    g.batch as i32,
                    compute,
                    algo,
                )
            }
            .map_err(blas_err("cublasGemmStridedBatchedEx"));
        }
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
                    ldc,
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
                    ldc,
                    g.stride_c as i64,
                    g.batch as i32,
                )
            }
        }
        .map_err(blas_err("cublasSgemm"))
    }

    /// One `cublasSgemmGroupedBatched` per `GROUPED_MAX` members (a
    /// group of one problem per member), its pointer arrays written on the
    /// device by a small kernel so that a captured graph replays it; the
    /// other precisions, or a cuBLAS without it, one product per member.
    fn gemm_grouped(
        &self,
        ctx: &mut CudaCtx,
        g: &GroupedGemm<'_>,
        a: View<'_, CudaBuf>,
        b: View<'_, CudaBuf>,
        c: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        check_gemm_grouped(g)?;
        if ctx.grouped_off || g.base.precision != Precision::Fp32 || g.sizes.len() < 2 {
            return crate::backend::gemm_each(self, ctx, g, a, b, c);
        }
        self.bind()?;
        let (ea, eb, ec) = g.extents();
        let s = ctx.stream.clone();
        let pa = view_ptr("gemm_grouped", "A", a, ea, &s)?;
        let pb = view_ptr("gemm_grouped", "B", b, eb, &s)?;
        let pc = view_mut_ptr("gemm_grouped", "C", at_mut(&mut *c.buf, c.off), ec, &s)?;
        if ctx.grouped.is_none() {
            // Two f32 words per pointer.
            ctx.grouped = Some(self.alloc_zeroed(2 * 3 * GROUPED_MAX)?);
        }
        let arrays = ctx.grouped.as_ref().expect("made above").ptr(0);
        let l = &g.base;
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        for first in (0..g.sizes.len()).step_by(GROUPED_MAX) {
            let sizes = &g.sizes[first..(first + GROUPED_MAX).min(g.sizes.len())];
            let count = sizes.len();
            let at = |base: u64, stride: usize| base + 4 * (first * stride) as u64;
            let (a0, b0, c0) = (at(pa, l.stride_a), at(pb, l.stride_b), at(pc, l.stride_c));
            let (sa, sb, sc, n64) = (
                l.stride_a as u64,
                l.stride_b as u64,
                l.stride_c as u64,
                count as u64,
            );
            launch!(
                s,
                &self.kernels.grouped_pointers,
                grid(count, 1),
                &n64,
                &a0,
                &sa,
                &b0,
                &sb,
                &c0,
                &sc,
                &arrays
            )?;
            // Row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T,
            // as in `gemm`: B's pointers first.
            let ints = |f: fn(&(usize, usize, usize)) -> usize| -> Vec<i32> {
                sizes.iter().map(|x| f(x) as i32).collect()
            };
            let (m, n, k) = (ints(|x| x.1), ints(|x| x.0), ints(|x| x.2));
            // Each member's pitches (the layout's unless it has its own);
            // cuBLAS wants every one >= 1.
            let pitch = |f: fn((usize, usize, usize)) -> usize| -> Vec<i32> {
                (first..first + count)
                    .map(|i| f(g.member(i).lds()).max(1) as i32)
                    .collect()
            };
            let (ta, tb) = (vec![op(l.trans_b); count], vec![op(l.trans_a); count]);
            let (alpha, beta) = (vec![l.alpha; count], vec![l.beta; count]);
            let (la, lb, lc) = (pitch(|p| p.1), pitch(|p| p.0), pitch(|p| p.2));
            let ones = vec![1i32; count];
            let word = 8 * count as u64;
            // SAFETY: every member's extent was checked; the pointer arrays
            // hold `count` pointers each, written above on this stream; the
            // host arrays are read before the call returns.
            let status = unsafe {
                cudarc::cublas::sys::cublasSgemmGroupedBatched(
                    *ctx.blas.handle(),
                    ta.as_ptr(),
                    tb.as_ptr(),
                    m.as_ptr(),
                    n.as_ptr(),
                    k.as_ptr(),
                    alpha.as_ptr(),
                    (arrays + word) as *const *const f32,
                    la.as_ptr(),
                    arrays as *const *const f32,
                    lb.as_ptr(),
                    beta.as_ptr(),
                    (arrays + 2 * word) as *const *mut f32,
                    lc.as_ptr(),
                    count as i32,
                    ones.as_ptr(),
                )
            };
            if let Err(e) = status.result() {
                // Not again on this lane; this call's products one by one.
                ctx.grouped_off = true;
                eprintln!(
                    "warning: cublasSgemmGroupedBatched failed ({e:?}); one GEMM per member from now on"
                );
                return crate::backend::gemm_each(self, ctx, g, a, b, c);
            }
        }
        Ok(())
    }

    fn gather_rows(
        &self,
        ctx: &mut CudaCtx,
        cols: usize,
        rows: usize,
        idx: View<'_, CudaBuf>,
        src: View<'_, CudaBuf>,
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "gather_rows";
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let src_rows = (src.buf.len - src.off.min(src.buf.len)) / cols;
        let pi = view_ptr(OP, "idx", idx, rows, s)?;
        let ps = view_ptr(OP, "src", src, src_rows * cols, s)?;
        let pd = view_mut_ptr(OP, "dst", dst, rows * cols, s)?;
        let (nrows, cols, src_rows) = (rows as u64, cols as u64, src_rows as u64);
        launch!(
            s,
            &self.kernels.gather_rows,
            grid(rows * cols as usize, 1),
            &nrows,
            &cols,
            &src_rows,
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

    fn bias_activation(
        &self,
        ctx: &mut CudaCtx,
        shape: Batched,
        bias_stride: usize,
        activation: Activation,
        x: ViewMut<'_, CudaBuf>,
        bias: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "bias_activation";
        if shape.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let nb = (shape.slots - 1) * bias_stride + shape.cols;
        let pb = view_ptr(OP, "bias", bias, nb, s)?;
        let px = view_mut_ptr(OP, "x", x, shape.len(), s)?;
        let py = view_mut_ptr(OP, "y", y, shape.len(), s)?;
        let (code, sl, r, c, bs) = (
            act_code(activation),
            shape.slots as u64,
            shape.rows as u64,
            shape.cols as u64,
            bias_stride as u64,
        );
        launch!(
            s,
            &self.kernels.bias_activation,
            grid(shape.len(), 1),
            &code,
            &sl,
            &r,
            &c,
            &bs,
            &px,
            &pb,
            &py
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
        // COLSUM_COLS x COLSUM_ROWS threads per block (ops.cu); slots past
        // the grid's y limit are strided over.
        let cfg = LaunchConfig {
            grid_dim: (
                shape.cols.div_ceil(32) as u32,
                shape.slots.min(65_535) as u32,
                1,
            ),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        launch!(s, &self.kernels.col_sum, cfg, &sl, &r, &c, &st, &pdy, &pdb)
    }

    fn activation(
        &self,
        ctx: &mut CudaCtx,
        op: ActivationOp,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        let (act, n) = (op.activation, op.n);
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

    fn activation_backward(
        &self,
        ctx: &mut CudaCtx,
        op: ActivationOp,
        x: View<'_, CudaBuf>,
        y: View<'_, CudaBuf>,
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "activation_backward";
        let (act, n) = (op.activation, op.n);
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
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CudaBuf>,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        self.dropout_like("dropout", ctx, slots, steps, x, y)
    }

    fn dropout_backward(
        &self,
        ctx: &mut CudaCtx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CudaBuf>,
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        self.dropout_like("dropout_backward", ctx, slots, steps, dy, dx)
    }

    fn softmax_xent(
        &self,
        ctx: &mut CudaCtx,
        loss: &Loss,
        logits: View<'_, CudaBuf>,
        labels: View<'_, CudaBuf>,
        dlogits: Option<ViewMut<'_, CudaBuf>>,
        stats: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        check_classes(loss.shape)?;
        let k = self.kernels.clone();
        let kernel = LossKernel {
            name: "softmax_xent",
            f: &k.softmax_xent,
            target_len: loss.shape.rows,
        };
        self.loss(kernel, ctx, loss, [logits, labels], dlogits, stats)
    }

    fn mse(
        &self,
        ctx: &mut CudaCtx,
        loss: &Loss,
        pred: View<'_, CudaBuf>,
        target: View<'_, CudaBuf>,
        dpred: Option<ViewMut<'_, CudaBuf>>,
        stats: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        let k = self.kernels.clone();
        let kernel = LossKernel {
            name: "mse",
            f: &k.mse,
            target_len: loss.shape.per_slot(),
        };
        self.loss(kernel, ctx, loss, [pred, target], dpred, stats)
    }

    fn sgd_step(
        &self,
        ctx: &mut CudaCtx,
        run: ParamRun<'_, SgdSlot>,
        params: ViewMut<'_, CudaBuf>,
        grads: View<'_, CudaBuf>,
        velocity: Option<ViewMut<'_, CudaBuf>>,
    ) -> Result<()> {
        const OP: &str = "sgd_step";
        check_param_run(OP, &run)?;
        let (n, stride, slots, extent) = (run.len, run.stride, run.settings, run.extent());
        if velocity.is_none() && slots.iter().any(|s| s.momentum != 0.0) {
            return Err(shape_err(
                OP,
                "a slot has momentum but no velocity buffer was given",
            ));
        }
        if n == 0 || slots.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let pp = view_mut_ptr(OP, "params", params, extent, s)?;
        let pg = view_ptr(OP, "grads", grads, extent, s)?;
        let pv = velocity
            .map(|v| view_mut_ptr(OP, "velocity", v, extent, s))
            .transpose()?;
        let (n64, stride64) = (n as u64, stride as u64);
        let slots: Vec<_> = (0..slots.len())
            .map(|i| (slots[i], run.len_of(i)))
            .collect();
        for (c, chunk) in slots.chunks(MAX_SLOTS).enumerate() {
            let off = (c * MAX_SLOTS * stride * 4) as u64;
            let ps = SlotParams::pack(chunk, params::sgd);
            let (p, g, v) = (pp + off, pg + off, pv.map_or(0, |v| v + off));
            launch!(
                s,
                &self.kernels.sgd_step,
                grid(n, chunk.len()),
                &n64,
                &stride64,
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
        run: ParamRun<'_, AdamSlot>,
        scalars: View<'_, CudaBuf>,
        params: ViewMut<'_, CudaBuf>,
        grads: View<'_, CudaBuf>,
        moments: Moments<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "adam_step";
        check_param_run(OP, &run)?;
        let (n, stride, slots, extent) = (run.len, run.stride, run.settings, run.extent());
        if n == 0 || slots.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let psc = view_ptr(OP, "scalars", scalars, slots.len() * ADAM_STEP_WORDS, s)?;
        let pp = view_mut_ptr(OP, "params", params, extent, s)?;
        let pg = view_ptr(OP, "grads", grads, extent, s)?;
        let pm = view_mut_ptr(OP, "m", moments.m, extent, s)?;
        let pv = view_mut_ptr(OP, "v", moments.v, extent, s)?;
        let (n64, stride64) = (n as u64, stride as u64);
        let slots: Vec<_> = (0..slots.len())
            .map(|i| (slots[i], run.len_of(i)))
            .collect();
        for (c, chunk) in slots.chunks(MAX_SLOTS).enumerate() {
            let off = (c * MAX_SLOTS * stride * 4) as u64;
            let ps = SlotParams::pack(chunk, params::adam);
            let sc = psc + (c * MAX_SLOTS * ADAM_STEP_WORDS * 4) as u64;
            let (p, g, m, v) = (pp + off, pg + off, pm + off, pv + off);
            launch!(
                s,
                &self.kernels.adam_step,
                grid(n, chunk.len()),
                &n64,
                &stride64,
                &ps,
                &sc,
                &p,
                &g,
                &m,
                &v
            )?;
        }
        Ok(())
    }

    fn im2col(
        &self,
        ctx: &mut CudaCtx,
        c: &Conv2d,
        x: View<'_, CudaBuf>,
        cols: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "im2col";
        check_conv(OP, c)?;
        if c.input.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr(OP, "x", x, c.input.extent(), s)?;
        let pc = view_mut_ptr(OP, "cols", cols, c.cols_len(), s)?;
        let g = ConvGeom::conv(c);
        launch!(s, &self.kernels.im2col, grid(c.cols_len(), 1), &g, &px, &pc)
    }

    fn col2im(
        &self,
        ctx: &mut CudaCtx,
        c: &Conv2d,
        cols: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
        accumulate: bool,
    ) -> Result<()> {
        const OP: &str = "col2im";
        check_conv(OP, c)?;
        if c.input.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let pc = view_ptr(OP, "cols", cols, c.cols_len(), s)?;
        let pd = view_mut_ptr(OP, "dx", dx, c.input.len(), s)?;
        let (g, acc) = (ConvGeom::conv(c), accumulate as i32);
        launch!(
            s,
            &self.kernels.col2im,
            grid(c.input.len(), 1),
            &g,
            &pc,
            &pd,
            &acc
        )
    }

    fn pool2d(
        &self,
        ctx: &mut CudaCtx,
        p: &Pool2d,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "pool2d";
        check_pool(OP, p)?;
        if p.input.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let n = p.output().len();
        let px = view_ptr(OP, "x", x, p.input.extent(), s)?;
        let py = view_mut_ptr(OP, "y", y, n, s)?;
        let (kind, g) = (pool_code(p.kind), ConvGeom::pool(p));
        launch!(s, &self.kernels.pool2d, grid(n, 1), &kind, &g, &px, &py)
    }

    fn pool2d_backward(
        &self,
        ctx: &mut CudaCtx,
        p: &Pool2d,
        x: View<'_, CudaBuf>,
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "pool2d_backward";
        check_pool(OP, p)?;
        if p.input.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr(OP, "x", x, p.input.extent(), s)?;
        let pdy = view_ptr(OP, "dy", dy, p.output().len(), s)?;
        let pdx = view_mut_ptr(OP, "dx", dx, p.input.len(), s)?;
        let (kind, g) = (pool_code(p.kind), ConvGeom::pool(p));
        launch!(
            s,
            &self.kernels.pool2d_backward,
            grid(p.input.len(), 1),
            &kind,
            &g,
            &px,
            &pdy,
            &pdx
        )
    }

    fn batch_norm_train(
        &self,
        ctx: &mut CudaCtx,
        bn: &BatchNorm,
        x: View<'_, CudaBuf>,
        params: View<'_, CudaBuf>,
        running: ViewMut<'_, CudaBuf>,
        saved: ViewMut<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "batch_norm_train";
        check_batch_norm(OP, bn, true)?;
        let sh = bn.shape;
        if sh.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr(OP, "x", x, sh.len(), s)?;
        let pp = view_ptr(OP, "params", params, bn.params_extent(), s)?;
        let pr = view_mut_ptr(OP, "running", running, bn.running_extent(), s)?;
        let psv = view_mut_ptr(OP, "saved", saved, bn.saved_len(), s)?;
        let py = view_mut_ptr(OP, "y", y, sh.len(), s)?;
        let (rows, cols, rs) = (sh.rows as u64, sh.cols as u64, bn.running_stride as u64);
        for (first, k) in slot_chunks(sh.slots) {
            let (xo, ro, so) = (
                px + 4 * (first * sh.per_slot()) as u64,
                pr + 4 * (first * bn.running_stride) as u64,
                psv + 4 * (first * 2 * sh.cols) as u64,
            );
            launch!(
                s,
                &self.kernels.bn_stats,
                bn_grid(sh.cols, k),
                &rows,
                &cols,
                &rs,
                &bn.momentum,
                &bn.eps,
                &xo,
                &ro,
                &so
            )?;
        }
        let (eval, sl, ps, ss) = (
            0i32,
            sh.slots as u64,
            bn.param_stride as u64,
            2 * sh.cols as u64,
        );
        launch!(
            s,
            &self.kernels.bn_apply,
            grid(sh.len(), 1),
            &eval,
            &sl,
            &rows,
            &cols,
            &ps,
            &ss,
            &bn.eps,
            &px,
            &pp,
            &psv,
            &py
        )
    }

    fn batch_norm_eval(
        &self,
        ctx: &mut CudaCtx,
        bn: &BatchNorm,
        x: View<'_, CudaBuf>,
        params: View<'_, CudaBuf>,
        running: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "batch_norm_eval";
        check_batch_norm(OP, bn, false)?;
        let sh = bn.shape;
        if sh.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr(OP, "x", x, sh.len(), s)?;
        let pp = view_ptr(OP, "params", params, bn.params_extent(), s)?;
        let pr = view_ptr(OP, "running", running, bn.running_extent(), s)?;
        let py = view_mut_ptr(OP, "y", y, sh.len(), s)?;
        let (eval, sl, rows, cols, ps, rs) = (
            1i32,
            sh.slots as u64,
            sh.rows as u64,
            sh.cols as u64,
            bn.param_stride as u64,
            bn.running_stride as u64,
        );
        launch!(
            s,
            &self.kernels.bn_apply,
            grid(sh.len(), 1),
            &eval,
            &sl,
            &rows,
            &cols,
            &ps,
            &rs,
            &bn.eps,
            &px,
            &pp,
            &pr,
            &py
        )
    }

    fn batch_norm_backward(
        &self,
        ctx: &mut CudaCtx,
        bn: &BatchNorm,
        x: View<'_, CudaBuf>,
        params: View<'_, CudaBuf>,
        saved: View<'_, CudaBuf>,
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
        dparams: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "batch_norm_backward";
        check_batch_norm(OP, bn, true)?;
        let sh = bn.shape;
        if sh.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr(OP, "x", x, sh.len(), s)?;
        let pp = view_ptr(OP, "params", params, bn.params_extent(), s)?;
        let psv = view_ptr(OP, "saved", saved, bn.saved_len(), s)?;
        let pdy = view_ptr(OP, "dy", dy, sh.len(), s)?;
        let pdx = view_mut_ptr(OP, "dx", dx, sh.len(), s)?;
        let pdp = view_mut_ptr(OP, "dparams", dparams, bn.params_extent(), s)?;
        let (rows, cols, ps) = (sh.rows as u64, sh.cols as u64, bn.param_stride as u64);
        for (first, k) in slot_chunks(sh.slots) {
            let (xo, so, yo, po) = (
                px + 4 * (first * sh.per_slot()) as u64,
                psv + 4 * (first * 2 * sh.cols) as u64,
                pdy + 4 * (first * sh.per_slot()) as u64,
                pdp + 4 * (first * bn.param_stride) as u64,
            );
            launch!(
                s,
                &self.kernels.bn_backward_reduce,
                bn_grid(sh.cols, k),
                &rows,
                &cols,
                &ps,
                &xo,
                &so,
                &yo,
                &po
            )?;
        }
        let sl = sh.slots as u64;
        launch!(
            s,
            &self.kernels.bn_backward_dx,
            grid(sh.len(), 1),
            &sl,
            &rows,
            &cols,
            &ps,
            &px,
            &pp,
            &psv,
            &pdy,
            &pdp,
            &pdx
        )
    }

    fn add(
        &self,
        ctx: &mut CudaCtx,
        n: usize,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let px = view_ptr("add", "x", x, n, s)?;
        let py = view_mut_ptr("add", "y", y, n, s)?;
        let n64 = n as u64;
        launch!(s, &self.kernels.add, grid(n, 1), &n64, &px, &py)
    }

    fn augment(
        &self,
        ctx: &mut CudaCtx,
        images: &crate::ops::Images,
        slots: &[AugmentSlot],
        steps: View<'_, CudaBuf>,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "augment";
        check_augment(OP, images, slots)?;
        let n = images.len();
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let pst = view_ptr(OP, "steps", steps, slots.len() * DROPOUT_STEP_WORDS, s)?;
        let px = view_ptr(OP, "x", x, n, s)?;
        let py = view_mut_ptr(OP, "y", y, n, s)?;
        let per_slot = images.per_slot();
        let (imgs, h, w, c) = (
            images.n as u64,
            images.h as u64,
            images.w as u64,
            images.c as u64,
        );
        for (k, chunk) in slots.chunks(MAX_SLOTS).enumerate() {
            let off = (k * MAX_SLOTS * per_slot * 4) as u64;
            let soff = (k * MAX_SLOTS * DROPOUT_STEP_WORDS * 4) as u64;
            let ps = SlotParams::pack(chunk, params::augment);
            let (st, x, y) = (pst + soff, px + off, py + off);
            launch!(
                s,
                &self.kernels.augment,
                grid(per_slot, chunk.len()),
                &imgs,
                &h,
                &w,
                &c,
                &ps,
                &st,
                &x,
                &y
            )?;
        }
        Ok(())
    }
}

/// A loss kernel, and the per-slot length of its targets: the labels
/// (cross-entropy) or the target values (MSE).
struct LossKernel<'a> {
    name: &'static str,
    f: &'a CudaFunction,
    target_len: usize,
}

impl CudaBackend {
    /// Dropout forward and backward: the same kernel, the mask recomputed.
    fn dropout_like(
        &self,
        op: &'static str,
        ctx: &mut CudaCtx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CudaBuf>,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        let n = slots.total();
        let (per_slot, slots) = (slots.n, slots.settings);
        check_dropout(op, per_slot, slots)?;
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let s = &ctx.stream;
        let pst = view_ptr(op, "steps", steps, slots.len() * DROPOUT_STEP_WORDS, s)?;
        let px = view_ptr(op, "x", x, n, s)?;
        let py = view_mut_ptr(op, "y", y, n, s)?;
        let per = per_slot as u64;
        for (c, chunk) in slots.chunks(MAX_SLOTS).enumerate() {
            let off = (c * MAX_SLOTS * per_slot * 4) as u64;
            let soff = (c * MAX_SLOTS * DROPOUT_STEP_WORDS * 4) as u64;
            let ps = SlotParams::pack(chunk, params::dropout);
            let (st, x, y) = (pst + soff, px + off, py + off);
            launch!(
                s,
                &self.kernels.dropout,
                grid(per_slot, chunk.len()),
                &per,
                &ps,
                &st,
                &x,
                &y
            )?;
        }
        Ok(())
    }

    /// The losses: one block per slot.
    fn loss(
        &self,
        kernel: LossKernel<'_>,
        ctx: &mut CudaCtx,
        loss: &Loss,
        [pred, target]: [View<'_, CudaBuf>; 2],
        grad: Option<ViewMut<'_, CudaBuf>>,
        stats: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        let (op, f, target_len) = (kernel.name, kernel.f, kernel.target_len);
        let Loss {
            shape,
            target_stride,
            accumulate,
        } = *loss;
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_failed_driver_call_keeps_its_name_and_the_drivers_error() {
        let e = dev("cuEventRecord")(DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE));
        // (Its message asks the driver library for the error's text; this
        // test runs where there is none, so it checks the parts.)
        assert!(matches!(&e, KernelError::Device { call, .. } if call == "cuEventRecord"));
        let source = e.source().expect("the driver's error");
        assert_eq!(
            source.downcast_ref::<DriverError>().map(|d| d.0),
            Some(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE)
        );
        // Out of memory keeps its own variant, so callers can retry smaller.
        let oom = dev("cuMemAlloc")(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(matches!(oom, KernelError::OutOfMemory { .. }));
    }

    #[test]
    fn a_failed_cublas_call_keeps_its_name_and_cublas_error() {
        let status = cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED;
        let e = blas_err("cublasSgemm")(cudarc::cublas::result::CublasError(status));
        assert!(e.to_string().starts_with("cublasSgemm: "), "{e}");
        assert!(
            e.source()
                .and_then(|s| s.downcast_ref::<cudarc::cublas::result::CublasError>())
                .is_some()
        );
    }
}
