//! Fused groups: every member's reports equal the same trial run alone with
//! the same seed (fp32 tolerance), while members finish at different times,
//! are dropped mid-run, and the group is swapped out and back.

mod common;

use std::collections::BTreeMap;

use common::*;
use kernels::{Activation, CpuBackend};
use training::{
    FusedTrials, Job, Lane, MemberOutcome, Optimizer, Report, StepOutcome, TrainTrial, TrialConfig,
    TrialSnapshot,
};

fn configs() -> Vec<TrialConfig> {
    let adamw = Optimizer::AdamW {
        beta1: 0.85,
        beta2: 0.99,
        eps: 1e-6,
    };
    [
        (Optimizer::adam(), 1e-2, 0.0, 3),
        (adamw, 3e-3, 0.25, 2),
        (Optimizer::adam(), 5e-2, 0.1, 4),
        (adamw, 1e-3, 0.0, 3),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (opt, lr, dropout, epochs))| {
        let mut c = config(
            vec![16, 12],
            Activation::Gelu,
            10,
            epochs,
            hparams(opt, lr, dropout, 20 + i as u64),
        );
        c.report_every = Some(3 + i as u64 % 2);
        c
    })
    .collect()
}

fn alone(lane: &mut Lane<CpuBackend>, cfg: &TrialConfig) -> Vec<Report> {
    let data = small_classification();
    let dev = upload(lane, &data);
    let mut t = TrainTrial::new(lane, dev, cfg.clone()).unwrap();
    run_to_end(&mut t, lane)
}

#[track_caller]
fn assert_same(tag: u64, fused: &[Report], lone: &[Report]) {
    assert_eq!(fused.len(), lone.len(), "member {tag}: report count");
    for (a, b) in fused.iter().zip(lone) {
        assert_eq!((a.step, a.iteration), (b.step, b.iteration), "member {tag}");
        for (what, x, y) in [
            ("train_loss", a.train_loss, b.train_loss),
            ("val_loss", a.val_loss, b.val_loss),
        ] {
            assert!(
                (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                "member {tag} step {}: {what} fused {x}, alone {y}",
                a.step
            );
        }
        let (x, y) = (a.val_accuracy.unwrap(), b.val_accuracy.unwrap());
        assert!((x - y).abs() <= 0.02, "member {tag}: accuracy {x} vs {y}");
    }
}

/// Runs the group to its end; `at(iteration, group, lane)` may act at boundaries.
fn run_fused(
    lane: &mut Lane<CpuBackend>,
    mut group: FusedTrials<CpuBackend>,
    mut at: impl FnMut(u64, &mut FusedTrials<CpuBackend>, &mut Lane<CpuBackend>),
) -> BTreeMap<u64, Vec<Report>> {
    let mut got: BTreeMap<u64, Vec<Report>> = BTreeMap::new();
    let mut left = Vec::new();
    let mut it = 0;
    while group.live_members() > 0 {
        at(it, &mut group, lane);
        step_once(&mut group, lane, it as usize, &mut got, &mut left);
        it += 1;
    }
    assert!(left.is_empty(), "members left unasked: {left:?}");
    got
}

/// One step of `group`: each member's report into `got`, and `(it, tag)`
/// of each member that left into `left`.
fn step_once(
    group: &mut FusedTrials<CpuBackend>,
    lane: &mut Lane<CpuBackend>,
    it: usize,
    got: &mut BTreeMap<u64, Vec<Report>>,
    left: &mut Vec<(usize, u64)>,
) {
    let StepOutcome::Members(steps) = group.step(lane).unwrap() else {
        panic!("a fused group reports per member")
    };
    for s in steps {
        match s.outcome {
            MemberOutcome::Report(r) | MemberOutcome::Finished(r) => {
                got.entry(s.tag).or_default().push(r)
            }
            MemberOutcome::Left => left.push((it, s.tag)),
            MemberOutcome::Failed(e) => panic!("member {} failed: {e}", s.tag),
        }
    }
}

/// Member `i`'s reports (`got[i]`) have the validation losses, bit for
/// bit, of `cfgs[i]` trained alone on `lane`.
#[track_caller]
fn assert_reports_of_lone_trials(
    lane: &mut Lane<CpuBackend>,
    dev: &std::sync::Arc<training::DeviceData<CpuBackend>>,
    cfgs: &[TrialConfig],
    got: &BTreeMap<u64, Vec<Report>>,
) {
    for (i, cfg) in cfgs.iter().enumerate() {
        let mut t = TrainTrial::new(lane, dev.clone(), cfg.clone()).unwrap();
        let lone = run_to_end(&mut t, lane);
        let fused = &got[&(i as u64)];
        assert_eq!(fused.len(), lone.len(), "member {i}: report count");
        for (a, b) in fused.iter().zip(&lone) {
            assert_eq!(
                a.val_loss.to_bits(),
                b.val_loss.to_bits(),
                "member {i} ({:?}): val_loss",
                cfg.hidden
            );
        }
    }
}

/// Steps `group` until no member is live, calling `before(it, group, lane)`
/// ahead of step `it`: every member's reports, and `(iteration, tag)` of
/// each member that left.
#[allow(clippy::type_complexity)]
fn run_group(
    group: &mut FusedTrials<CpuBackend>,
    lane: &mut Lane<CpuBackend>,
    mut before: impl FnMut(usize, &mut FusedTrials<CpuBackend>, &mut Lane<CpuBackend>),
) -> (BTreeMap<u64, Vec<Report>>, Vec<(usize, u64)>) {
    let (mut got, mut left) = (BTreeMap::new(), Vec::new());
    for it in 0.. {
        if group.live_members() == 0 {
            break;
        }
        before(it, group, lane);
        step_once(group, lane, it, &mut got, &mut left);
    }
    (got, left)
}

/// One host-side trial per config, tagged by its index.
fn on_host(
    dev: &std::sync::Arc<training::DeviceData<CpuBackend>>,
    cfgs: &[TrialConfig],
) -> Vec<(u64, TrainTrial<CpuBackend>)> {
    cfgs.iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as u64,
                TrainTrial::new_on_host(dev.clone(), c.clone()).unwrap(),
            )
        })
        .collect()
}

