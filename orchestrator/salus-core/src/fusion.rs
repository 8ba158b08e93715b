//! How large a fused group may be: a pure function of the device, the
//! study's `fuse` limit, a lane's memory and one member's footprint.
//!
//! * **Memory.** A group lives on one lane, so its members must fit the
//!   lane's share of the budget.
//! * **Cache, on the CPU.** Each op of a fused iteration sweeps every
//!   member's weights, optimizer state and activations before the next op
//!   starts, where a trial alone runs its whole iteration on data still in
//!   cache. On the 2-core development machine (2 MiB of L2 per core) fused
//!   groups never ran faster than the same trials through lanes, and lost
//!   once a group swept more than a few MiB per op (`bench packing`, K = 8,
//!   2026-12-05): 784-32-32-10 MLPs (1.7 MB a member) level in pairs and
//!   10-12% slower in fours, `cnn-32` (over 100 MB of buffers a member) 7%
//!   slower as one group of eight than one at a time. So a CPU group sweeps
//!   at most [`CPU_GROUP_BYTES`] (persistent state and one iteration's
//!   buffers, per member), and a member larger than that runs alone. A GPU
//!   wants one large batched launch per op, and has no such bound.
//! * **Lanes, on the CPU.** A CPU lane is one core, and a group runs on
//!   one lane: one group of eight leaves the other cores idle. So a CPU
//!   group holds at most its lane's share of the trials in flight. (A GPU
//!   lane is a stream of one device: one large group is best there.)
//!
//! Who holds a group's seats is [`reseat`]'s choice, also pure: trials
//! waiting to run (new ones, promoted ones, preempted ones) take free seats
//! in arrival order; under `priority` the highest-priority trials hold the
//! seats, and a member outranked by a waiting trial leaves to make way.

use kernels::{Backend, DeviceKind};
use training::{Footprint, TrainTrial};

use super::policy::Policy;

/// What a CPU group may sweep per op: its members' persistent state and
/// iteration buffers (see the module docs).
pub const CPU_GROUP_BYTES: usize = 4 << 20;

/// The most members a group of trials with footprint `member` may have,
/// when `per_lane` trials would fall to each lane spread evenly.
pub fn group_cap(
    kind: DeviceKind,
    fuse: usize,
    lane_budget: u64,
    member: &Footprint,
    per_lane: usize,
) -> usize {
    let per = (member.persistent_bytes + member.ephemeral_bytes).max(1) as u64;
    let by_memory = (lane_budget.saturating_sub(member.shared_bytes as u64) / per) as usize;
    let by_cache = match kind {
        DeviceKind::Cpu => (CPU_GROUP_BYTES / per as usize).min(per_lane.max(1)),
        DeviceKind::Cuda(_) => usize::MAX,
    };
    fuse.min(by_memory).min(by_cache).max(1)
}

/// Whether trials of different widths share groups (`[scheduler]
/// mix_widths`): `Auto` asks [`mixed_group_pays`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MixWidths {
    #[default]
    Auto,
    On,
    Off,
}

/// One trial's iteration, as the mixing cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixMember {
    /// Floating-point operations of one iteration.
    pub flops: f64,
    /// Kernel launches of one iteration alone.
    pub launches: usize,
    /// Whether it applies dropout (a group of it then runs dropout's
    /// launches for every member).
    pub dropout: bool,
    /// Bytes one iteration sweeps in a group's layout beyond its own: the
    /// element-wise ops over the padding of its activations (the optimizer
    /// steps a member's own parameters only).
    pub padding_bytes: f64,
}

/// A device's rates for [`mixed_group_pays`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixRates {
    /// Seconds per kernel launch the device cannot hide (0 on a CPU,
    /// where a lane's op is a function call).
    pub launch_s: f64,
    pub flops_per_s: f64,
    pub bytes_per_s: f64,
}

