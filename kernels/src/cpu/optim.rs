//! Optimizer updates over slots of parameters, in PyTorch's semantics.

use super::CpuCtx;
use super::par::{self, MIN_ELEMS_PER_TASK, split_ranges};
use crate::ops::{ADAM_STEP_WORDS, AdamSlot, ParamRun, SgdSlot};

pub(crate) fn sgd(
    ctx: &CpuCtx,
    run: ParamRun<'_, SgdSlot>,
    params: &mut [f32],
    grads: &[f32],
    velocity: Option<&mut [f32]>,
) {
    let (stride, slots) = (run.stride, run.settings);
    // Each slot's own length: a ragged run leaves the rest as it is.
    let segs = par::segments_of(ctx, slots.len(), |s| run.len_of(s), MIN_ELEMS_PER_TASK);
    let at = |s: &par::Segment| s.slot * stride + s.start..s.slot * stride + s.end;
    let ps = split_ranges(params, segs.iter().map(at));
    // With no velocity, every task gets `None`.
    let mut vs = velocity.map(|v| split_ranges(v, segs.iter().map(at)));
    let vs = std::iter::from_fn(move || Some(vs.as_mut().and_then(|v| v.next())));
    let tasks = segs.iter().zip(ps).zip(vs);
    par::run(ctx, tasks, |((s, p), v)| {
        let h = slots[s.slot];
        let g = &grads[at(s)];
        match v {
            Some(v) if h.momentum != 0.0 => {
                // Nesterov steps along gi + momentum * v; plain momentum along v.
                let pv = p.iter_mut().zip(v.iter_mut()).zip(g);
                if h.nesterov {
                    for ((p, v), &g) in pv {
                        let gi = g + h.weight_decay * *p;
                        *v = h.momentum * *v + gi;
                        *p -= h.lr * (gi + h.momentum * *v);
                    }
                } else {
                    for ((p, v), &g) in pv {
                        *v = h.momentum * *v + g + h.weight_decay * *p;
                        *p -= h.lr * *v;
                    }
                }
            }
            _ => {
                for (p, &g) in p.iter_mut().zip(g) {
                    *p -= h.lr * (g + h.weight_decay * *p);
                }
            }
        }
    });
}

pub(crate) fn adam(
    ctx: &CpuCtx,
    run: ParamRun<'_, AdamSlot>,
    scalars: &[f32],
    params: &mut [f32],
    grads: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let (stride, slots) = (run.stride, run.settings);
    // Each slot's own length: a ragged run leaves the rest as it is.
    let segs = par::segments_of(ctx, slots.len(), |s| run.len_of(s), MIN_ELEMS_PER_TASK);
    let at = |s: &par::Segment| s.slot * stride + s.start..s.slot * stride + s.end;
    let (ps, ms, vs) = (
        split_ranges(params, segs.iter().map(at)),
        split_ranges(m, segs.iter().map(at)),
        split_ranges(v, segs.iter().map(at)),
    );
    let tasks = segs.iter().zip(ps).zip(ms).zip(vs);
    par::run(ctx, tasks, |(((s, p), m), v)| {
        let h = slots[s.slot];
        // This step's bias corrections, from the step block.
        let k = s.slot * ADAM_STEP_WORDS;
        let (step_size, inv_sqrt_bc2) = (scalars[k], scalars[k + 1]);
        let decay = if h.decoupled {
            1.0 - h.lr * h.weight_decay
        } else {
            1.0
        };
        let l2 = if h.decoupled { 0.0 } else { h.weight_decay };
        let step = AdamStep {
            beta1: h.beta1,
            beta2: h.beta2,
            eps: h.eps,
            step_size,
            inv_sqrt_bc2,
            decay,
            l2,
        };
        step.apply(p, m, v, &grads[at(s)]);
    });
}

/// One Adam step's constants for a run of parameters.
#[derive(Clone, Copy)]
struct AdamStep {
    beta1: f32,
    beta2: f32,
    eps: f32,
    step_size: f32,
    inv_sqrt_bc2: f32,
    decay: f32,
    l2: f32,
}

impl AdamStep {
    /// Runs the update with the widest vectors the CPU has. The build
    /// targets baseline x86-64 (4-wide), and Adam's square root and
    /// division were an eighth of a small digits trial's time. Every
    /// width gives the same bits: add, multiply, square root and divide
    /// round each lane alike, and Rust never fuses a multiply-add unasked.
    fn apply(self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                return unsafe { self.apply_avx512(p, m, v, g) };
            }
            if std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: the CPU has AVX.
                return unsafe { self.apply_avx(p, m, v, g) };
            }
        }
        self.apply_portable(p, m, v, g)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn apply_avx512(self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        self.apply_portable(p, m, v, g)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    unsafe fn apply_avx(self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        self.apply_portable(p, m, v, g)
    }

    #[inline(always)]
    fn apply_portable(self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
            let gi = g + self.l2 * *p;
            *m = self.beta1 * *m + (1.0 - self.beta1) * gi;
            *v = self.beta2 * *v + (1.0 - self.beta2) * gi * gi;
            let denom = v.sqrt() * self.inv_sqrt_bc2 + self.eps;
            *p = *p * self.decay - self.step_size * *m / denom;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AdamStep;

    #[test]
    fn every_vector_width_gives_the_same_bits() {
        // Awkward values (tiny, huge, negative second moments' roots near
        // eps) over a length that leaves a remainder at every width.
        let n = 1000 + 13;
        let f = |i: usize, k: f32| (i as f32 * k).sin() * 10f32.powi((i % 9) as i32 - 4);
        let g: Vec<f32> = (0..n).map(|i| f(i, 0.37)).collect();
        let p0: Vec<f32> = (0..n).map(|i| f(i, 1.3)).collect();
        let m0: Vec<f32> = (0..n).map(|i| f(i, 0.11)).collect();
        let v0: Vec<f32> = (0..n).map(|i| f(i, 0.71).abs()).collect();
        let step = AdamStep {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step_size: 1e-3 / (1.0 - 0.9f32.powi(7)),
            inv_sqrt_bc2: 1.0 / (1.0 - 0.999f32.powi(7)).sqrt(),
            decay: 1.0 - 1e-3 * 1e-2,
            l2: 1e-4,
        };
        type Apply<'a> = &'a dyn Fn(&mut [f32], &mut [f32], &mut [f32]);
        let run = |apply: Apply| {
            let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
            apply(&mut p, &mut m, &mut v);
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (bits(&p), bits(&m), bits(&v))
        };
        let portable = run(&|p, m, v| step.apply_portable(p, m, v, &g));
        // The dispatched path: the widest this CPU has.
        assert_eq!(run(&|p, m, v| step.apply(p, m, v, &g)), portable);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX.
            assert_eq!(
                run(&|p, m, v| unsafe { step.apply_avx(p, m, v, &g) }),
                portable
            );
        }
    }
}
