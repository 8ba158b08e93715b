//! CUDA graphs: an iteration replayed from a captured graph gives exactly
//! what the same iteration launched op by op gives, bit for bit, over 50
//! iterations, and across the changes that move buffers (a member leaving,
//! a member dropped, a swap out and back in, a rebuilt group).
//!
//! Each test body runs first on the CPU, which cannot capture (both lanes
//! run op by op there: the scenario itself is checked, and that it is
//! deterministic), then on CUDA where present (`scripts/gpu-check.sh` runs
//! them); elsewhere the CUDA half is recorded as skipped
//! (`kernels::device_tests`).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use kernels::{Activation, Backend};
use training::data::{digits, split};
use training::group::ModelGroup;
use training::{
    FusedTrials, Job, Lane, LossKind, MemberOutcome, ModelSpec, Optimizer, OptimizerOrder, Report,
    StepOutcome, TrainTrial, TrialConfig,
};

/// Two lanes of one device: op by op, and with graphs where it has them.
fn two_lanes<B: Backend>(b: Arc<B>) -> (Lane<B>, Lane<B>) {
    let eager = Lane::new(b.clone(), 0, 1).unwrap();
    let mut graphs = Lane::new(b, 1, 1).unwrap();
    graphs.set_graphs(true);
    assert_eq!(graphs.graphs(), graphs.backend().graphs_supported());
    (eager, graphs)
}

/// 50 iterations of a 3-slot group (dropout, Adam and AdamW or SGD with
/// momentum), with `mixed` a group of three depths and widths (of one conv
/// net's heads with `cnn`): every slot's final state and the validation
/// statistics.
fn fifty_steps<B: Backend>(
    lane: &mut Lane<B>,
    sgd: bool,
    cnn: bool,
    mixed: bool,
) -> (Vec<training::group::SlotState>, Vec<f64>, usize) {
    let data = if cnn {
        split(&training::data::digit_images(), 0.2, 0).unwrap()
    } else {
        split(&digits(), 0.2, 0).unwrap()
    };
    let dev = upload(lane, &data);
    // A conv net with batch norm, residual blocks and augmentation in front of the head.
    let conv = cnn.then(|| residual_net(data.image.unwrap(), vec![8, 12]));
    let spec = ModelSpec {
        precision: Default::default(),
        input: conv.as_ref().map_or(data.features, |c| c.plan().features),
        hidden: vec![48, 24],
        output: data.task.outputs(),
        activation: Activation::Gelu,
        loss: LossKind::CrossEntropy,
        conv,
    };
    let opts = if sgd {
        [Optimizer::Sgd {
            momentum: 0.9,
            nesterov: true,
        }; 3]
    } else {
        [
            Optimizer::adam(),
            Optimizer::AdamW {
                beta1: 0.85,
                beta2: 0.99,
                eps: 1e-6,
            },
            Optimizer::adam(),
        ]
    };
    let hps: Vec<_> = opts
        .iter()
        .enumerate()
        .map(|(s, &o)| {
            // Without dropout in a group of mixed depths: dropout zeroes a
            // layer a slot lacks, which would hide what the optimizer skips.
            let p = if mixed { 0.0 } else { 0.1 * s as f32 };
            hparams(o, 2e-3 * (s + 1) as f32, p, 40 + s as u64)
        })
        .collect();
    let (k, batch) = (hps.len(), 32);
    let cols = data.target_cols();
    let mut group = if mixed {
        // Pitches that differ from layer to layer, and a shallow slot after
        // a deep one: the backward pass leaves other slots' gradients in
        // the layers the shallow one lacks, which its optimizer must skip.
        let specs: Vec<ModelSpec> = [vec![48, 8], vec![30, 12, 6], vec![20]]
            .into_iter()
            .map(|hidden| ModelSpec {
                hidden,
                ..spec.clone()
            })
            .collect();
        ModelGroup::new_mixed(lane, &specs, batch, cols, hps).unwrap()
    } else {
        ModelGroup::new(lane, spec, batch, cols, hps).unwrap()
    };
    for it in 0..50u64 {
        let idx: Vec<u32> = (0..k * batch)
            .map(|i| ((i as u64 * 131 + it * 977) % data.n_train as u64) as u32)
            .collect();
        let iterations: Vec<u64> = (0..k as u64).map(|s| it + 3 * s).collect();
        group.train_step(lane, &dev, &idx, &iterations).unwrap();
        lane.sync().unwrap();
    }
    let train: Vec<f64> = group
        .take_train_stats(lane)
        .unwrap()
        .iter()
        .map(|s| s.loss_sum)
        .collect();
    let states: Vec<_> = (0..k)
        .map(|s| group.export_slot(lane, s).unwrap())
        .collect();
    if mixed {
        // The optimizer steps each slot's own parameters only: the rest of
        // its laid-out vector stays as it began, zero.
        for (s, st) in states.iter().enumerate() {
            let laid = group.laid_params(lane, s).unwrap();
            let nonzero = |v: &[f32]| {
                let mut bits: Vec<u32> = v
                    .iter()
                    .filter(|x| **x != 0.0)
                    .map(|x| x.to_bits())
                    .collect();
                bits.sort_unstable();
                bits
            };
            assert_eq!(
                nonzero(&laid),
                nonzero(&st.params),
                "slot {s}: padding stepped"
            );
        }
    }
    let val: Vec<f64> = group
        .evaluate(lane, &dev)
        .unwrap()
        .iter()
        .flat_map(|s| [s.loss_sum, s.metric_sum])
        .chain(train)
        .collect();
    (states, val, group.graphs_held())
}

