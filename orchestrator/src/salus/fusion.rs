//! How large a fused group may be: a pure function of the device, the
//! study's `fuse` limit, a lane's memory and one member's footprint.
//!
//! * **Memory.** A group lives on one lane, so its members must fit the
//!   lane's share of the budget.
//! * **Cache, on the CPU.** Each op of a fused iteration sweeps every
//!   member's weights and optimizer state. Past the cache that stops paying:
//!   measured on the 2-core development machine at h=256 (3.2 MB of state
//!   per trial), groups of 2 ran at 95% of the large-GEMM rate, of 4 at 90%,
//!   and of 8 at 66-77%. So a CPU group holds at most [`CPU_GROUP_BYTES`] of
//!   persistent state (and at least two members). A GPU wants one large
//!   batched launch per op, and has no such bound.

use kernels::DeviceKind;
use workers::Footprint;

/// Persistent state a CPU group may sweep per op.
pub const CPU_GROUP_BYTES: usize = 8 << 20;

/// The most members a group of trials with footprint `member` may have.
pub fn group_cap(kind: DeviceKind, fuse: usize, lane_budget: u64, member: &Footprint) -> usize {
    let per = (member.persistent_bytes + member.ephemeral_bytes).max(1) as u64;
    let by_memory = (lane_budget.saturating_sub(member.shared_bytes as u64) / per) as usize;
    let by_cache = match kind {
        DeviceKind::Cpu => (CPU_GROUP_BYTES / member.persistent_bytes.max(1)).max(2),
        DeviceKind::Cuda(_) => usize::MAX,
    };
    fuse.min(by_memory).min(by_cache).max(1)
}

/// Splits `k` trials into groups of at most `cap`, as even as can be.
pub fn split(k: usize, cap: usize) -> Vec<usize> {
    let groups = k.div_ceil(cap.max(1)).max(1);
    (0..groups)
        .map(|g| k / groups + usize::from(g < k % groups))
        .filter(|&n| n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(persistent: usize, ephemeral: usize) -> Footprint {
        Footprint {
            persistent_bytes: persistent,
            ephemeral_bytes: ephemeral,
            shared_bytes: 1000,
        }
    }

    #[test]
    fn caps_follow_fuse_memory_and_cache() {
        let big = u64::MAX / 4;
        let small = fp(30_000, 10_000);
        assert_eq!(group_cap(DeviceKind::Cpu, 8, big, &small), 8, "fuse bounds");
        assert_eq!(
            group_cap(DeviceKind::Cpu, 1, big, &small),
            1,
            "fuse = 1 is off"
        );
        // 3.2 MB of state per trial: two per CPU group, all on a GPU.
        let h256 = fp(3_200_000, 1_000_000);
        assert_eq!(group_cap(DeviceKind::Cpu, 64, big, &h256), 2);
        assert_eq!(group_cap(DeviceKind::Cuda(0), 64, big, &h256), 64);
        // A lane with room for three members gets groups of three.
        assert_eq!(
            group_cap(DeviceKind::Cuda(0), 64, 1000 + 3 * 4_200_000, &h256),
            3
        );
        // Even a member too large for the lane forms a "group" of one.
        assert_eq!(group_cap(DeviceKind::Cuda(0), 64, 10, &h256), 1);
    }

    #[test]
    fn splits_are_even_and_cover_every_trial() {
        assert_eq!(split(16, 2), vec![2; 8]);
        assert_eq!(split(10, 4), vec![4, 3, 3]);
        assert_eq!(split(3, 8), vec![3]);
        assert_eq!(split(1, 1), vec![1]);
        for k in 1..40 {
            for cap in 1..10 {
                let s = split(k, cap);
                assert_eq!(s.iter().sum::<usize>(), k);
                assert!(s.iter().all(|&n| (1..=cap).contains(&n)), "{k} {cap} {s:?}");
                assert!(s.iter().max().unwrap() - s.iter().min().unwrap() <= 1);
            }
        }
    }
}
