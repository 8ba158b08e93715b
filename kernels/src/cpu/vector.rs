//! Whole-vector loads, stores and adds for hand-blocked loops.
//!
//! Why by hand: LLVM vectorises a plain `d[i] += s[i]` over a length known
//! only at run time where the length reaches its unrolled block (65 floats
//! for 16-wide vectors), so rows of 32 or 64 channels ran one float at a
//! time. These work [`LANES`] floats at a time, whatever the length; inside
//! a `widest_fn!` body a `[f32; LANES]` is one AVX-512 register.

/// Floats in one vector of these helpers.
pub(crate) const LANES: usize = 16;

/// `N` values from `buf[at..]`: one vector load where `N` is [`LANES`]
/// (and one float where a loop's tail takes `N = 1`).
#[inline(always)]
pub(crate) fn load<const N: usize>(buf: &[f32], at: usize) -> [f32; N] {
    assert!(at + N <= buf.len());
    // SAFETY: in bounds by the assert; `[f32; N]` has no alignment
    // beyond `f32`'s and the read is unaligned.
    unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at) as *const [f32; N]) }
}

/// `v` into `buf[at..]`, as one vector store where `N` is [`LANES`].
#[inline(always)]
pub(crate) fn store<const N: usize>(buf: &mut [f32], at: usize, v: [f32; N]) {
    assert!(at + N <= buf.len());
    // SAFETY: in bounds by the assert; the write is unaligned.
    unsafe { std::ptr::write_unaligned(buf.as_mut_ptr().add(at) as *mut [f32; N], v) }
}

/// Runs `block` over `c` channels: with `N` a constant [`LANES`] for each
/// whole vector of them, then `N = 1` for each channel left, `ch` the
/// first channel of the block. A block's code, generic over `N`, is then
/// one vector's work or one float's.
macro_rules! channel_blocks {
    ($c:expr, |$ch:ident, $N:ident| $block:expr) => {{
        let mut $ch = 0;
        while $ch + $crate::cpu::vector::LANES <= $c {
            {
                const $N: usize = $crate::cpu::vector::LANES;
                $block;
            }
            $ch += $crate::cpu::vector::LANES;
        }
        while $ch < $c {
            {
                const $N: usize = 1;
                $block;
            }
            $ch += 1;
        }
    }};
}
pub(crate) use channel_blocks;

/// `d += s` element by element (`s` at least as long as `d`), whole
/// vectors at a time: the same bits as the plain loop.
#[inline(always)]
pub(crate) fn add_assign(d: &mut [f32], s: &[f32]) {
    channel_blocks!(d.len(), |c0, N| {
        let (mut v, sv): ([f32; N], [f32; N]) = (load(d, c0), load(s, c0));
        (0..N).for_each(|j| v[j] += sv[j]);
        store(d, c0, v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_assign_adds_every_element_of_any_length() {
        for len in [0, 1, 15, 16, 17, 32, 33, 64, 100] {
            let s: Vec<f32> = (0..len + 3).map(|i| i as f32 * 0.5 - 7.0).collect();
            let mut d: Vec<f32> = (0..len).map(|i| (i * i) as f32).collect();
            let want: Vec<f32> = d.iter().zip(&s).map(|(d, s)| d + s).collect();
            add_assign(&mut d, &s);
            assert_eq!(d, want, "length {len}");
        }
    }
}
