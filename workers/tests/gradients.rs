//! Whole-model gradients (MLPs, and conv nets with their MLP heads)
//! against finite differences of a float64 reference.

mod common;

use common::*;
use kernels::PoolKind;
use kernels::{Activation, Backend, rng};
use training::data::SplitData;
use training::data::{ImageShape, split, synthetic_images};
use training::group::ModelGroup;
use training::model::{ConvNetSpec, UnitInput};
use training::{Lane, LossKind, ModelSpec, Optimizer, SlotHparams};

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
    spec: &ModelSpec,
    p: &[f64],
    data: &SplitData,
    idx: &[u32],
    hp: &SlotHparams,
    iteration: u64,
) -> f64 {
    let rows = idx.len();
    let f = spec.data_features();
    let mut h: Vec<f64> = idx
        .iter()
        .flat_map(|&i| {
            data.train_x[i as usize * f..(i as usize + 1) * f]
                .iter()
                .map(|&v| v as f64)
        })
        .collect();
    if spec.conv.is_some() {
        h = conv_features64(spec, p, &h, rows);
    }
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

/// The conv net's output features in f64: convolutions, batch norm with
/// the batch's statistics, residual additions, activations and pooling, as
/// [`ConvNetSpec`] lays them out.
fn conv_features64(spec: &ModelSpec, p: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    let c = spec.conv.as_ref().unwrap();
    let plan = c.plan();
    let mut a: Vec<Vec<f64>> = Vec::new();
    let mut pooled: Vec<Option<Vec<f64>>> = Vec::new();
    for u in &plan.units {
        let input: &[f64] = match u.input {
            UnitInput::Data => x,
            UnitInput::Unit(j) => &a[j],
            UnitInput::Pooled(j) => pooled[j].as_ref().unwrap(),
        };
        let (s, oc, k) = (u.in_shape, u.out_c, u.kernel);
        let pad = (k / 2) as isize;
        let px = s.h * s.w;
        let mut z = vec![0.0; rows * px * oc];
        for r in 0..rows {
            for y in 0..s.h {
                for xx in 0..s.w {
                    for o in 0..oc {
                        let mut acc = 0.0;
                        for ki in 0..k {
                            for kj in 0..k {
                                let iy = y as isize + ki as isize - pad;
                                let ix = xx as isize + kj as isize - pad;
                                if iy < 0 || ix < 0 || iy >= s.h as isize || ix >= s.w as isize {
                                    continue;
                                }
                                for ci in 0..s.c {
                                    let v = input
                                        [((r * s.h + iy as usize) * s.w + ix as usize) * s.c + ci];
                                    acc += v * p[u.w_off + ((ki * k + kj) * s.c + ci) * oc + o];
                                }
                            }
                        }
                        z[((r * s.h + y) * s.w + xx) * oc + o] = acc;
                    }
                }
            }
        }
        if u.running_off.is_some() {
            let m = (rows * px) as f64;
            for o in 0..oc {
                let mean = z.iter().skip(o).step_by(oc).sum::<f64>() / m;
                let var = z
                    .iter()
                    .skip(o)
                    .step_by(oc)
                    .map(|v| (v - mean).powi(2))
                    .sum::<f64>()
                    / m;
                let (g, b) = (p[u.b_off + o], p[u.b_off + oc + o]);
                z.iter_mut()
                    .skip(o)
                    .step_by(oc)
                    .for_each(|v| *v = g * (*v - mean) / (var + 1e-5).sqrt() + b);
            }
        } else {
            z.iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v += p[u.b_off + i % oc]);
        }
        if let Some(j) = u.skip {
            z.iter_mut().zip(&a[j]).for_each(|(v, s)| *v += s);
        }
        let out: Vec<f64> = z.iter().map(|&v| act64(spec.activation, v)).collect();
        pooled.push(u.pooled.then(|| {
            let (oh, ow) = (s.h / 2, s.w / 2);
            let mut q = vec![0.0; rows * oh * ow * oc];
            for r in 0..rows {
                for y in 0..oh {
                    for xx in 0..ow {
                        for o in 0..oc {
                            let w = [(0, 0), (0, 1), (1, 0), (1, 1)].map(|(dy, dx)| {
                                out[((r * s.h + 2 * y + dy) * s.w + 2 * xx + dx) * oc + o]
                            });
                            q[((r * oh + y) * ow + xx) * oc + o] = match c.pool {
                                PoolKind::Max => w.into_iter().fold(f64::NEG_INFINITY, f64::max),
                                PoolKind::Avg => w.iter().sum::<f64>() / 4.0,
                            };
                        }
                    }
                }
            }
            q
        }));
        a.push(out);
    }
    let last = plan.units.len() - 1;
    let out = pooled[last].clone().unwrap_or_else(|| a[last].clone());
    if !c.global_pool {
        return out;
    }
    let ch = plan.last.c;
    let px = plan.last.h * plan.last.w;
    (0..rows * ch)
        .map(|i| {
            let (r, o) = (i / ch, i % ch);
            (0..px).map(|q| out[(r * px + q) * ch + o]).sum::<f64>() / px as f64
        })
        .collect()
}

