//! Training behaviour: exact footprints, fusion keys, fused slots equal to
//! lone trials, learning, determinism and divergence.

mod common;

use common::*;
use kernels::{Activation, Backend, CpuBackend};
use training::data::{digits, split};
use training::group::ModelGroup;
use training::{Job, LossKind, ModelSpec, Optimizer, StepOutcome, TrainTrial, WorkerError};

fn finish(
    trial: &mut TrainTrial<CpuBackend>,
    lane: &mut training::Lane<CpuBackend>,
) -> Result<Vec<training::Report>, WorkerError> {
    let mut out = Vec::new();
    loop {
        match trial.step(lane)? {
            StepOutcome::Continue => {}
            StepOutcome::Report(r) => out.push(r),
            StepOutcome::Finished(r) => {
                out.push(r);
                return Ok(out);
            }
            StepOutcome::Members(_) => unreachable!("a lone trial"),
        }
    }
}

#[test]
fn footprint_equals_what_is_allocated() {
    let data = small_classification();
    for (dropout, opt) in [
        (0.0, Optimizer::adam()),
        (
            0.3,
            Optimizer::Sgd {
                momentum: 0.0,
                nesterov: false,
            },
        ),
    ] {
        let mut lane = cpu_lane(1);
        let dev = upload(&mut lane, &data);
        let cfg = config(
            vec![9, 4, 3],
            Activation::Relu,
            12,
            1,
            hparams(opt, 1e-2, dropout, 1),
        );
        let mut trial = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        trial.step(&mut lane).unwrap();
        let fp = trial.footprint();
        assert_eq!(lane.arena_allocated_elems() * 4, fp.ephemeral_bytes);
        assert_eq!(lane.arena_bytes(), fp.ephemeral_bytes);
        assert_eq!(fp.shared_bytes, dev.bytes());
        let spec = cfg.spec(data.features, data.task, None).unwrap();
        let group = ModelGroup::new(&mut lane, spec, 12, 1, vec![cfg.hparams]).unwrap();
        assert_eq!(
            group.allocated_elems(&CpuBackend::new()) * 4,
            fp.persistent_bytes
        );
        assert_eq!(trial.swap_out(&mut lane).unwrap(), fp.persistent_bytes);
    }
}

#[test]
fn fusion_keys_ignore_slot_scalars_but_not_shapes() {
    let data = small_classification();
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &data);
    let key = |hidden: Vec<usize>,
               batch: usize,
               opt: Optimizer,
               lr: f32,
               seed: u64,
               lane: &mut training::Lane<CpuBackend>| {
        let cfg = config(
            hidden,
            Activation::Relu,
            batch,
            1,
            hparams(opt, lr, 0.1, seed),
        );
        TrainTrial::new(lane, dev.clone(), cfg)
            .unwrap()
            .fusion_key()
    };
    let adamw = Optimizer::AdamW {
        beta1: 0.8,
        beta2: 0.9,
        eps: 1e-6,
    };
    let base = key(vec![8], 10, Optimizer::adam(), 1e-3, 1, &mut lane);
    assert_eq!(base, key(vec![8], 10, adamw, 0.5, 2, &mut lane));
    assert_ne!(
        base,
        key(vec![9], 10, Optimizer::adam(), 1e-3, 1, &mut lane)
    );
    assert_ne!(
        base,
        key(vec![8], 11, Optimizer::adam(), 1e-3, 1, &mut lane)
    );
    assert_ne!(
        base,
        key(
            vec![8],
            10,
            Optimizer::Sgd {
                momentum: 0.9,
                nesterov: false
            },
            1e-3,
            1,
            &mut lane
        )
    );
}

