//! A counter-based random number generator.
//!
//! A value is a pure function of `(seed, step, index)`, in the spirit of
//! Random123: no state to carry, to swap out or to share between threads,
//! and the CUDA kernels compute the same bits. Dropout uses it so that the
//! backward pass recomputes its mask instead of storing it.

/// The SplitMix64 finaliser: a bijective 64-bit mixer.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits for element `index` of draw `step` under `seed`.
#[inline(always)]
pub fn bits(seed: u64, step: u64, index: u64) -> u64 {
    let s = mix64(seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    mix64(s.wrapping_add(index.wrapping_mul(0xd1b5_4a32_d192_ed03)))
}

/// A uniform `f32` in `[0, 1)` with 24 random bits.
#[inline(always)]
pub fn uniform(seed: u64, step: u64, index: u64) -> f32 {
    (bits(seed, step, index) >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_deterministic_and_spread() {
        assert_eq!(uniform(7, 3, 11), uniform(7, 3, 11));
        assert_ne!(uniform(7, 3, 11), uniform(7, 4, 11));
        assert_ne!(uniform(7, 3, 11), uniform(8, 3, 11));
        let n = 100_000;
        let mean: f64 = (0..n).map(|i| uniform(1, 2, i) as f64).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let below: usize = (0..n).filter(|&i| uniform(1, 2, i) < 0.25).count();
        assert!((below as f64 / n as f64 - 0.25).abs() < 0.01);
        assert!((0..n).all(|i| (0.0..1.0).contains(&uniform(5, 0, i))));
    }
}