fn group_of(lane: &mut Lane<CpuBackend>, cfgs: &[TrialConfig]) -> FusedTrials<CpuBackend> {
    let dev = upload(lane, &small_classification());
    let trials = on_host(&dev, cfgs);
    FusedTrials::new(trials).unwrap()
}

#[test]
fn fused_members_match_lone_trials_as_they_finish_at_different_times() {
    let mut lane = cpu_lane(2);
    let cfgs = configs();
    let group = group_of(&mut lane, &cfgs);
    assert_eq!(group.len(), 4);
    let got = run_fused(&mut lane, group, |_, _, _| {});
    for (i, c) in cfgs.iter().enumerate() {
        assert_same(i as u64, &got[&(i as u64)], &alone(&mut lane, c));
    }
}

#[test]
fn dropping_a_member_and_swapping_the_group_leave_the_others_untouched() {
    let mut lane = cpu_lane(1);
    let cfgs = configs();
    let group = group_of(&mut lane, &cfgs);
    let control = group.control();
    let got = run_fused(&mut lane, group, |it, g, lane| {
        if it == 5 {
            control.drop_member(1);
        }
        if it == 9 {
            assert!(g.swap_out(lane).unwrap() > 0);
            assert!(!g.is_resident());
        }
        if it == 11 {
            // A member can leave with its state and carry on alone.
            let mut t = g.leave(lane, 2).unwrap();
            assert_eq!(t.iterations_done(), 11);
            t.swap_in(lane).unwrap();
        }
    });
    assert!(!got.contains_key(&2) || got[&2].iter().all(|r| r.iteration <= 11));
    assert!(
        got.get(&1)
            .is_none_or(|r| r.iter().all(|r| r.iteration <= 5))
    );
    for i in [0u64, 3] {
        assert_same(i, &got[&i], &alone(&mut lane, &cfgs[i as usize]));
    }
}

#[test]
fn only_trials_of_one_key_fuse() {
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &small_classification());
    let mut cfgs = configs();
    cfgs[1].hidden = vec![16, 13];
    let trials = on_host(&dev, &cfgs);
    let err = FusedTrials::new(trials).err().expect("different shapes");
    assert!(err.to_string().contains("fusion key"), "{err}");
}

