//! Whole-MLP gradients against finite differences of a float64 reference.

mod common;

use common::*;
use kernels::{Activation, Backend, rng};
use workers::data::SplitData;
use workers::group::MlpGroup;
use workers::{Lane, LossKind, MlpSpec, Optimizer, SlotHparams};

fn act64(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Relu => x.max(0.0),
        Activation::Gelu => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
        Activation::Tanh => x.tanh(),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// The mean loss of one slot over batch rows `idx`, all in f64, with the
/// same dropout masks as the kernels (a pure function of seed and step).
fn loss64(
    spec: &MlpSpec,
    p: &[f64],
    data: &SplitData,
    idx: &[u32],
    hp: &SlotHparams,
    iteration: u64,
) -> f64 {
    let rows = idx.len();
    let mut h: Vec<f64> = idx
        .iter()
        .flat_map(|&i| {
            data.train_x[i as usize * spec.input..(i as usize + 1) * spec.input]
                .iter()
                .map(|&v| v as f64)
        })
        .collect();
    let layers = spec.layers();
    for (l, layer) in layers.iter().enumerate() {
        let mut z = vec![0.0; rows * layer.fan_out];
        for r in 0..rows {
            for o in 0..layer.fan_out {
                let mut s = p[layer.b_off + o];
                for i in 0..layer.fan_in {
                    s += h[r * layer.fan_in + i] * p[layer.w_off + i * layer.fan_out + o];
                }
                z[r * layer.fan_out + o] = s;
            }
        }
        if l + 1 == layers.len() {
            h = z;
            break;
        }
        let d = hp.dropout_slot(l);
        h = z
            .iter()
            .enumerate()
            .map(|(j, &v)| {
                let keep = if d.p == 0.0 {
                    1.0
                } else if rng::uniform(d.seed, iteration, j as u64) < d.p {
                    0.0
                } else {
                    1.0 / (1.0 - d.p as f64)
                };
                act64(spec.activation, v) * keep
            })
            .collect();
    }
    let out = spec.output;
    let mut total = 0.0;
    for (r, &i) in idx.iter().enumerate() {
        let z = &h[r * out..(r + 1) * out];
        match spec.loss {
            LossKind::CrossEntropy => {
                let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                total += lse - z[data.train_y[i as usize] as usize];
            }
            LossKind::Mse => {
                total += (0..out)
                    .map(|c| (z[c] - data.train_y[i as usize * out + c] as f64).powi(2))
                    .sum::<f64>()
                    / out as f64;
            }
        }
    }
    total / rows as f64
}

fn check<B: Backend>(
    lane: &mut Lane<B>,
    data: &SplitData,
    act: Activation,
    dropout: f32,
    slots: usize,
) {
    let dev = upload(lane, data);
    let spec = MlpSpec {
        input: data.features,
        hidden: vec![7, 5],
        output: data.task.outputs(),
        activation: act,
        loss: if data.task.target_cols() == 1
            && matches!(data.task, workers::data::Task::Classification { .. })
        {
            LossKind::CrossEntropy
        } else {
            LossKind::Mse
        },
    };
    let batch = 8;
    let hps: Vec<_> = (0..slots)
        .map(|s| SlotHparams {
            dropout,
            ..hparams(Optimizer::adam(), 1e-3, dropout, 11 + s as u64)
        })
        .collect();
    let mut group =
        MlpGroup::new(lane, spec.clone(), batch, data.target_cols(), hps.clone()).unwrap();
    let idx: Vec<u32> = (0..slots * batch)
        .map(|i| ((i * 5 + 3) % data.n_train) as u32)
        .collect();
    let iterations: Vec<u64> = (0..slots as u64).map(|s| 4 + s).collect();
    let grads = group.gradients(lane, &dev, &idx, &iterations).unwrap();
    let n = spec.n_params();
    for s in 0..slots {
        let p0: Vec<f64> = spec
            .init_params(hps[s].seed)
            .iter()
            .map(|&v| v as f64)
            .collect();
        let rows = &idx[s * batch..(s + 1) * batch];
        let f = |p: &[f64]| loss64(&spec, p, data, rows, &hps[s], iterations[s]);
        let mut p = p0.clone();
        let f0 = f(&p0);
        let scale = grads[s * n..(s + 1) * n]
            .iter()
            .fold(0.0f64, |m, g| m.max(g.abs() as f64));
        let mut kinks = 0;
        for i in 0..n {
            let h = 1e-5;
            p[i] = p0[i] + h;
            let up = f(&p);
            p[i] = p0[i] - h;
            let down = f(&p);
            p[i] = p0[i];
            let got = grads[s * n + i] as f64;
            // A ReLU kink inside [-h, h] makes the one-sided slopes disagree:
            // the analytic gradient must then be one of them.
            let (right, left) = ((up - f0) / h, (f0 - down) / h);
            if (right - left).abs() > 1e-3 * scale {
                kinks += 1;
                let near = (got - right).abs().min((got - left).abs());
                assert!(
                    near <= 1e-3 * scale,
                    "{act:?} slot {s} param {i}: analytic {got} is neither one-sided slope {left} / {right}"
                );
                continue;
            }
            let numeric = (up - down) / (2.0 * h);
            assert!(
                (got - numeric).abs() <= 1e-4 * scale + 1e-7,
                "{act:?} dropout={dropout} slot {s} param {i}: analytic {got}, numeric {numeric} (max |g| {scale})"
            );
        }
        assert!(kinks * 10 <= n, "{kinks} of {n} parameters sit on a kink");
        if act != Activation::Relu {
            assert_eq!(kinks, 0, "{act:?} is smooth");
        }
    }
}

#[test]
fn classification_mlp_gradients_match_finite_differences() {
    let data = small_classification();
    on_every_device!("classification_mlp_gradients", |lane| {
        for act in Activation::ALL {
            check(lane, &data, act, 0.0, 1);
        }
    });
}

#[test]
fn regression_mlp_gradients_match_finite_differences() {
    let data = small_regression();
    on_every_device!("regression_mlp_gradients", |lane| {
        for act in [Activation::Tanh, Activation::Gelu] {
            check(lane, &data, act, 0.0, 1);
        }
    });
}

#[test]
fn gradients_with_dropout_and_several_slots_match_finite_differences() {
    on_every_device!("gradients_with_dropout", |lane| {
        check(lane, &small_classification(), Activation::Sigmoid, 0.3, 3);
        check(lane, &small_regression(), Activation::Relu, 0.2, 2);
    });
}
