//! The one error type of the `kernels` crate.

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
    /// A failure reported by the device driver or runtime.
    #[error("device error: {0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, KernelError>;

/// Checks that `off..off+n` lies inside a buffer of `len` elements.
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

/// Every slot's dropout probability lies in `[0, 1)`.
pub(crate) fn check_dropout(op: &'static str, slots: &[DropoutSlot]) -> Result<()> {
    match slots.iter().find(|s| !(0.0..1.0).contains(&s.p)) {
        Some(s) => Err(shape_err(
            op,
            format!("dropout p must be in [0, 1), got {}", s.p),
        )),
        None => Ok(()),
    }
}
