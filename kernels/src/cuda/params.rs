//! Per-slot scalars as the kernels in `ops.cu` take them: `#[repr(C)]`
//! mirrors of `SgdParams`, `AdamParams` and `DropoutParams`, passed by value.

use cudarc::driver::DeviceRepr;

use super::module::MAX_SLOTS;
use crate::ops::{AdamSlot, AugmentSlot, Conv2d, DropoutSlot, Images, Pool2d, SgdSlot};

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct SgdParam {
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    nesterov: i32,
    /// The slot's own parameters from the run's start.
    len: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct AdamParam {
    decay: f32,
    l2: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    /// The slot's own parameters from the run's start.
    len: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct DropoutParam {
    seed: u64,
    p: f32,
    scale: f32,
    /// Padded rows ([`crate::RowsWithin`]); a stride of 0 means contiguous.
    width: u32,
    stride: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct AugmentParam {
    seed: u64,
    pad: u32,
    flip: i32,
}

/// Up to [`MAX_SLOTS`] per-slot entries, as one kernel argument.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlotParams<T: Copy> {
    s: [T; MAX_SLOTS],
}

// SAFETY: plain `#[repr(C)]` data with the layout of the structs in ops.cu.
unsafe impl DeviceRepr for SlotParams<SgdParam> {}
unsafe impl DeviceRepr for SlotParams<AdamParam> {}
unsafe impl DeviceRepr for SlotParams<DropoutParam> {}
unsafe impl DeviceRepr for SlotParams<AugmentParam> {}

impl<T: Copy + Default> SlotParams<T> {
    /// Packs `chunk` (at most [`MAX_SLOTS`] slots) through `f`.
    pub fn pack<S>(chunk: &[S], f: impl Fn(&S) -> T) -> Self {
        debug_assert!(chunk.len() <= MAX_SLOTS);
        let mut s = [T::default(); MAX_SLOTS];
        for (d, c) in s.iter_mut().zip(chunk) {
            *d = f(c);
        }
        SlotParams { s }
    }
}

/// A slot's own length in a kernel's word (runs are far below 4 G).
fn own_len(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// Slot `h`'s scalars, stepping `len` parameters of its run.
pub fn sgd((h, len): &(SgdSlot, usize)) -> SgdParam {
    SgdParam {
        lr: h.lr,
        momentum: h.momentum,
        weight_decay: h.weight_decay,
        nesterov: h.nesterov as i32,
        len: own_len(*len),
    }
}

/// The same derived scalars as the CPU's `optim::adam`; the per-step ones
/// come from the step block. It steps `len` parameters of its run.
pub fn adam((h, len): &(AdamSlot, usize)) -> AdamParam {
    AdamParam {
        decay: if h.decoupled {
            1.0 - h.lr * h.weight_decay
        } else {
            1.0
        },
        l2: if h.decoupled { 0.0 } else { h.weight_decay },
        beta1: h.beta1,
        beta2: h.beta2,
        eps: h.eps,
        len: own_len(*len),
    }
}

pub fn dropout(d: &DropoutSlot) -> DropoutParam {
    DropoutParam {
        seed: d.seed,
        p: d.p,
        scale: if d.p > 0.0 { 1.0 / (1.0 - d.p) } else { 1.0 },
        // check_dropout bounds both by u32::MAX.
        width: d.rows.map_or(0, |r| r.width as u32),
        stride: d.rows.map_or(0, |r| r.stride as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_cuda_structs() {
        assert_eq!(std::mem::size_of::<SgdParam>(), 20);
        assert_eq!(std::mem::size_of::<AdamParam>(), 24);
        assert_eq!(std::mem::size_of::<DropoutParam>(), 24);
        assert_eq!(std::mem::align_of::<DropoutParam>(), 8);
        // Kernel parameters are limited to 4 KiB.
        assert!(std::mem::size_of::<SlotParams<AdamParam>>() <= 4096 - 64);
    }
}

pub fn augment(a: &AugmentSlot) -> AugmentParam {
    AugmentParam {
        seed: a.seed,
        pad: a.pad as u32,
        flip: a.flip as i32,
    }
}

/// The geometry of a convolution or pooling, as `ConvGeom` in ops.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ConvGeom {
    slots: u64,
    n: u64,
    h: u64,
    w: u64,
    c: u64,
    slot_stride: u64,
    kh: u64,
    kw: u64,
    stride: u64,
    pad: u64,
    oh: u64,
    ow: u64,
}

// SAFETY: plain `#[repr(C)]` data with the layout of `ConvGeom` in ops.cu.
unsafe impl DeviceRepr for ConvGeom {}

impl ConvGeom {
    pub fn conv(c: &Conv2d) -> Self {
        Self::over(
            &c.input,
            [c.kh, c.kw, c.stride, c.pad],
            [c.out_h(), c.out_w()],
        )
    }

    pub fn pool(p: &Pool2d) -> Self {
        Self::over(&p.input, [p.kh, p.kw, p.stride, 0], [p.out_h(), p.out_w()])
    }

    /// A window `[kh, kw, stride, pad]` sliding over `i` to an `[oh, ow]` output.
    fn over(i: &Images, [kh, kw, stride, pad]: [usize; 4], [oh, ow]: [usize; 2]) -> Self {
        ConvGeom {
            slots: i.slots as u64,
            n: i.n as u64,
            h: i.h as u64,
            w: i.w as u64,
            c: i.c as u64,
            slot_stride: i.slot_stride as u64,
            kh: kh as u64,
            kw: kw as u64,
            stride: stride as u64,
            pad: pad as u64,
            oh: oh as u64,
            ow: ow as u64,
        }
    }
}