/// K slots with different hyper-parameters, trained as one group, end where
/// K lone groups end (fp32 tolerance: the batched GEMM may block differently).
#[test]
fn fused_slots_match_lone_trials() {
    let data = small_classification();
    let mut lane = cpu_lane(2);
    let dev = upload(&mut lane, &data);
    let spec = ModelSpec {
        precision: Default::default(),
        input: data.features,
        hidden: vec![16, 16],
        output: 3,
        activation: Activation::Gelu,
        loss: LossKind::CrossEntropy,
        conv: None,
    };
    let slots = vec![
        hparams(Optimizer::adam(), 1e-2, 0.0, 1),
        hparams(
            Optimizer::AdamW {
                beta1: 0.85,
                beta2: 0.99,
                eps: 1e-6,
            },
            3e-3,
            0.25,
            2,
        ),
        hparams(Optimizer::adam(), 5e-2, 0.1, 3),
    ];
    let batch = 10;
    let mut fused = ModelGroup::new(&mut lane, spec.clone(), batch, 1, slots.clone()).unwrap();
    let mut lone: Vec<_> = slots
        .iter()
        .map(|h| ModelGroup::new(&mut lane, spec.clone(), batch, 1, vec![*h]).unwrap())
        .collect();
    for it in 0..12u64 {
        let idx: Vec<u32> = (0..3 * batch)
            .map(|i| ((i as u64 * 7 + it * 13) % data.n_train as u64) as u32)
            .collect();
        fused
            .train_step(&mut lane, &dev, &idx, &[it, it, it])
            .unwrap();
        for (s, g) in lone.iter_mut().enumerate() {
            g.train_step(&mut lane, &dev, &idx[s * batch..(s + 1) * batch], &[it])
                .unwrap();
        }
    }
    let fused_eval = fused.evaluate(&mut lane, &dev).unwrap();
    for (s, g) in lone.iter().enumerate() {
        let (a, b) = (
            fused.export_slot(&mut lane, s).unwrap(),
            g.export_slot(&mut lane, 0).unwrap(),
        );
        let scale = b.params.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (x, y) in a.params.iter().zip(&b.params) {
            assert!((x - y).abs() <= 1e-5 * scale, "slot {s}: {x} vs {y}");
        }
        let lone_eval = g.evaluate(&mut lane, &dev).unwrap()[0];
        assert!(
            (fused_eval[s].loss_sum - lone_eval.loss_sum).abs()
                <= 1e-4 * lone_eval.loss_sum.abs().max(1.0)
        );
        assert_eq!(fused_eval[s].rows, lone_eval.rows);
    }
}

#[test]
fn digits_trains_to_high_accuracy_with_sgd_and_is_deterministic() {
    let data = split(&digits(), 0.2, 0).unwrap();
    let mut lane = cpu_lane(2);
    let dev = upload(&mut lane, &data);
    let cfg = config(
        vec![64],
        Activation::Relu,
        32,
        5,
        hparams(
            Optimizer::Sgd {
                momentum: 0.9,
                nesterov: true,
            },
            0.02,
            0.0,
            3,
        ),
    );
    let a = finish(
        &mut TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap(),
        &mut lane,
    )
    .unwrap();
    let last = a.last().unwrap();
    assert!(last.val_accuracy.unwrap() > 0.93, "{last:?}");
    assert!(a.first().unwrap().train_loss > last.train_loss);
    assert_eq!(
        a.iter().map(|r| r.step).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    let b = finish(
        &mut TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap(),
        &mut lane,
    )
    .unwrap();
    assert_eq!(a, b, "same seed, same trajectory");
    let mut other = cfg.clone();
    other.hparams.seed = 4;
    let c = finish(
        &mut TrainTrial::new(&mut lane, dev, other).unwrap(),
        &mut lane,
    )
    .unwrap();
    assert_ne!(a, c);
}

/// BF16 GEMMs (rounded inputs, fp32 accumulation, fp32 master weights and
/// Adam state) learn the digits as well as fp32: the mean final accuracy
/// over 5 seeds within half a point, while the curves do differ (the
/// rounding is real).
#[test]
fn bf16_training_reaches_fp32_accuracy_on_digits() {
    let data = split(&digits(), 0.2, 0).unwrap();
    let mut lane = cpu_lane(2);
    let dev = upload(&mut lane, &data);
    let mut mean = |precision: kernels::Precision| {
        let mut finals = Vec::new();
        let mut curves = Vec::new();
        for seed in 0..5 {
            let mut cfg = config(
                vec![64],
                Activation::Relu,
                32,
                8,
                hparams(Optimizer::adam(), 3e-3, 0.0, seed),
            );
            cfg.precision = precision;
            let r = finish(
                &mut TrainTrial::new(&mut lane, dev.clone(), cfg).unwrap(),
                &mut lane,
            )
            .unwrap();
            finals.push(r.last().unwrap().val_accuracy.unwrap());
            curves.push(r.iter().map(|r| r.train_loss).collect::<Vec<_>>());
        }
        (finals.iter().sum::<f64>() / finals.len() as f64, curves)
    };
    let (fp32, fp32_curves) = mean(kernels::Precision::Fp32);
    let (bf16, bf16_curves) = mean(kernels::Precision::Bf16);
    eprintln!("mean final accuracy over 5 seeds: fp32 {fp32:.4}, bf16 {bf16:.4}");
    assert!(fp32 > 0.95, "fp32 mean accuracy {fp32}");
    assert!(
        (bf16 - fp32).abs() <= 0.005,
        "bf16 mean accuracy {bf16} against fp32's {fp32}"
    );
    assert_ne!(fp32_curves, bf16_curves, "bf16 trained exactly as fp32");
}

#[test]
fn regression_reports_rmse_and_r2() {
    let data = small_regression();
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &data);
    let mut cfg = config(
        vec![32],
        Activation::Tanh,
        10,
        60,
        hparams(Optimizer::adam(), 1e-2, 0.0, 1),
    );
    cfg.report_every = Some(45);
    let mut trial = TrainTrial::new(&mut lane, dev, cfg).unwrap();
    let reports = finish(&mut trial, &mut lane).unwrap();
    assert_eq!(reports.len(), 12, "540 iterations at one report per 45");
    let last = reports.last().unwrap();
    assert!(last.val_r2.unwrap() > 0.8, "{last:?}");
    assert!(last.val_accuracy.is_none());
    // RMSE in original units is the standardised RMSE times the target's std.
    let std_rmse = (1.0 - last.val_r2.unwrap()) * dev_sst(&data) / data.n_val as f64;
    assert!(
        (last.val_rmse.unwrap() - std_rmse.sqrt() * data.target_std[0] as f64).abs()
            < 1e-3 * last.val_rmse.unwrap()
    );
}