impl MixRates {
    /// Measured rates: the H200 dispatches about 0.8 million kernels a
    /// second whatever the lanes (`bench packing`, 2026-11-30), reaches
    /// about 40 TFLOP/s in fp32 GEMMs and 4 TB/s; the 2-core development
    /// CPU, about 300 GFLOP/s and 20 GB/s, and nothing to save per launch.
    pub fn of(kind: DeviceKind) -> MixRates {
        match kind {
            DeviceKind::Cuda(_) => MixRates {
                launch_s: 1.25e-6,
                flops_per_s: 40e12,
                bytes_per_s: 4e12,
            },
            DeviceKind::Cpu => MixRates {
                launch_s: 0.0,
                flops_per_s: 300e9,
                bytes_per_s: 20e9,
            },
        }
    }
}

/// Predicted seconds of one iteration of every member: through lanes (the
/// device bound by its launches or its arithmetic, whichever is slower),
/// and as one mixed group (one launch per op for all, plus the sweeps over
/// the padding; `group_launches` is one iteration's launches as a group).
pub fn mixed_group_times(
    rates: MixRates,
    members: &[MixMember],
    group_launches: usize,
) -> (f64, f64) {
    let flops: f64 = members.iter().map(|m| m.flops).sum();
    let launches: usize = members.iter().map(|m| m.launches).sum();
    let padding: f64 = members.iter().map(|m| m.padding_bytes).sum();
    let compute = flops / rates.flops_per_s;
    let lanes = compute.max(launches as f64 * rates.launch_s);
    let group = compute.max(group_launches as f64 * rates.launch_s) + padding / rates.bytes_per_s;
    (lanes, group)
}

/// Whether `members` run faster as one group of mixed widths than through
/// lanes, by at least a tenth (the model's margin): where launches bound
/// the lanes and the padding costs less than the launches saved. Never on
/// a CPU, where a launch costs nothing to save (and where fused groups
/// never beat lanes: see the module docs).
pub fn mixed_group_pays(rates: MixRates, members: &[MixMember], group_launches: usize) -> bool {
    if members.len() < 2 {
        return false;
    }
    let (lanes, group) = mixed_group_times(rates, members, group_launches);
    group * 1.1 < lanes
}

/// Launches of one iteration of an MLP of `layers` layers: the batch's
/// gathers, the loss and the optimizer step, and per layer its three
/// products, the bias and activation, the bias gradient and the
/// activation's gradient; dropout adds two per hidden layer (forward and
/// backward); a group of mixed widths adds a launch per product (its
/// pointer arrays), and steps each layer's weights and bias as two ragged
/// runs instead of one step over everything.
pub fn launches(layers: usize, dropout: bool, mixed: bool) -> usize {
    let optimizer = if mixed { 2 * layers } else { 1 };
    3 + optimizer + layers * if mixed { 8 } else { 5 } + if dropout { 2 * (layers - 1) } else { 0 }
}

/// Launches of one iteration of a group of mixed shapes `layers` deep
/// whose members have `depths` distinct depths: each depth past the first
/// adds the output layer's three products and their pointer arrays.
pub fn mixed_launches(layers: usize, dropout: bool, depths: usize) -> usize {
    launches(layers, dropout, true) + 6 * depths.saturating_sub(1)
}

/// Units of a member's activations (per row) that a group laid out as
/// `layout` sweeps beyond its own: the padding of each layer it has, and
/// the whole of each layer it lacks.
pub fn padding_units(hidden: &[usize], layout: &[usize]) -> usize {
    layout
        .iter()
        .enumerate()
        .map(|(l, &w)| w.saturating_sub(hidden.get(l).copied().unwrap_or(0)))
        .sum()
}

/// Backend ops of one conv unit in an iteration, counted from the conv
/// net's passes: forward its convolution, batch norm (or bias),
/// activation and pooling; backward their four gradients and the
/// convolution's data gradient.
pub const CONV_UNIT_OPS: usize = 9;

/// Ops of one iteration of `spec`'s conv net, if any: a group of mixed
/// heads runs them once for all its members.
pub fn conv_ops(spec: &training::ModelSpec) -> usize {
    spec.conv
        .as_ref()
        .map_or(0, |c| CONV_UNIT_OPS * c.plan().units.len())
}