#[test]
fn trials_join_a_running_group_and_members_leave_with_their_state() {
    let mut lane = cpu_lane(2);
    let cfgs = configs();
    let dev = upload(&mut lane, &small_classification());
    let host = |i: usize| TrainTrial::new_on_host(dev.clone(), cfgs[i].clone()).unwrap();
    let mut group = FusedTrials::with_capacity(vec![(0, host(0)), (1, host(1))], 3).unwrap();
    let control = group.control();
    // Trial 3 runs alone for a while, then joins with its state on the host.
    let mut three = TrainTrial::new(&mut lane, dev.clone(), cfgs[3].clone()).unwrap();
    let mut three_alone = Vec::new();
    for _ in 0..7 {
        if let StepOutcome::Report(r) = three.step(&mut lane).unwrap() {
            three_alone.push(r);
        }
    }
    three.swap_out(&mut lane).unwrap();
    let mut three = Some(three);
    let mut got: BTreeMap<u64, Vec<Report>> = BTreeMap::new();
    let mut left = Vec::new();
    for it in 0.. {
        if group.live_members() == 0 {
            break;
        }
        if it == 3 {
            control.join(2, host(2));
            // The group is full (3 of 3): this one comes back.
            control.join(9, host(0));
        }
        if it == 6 {
            control.leave(0);
        }
        if it == 7 {
            control.join(3, three.take().unwrap());
        }
        step_once(&mut group, &mut lane, it, &mut got, &mut left);
        assert!(group.len() <= 3, "capacity");
    }
    assert_eq!(
        left,
        vec![(3, 9), (6, 0)],
        "the extra joiner, then the leaver"
    );
    let mut handed: BTreeMap<u64, TrainTrial<CpuBackend>> =
        control.take_left().into_iter().collect();
    assert!(control.take_unjoined().is_empty());
    let extra = handed.remove(&9).unwrap();
    assert_eq!(extra.iterations_done(), 0, "untouched");
    // The leaver carries on alone where it left the group.
    let mut zero = handed.remove(&0).unwrap();
    assert_eq!(zero.iterations_done(), 6);
    zero.swap_in(&mut lane).unwrap();
    let mut zero_reports = got.remove(&0).unwrap_or_default();
    zero_reports.extend(run_to_end(&mut zero, &mut lane));
    assert_same(0, &zero_reports, &alone(&mut lane, &cfgs[0]));
    for i in [1u64, 2] {
        assert_same(i, &got[&i], &alone(&mut lane, &cfgs[i as usize]));
    }
    three_alone.extend(got.remove(&3).unwrap());
    assert_same(3, &three_alone, &alone(&mut lane, &cfgs[3]));
}

/// Trials of different widths as one group of mixed widths: each member's
/// reports are the bits of the same trial alone, through a swap out and
/// back, a member leaving and carrying on alone, a narrower trial joining,
/// and a wider one handed back.
#[test]
fn mixed_width_members_equal_lone_trials_bit_for_bit() {
    mixed_shapes_equal_lone_trials(false, false);
}

/// The same with dropout in two of the five members (p of 0.25 and 0.1):
/// each draws its own masks in the padded layout.
#[test]
fn mixed_width_members_with_dropout_equal_lone_trials_bit_for_bit() {
    mixed_shapes_equal_lone_trials(true, false);
}

/// The same with members of one, two and three hidden layers, with and
/// without dropout: each member's output layer reads its own last hidden
/// layer, and the layers it lacks are products of size 0.
#[test]
fn mixed_depth_members_equal_lone_trials_bit_for_bit() {
    mixed_shapes_equal_lone_trials(false, true);
    mixed_shapes_equal_lone_trials(true, true);
}