fn dev_sst(data: &training::data::SplitData) -> f64 {
    let mean = data.val_y.iter().map(|&v| v as f64).sum::<f64>() / data.n_val as f64;
    data.val_y.iter().map(|&v| (v as f64 - mean).powi(2)).sum()
}

#[test]
fn an_exploding_trial_reports_divergence() {
    let data = small_classification();
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &data);
    let cfg = config(
        vec![16],
        Activation::Relu,
        10,
        20,
        hparams(
            Optimizer::Sgd {
                momentum: 0.9,
                nesterov: false,
            },
            1e30,
            0.0,
            1,
        ),
    );
    let err = finish(
        &mut TrainTrial::new(&mut lane, dev, cfg).unwrap(),
        &mut lane,
    )
    .unwrap_err();
    assert!(matches!(err, WorkerError::Diverged { .. }), "{err}");
}

#[test]
fn bad_trial_configs_are_errors() {
    let data = small_classification();
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &data);
    let ok = config(
        vec![4],
        Activation::Relu,
        10,
        1,
        hparams(Optimizer::adam(), 1e-3, 0.0, 1),
    );
    for bad in [
        training::TrialConfig {
            batch_size: 0,
            ..ok.clone()
        },
        training::TrialConfig {
            batch_size: 10_000,
            ..ok.clone()
        },
        training::TrialConfig {
            epochs: 0,
            ..ok.clone()
        },
        training::TrialConfig {
            hidden: vec![4, 0],
            ..ok.clone()
        },
        training::TrialConfig {
            hparams: training::SlotHparams {
                dropout: 1.0,
                ..ok.hparams
            },
            ..ok.clone()
        },
    ] {
        assert!(matches!(
            TrainTrial::new(&mut lane, dev.clone(), bad),
            Err(WorkerError::Config(_))
        ));
    }
}

/// Labels are checked once, when the data is uploaded, for every backend;
/// the loss only counts bad ones (corrupt device data), and a trial whose
/// statistics count any fails instead of reporting a metric.
#[test]
fn bad_labels_are_refused_at_upload_and_fail_a_trial_that_meets_them() {
    let mut lane = cpu_lane(1);
    let mut data = small_classification();
    data.val_y[3] = 3.0; // three classes: 0, 1, 2
    let e = training::DeviceData::upload(&mut lane, &data)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("validation row 3 has label 3"),
        "{e}"
    );
    data.val_y[3] = 0.5;
    assert!(training::DeviceData::upload(&mut lane, &data).is_err());

    // Past the check (as corrupt device memory would be), the trial fails.
    data.val_y[3] = 0.0;
    let mut bad_y = data.val_y.clone();
    bad_y[0] = 9.0;
    let mut put = |v: &[f32]| {
        let (b, ctx) = lane.device();
        let mut buf = b.alloc_zeroed(v.len()).unwrap();
        b.upload(ctx, v, kernels::at_mut(&mut buf, 0)).unwrap();
        buf
    };
    let corrupt = training::DeviceData {
        name: data.name.clone(),
        task: data.task,
        features: data.features,
        image: None,
        target_cols: data.target_cols(),
        n_train: data.n_train,
        n_val: data.n_val,
        train_x: put(&data.train_x),
        train_y: put(&data.train_y),
        val_x: put(&data.val_x),
        val_y: put(&bad_y),
        target_std: Vec::new(),
        val_sst: 1.0,
    };
    let cfg = config(
        vec![8],
        Activation::Relu,
        10,
        1,
        hparams(Optimizer::adam(), 1e-2, 0.0, 1),
    );
    let mut trial = TrainTrial::new(&mut lane, std::sync::Arc::new(corrupt), cfg).unwrap();
    let e = finish(&mut trial, &mut lane).unwrap_err();
    assert!(e.to_string().contains("not class indices"), "{e}");
}