fn replay_equals_eager_over_50_iterations<B: Backend>(b: Arc<B>) {
    let (mut eager, mut graphs) = two_lanes(b);
    for (sgd, cnn, mixed) in [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (false, false, true),
        (false, true, true),
    ] {
        let (want, want_val, none) = fifty_steps(&mut eager, sgd, cnn, mixed);
        let (got, got_val, held) = fifty_steps(&mut graphs, sgd, cnn, mixed);
        assert_eq!(none, 0, "the eager lane captured a graph");
        // Captured after the first iteration, then replayed: one graph.
        let one = graphs.graphs() as usize;
        assert_eq!(held, one, "sgd {sgd}: graphs held");
        assert_same_states(&format!("sgd {sgd} cnn {cnn} mixed {mixed}"), &got, &want);
        assert_eq!(got_val, want_val, "sgd {sgd} mixed {mixed}: statistics");
    }
}

/// Every slot's parameters, optimizer state and running statistics are
/// the same bits.
fn assert_same_states(
    case: &str,
    got: &[training::group::SlotState],
    want: &[training::group::SlotState],
) {
    assert_eq!(got.len(), want.len(), "{case}: slots");
    for (s, (g, w)) in got.iter().zip(want).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&g.params),
            bits(&w.params),
            "{case} slot {s}: parameters"
        );
        for (a, b) in g.opt_state.iter().zip(&w.opt_state) {
            assert_eq!(bits(a), bits(b), "{case} slot {s}: optimizer state");
        }
        assert_eq!(
            bits(&g.running),
            bits(&w.running),
            "{case} slot {s}: batch norm's running statistics"
        );
    }
}

/// Each layer's optimizer step queued as soon as the backward pass is done
/// with the layer (beside the next layers' backward GEMMs: a second stream
/// on CUDA, captured into the graph where the lane replays graphs) gives
/// the bits of one step over all parameters after the backward pass.
fn per_layer_steps_equal_one_step_after_backward<B: Backend>(b: Arc<B>) {
    let overlaps = b.beside_overlaps();
    let (mut after, mut per_layer) = two_lanes(b);
    // Lanes start in their backend's order: per layer where that overlaps.
    let default = [OptimizerOrder::AfterBackward, OptimizerOrder::PerLayer][overlaps as usize];
    assert_eq!(after.optimizer_order(), default);
    after.set_optimizer_order(OptimizerOrder::AfterBackward);
    per_layer.set_optimizer_order(OptimizerOrder::PerLayer);
    for (sgd, cnn, mixed) in [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (true, true, false),
        (false, false, true),
        (true, false, true),
        (true, true, true),
    ] {
        let (want, want_val, _) = fifty_steps(&mut after, sgd, cnn, mixed);
        let (got, got_val, _) = fifty_steps(&mut per_layer, sgd, cnn, mixed);
        let case = format!("sgd {sgd} cnn {cnn} mixed {mixed}");
        assert_same_states(&case, &got, &want);
        assert_eq!(got_val, want_val, "{case}: statistics");
    }
}

