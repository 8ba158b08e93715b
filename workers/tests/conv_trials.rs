//! Conv-net trials as jobs: they learn images, their footprint is what they
//! allocate, and export/import, swapping and fusion leave their trajectory
//! bit for bit unchanged (batch norm's running statistics included).

mod common;

use std::collections::BTreeMap;

use common::*;
use kernels::{Activation, CpuBackend, PoolKind};
use training::data::{ImageShape, SplitData, digit_images, split, synthetic_images};
use training::model::{Augment, ConvNetSpec};
use training::{
    FusedTrials, Job, Lane, MemberOutcome, Optimizer, Report, StepOutcome, TrainTrial, TrialConfig,
    TrialSnapshot,
};

fn images() -> SplitData {
    split(
        &synthetic_images(96, ImageShape { h: 8, w: 8, c: 3 }, 4, 3),
        0.25,
        1,
    )
    .unwrap()
}

fn net(batch_norm: bool, residual: bool, pool: PoolKind, global_pool: bool) -> ConvNetSpec {
    ConvNetSpec {
        // The data's shape is filled in when a trial is bound to it.
        image: ImageShape { h: 0, w: 0, c: 0 },
        stages: vec![4, 6],
        blocks_per_stage: 2,
        kernel: 3,
        residual,
        batch_norm,
        pool,
        global_pool,
        augment: None,
    }
}

fn cnn(conv: ConvNetSpec, batch: usize, epochs: u64, dropout: f32, seed: u64) -> TrialConfig {
    TrialConfig {
        conv: Some(conv),
        report_every: Some(5),
        ..config(
            vec![16],
            Activation::Relu,
            batch,
            epochs,
            hparams(Optimizer::adam(), 3e-3, dropout, seed),
        )
    }
}

/// Several shapes of net: batch norm and residual blocks, and neither.
fn configs() -> Vec<TrialConfig> {
    vec![
        cnn(net(true, true, PoolKind::Max, false), 8, 3, 0.0, 1),
        cnn(net(false, false, PoolKind::Avg, true), 8, 3, 0.2, 2),
        cnn(net(true, false, PoolKind::Max, true), 6, 2, 0.1, 3),
        cnn(
            augmented(net(true, true, PoolKind::Avg, false)),
            8,
            2,
            0.0,
            4,
        ),
    ]
}

/// Random crops (2 pixels) and flips of the training images.
fn augmented(mut n: ConvNetSpec) -> ConvNetSpec {
    n.augment = Some(Augment {
        crop: 2,
        flip: true,
    });
    n
}

#[test]
fn a_cnn_learns_the_digit_images() {
    let data = split(&digit_images(), 0.2, 0).unwrap();
    let mut lane = cpu_lane(2);
    let dev = upload(&mut lane, &data);
    let mut cfg = cnn(net(true, true, PoolKind::Max, false), 64, 4, 0.0, 7);
    cfg.conv.as_mut().unwrap().stages = vec![16, 32];
    cfg.hidden = vec![64];
    cfg.report_every = None;
    let reports = run_to_end(
        &mut TrainTrial::new(&mut lane, dev, cfg).unwrap(),
        &mut lane,
    );
    let last = reports.last().unwrap();
    assert!(
        last.val_accuracy.unwrap() > 0.9,
        "accuracy {:?} after 4 epochs",
        last.val_accuracy
    );
    assert!(last.train_loss < reports[0].train_loss);
}

#[test]
fn a_cnn_footprint_equals_what_is_allocated() {
    let data = images();
    for cfg in configs() {
        let mut lane = cpu_lane(1);
        let dev = upload(&mut lane, &data);
        let mut trial = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        trial.step(&mut lane).unwrap();
        let fp = trial.footprint();
        assert_eq!(lane.arena_allocated_elems() * 4, fp.ephemeral_bytes);
        assert_eq!(trial.swap_out(&mut lane).unwrap(), fp.persistent_bytes);
    }
}