fn mixed_shapes_equal_lone_trials(dropout: bool, depths: bool) {
    let mut lane = cpu_lane(2);
    let widths = if depths {
        // Layout [24, 12, 12]: the last layer is as wide as member 0's last.
        [
            vec![16, 12],
            vec![24, 5, 8],
            vec![7],
            vec![16, 12],
            vec![9, 9],
        ]
    } else {
        [
            vec![16, 12],
            vec![24, 5],
            vec![7, 30],
            vec![16, 12],
            vec![9, 9],
        ]
    };
    let cfgs: Vec<TrialConfig> = configs()
        .into_iter()
        .cycle()
        .zip(&widths)
        .map(|(mut c, w)| {
            c.hidden = w.clone();
            if !dropout {
                c.hparams.dropout = 0.0;
            }
            c
        })
        .collect();
    assert_eq!(
        cfgs.iter().filter(|c| c.hparams.dropout > 0.0).count(),
        if dropout { 2 } else { 0 }
    );
    let dev = upload(&mut lane, &small_classification());
    let host = |i: usize| TrainTrial::new_on_host(dev.clone(), cfgs[i].clone()).unwrap();
    let trials = (0..4).map(|i| (i as u64, host(i))).collect();
    let mut group = FusedTrials::mixed(trials, 5)
        .unwrap()
        .keeping_final_states(true);
    let control = group.control();
    let (mut got, left) = run_group(&mut group, &mut lane, |it, group, lane| match it {
        4 => {
            assert!(group.swap_out(lane).unwrap() > 0);
        }
        5 => control.leave(1),
        // Narrower than the layout in both layers: joins. Wider (40 > 24): handed back.
        6 => {
            control.join(4, host(4));
            let mut wide = cfgs[0].clone();
            wide.hidden = vec![40, 12];
            control.join(9, TrainTrial::new_on_host(dev.clone(), wide).unwrap());
        }
        _ => {}
    });
    assert_eq!(
        left,
        vec![(5, 1), (6, 9)],
        "the leaver, then the wide joiner"
    );
    let mut finals: BTreeMap<u64, TrialSnapshot> = group.take_final_states().into_iter().collect();
    let mut handed: BTreeMap<u64, TrainTrial<CpuBackend>> =
        control.take_left().into_iter().collect();
    let mut one = handed.remove(&1).unwrap();
    one.swap_in(&mut lane).unwrap();
    let mut one_reports = got.remove(&1).unwrap_or_default();
    one_reports.extend(run_to_end(&mut one, &mut lane));
    got.insert(1, one_reports);
    finals.insert(1, one.export_state(&mut lane).unwrap());
    for i in [0usize, 1, 2, 3, 4] {
        let what = format!("member {i} ({:?})", cfgs[i].hidden);
        let mut t = TrainTrial::new(&mut lane, dev.clone(), cfgs[i].clone()).unwrap();
        let lone = run_to_end(&mut t, &mut lane);
        let fused = &got[&(i as u64)];
        assert_eq!(fused.len(), lone.len(), "{what}: report count");
        for (a, b) in fused.iter().zip(&lone) {
            assert_eq!(a.iteration, b.iteration);
            assert_eq!(
                a.val_loss.to_bits(),
                b.val_loss.to_bits(),
                "{what}: val_loss"
            );
            assert_eq!(a.val_accuracy, b.val_accuracy, "{what}: val_accuracy");
            // The training loss is summed on the device between downloads,
            // which another member's report point splits: its sum is
            // rounded differently, its terms are the same.
            assert!(
                (a.train_loss - b.train_loss).abs() <= 1e-6 * b.train_loss.abs(),
                "{what}: train_loss {} against {}",
                a.train_loss,
                b.train_loss
            );
        }
        let (mine, theirs) = (
            &finals[&(i as u64)].slot,
            &t.export_state(&mut lane).unwrap().slot,
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&mine.params),
            bits(&theirs.params),
            "{what}: final weights"
        );
        for (a, b) in mine.opt_state.iter().zip(&theirs.opt_state) {
            assert_eq!(bits(a), bits(b), "{what}: final optimizer state");
        }
    }
}

/// The layout rule: as deep as the deepest, each layer as wide as the
/// widest that has it, the last as wide as every member's last; a member
/// fits a layout it is no deeper and no wider than.
#[test]
fn a_mixed_layout_covers_every_member_and_a_joiner_must_fit_it() {
    let layout = |h: &[&[usize]]| training::mixed_hidden(h).unwrap();
    assert_eq!(layout(&[&[16, 12], &[24, 5]]), vec![24, 12]);
    assert_eq!(layout(&[&[8, 8, 24], &[24], &[8, 8]]), vec![24, 8, 24]);
    assert_eq!(layout(&[&[24], &[8, 8]]), vec![24, 24]);
    assert!(training::mixed_hidden(&[&[8], &[]]).is_err());
    assert!(training::fits_layout(&[8, 8], &[24, 8, 24]));
    assert!(training::fits_layout(&[24], &[24, 8, 24]));
    assert!(
        !training::fits_layout(&[8, 9], &[24, 8, 24]),
        "a layer too wide"
    );
    assert!(
        !training::fits_layout(&[8, 8, 8, 8], &[24, 8, 24]),
        "too deep"
    );
    assert!(
        !training::fits_layout(&[30], &[30, 8, 24]),
        "its last too wide"
    );
    // Without the deepest member, the others' own layout would be larger
    // than the one their group reserved: `[24, 24]` does not fit
    // `[24, 8, 24]`, so such a group keeps the reserved layout.
    assert!(!training::fits_layout(&[24, 24], &[24, 8, 24]));
}

