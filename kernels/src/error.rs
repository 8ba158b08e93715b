//! The one error type of the `kernels` crate.

use std::borrow::Cow;

use thiserror::Error;

use crate::ops::DropoutSlot;

/// Everything a backend operation can fail with.
#[derive(Debug, Error)]
pub enum KernelError {
    /// A view reaches past the end of its buffer.
    #[error("{op}: {what} needs elements {off}..{end} but the buffer holds {len}")]
    OutOfBounds {
        op: &'static str,
        what: &'static str,
        off: usize,
        end: usize,
        len: usize,
    },
    /// Arguments that disagree with each other (slot counts, lengths).
    #[error("{op}: {msg}")]
    Shape { op: &'static str, msg: String },
    /// The device could not provide memory.
    #[error("out of device memory: {requested} bytes requested")]
    OutOfMemory { requested: usize },
    /// The backend is not available on this machine.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend does not offer this arithmetic (TF32 on the CPU).
    #[error("{op}: precision {precision} is not offered by the {backend} backend")]
    Precision {
        op: &'static str,
        precision: &'static str,
        backend: &'static str,
    },
    /// The backend does not offer this op (see the op's capability query).
    #[error("{op}: not offered by the {backend} backend")]
    Unsupported { op: &'static str, backend: String },
    /// A call into the CUDA driver, a CUDA library (cuBLAS, NVRTC) or the
    /// thread pool failed: the call, and the library's own error as the
    /// source.
    #[error("{call}: {source}")]
    Device {
        call: Cow<'static, str>,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The device answered in a way the backend cannot use.
    #[error("device error: {0}")]
    Unexpected(String),
}

/// A library's failure that reached us as text (NVRTC's log, kept for
/// every later caller of a compile that failed once), as a source.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct Message(pub String);

impl KernelError {
    /// A failed call `call` with its library's error `source`.
    pub fn device(
        call: impl Into<Cow<'static, str>>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        KernelError::Device {
            call: call.into(),
            source: Box::new(source),
        }
    }
}

pub type Result<T> = std::result::Result<T, KernelError>;

/// Checks that `off..off+n` lies inside a buffer of `len` elements.
/// Checks `copy_within`'s two ranges: in the buffer, and apart.
pub(crate) fn check_apart(len: usize, src: usize, dst: usize, buf_len: usize) -> Result<()> {
    check_range("copy_within", "src", src, len, buf_len)?;
    check_range("copy_within", "dst", dst, len, buf_len)?;
    if len > 0 && src.abs_diff(dst) < len {
        return Err(KernelError::Shape {
            op: "copy_within",
            msg: format!("ranges at {src} and {dst} of {len} elements overlap"),
        });
    }
    Ok(())
}

pub(crate) fn check_range(
    op: &'static str,
    what: &'static str,
    off: usize,
    n: usize,
    len: usize,
) -> Result<()> {
    match off.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(KernelError::OutOfBounds {
            op,
            what,
            off,
            end: off.saturating_add(n),
            len,
        }),
    }
}

pub(crate) fn shape_err(op: &'static str, msg: impl Into<String>) -> KernelError {
    KernelError::Shape {
        op,
        msg: msg.into(),
    }
}

/// The checks every backend makes before a GEMM. `Ok(false)`: there is
/// nothing to compute (an empty batch or an empty `C`). `k == 0` is valid
/// and means `C = beta * C`.
pub(crate) fn check_gemm(g: &crate::ops::Gemm) -> Result<bool> {
    if g.batch == 0 || g.m == 0 || g.n == 0 {
        return Ok(false);
    }
    if g.batch > 1 && g.stride_c < g.m * g.n {
        return Err(shape_err(
            "gemm",
            "batched outputs overlap (stride_c < m * n)",
        ));
    }
    Ok(true)
}

/// [`check_gemm`] of every member of a grouped GEMM.
pub(crate) fn check_gemm_grouped(g: &crate::ops::GroupedGemm<'_>) -> Result<()> {
    if g.pitches.is_some_and(|p| p.len() != g.sizes.len()) {
        return Err(shape_err(
            "gemm_grouped",
            "every member needs its pitches, or none does",
        ));
    }
    for i in 0..g.sizes.len() {
        check_gemm(&g.member(i))?;
    }
    Ok(())
}

/// The checks every backend makes before `softmax_xent`: it needs classes.
pub(crate) fn check_classes(shape: crate::ops::Batched) -> Result<()> {
    if shape.cols == 0 && shape.slots > 0 && shape.rows > 0 {
        return Err(shape_err(
            "softmax_xent",
            "logits have 0 columns: cross-entropy needs at least one class",
        ));
    }
    Ok(())
}

/// Every slot's dropout probability lies in `[0, 1)`, and padded rows
/// tile the `per_slot` elements of a slot.
pub(crate) fn check_dropout(
    op: &'static str,
    per_slot: usize,
    slots: &[DropoutSlot],
) -> Result<()> {
    if let Some(s) = slots.iter().find(|s| !(0.0..1.0).contains(&s.p)) {
        return Err(shape_err(
            op,
            format!("dropout p must be in [0, 1), got {}", s.p),
        ));
    }
    let bad_rows = |r: &crate::ops::RowsWithin| {
        r.stride == 0
            || r.width > r.stride
            || !per_slot.is_multiple_of(r.stride)
            || r.stride > u32::MAX as usize
    };
    match slots.iter().filter_map(|s| s.rows).find(bad_rows) {
        Some(r) => Err(shape_err(
            op,
            format!(
                "padded dropout rows of width {} and stride {} do not tile {per_slot} elements",
                r.width, r.stride
            ),
        )),
        None => Ok(()),
    }
}

/// An optimizer's runs of consecutive slots do not overlap (each element
/// would be stepped twice).
pub(crate) fn check_param_run<S>(
    op: &'static str,
    run: &crate::ops::ParamRun<'_, S>,
) -> Result<()> {
    if run.overlaps() {
        return Err(shape_err(
            op,
            format!(
                "a run of {} parameters does not fit slots {} apart",
                run.len, run.stride
            ),
        ));
    }
    if run.lens.is_some_and(|l| l.len() != run.settings.len()) {
        return Err(shape_err(op, "every slot needs its length, or none does"));
    }
    Ok(())
}

/// Slots' images that do not overlap: a stride of at least one slot's
/// images, or 0 (one batch shared by all).
fn check_slot_stride(op: &'static str, i: &crate::ops::Images) -> Result<()> {
    if i.slots > 1 && i.slot_stride != 0 && i.slot_stride < i.per_slot() {
        return Err(shape_err(op, "slot_stride is smaller than a slot's images"));
    }
    Ok(())
}

/// A convolution's geometry: positive kernel and stride, and a padded
/// input at least as large as the kernel.
pub(crate) fn check_conv(op: &'static str, c: &crate::ops::Conv2d) -> Result<()> {
    let i = c.input;
    if c.kh == 0 || c.kw == 0 || c.stride == 0 {
        return Err(shape_err(op, "kernel and stride must be at least 1"));
    }
    if i.h + 2 * c.pad < c.kh || i.w + 2 * c.pad < c.kw {
        return Err(shape_err(
            op,
            format!(
                "a {}x{} kernel does not fit a {}x{} image padded by {}",
                c.kh, c.kw, i.h, i.w, c.pad
            ),
        ));
    }
    check_slot_stride(op, &i)
}

/// A convolution's geometry ([`check_conv`]), and slots' weights (with
/// their bias) that do not overlap.
pub(crate) fn check_conv_gemm(op: &'static str, c: &crate::ops::ConvGemm) -> Result<()> {
    check_conv(op, &c.conv)?;
    if c.conv.input.slots > 1 && c.weight_stride < c.weights_len() {
        return Err(shape_err(
            op,
            format!(
                "weight_stride {} is smaller than a slot's weights ({})",
                c.weight_stride,
                c.weights_len()
            ),
        ));
    }
    Ok(())
}

/// A pooling window that fits the image, and a positive stride.
pub(crate) fn check_pool(op: &'static str, p: &crate::ops::Pool2d) -> Result<()> {
    let i = p.input;
    if p.kh == 0 || p.kw == 0 || p.stride == 0 {
        return Err(shape_err(op, "window and stride must be at least 1"));
    }
    if p.kh > i.h || p.kw > i.w {
        return Err(shape_err(
            op,
            format!(
                "a {}x{} window does not fit a {}x{} image",
                p.kh, p.kw, i.h, i.w
            ),
        ));
    }
    check_slot_stride(op, &i)
}

/// A pooling whose windows must tile its images ([`crate::ops::Pool2d::tiles`]).
pub(crate) fn check_tiled_pool(op: &'static str, p: &crate::ops::Pool2d) -> Result<()> {
    check_pool(op, p)?;
    if !p.tiles() {
        return Err(shape_err(
            op,
            format!(
                "{}x{} windows {} apart do not tile a {}x{} image",
                p.kh, p.kw, p.stride, p.input.h, p.input.w
            ),
        ));
    }
    Ok(())
}

/// Batch norm needs a positive epsilon, and in training more than one
/// value per channel (as PyTorch).
pub(crate) fn check_batch_norm(
    op: &'static str,
    bn: &crate::ops::BatchNorm,
    training: bool,
) -> Result<()> {
    if bn.eps.is_nan() || bn.eps <= 0.0 || !(0.0..=1.0).contains(&bn.momentum) {
        return Err(shape_err(op, "eps must be > 0 and momentum in [0, 1]"));
    }
    if training && bn.shape.rows < 2 && !bn.shape.is_empty() {
        return Err(shape_err(
            op,
            "training needs more than one value per channel",
        ));
    }
    let s = bn.shape;
    if s.slots > 1 && (bn.param_stride < 2 * s.cols || bn.running_stride < 2 * s.cols) {
        return Err(shape_err(op, "a slot's parameters overlap the next slot's"));
    }
    Ok(())
}

/// One augmentation setting per slot of packed images.
pub(crate) fn check_augment(
    op: &'static str,
    images: &crate::ops::Images,
    slots: &[crate::ops::AugmentSlot],
) -> Result<()> {
    if slots.len() != images.slots {
        return Err(shape_err(
            op,
            format!("{} settings for {} slots", slots.len(), images.slots),
        ));
    }
    if images.slots > 1 && images.slot_stride != images.per_slot() {
        return Err(shape_err(op, "augmented images must be packed"));
    }
    Ok(())
}
