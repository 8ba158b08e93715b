//! Shared helpers: host<->device round trips, f64 references, and the
//! macro that runs one test body on every backend present.
#![allow(dead_code)]

use kernels::{Backend, at, at_mut};

/// A backend and one of its contexts.
pub struct Dev<B: Backend> {
    pub b: B,
    pub ctx: B::Ctx,
}

impl<B: Backend> Dev<B> {
    pub fn new(b: B, threads: usize) -> Self {
        let ctx = b.new_ctx(threads).unwrap();
        Dev { b, ctx }
    }
    pub fn put(&mut self, v: &[f32]) -> B::Buf {
        let mut buf = self.b.alloc_zeroed(v.len()).unwrap();
        self.b
            .upload(&mut self.ctx, v, at_mut(&mut buf, 0))
            .unwrap();
        buf
    }
    pub fn zeros(&mut self, n: usize) -> B::Buf {
        self.b.alloc_zeroed(n).unwrap()
    }
    /// A step block holding one dropout step per slot.
    pub fn dropout_steps(&mut self, steps: &[u64]) -> B::Buf {
        let mut w = kernels::StepWords::new();
        w.push_dropout_steps(steps.iter().copied());
        self.put(w.as_slice())
    }
    /// A step block holding each slot's Adam scalars at its 1-based step.
    pub fn adam_scalars(&mut self, slots: &[kernels::AdamSlot], steps: &[u64]) -> B::Buf {
        let mut w = kernels::StepWords::new();
        w.push_adam(slots.iter().copied().zip(steps.iter().copied()));
        self.put(w.as_slice())
    }
    /// A step block holding row indices, staged as a step is.
    pub fn indices(&mut self, idx: &[u32]) -> B::Buf {
        let mut w = kernels::StepWords::new();
        w.push_indices(idx);
        let mut buf = self.b.alloc_zeroed(w.len()).unwrap();
        self.b
            .stage_step(&mut self.ctx, w.as_slice(), at_mut(&mut buf, 0))
            .unwrap();
        buf
    }
    pub fn get(&mut self, buf: &B::Buf) -> Vec<f32> {
        let mut v = vec![0.0; self.b.buf_len(buf)];
        self.b.download(&mut self.ctx, at(buf, 0), &mut v).unwrap();
        v
    }
}

/// Deterministic pseudo-random values in [-scale, scale).
pub fn rand_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (kernels::rng::uniform(seed, 0, i as u64) * 2.0 - 1.0) * scale)
        .collect()
}

pub fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Central finite differences of a float64 scalar function.
pub fn numeric_grad(f: impl Fn(&[f64]) -> f64, x: &[f64]) -> Vec<f64> {
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let h = 1e-6 * x[i].abs().max(1.0);
            let orig = x[i];
            x[i] = orig + h;
            let up = f(&x);
            x[i] = orig - h;
            let down = f(&x);
            x[i] = orig;
            (up - down) / (2.0 * h)
        })
        .collect()
}

/// Asserts `got` (f32) matches `want` (f64) to `rel` of `want`'s max norm.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-12);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs() / scale;
        assert!(
            err <= rel,
            "{what}[{i}]: got {g}, want {w} (error {err:.2e} of max {scale:.3e} > {rel:.1e})"
        );
    }
}

/// Asserts two f32 vectors agree to `rel` of `want`'s largest magnitude:
/// for results that different kernels may sum in different orders (cuBLAS
/// picks per shape and batch), where element-wise relative error would
/// fail on values near zero.
#[track_caller]
pub fn assert_rel_max(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}[{i}]: got {g}, want {w} (more than {rel:.0e} of max {scale:.3e})"
        );
    }
}

/// Asserts two f32 vectors agree element-wise to `rel` relative error.
#[track_caller]
pub fn assert_rel(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(1e-6);
        assert!((g - w).abs() <= tol, "{what}[{i}]: got {g}, want {w}");
    }
}

/// f64 reference GEMM: row-major `op(A) op(B)`.
pub fn gemm_ref(
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    a: &[f64],
    b: &[f64],
) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            c[i * n + j] = s;
        }
    }
    c
}

pub fn act_ref(act: kernels::Activation, x: f64) -> f64 {
    use kernels::Activation::*;
    match act {
        Relu => x.max(0.0),
        Gelu => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        Tanh => x.tanh(),
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// Mean softmax cross-entropy of one slot, in f64.
pub fn xent_ref(rows: usize, classes: usize, z: &[f64], labels: &[f32]) -> f64 {
    let mut total = 0.0;
    for r in 0..rows {
        let row = &z[r * classes..(r + 1) * classes];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        total += lse - row[labels[r] as usize];
    }
    total / rows as f64
}