fn check<B: Backend>(
    lane: &mut Lane<B>,
    data: &SplitData,
    act: Activation,
    dropout: f32,
    slots: usize,
) {
    check_model(lane, data, act, dropout, slots, None)
}

fn check_model<B: Backend>(
    lane: &mut Lane<B>,
    data: &SplitData,
    act: Activation,
    dropout: f32,
    slots: usize,
    conv: Option<ConvNetSpec>,
) {
    let dev = upload(lane, data);
    let input = conv.as_ref().map_or(data.features, |c| c.plan().features);
    let spec = ModelSpec {
        precision: Default::default(),
        input,
        hidden: vec![7, 5],
        output: data.task.outputs(),
        activation: act,
        loss: if data.task.target_cols() == 1
            && matches!(data.task, training::data::Task::Classification { .. })
        {
            LossKind::CrossEntropy
        } else {
            LossKind::Mse
        },
        conv,
    };
    let batch = 8;
    let hps: Vec<_> = (0..slots)
        .map(|s| SlotHparams {
            dropout,
            ..hparams(Optimizer::adam(), 1e-3, dropout, 11 + s as u64)
        })
        .collect();
    let mut group =
        ModelGroup::new(lane, spec.clone(), batch, data.target_cols(), hps.clone()).unwrap();
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

fn classification_mlp_gradients_match_finite_differences<B: Backend>(lane: &mut Lane<B>) {
    let data = small_classification();
    for act in Activation::ALL {
        check(lane, &data, act, 0.0, 1);
    }
}

fn regression_mlp_gradients_match_finite_differences<B: Backend>(lane: &mut Lane<B>) {
    let data = small_regression();
    for act in [Activation::Tanh, Activation::Gelu] {
        check(lane, &data, act, 0.0, 1);
    }
}

fn gradients_with_dropout_and_several_slots_match_finite_differences<B: Backend>(
    lane: &mut Lane<B>,
) {
    check(lane, &small_classification(), Activation::Sigmoid, 0.3, 3);
    check(lane, &small_regression(), Activation::Relu, 0.2, 2);
}

fn image_data() -> SplitData {
    let shape = ImageShape { h: 6, w: 6, c: 2 };
    split(&synthetic_images(40, shape, 3, 5), 0.25, 1).unwrap()
}

fn conv_net(
    pool: PoolKind,
    batch_norm: bool,
    residual: bool,
    global_pool: bool,
    kernel: usize,
) -> ConvNetSpec {
    ConvNetSpec {
        image: ImageShape { h: 6, w: 6, c: 2 },
        stages: vec![3, 4],
        blocks_per_stage: 2,
        kernel,
        residual,
        batch_norm,
        pool,
        global_pool,
        augment: None,
    }
}

/// Conv nets with batch norm, residual blocks, both poolings, flattened and
/// globally pooled heads, one and two slots: every parameter's gradient
/// against finite differences of the f64 model.
fn conv_net_gradients_match_finite_differences<B: Backend>(lane: &mut Lane<B>) {
    let data = image_data();
    // Smooth: tanh and average pooling, so no kinks at all.
    let smooth = conv_net(PoolKind::Avg, true, true, false, 3);
    check_model(lane, &data, Activation::Tanh, 0.0, 2, Some(smooth));
    let plain = conv_net(PoolKind::Avg, false, false, true, 5);
    check_model(lane, &data, Activation::Gelu, 0.0, 1, Some(plain));
    // ReLU and max pooling, with the head's dropout.
    let kinked = conv_net(PoolKind::Max, true, true, true, 3);
    check_model(lane, &data, Activation::Relu, 0.25, 2, Some(kinked));
    // The cuda-convnet preset's shape: one unit a stage, no batch norm,
    // max pooling after each (on the CPU the first unit's filter gradient
    // is made through its pooling, without its output's gradient).
    let convnet = ConvNetSpec {
        blocks_per_stage: 1,
        ..conv_net(PoolKind::Max, false, false, false, 5)
    };
    check_model(lane, &data, Activation::Relu, 0.0, 2, Some(convnet));
}

kernels::device_tests!(
    cpu: crate::common::cpu_lane(1),
    cuda: |b| crate::common::lane_on(b, 1);
    classification_mlp_gradients_match_finite_differences,
    regression_mlp_gradients_match_finite_differences,
    gradients_with_dropout_and_several_slots_match_finite_differences,
    conv_net_gradients_match_finite_differences,
);
