//! A lane's thread count can change between any two iterations (the Salus
//! core widens a lane left alone into idle lanes' cores) without changing
//! a trial's results: every op gives the same bits on any number of
//! threads, so a trial stepped on 1, 2 and 3 threads in turn reports, and
//! ends with, exactly what it does on one thread.

mod common;

use common::*;
use kernels::Activation;
use training::data::{digit_images, digits, split};
use training::{Job, Optimizer, StepOutcome, TrainTrial, TrialConfig};

/// Trials large enough that their GEMMs, element-wise ops and conv ops
/// are split over threads: an MLP with dropout on the digits, and a conv
/// net with batch norm, residual blocks and augmentation on their images.
fn configs() -> Vec<(bool, TrialConfig)> {
    let mlp = TrialConfig {
        report_every: Some(3),
        ..config(
            vec![512, 384],
            Activation::Gelu,
            128,
            2,
            hparams(Optimizer::adam(), 1e-3, 0.2, 7),
        )
    };
    let cnn = TrialConfig {
        conv: Some(residual_net(
            training::data::ImageShape { h: 0, w: 0, c: 0 },
            vec![16, 24],
        )),
        report_every: Some(3),
        ..config(
            vec![32],
            Activation::Relu,
            64,
            1,
            hparams(Optimizer::adam(), 3e-3, 0.0, 8),
        )
    };
    vec![(false, mlp), (true, cnn)]
}

#[test]
fn a_trial_whose_lane_changes_its_thread_count_every_iteration_gives_the_same_bits() {
    for (images, cfg) in configs() {
        let data = if images {
            split(&digit_images(), 0.2, 0).unwrap()
        } else {
            split(&digits(), 0.2, 0).unwrap()
        };
        let (mut one, mut varying) = (cpu_lane(1), cpu_lane(3));
        assert_eq!(varying.threads(), 3);
        let run = |lane: &mut training::Lane<kernels::CpuBackend>, vary: bool| {
            let dev = upload(lane, &data);
            let mut trial = TrainTrial::new(lane, dev, cfg.clone()).unwrap();
            let (mut reports, mut widths) = (Vec::new(), Vec::new());
            for i in 0.. {
                if vary {
                    lane.set_threads([1, 3, 2][i % 3]);
                    widths.push(lane.threads());
                }
                match trial.step(lane).unwrap() {
                    StepOutcome::Continue => {}
                    StepOutcome::Report(r) => reports.push(r),
                    StepOutcome::Finished(r) => {
                        reports.push(r);
                        break;
                    }
                    StepOutcome::Members(_) => unreachable!("a lone trial"),
                }
            }
            let state = trial.export_state(lane).unwrap();
            (reports, state.to_bytes(), widths)
        };
        let (want, want_state, _) = run(&mut one, false);
        let (got, got_state, widths) = run(&mut varying, true);
        assert!(want.len() >= 2, "images {images}: reports {}", want.len());
        assert!(widths.contains(&1) && widths.contains(&3), "{widths:?}");
        assert_eq!(got, want, "images {images}: reports");
        assert!(got_state == want_state, "images {images}: final state");
    }
}

#[test]
fn a_lane_never_widens_past_its_threads_nor_below_one() {
    let mut lane = cpu_lane(2);
    lane.set_threads(5);
    assert_eq!(lane.threads(), 2);
    lane.set_threads(0);
    assert_eq!(lane.threads(), 1);
}