#[test]
fn cnn_export_import_and_swap_continue_bit_exactly() {
    let data = images();
    for cfg in configs() {
        let mut lane = cpu_lane(2);
        let dev = upload(&mut lane, &data);
        let straight = run_to_end(
            &mut TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap(),
            &mut lane,
        );
        assert!(straight.len() >= 4, "{cfg:?}: reports every 5 iterations");

        // A checkpoint mid-epoch, into a fresh trial.
        let mut first = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        let cut = first.iterations_per_epoch() + 3;
        let mut reports = run_iterations(&mut first, &mut lane, cut);
        let state = first.export_state(&mut lane).unwrap();
        assert_eq!(
            !state.slot.running.is_empty(),
            cfg.conv.as_ref().unwrap().batch_norm,
            "batch norm's running statistics travel with the state"
        );
        let bytes = state.to_bytes();
        drop(first);
        let mut second = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        second
            .import_state(&mut lane, &TrialSnapshot::from_bytes(&bytes).unwrap())
            .unwrap();
        reports.extend(run_to_end(&mut second, &mut lane));
        assert_eq!(reports, straight, "resumed from bytes: {cfg:?}");

        // Swapped out while another trial uses the lane's arena.
        let mut trial = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        let mut reports = run_iterations(&mut trial, &mut lane, 7);
        trial.swap_out(&mut lane).unwrap();
        let mut other = TrainTrial::new(&mut lane, dev.clone(), configs()[2].clone()).unwrap();
        run_iterations(&mut other, &mut lane, 4);
        trial.swap_in(&mut lane).unwrap();
        reports.extend(run_to_end(&mut trial, &mut lane));
        assert_eq!(reports, straight, "swapped: {cfg:?}");
    }
}

/// K trials of one net fused into one group report, bit for bit, what each
/// reports alone, while one of them is dropped and the group swapped.
#[test]
fn fused_cnn_trials_match_lone_trials_bit_for_bit() {
    let data = images();
    let mut lane = cpu_lane(2);
    let dev = upload(&mut lane, &data);
    let base = augmented(net(true, true, PoolKind::Max, false));
    let cfgs: Vec<TrialConfig> = [(3e-3, 0.0, 3), (1e-2, 0.3, 2), (5e-4, 0.1, 3)]
        .into_iter()
        .enumerate()
        .map(|(i, (lr, dropout, epochs))| {
            let mut c = cnn(base.clone(), 8, epochs, dropout, 30 + i as u64);
            c.hparams.lr = lr;
            c
        })
        .collect();
    let alone: Vec<Vec<Report>> = cfgs
        .iter()
        .map(|c| {
            run_to_end(
                &mut TrainTrial::new(&mut lane, dev.clone(), c.clone()).unwrap(),
                &mut lane,
            )
        })
        .collect();
    let trials = cfgs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as u64,
                TrainTrial::new_on_host(dev.clone(), c.clone()).unwrap(),
            )
        })
        .collect();
    let mut group = FusedTrials::new(trials).unwrap();
    assert_eq!(group.len(), 3, "one net, one fusion key");
    let mut got: BTreeMap<u64, Vec<Report>> = BTreeMap::new();
    let mut it = 0;
    while group.live_members() > 0 {
        if it == 6 {
            assert!(group.swap_out(&mut lane).unwrap() > 0);
        }
        let StepOutcome::Members(steps) = group.step(&mut lane).unwrap() else {
            panic!("a fused group reports per member")
        };
        for s in steps {
            match s.outcome {
                MemberOutcome::Report(r) | MemberOutcome::Finished(r) => {
                    got.entry(s.tag).or_default().push(r)
                }
                other => panic!("member {}: {other:?}", s.tag),
            }
        }
        it += 1;
    }
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(&got[&(i as u64)], want, "member {i}");
    }
}

/// Augmentation changes what a trial trains on, not what it is evaluated
/// on: the same seed with and without it starts from the same validation
/// loss and then departs.
#[test]
fn augmentation_changes_training_not_evaluation() {
    let data = images();
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &data);
    let plain = cnn(net(true, false, PoolKind::Max, false), 8, 1, 0.0, 9);
    let mut aug = plain.clone();
    aug.conv = aug.conv.map(augmented);
    let run = |lane: &mut Lane<CpuBackend>, c: &TrialConfig| {
        let mut t = TrainTrial::new(lane, dev.clone(), c.clone()).unwrap();
        run_iterations(&mut t, lane, 5)
    };
    let (a, b) = (run(&mut lane, &plain), run(&mut lane, &aug));
    assert_ne!(a[0].train_loss, b[0].train_loss, "augmented batches differ");
    assert_eq!(run(&mut lane, &aug), b, "and are the same every time");
}

#[test]
fn a_cnn_without_image_data_or_with_an_even_kernel_is_refused() {
    let mut lane = cpu_lane(1);
    let flat = upload(&mut lane, &small_classification());
    let cfg = configs().remove(0);
    let err = TrainTrial::new(&mut lane, flat, cfg.clone()).err().unwrap();
    assert!(err.to_string().contains("needs image data"), "{err}");
    let dev = upload(&mut lane, &images());
    let mut even = cfg;
    even.conv.as_mut().unwrap().kernel = 4;
    let err = TrainTrial::new(&mut lane, dev, even).err().unwrap();
    assert!(err.to_string().contains("odd kernel"), "{err}");
}
