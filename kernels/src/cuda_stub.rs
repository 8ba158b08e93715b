//! The CUDA backend when salus-tune is built without the `cuda` feature:
//! the same names, but no device can be opened.

use crate::backend::{Backend, DeviceKind, Moments, View, ViewMut};
use crate::error::{KernelError, Result};
use crate::ops::{
    ActivationOp, AdamSlot, AugmentSlot, BatchNorm, Batched, Conv2d, DropoutSlot, Gemm, Loss,
    ParamRun, Pool2d, SgdSlot, Slots,
};

/// Says why CUDA cannot be used: this build has no CUDA backend.
pub fn probe() -> std::result::Result<usize, String> {
    Err("this salus-tune was built without the `cuda` feature".into())
}

/// `None`: the test is skipped on CUDA, and recorded as skipped (see
/// [`crate::device_tests`]).
#[doc(hidden)]
pub fn device_for_test(test: &str) -> Option<CudaBackend> {
    crate::device_tests::record(test, "cuda", Some(&probe().unwrap_err()));
    None
}

/// A CUDA device; none can exist in this build.
#[derive(Debug, Clone)]
pub enum CudaBackend {}

impl CudaBackend {
    pub fn new(_ordinal: usize) -> Result<Self> {
        Err(KernelError::Unavailable(probe().unwrap_err()))
    }
    pub fn notes(&self) -> Vec<String> {
        match *self {}
    }
}

/// A device buffer; none can exist in this build.
pub enum CudaBuf {}
/// An execution context; none can exist in this build.
pub enum CudaCtx {}

// The methods cannot be called: `self` is uninhabited.
#[allow(unused_variables)]
impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Ctx = CudaCtx;
    type HostThreads = ();
    type Graph = ();

    fn kind(&self) -> DeviceKind {
        match *self {}
    }

    fn name(&self) -> String {
        match *self {}
    }

    fn memory_bytes(&self) -> usize {
        match *self {}
    }

    fn new_ctx(&self, threads: usize) -> Result<CudaCtx> {
        match *self {}
    }

    fn host_threads(&self, ctx: &CudaCtx) {
        match *self {}
    }

    fn enter<R: Send>(&self, host: &(), f: impl FnOnce() -> R + Send) -> R {
        match *self {}
    }

    fn sync(&self, ctx: &mut CudaCtx) -> Result<()> {
        match *self {}
    }

    fn alloc_zeroed(&self, len: usize) -> Result<CudaBuf> {
        match *self {}
    }

    fn buf_len(&self, buf: &CudaBuf) -> usize {
        match *self {}
    }

    fn upload(&self, ctx: &mut CudaCtx, src: &[f32], dst: ViewMut<'_, CudaBuf>) -> Result<()> {
        match *self {}
    }

    fn download(&self, ctx: &mut CudaCtx, src: View<'_, CudaBuf>, dst: &mut [f32]) -> Result<()> {
        match *self {}
    }

    fn stage_step(
        &self,
        ctx: &mut CudaCtx,
        words: &[f32],
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn buf_addr(&self, buf: &CudaBuf) -> usize {
        match *self {}
    }

    fn copy(
        &self,
        ctx: &mut CudaCtx,
        len: usize,
        src: View<'_, CudaBuf>,
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn copy_within(
        &self,
        ctx: &mut CudaCtx,
        len: usize,
        buf: &mut CudaBuf,
        src: usize,
        dst: usize,
    ) -> Result<()> {
        match *self {}
    }

    fn fill(
        &self,
        ctx: &mut CudaCtx,
        len: usize,
        value: f32,
        dst: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn gemm(
        &self,
        ctx: &mut CudaCtx,
        g: &Gemm,
        a: View<'_, CudaBuf>,
        b: View<'_, CudaBuf>,
        c: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
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
        match *self {}
    }

    fn bias_add(
        &self,
        ctx: &mut CudaCtx,
        shape: Batched,
        bias_stride: usize,
        x: ViewMut<'_, CudaBuf>,
        bias: View<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn col_sum(
        &self,
        ctx: &mut CudaCtx,
        shape: Batched,
        db_stride: usize,
        dy: View<'_, CudaBuf>,
        db: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn activation(
        &self,
        ctx: &mut CudaCtx,
        op: ActivationOp,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
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
        match *self {}
    }

    fn dropout(
        &self,
        ctx: &mut CudaCtx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CudaBuf>,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn dropout_backward(
        &self,
        ctx: &mut CudaCtx,
        slots: Slots<'_, DropoutSlot>,
        steps: View<'_, CudaBuf>,
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
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
        match *self {}
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
        match *self {}
    }

    fn sgd_step(
        &self,
        ctx: &mut CudaCtx,
        run: ParamRun<'_, SgdSlot>,
        params: ViewMut<'_, CudaBuf>,
        grads: View<'_, CudaBuf>,
        velocity: Option<ViewMut<'_, CudaBuf>>,
    ) -> Result<()> {
        match *self {}
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
        match *self {}
    }
    fn im2col(
        &self,
        ctx: &mut CudaCtx,
        conv: &Conv2d,
        x: View<'_, CudaBuf>,
        cols: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn col2im(
        &self,
        ctx: &mut CudaCtx,
        conv: &Conv2d,
        cols: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
        accumulate: bool,
    ) -> Result<()> {
        match *self {}
    }

    fn pool2d(
        &self,
        ctx: &mut CudaCtx,
        pool: &Pool2d,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
    }

    fn pool2d_backward(
        &self,
        ctx: &mut CudaCtx,
        pool: &Pool2d,
        x: View<'_, CudaBuf>,
        dy: View<'_, CudaBuf>,
        dx: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
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
        match *self {}
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
        match *self {}
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
        match *self {}
    }

    fn add(
        &self,
        ctx: &mut CudaCtx,
        n: usize,
        x: View<'_, CudaBuf>,
        y: ViewMut<'_, CudaBuf>,
    ) -> Result<()> {
        match *self {}
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
        match *self {}
    }
}

/// Without CUDA there is no context to configure.
///
/// # Safety
///
/// None needed; `unsafe` only to match the CUDA build's signature.
pub unsafe fn prefer_device_connections() {}