/// The deepest member of a group of mixed depths leaves: the others' own
/// layout would outgrow the reserved one, so the group keeps it, and each
/// member still reports the bits of the trial alone.
#[test]
fn a_group_whose_deepest_member_leaves_keeps_its_reserved_layout() {
    let mut lane = cpu_lane(2);
    let dev = upload(&mut lane, &small_classification());
    let cfgs: Vec<TrialConfig> = [vec![8, 8, 24], vec![24], vec![8, 8]]
        .into_iter()
        .zip(configs())
        .map(|(hidden, mut c)| {
            c.hidden = hidden;
            c
        })
        .collect();
    let mut group = FusedTrials::mixed(on_host(&dev, &cfgs), 3).unwrap();
    let control = group.control();
    let (mut got, left) = run_group(&mut group, &mut lane, |it, _, _| {
        if it == 2 {
            control.leave(0);
        }
    });
    assert_eq!(left, vec![(2, 0)]);
    let mut zero = control.take_left().pop().unwrap().1;
    zero.swap_in(&mut lane).unwrap();
    got.entry(0)
        .or_default()
        .extend(run_to_end(&mut zero, &mut lane));
    assert_reports_of_lone_trials(&mut lane, &dev, &cfgs, &got);
}

/// Conv nets share a group of mixed shapes when only their heads differ;
/// each member's reports are the bits of the trial alone.
#[test]
fn conv_nets_of_one_conv_net_mix_their_heads() {
    let mut lane = cpu_lane(2);
    let shape = training::data::ImageShape { h: 8, w: 8, c: 3 };
    let data =
        training::data::split(&training::data::synthetic_images(90, shape, 4, 3), 0.25, 0).unwrap();
    let dev = upload(&mut lane, &data);
    let cfgs: Vec<TrialConfig> = [vec![16], vec![8, 12], vec![24, 6]]
        .into_iter()
        .zip(configs())
        .map(|(hidden, mut c)| {
            c.hidden = hidden;
            c.batch_size = 12;
            c.conv = Some(residual_net(shape, vec![6, 8]));
            c
        })
        .collect();
    let trials: Vec<_> = cfgs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let t = TrainTrial::new_on_host(dev.clone(), c.clone()).unwrap();
            (i as u64, t)
        })
        .collect();
    let mut other = cfgs[0].clone();
    other.conv = Some(residual_net(shape, vec![6, 10]));
    let odd = TrainTrial::new_on_host(dev.clone(), other).unwrap();
    let mut with_odd: Vec<_> = cfgs[1..]
        .iter()
        .map(|c| TrainTrial::new_on_host(dev.clone(), c.clone()).unwrap())
        .chain([odd])
        .enumerate()
        .map(|(i, t)| (i as u64, t))
        .collect();
    let refused = FusedTrials::mixed(std::mem::take(&mut with_odd), 3).err();
    assert!(
        refused.is_some_and(|e| e.to_string().contains("hidden layers")),
        "another conv net must not join"
    );
    let mut group = FusedTrials::mixed(trials, 3).unwrap();
    let (got, _) = run_group(&mut group, &mut lane, |it, group, lane| {
        if it == 3 {
            assert!(group.swap_out(lane).unwrap() > 0);
        }
    });
    assert_reports_of_lone_trials(&mut lane, &dev, &cfgs, &got);
}

#[test]
fn a_group_of_mixed_shapes_refuses_other_differences_than_hidden_layers_and_dropout() {
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &small_classification());
    let mut cfgs: Vec<TrialConfig> = configs().into_iter().take(2).collect();
    for c in &mut cfgs {
        c.hparams.dropout = 0.0;
    }
    let build = |cfgs: &[TrialConfig]| {
        let trials = on_host(&dev, cfgs);
        FusedTrials::mixed(trials, 2).err().map(|e| e.to_string())
    };
    let mut deeper = cfgs.clone();
    deeper[1].hidden = vec![16, 12, 8];
    assert_eq!(build(&deeper), None, "depths may differ");
    let mut bare = cfgs.clone();
    bare[1].hidden = vec![];
    assert!(
        build(&bare).unwrap().contains("without hidden layers"),
        "no hidden layer beside some"
    );
    let mut batch = cfgs.clone();
    batch[1].batch_size = 20;
    assert!(
        build(&batch).unwrap().contains("hidden layers"),
        "batch differs"
    );
    let mut dropout = cfgs.clone();
    dropout[1].hparams.dropout = 0.2;
    dropout[1].hidden = vec![8, 30];
    assert_eq!(build(&dropout), None, "widths and dropout may differ");
    assert_eq!(build(&cfgs), None, "widths alone may differ");
}