/// What the mixing cost model needs of `trial` in a group laid out as
/// `layout` (its hidden widths, [`training::mixed_hidden`]).
pub fn mix_member<B: Backend>(trial: &TrainTrial<B>, layout: &[usize]) -> MixMember {
    let spec = trial.spec();
    let rows = trial.config().batch_size as f64;
    let unit_padding = padding_units(&spec.hidden, layout);
    let dropout = trial.config().hparams.dropout > 0.0;
    // About eight element-wise passes touch each activation; dropout's
    // forward and backward two more.
    let passes = if dropout { 10.0 } else { 8.0 };
    MixMember {
        flops: trial.flops_per_iteration(),
        launches: launches(spec.hidden.len() + 1, dropout, false) + conv_ops(spec),
        dropout,
        // The optimizer steps the member's own parameters only.
        padding_bytes: 4.0 * passes * rows * unit_padding as f64,
    }
}

/// [`mixed_group_pays`] for `trials` as one group laid out as `layout`
/// (its hidden widths) on a device of `kind`.
pub fn mixing_pays<B: Backend>(
    kind: DeviceKind,
    trials: &[&TrainTrial<B>],
    layout: &[usize],
) -> bool {
    let costs: Vec<_> = trials.iter().map(|t| mix_member(t, layout)).collect();
    // A group runs dropout's launches if any member drops.
    let dropout = costs.iter().any(|c| c.dropout);
    let depths: std::collections::BTreeSet<usize> =
        trials.iter().map(|t| t.spec().hidden.len()).collect();
    // Members of one key share their conv net, which the group runs once.
    let trunk = trials.first().map_or(0, |t| conv_ops(t.spec()));
    let group = mixed_launches(layout.len() + 1, dropout, depths.len()) + trunk;
    mixed_group_pays(MixRates::of(kind), &costs, group)
}

/// Most a group of mixed widths may span: its largest member's
/// parameters over its smallest's. Its layout then pads a member to at
/// most this many times its own parameters.
pub const MIX_SPAN: usize = 4;

/// Cuts trials sorted by size (`sizes`, ascending: each one's parameters)
/// into runs whose largest is at most [`MIX_SPAN`] times their smallest;
/// returns the runs' lengths, in order.
pub fn width_bands(sizes: &[usize]) -> Vec<usize> {
    let mut bands = Vec::new();
    let mut start = 0;
    for (i, &s) in sizes.iter().enumerate() {
        if s > MIX_SPAN * sizes[start].max(1) {
            bands.push(i - start);
            start = i;
        }
    }
    if start < sizes.len() {
        bands.push(sizes.len() - start);
    }
    bands
}

/// Splits `k` trials into groups of at most `cap`, as even as can be.
pub fn split(k: usize, cap: usize) -> Vec<usize> {
    let groups = k.div_ceil(cap.max(1)).max(1);
    (0..groups)
        .map(|g| k / groups + usize::from(g < k % groups))
        .filter(|&n| n > 0)
        .collect()
}

/// `items` in groups of the sizes [`split`] gives, in order.
pub fn groups_of<T>(mut items: Vec<T>, cap: usize) -> Vec<Vec<T>> {
    split(items.len(), cap)
        .into_iter()
        .map(|n| {
            let rest = items.split_off(n);
            std::mem::replace(&mut items, rest)
        })
        .collect()
}

/// A trial that holds, or wants, a seat in a group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seat {
    pub id: u64,
    /// Higher first under `priority`.
    pub priority: f64,
    /// Smaller arrived earlier (the trial number).
    pub arrival: i64,
}

/// Changes to one group's membership, made at its next boundary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reseat {
    /// Waiting trials that join, best first.
    pub join: Vec<u64>,
    /// Members that leave to make way.
    pub evict: Vec<u64>,
}