#[test]
fn optimizer_steps_per_layer_equal_one_step_after_the_backward_pass() {
    per_layer_steps_equal_one_step_after_backward(Arc::new(kernels::CpuBackend::new()));
    if let Some(b) = kernels::cuda::device_for_test(
        "optimizer_steps_per_layer_equal_one_step_after_the_backward_pass",
    ) {
        per_layer_steps_equal_one_step_after_backward(Arc::new(b));
    }
}

#[test]
fn graph_replay_equals_eager_over_50_iterations() {
    replay_equals_eager_over_50_iterations(Arc::new(kernels::CpuBackend::new()));
    if let Some(b) = kernels::cuda::device_for_test("graph_replay_equals_eager_over_50_iterations")
    {
        replay_equals_eager_over_50_iterations(Arc::new(b));
    }
}

fn configs() -> Vec<TrialConfig> {
    [
        (1e-2, 0.0, 3),
        (3e-3, 0.25, 2),
        (5e-2, 0.1, 4),
        (1e-3, 0.0, 3),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (lr, dropout, epochs))| {
        let mut c = config(
            vec![16, 12],
            Activation::Relu,
            10,
            epochs,
            hparams(Optimizer::adam(), lr, dropout, 60 + i as u64),
        );
        c.report_every = Some(3);
        c
    })
    .collect()
}

/// A fused group of four run to its end: members finish at different
/// times, member 1 is dropped at iteration 5, member 2 leaves at 9 and
/// carries on alone, and the group is swapped out and in at 13. Every
/// report, in order, by member.
fn churn<B: Backend>(lane: &mut Lane<B>) -> BTreeMap<u64, Vec<Report>> {
    let dev = upload(lane, &small_classification());
    let trials = configs()
        .into_iter()
        .enumerate()
        .map(|(i, c)| (i as u64, TrainTrial::new_on_host(dev.clone(), c).unwrap()))
        .collect();
    let mut group = FusedTrials::new(trials).unwrap();
    let control = group.control();
    let mut got: BTreeMap<u64, Vec<Report>> = BTreeMap::new();
    let mut it = 0;
    while group.live_members() > 0 {
        match it {
            5 => control.drop_member(1),
            9 => control.leave(2),
            13 => {
                assert!(group.swap_out(lane).unwrap() > 0);
                group.swap_in(lane).unwrap();
            }
            _ => {}
        }
        let StepOutcome::Members(steps) = group.step(lane).unwrap() else {
            panic!("a fused group reports per member")
        };
        lane.sync().unwrap();
        for s in steps {
            match s.outcome {
                MemberOutcome::Report(r) | MemberOutcome::Finished(r) => {
                    got.entry(s.tag).or_default().push(r)
                }
                MemberOutcome::Failed(e) => panic!("member {} failed: {e}", s.tag),
                MemberOutcome::Left => {}
            }
        }
        it += 1;
    }
    // The leaver, alone on the same lane (a lone trial's graph).
    for (tag, mut t) in control.take_left() {
        t.swap_in(lane).unwrap();
        got.entry(tag).or_default().extend(run_to_end(&mut t, lane));
    }
    got
}

fn replay_equals_eager_across_membership_changes<B: Backend>(b: Arc<B>) {
    let (mut eager, mut graphs) = two_lanes(b);
    let want = churn(&mut eager);
    let got = churn(&mut graphs);
    // Member 1 reported once (iteration 3) before it was dropped at 5.
    assert_eq!(want.len(), 4, "members that reported: {:?}", want.keys());
    assert_eq!(want[&1].len(), 1, "the dropped member's reports");
    // Report holds f64s of the device's f32 sums: equal means bit for bit.
    assert_eq!(got, want);
}

#[test]
fn graph_replay_equals_eager_across_membership_changes() {
    replay_equals_eager_across_membership_changes(Arc::new(kernels::CpuBackend::new()));
    if let Some(b) =
        kernels::cuda::device_for_test("graph_replay_equals_eager_across_membership_changes")
    {
        replay_equals_eager_across_membership_changes(Arc::new(b));
    }
}

/// The CPU has no graphs: asking for them leaves every lane op by op.
#[test]
fn cpu_lanes_never_replay_graphs() {
    let mut lane = cpu_lane(1);
    lane.set_graphs(true);
    assert!(!lane.graphs());
}
