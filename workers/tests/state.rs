//! Export, import and swap mid-training continue bit-exactly.

mod common;

use common::*;
use kernels::Activation;
use training::{Job, Optimizer, TrainTrial, TrialSnapshot, WorkerError};

fn configs() -> Vec<training::TrialConfig> {
    vec![
        config(
            vec![16, 8],
            Activation::Relu,
            10,
            4,
            hparams(Optimizer::adam(), 3e-3, 0.2, 5),
        ),
        config(
            vec![12],
            Activation::Tanh,
            9,
            4,
            hparams(
                Optimizer::Sgd {
                    momentum: 0.9,
                    nesterov: true,
                },
                0.05,
                0.0,
                6,
            ),
        ),
        config(
            vec![8, 8],
            Activation::Gelu,
            16,
            3,
            hparams(
                Optimizer::AdamW {
                    beta1: 0.9,
                    beta2: 0.99,
                    eps: 1e-7,
                },
                1e-2,
                0.1,
                7,
            ),
        ),
    ]
}

#[test]
fn export_then_import_into_a_fresh_trial_continues_the_same_trajectory() {
    let data = small_classification();
    for cfg in configs() {
        let mut lane = cpu_lane(1);
        let dev = upload(&mut lane, &data);
        let mut straight = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        let uninterrupted = run_to_end(&mut straight, &mut lane);

        let mut first = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        let cut = first.iterations_per_epoch() + 3; // mid-epoch
        let mut reports = run_iterations(&mut first, &mut lane, cut);
        let bytes = first.export_state(&mut lane).unwrap().to_bytes();
        drop(first);

        let mut second = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        second
            .import_state(&mut lane, &TrialSnapshot::from_bytes(&bytes).unwrap())
            .unwrap();
        assert_eq!(second.iterations_done(), cut);
        reports.extend(run_to_end(&mut second, &mut lane));
        assert_eq!(reports, uninterrupted, "{cfg:?}");
        assert!(uninterrupted.len() as u64 == cfg.epochs);
    }
}

#[test]
fn swap_out_and_in_mid_training_is_invisible() {
    let data = small_regression();
    for cfg in configs() {
        let mut lane = cpu_lane(2);
        let dev = upload(&mut lane, &data);
        let uninterrupted = run_to_end(
            &mut TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap(),
            &mut lane,
        );

        let mut trial = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        let mut reports = run_iterations(&mut trial, &mut lane, 5);
        let moved = trial.swap_out(&mut lane).unwrap();
        assert_eq!(moved, trial.footprint().persistent_bytes);
        assert!(!trial.is_resident());
        assert!(matches!(
            trial.step(&mut lane),
            Err(WorkerError::NotResident)
        ));
        // Another trial uses the lane's arena in between.
        let mut other = TrainTrial::new(&mut lane, dev.clone(), cfg.clone()).unwrap();
        run_iterations(&mut other, &mut lane, 3);
        assert_eq!(trial.swap_in(&mut lane).unwrap(), moved);
        assert!(trial.is_resident());
        reports.extend(run_to_end(&mut trial, &mut lane));
        assert_eq!(reports, uninterrupted);
    }
}

#[test]
fn states_round_trip_through_bytes_and_refuse_other_models() {
    let data = small_classification();
    let mut lane = cpu_lane(1);
    let dev = upload(&mut lane, &data);
    let cfgs = configs();
    let mut trial = TrainTrial::new(&mut lane, dev.clone(), cfgs[0].clone()).unwrap();
    run_iterations(&mut trial, &mut lane, 7);
    let state = trial.export_state(&mut lane).unwrap();
    let bytes = state.to_bytes();
    assert_eq!(TrialSnapshot::from_bytes(&bytes).unwrap(), state);
    for cut in [0, 10, 55, bytes.len() - 1] {
        assert!(
            TrialSnapshot::from_bytes(&bytes[..cut]).is_err(),
            "truncated at {cut}"
        );
    }
    let mut other = TrainTrial::new(&mut lane, dev, cfgs[1].clone()).unwrap();
    let err = other.import_state(&mut lane, &state).unwrap_err();
    assert!(err.to_string().contains("different model"), "{err}");
}