/// Who holds the seats of a group with `capacity` seats, `members` in it
/// now, when `waiting` trials of its fusion key want one.
///
/// Members keep their seats and waiting trials fill free ones, earliest
/// arrival first. Under `priority` the `capacity` highest-priority trials
/// of both hold the seats: a member leaves only for a waiting trial of
/// strictly higher priority (ties keep members, so seats do not churn), and
/// free seats go to the highest priorities first.
pub fn reseat(policy: Policy, capacity: usize, members: &[Seat], waiting: &[Seat]) -> Reseat {
    let mut waiting = waiting.to_vec();
    if policy != Policy::Priority {
        waiting.sort_by_key(|s| s.arrival);
        let free = capacity.saturating_sub(members.len());
        return Reseat {
            join: waiting.iter().take(free).map(|s| s.id).collect(),
            evict: Vec::new(),
        };
    }
    // Members first among equals: a tie never evicts.
    let mut all: Vec<(bool, Seat)> = members
        .iter()
        .map(|s| (true, *s))
        .chain(waiting.iter().map(|s| (false, *s)))
        .collect();
    all.sort_by(|(am, a), (bm, b)| {
        b.priority
            .total_cmp(&a.priority)
            .then(bm.cmp(am))
            .then(a.arrival.cmp(&b.arrival))
    });
    let (seated, rest) = all.split_at(capacity.min(all.len()));
    Reseat {
        join: seated
            .iter()
            .filter(|(m, _)| !m)
            .map(|(_, s)| s.id)
            .collect(),
        evict: rest.iter().filter(|(m, _)| *m).map(|(_, s)| s.id).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(id: u64, priority: f64) -> Seat {
        Seat {
            id,
            priority,
            arrival: id as i64,
        }
    }

    #[test]
    fn waiting_trials_fill_free_seats_in_arrival_order() {
        let members = [seat(1, 0.0), seat(2, 0.0)];
        let waiting = [seat(7, 5.0), seat(4, 0.0), seat(5, 9.0)];
        for policy in [Policy::Pack, Policy::Fair, Policy::Fifo, Policy::Srtf] {
            assert_eq!(
                reseat(policy, 4, &members, &waiting),
                Reseat {
                    join: vec![4, 5],
                    evict: vec![]
                },
                "{policy:?}"
            );
            // A full group takes nobody and evicts nobody.
            assert_eq!(reseat(policy, 2, &members, &waiting), Reseat::default());
        }
    }

    #[test]
    fn under_priority_the_highest_priorities_hold_the_seats() {
        let members = [seat(1, 0.5), seat(2, 1.2), seat(3, 0.1)];
        // Room for one: the best waiting trial takes it.
        let r = reseat(
            Policy::Priority,
            4,
            &members,
            &[seat(8, 0.05), seat(9, 2.1)],
        );
        assert_eq!(r.join, vec![9]);
        assert!(r.evict.is_empty());
        // Both outrank the lowest member: one takes the free seat, one its.
        let r = reseat(Policy::Priority, 4, &members, &[seat(8, 0.3), seat(9, 2.1)]);
        assert_eq!(r.join, vec![9, 8]);
        assert_eq!(r.evict, vec![3]);
        // Full: a promoted trial (rung 2) pushes out the lowest member.
        let r = reseat(
            Policy::Priority,
            3,
            &members,
            &[seat(9, 2.1), seat(8, 0.05)],
        );
        assert_eq!(r.join, vec![9]);
        assert_eq!(r.evict, vec![3]);
        // A tie keeps the member.
        let r = reseat(Policy::Priority, 3, &members, &[seat(9, 0.1)]);
        assert_eq!(r, Reseat::default());
    }

    #[test]
    fn reseating_keeps_the_group_within_capacity_and_takes_the_best() {
        use proptest::prelude::*;
        let seats = || prop::collection::vec((0u8..4, any::<bool>()), 0..10);
        proptest!(|(cap in 1usize..6, m in seats(), w in seats(), prio in any::<bool>())| {
            let policy = if prio { Policy::Priority } else { Policy::Fifo };
            let members: Vec<Seat> = m.iter().take(cap).enumerate()
                .map(|(i, (p, _))| seat(i as u64, *p as f64)).collect();
            let waiting: Vec<Seat> = w.iter().enumerate()
                .map(|(i, (p, _))| seat(100 + i as u64, *p as f64)).collect();
            let r = reseat(policy, cap, &members, &waiting);
            let size = members.len() - r.evict.len() + r.join.len();
            prop_assert!(size <= cap);
            prop_assert_eq!(size, cap.min(members.len() + waiting.len()), "seats stay filled");
            prop_assert!(r.join.iter().all(|j| waiting.iter().any(|s| s.id == *j)));
            prop_assert!(r.evict.iter().all(|j| members.iter().any(|s| s.id == *j)));
            if prio {
                // Nobody left out outranks anybody seated.
                let seated: Vec<f64> = members.iter().filter(|s| !r.evict.contains(&s.id))
                    .chain(waiting.iter().filter(|s| r.join.contains(&s.id)))
                    .map(|s| s.priority).collect();
                let out = members.iter().filter(|s| r.evict.contains(&s.id))
                    .chain(waiting.iter().filter(|s| !r.join.contains(&s.id)));
                for s in out {
                    prop_assert!(seated.iter().all(|&p| p >= s.priority));
                }
            } else {
                prop_assert!(r.evict.is_empty());
            }
        });
    }

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
        assert_eq!(
            group_cap(DeviceKind::Cpu, 8, big, &small, 64),
            8,
            "fuse bounds"
        );
        assert_eq!(
            group_cap(DeviceKind::Cpu, 1, big, &small, 64),
            1,
            "fuse = 1 is off"
        );
        // 4.2 MB swept per trial: alone on the CPU, all in one group on a GPU.
        let h256 = fp(3_200_000, 1_000_000);
        assert_eq!(group_cap(DeviceKind::Cpu, 64, big, &h256, 64), 1);
        // 784-32-32-10 at batch 128 (1.7 MB): in pairs on the CPU.
        let h32 = fp(318_088, 1_387_080);
        assert_eq!(group_cap(DeviceKind::Cpu, 8, big, &h32, 4), 2);
        // A conv net's buffers count too: `cnn-32` runs alone.
        let cnn32 = fp(1_074_952, 102_862_280);
        assert_eq!(group_cap(DeviceKind::Cpu, 8, big, &cnn32, 4), 1);
        assert_eq!(group_cap(DeviceKind::Cuda(0), 64, big, &h256, 64), 64);
        // A lane with room for three members gets groups of three.
        assert_eq!(
            group_cap(DeviceKind::Cuda(0), 64, 1000 + 3 * 4_200_000, &h256, 64),
            3
        );
        // On the CPU a group takes no more than its lane's share.
        assert_eq!(group_cap(DeviceKind::Cpu, 8, big, &small, 3), 3);
        assert_eq!(group_cap(DeviceKind::Cuda(0), 8, big, &small, 3), 8);
        // Even a member too large for the lane forms a "group" of one.
        assert_eq!(group_cap(DeviceKind::Cuda(0), 64, 10, &h256, 64), 1);
    }

    fn mlp(h: f64, rows: f64) -> MixMember {
        // 784-h-h-10 at batch `rows`: 3 products a layer, eight element-wise
        // passes over a padding of half its width in each hidden layer.
        let params = 784.0 * h + h * h + 10.0 * h;
        MixMember {
            flops: 6.0 * rows * params,
            launches: 22,
            dropout: false,
            padding_bytes: 4.0 * 8.0 * rows * h,
        }
    }

    #[test]
    fn dropout_adds_two_launches_per_hidden_layer() {
        // A 3-layer MLP: 19 launches alone, 23 with dropout; a group of
        // mixed widths adds one per product and steps 6 ragged runs.
        assert_eq!(launches(3, false, false), 19);
        assert_eq!(launches(3, true, false), 23);
        assert_eq!(launches(3, false, true), 33);
        assert_eq!(launches(3, true, true), 37);
    }

    #[test]
    fn each_further_depth_adds_the_output_layer_s_products() {
        // Three layers, one depth: as `launches`; two more depths, 12 more.
        assert_eq!(mixed_launches(3, false, 1), launches(3, false, true));
        assert_eq!(mixed_launches(3, false, 3), 33 + 12);
        assert_eq!(mixed_launches(3, true, 2), 37 + 6);
    }

    #[test]
    fn groups_of_three_depths_still_pay_where_launches_bound_the_lanes() {
        let gpu = MixRates::of(DeviceKind::Cuda(0));
        // 64 small trials of 1-3 hidden layers: about 22 launches each
        // through lanes, against one group 4 layers deep with 3 exits.
        let small: Vec<_> = (0..64)
            .map(|i| MixMember {
                launches: launches(2 + i % 3, false, false),
                ..mlp(64.0 + i as f64, 128.0)
            })
            .collect();
        let group = mixed_launches(4, false, 3);
        assert!(mixed_group_pays(gpu, &small, group));
        // Never on the CPU.
        assert!(!mixed_group_pays(
            MixRates::of(DeviceKind::Cpu),
            &small,
            group
        ));
    }

    #[test]
    fn a_conv_net_counts_its_units_ops_and_an_mlp_none() {
        let net = training::model::ConvNetSpec {
            image: training::model::ImageShape { h: 8, w: 8, c: 1 },
            stages: vec![4, 8],
            blocks_per_stage: 2,
            kernel: 3,
            residual: false,
            batch_norm: true,
            pool: kernels::PoolKind::Max,
            global_pool: false,
            augment: None,
        };
        let units = net.plan().units.len();
        assert_eq!(units, 4, "two stages of two units");
        let mlp = training::ModelSpec {
            input: 64,
            hidden: vec![16],
            output: 10,
            activation: kernels::Activation::Relu,
            loss: training::LossKind::CrossEntropy,
            conv: None,
            precision: Default::default(),
        };
        assert_eq!(conv_ops(&mlp), 0);
        let cnn = training::ModelSpec {
            conv: Some(net),
            ..mlp
        };
        assert_eq!(conv_ops(&cnn), 4 * CONV_UNIT_OPS);
    }

    #[test]
    fn a_shallower_member_sweeps_the_layers_it_lacks_as_padding() {
        assert_eq!(padding_units(&[16, 12], &[24, 12]), 8);
        // One layer of a layout of three: the padding of its own, the rest whole.
        assert_eq!(padding_units(&[7], &[24, 12, 12]), 17 + 12 + 12);
        assert_eq!(padding_units(&[24, 12, 12], &[24, 12, 12]), 0);
    }

    #[test]
    fn mixed_groups_pay_where_launches_bound_the_lanes() {
        let gpu = MixRates::of(DeviceKind::Cuda(0));
        let cpu = MixRates::of(DeviceKind::Cpu);
        // 64 small trials: 1,408 launches through lanes against 31 as a group.
        let small: Vec<_> = (0..64).map(|i| mlp(64.0 + i as f64, 128.0)).collect();
        assert!(mixed_group_pays(gpu, &small, 31));
        let (lanes, group) = mixed_group_times(gpu, &small, 31);
        assert!(lanes > 5.0 * group, "{lanes} against {group}");
        // Never on the CPU, whatever the sizes.
        assert!(!mixed_group_pays(cpu, &small, 31));
        // Four wide trials: the arithmetic bounds both, and the padding costs.
        let wide: Vec<_> = [2048.0, 3072.0, 4096.0, 4000.0]
            .iter()
            .map(|&h| mlp(h, 1024.0))
            .collect();
        assert!(!mixed_group_pays(gpu, &wide, 31));
        // A group of one never pays.
        assert!(!mixed_group_pays(gpu, &small[..1], 31));
    }

    #[test]
    fn width_bands_span_at_most_mix_span() {
        assert_eq!(width_bands(&[]), Vec::<usize>::new());
        assert_eq!(width_bands(&[10]), vec![1]);
        assert_eq!(width_bands(&[10, 20, 40, 41, 160, 161, 700]), vec![3, 3, 1]);
        let sizes: Vec<usize> = (0..64).map(|i| 100 + i * i * 10).collect();
        let bands = width_bands(&sizes);
        assert_eq!(bands.iter().sum::<usize>(), 64);
        let mut at = 0;
        for b in bands {
            assert!(b > 0 && sizes[at + b - 1] <= MIX_SPAN * sizes[at]);
            at += b;
        }
    }

    #[test]
    fn groups_keep_every_item_in_order() {
        let g = groups_of((0..10).collect(), 4);
        assert_eq!(g, vec![vec![0, 1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]]);
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
