//! Every op against a float64 reference and finite differences, its batched
//! form against single-slot calls, and the optimizers against hand-computed
//! steps. Each body runs on every backend present (`kernels::device_tests!`).

mod common;

use common::*;
use kernels::*;

type D<B> = Dev<B>;

fn gemm_matches_reference<B: Backend>(d: &mut D<B>) {
    for &(m, n, k) in &[(7, 5, 3), (37, 53, 29), (130, 300, 70)] {
        for ta in [false, true] {
            for tb in [false, true] {
                let a = rand_vec(m * k, 1, 1.0);
                let b = rand_vec(k * n, 2, 1.0);
                let c0 = rand_vec(m * n, 3, 1.0);
                let (ab, bb) = (d.put(&a), d.put(&b));
                let mut cb = d.put(&c0);
                let mut g = Gemm::new(m, n, k).beta(0.5);
                g.trans_a = ta;
                g.trans_b = tb;
                d.b.gemm(&mut d.ctx, &g, at(&ab, 0), at(&bb, 0), at_mut(&mut cb, 0))
                    .unwrap();
                let want: Vec<f64> = gemm_ref(m, n, k, ta, tb, &to64(&a), &to64(&b))
                    .iter()
                    .zip(&c0)
                    .map(|(p, &c)| p + 0.5 * c as f64)
                    .collect();
                assert_close(
                    &format!("gemm {m}x{n}x{k} ta={ta} tb={tb}"),
                    &d.get(&cb),
                    &want,
                    1e-5,
                );
            }
        }
    }
}

/// TF32 and BF16 GEMMs against float64 references, with bounds from the
/// formats: each product's inputs are rounded once (relative error at most
/// the format's unit roundoff `u` each, so `2u + u^2` for a product), and
/// the fp32 accumulation adds at most `k` fp32 unit roundoffs; both scale
/// with `sum |a||b|`. BF16's result is also checked to be the fp32 GEMM of
/// the rounded inputs (the CPU rounds them itself, cuBLAS in its tensor
/// cores), and to differ from plain fp32: the rounding really happens. TF32
/// is CUDA's alone; the CPU refuses it by name.
fn gemm_precisions_within_their_formats<B: Backend>(d: &mut D<B>) {
    let (m, n, k) = (37, 53, 300);
    let a = rand_vec(m * k, 11, 1.0);
    let b = rand_vec(k * n, 12, 1.0);
    let (ab, bb) = (d.put(&a), d.put(&b));
    let abs = |x: &[f32]| x.iter().map(|v| v.abs() as f64).collect::<Vec<f64>>();
    let magnitude = gemm_ref(m, n, k, false, false, &abs(&a), &abs(&b));
    let exact = gemm_ref(m, n, k, false, false, &to64(&a), &to64(&b));
    let round = |x: &[f32]| {
        x.iter()
            .map(|&v| round_bf16(v) as f64)
            .collect::<Vec<f64>>()
    };
    let of_rounded = gemm_ref(m, n, k, false, false, &round(&a), &round(&b));
    let fp32_acc = k as f64 * f64::from(f32::EPSILON) / 2.0;
    let run = |d: &mut D<B>, p: Precision| {
        let mut cb = d.put(&vec![0.0; m * n]);
        let g = Gemm::new(m, n, k).precision(p);
        d.b.gemm(&mut d.ctx, &g, at(&ab, 0), at(&bb, 0), at_mut(&mut cb, 0))
            .map(|()| d.get(&cb))
    };
    let within = |what: &str, got: &[f32], want: &[f64], rel: f64| {
        for (i, ((g, w), mag)) in got.iter().zip(want).zip(&magnitude).enumerate() {
            let bound = rel * mag + 1e-30;
            assert!(
                (*g as f64 - w).abs() <= bound,
                "{what}: element {i}: {g} against {w}, bound {bound}"
            );
        }
    };
    let fp32 = run(d, Precision::Fp32).unwrap();
    within("fp32", &fp32, &exact, fp32_acc);
    let u = Precision::Bf16.unit_roundoff();
    let bf16 = run(d, Precision::Bf16).unwrap();
    within(
        "bf16 against exact",
        &bf16,
        &exact,
        2.0 * u + u * u + fp32_acc,
    );
    within("bf16 against rounded inputs", &bf16, &of_rounded, fp32_acc);
    let moved = fp32
        .iter()
        .zip(&bf16)
        .filter(|(x, y)| (*x - *y).abs() > 1e-4 * x.abs().max(1.0))
        .count();
    assert!(
        moved > m * n / 2,
        "bf16 left {moved} of {} elements at fp32's",
        m * n
    );
    match (d.b.kind(), run(d, Precision::Tf32)) {
        (DeviceKind::Cpu, Err(e)) => {
            let text = e.to_string();
            assert!(text.contains("tf32") && text.contains("CPU"), "{text}");
        }
        (DeviceKind::Cpu, Ok(_)) => panic!("the CPU ran a TF32 GEMM"),
        (_, Ok(tf32)) => {
            let u = Precision::Tf32.unit_roundoff();
            within(
                "tf32 against exact",
                &tf32,
                &exact,
                2.0 * u + u * u + fp32_acc,
            );
        }
        (_, Err(e)) => panic!("tf32 on {:?}: {e}", d.b.kind()),
    }
}

/// The two backward GEMMs (dA = dC B^T, dB = A^T dC) against finite
/// differences of L = sum(W * (A B)).
fn gemm_backward_finite_differences<B: Backend>(d: &mut D<B>) {
    let (m, n, k) = (6, 5, 4);
    let (a, b, w) = (
        rand_vec(m * k, 4, 1.0),
        rand_vec(k * n, 5, 1.0),
        rand_vec(m * n, 6, 1.0),
    );
    let (a64, b64, w64) = (to64(&a), to64(&b), to64(&w));
    let loss = |a: &[f64], b: &[f64]| -> f64 {
        gemm_ref(m, n, k, false, false, a, b)
            .iter()
            .zip(&w64)
            .map(|(c, w)| c * w)
            .sum()
    };
    let (ab, bb, wb) = (d.put(&a), d.put(&b), d.put(&w));
    let (mut da, mut db) = (d.zeros(m * k), d.zeros(k * n));
    d.b.gemm(
        &mut d.ctx,
        &Gemm::new(m, k, n).trans_b(),
        at(&wb, 0),
        at(&bb, 0),
        at_mut(&mut da, 0),
    )
    .unwrap();
    d.b.gemm(
        &mut d.ctx,
        &Gemm::new(k, n, m).trans_a(),
        at(&ab, 0),
        at(&wb, 0),
        at_mut(&mut db, 0),
    )
    .unwrap();
    assert_close(
        "dA",
        &d.get(&da),
        &numeric_grad(|x| loss(x, &b64), &a64),
        1e-5,
    );
    assert_close(
        "dB",
        &d.get(&db),
        &numeric_grad(|x| loss(&a64, x), &b64),
        1e-5,
    );
}

fn gemm_batched_equals_single_calls<B: Backend>(d: &mut D<B>) {
    let (m, n, k, slots) = (9, 11, 13, 4);
    for shared_a in [false, true] {
        let sa = if shared_a { 0 } else { m * k + 3 };
        let (sb, sc) = (k * n + 5, m * n + 2);
        let a = rand_vec(sa * (slots - 1) + m * k, 7, 1.0);
        let b = rand_vec(sb * (slots - 1) + k * n, 8, 1.0);
        let (ab, bb) = (d.put(&a), d.put(&b));
        let mut cb = d.zeros(sc * (slots - 1) + m * n);
        let g = Gemm::new(m, n, k).trans_b().batched(slots, sa, sb, sc);
        let g = Gemm {
            trans_b: false,
            ..g
        };
        d.b.gemm(&mut d.ctx, &g, at(&ab, 0), at(&bb, 0), at_mut(&mut cb, 0))
            .unwrap();
        let batched = d.get(&cb);
        for s in 0..slots {
            let mut c1 = d.zeros(m * n);
            d.b.gemm(
                &mut d.ctx,
                &Gemm::new(m, n, k),
                at(&ab, s * sa),
                at(&bb, s * sb),
                at_mut(&mut c1, 0),
            )
            .unwrap();
            // cuBLAS may sum a batched and a single call in different
            // orders: compare to the largest value, not element-wise.
            assert_rel_max(
                "batched gemm slot",
                &batched[s * sc..s * sc + m * n],
                &d.get(&c1),
                1e-5,
            );
        }
    }
}

/// Members whose operands are packed in pitches of their own (a group's
/// weights, each slot's at the start of its block): each is its product,
/// and C is written only inside each member's own rows.
fn gemm_grouped_members_in_pitches_of_their_own<B: Backend>(d: &mut D<B>) {
    let sizes = [(6, 7, 5), (6, 3, 9), (6, 12, 2)];
    let pitches: Vec<_> = sizes.iter().map(|&(_, n, k)| (k, n, n)).collect();
    let (mm, nn, kk) = (6, 12, 9);
    let (sa, sb, sc) = (mm * kk, kk * nn, mm * nn);
    let count = sizes.len();
    let a = rand_vec(sa * count, 41, 1.0);
    let b = rand_vec(sb * count, 42, 1.0);
    let (ab, bb) = (d.put(&a), d.put(&b));
    let mut cb = d.put(&vec![7.0f32; sc * count]);
    let g = GroupedGemm {
        base: Gemm::new(mm, nn, kk).batched(count, sa, sb, sc),
        sizes: &sizes,
        pitches: Some(&pitches),
    };
    d.b.gemm_grouped(&mut d.ctx, &g, at(&ab, 0), at(&bb, 0), at_mut(&mut cb, 0))
        .unwrap();
    let got = d.get(&cb);
    for (i, &(m, n, k)) in sizes.iter().enumerate() {
        let packed = |src: &[f32], len: usize| -> Vec<f64> {
            src[..len].iter().map(|&x| x as f64).collect()
        };
        let want = gemm_ref(
            m,
            n,
            k,
            false,
            false,
            &packed(&a[i * sa..], m * k),
            &packed(&b[i * sb..], k * n),
        );
        let c = &got[i * sc..(i + 1) * sc];
        assert_close(&format!("member {i}"), &c[..m * n], &want, 1e-5);
        assert!(
            c[m * n..].iter().all(|&x| x == 7.0),
            "member {i} wrote past its rows"
        );
    }
    let bad = GroupedGemm {
        pitches: Some(&pitches[..2]),
        ..g
    };
    assert!(
        d.b.gemm_grouped(&mut d.ctx, &bad, at(&ab, 0), at(&bb, 0), at_mut(&mut cb, 0))
            .is_err(),
        "pitches for some members only"
    );
}

/// A member of size 0 (a layer its trial does not have, in a group of
/// mixed depths) writes nothing; the members beside it are their products.
fn gemm_grouped_members_of_size_0_write_nothing<B: Backend>(d: &mut D<B>) {
    let sizes = [(8, 6, 5), (0, 0, 0), (8, 10, 12)];
    let (mm, nn, kk) = (8, 10, 12);
    let (sa, sb, sc) = (mm * kk, kk * nn, mm * nn);
    let count = sizes.len();
    let a = rand_vec(sa * count, 31, 1.0);
    let b = rand_vec(sb * count, 32, 1.0);
    let (ab, bb) = (d.put(&a), d.put(&b));
    let mut cb = d.put(&vec![7.0f32; sc * count]);
    let base = Gemm::new(mm, nn, kk).batched(count, sa, sb, sc);
    let g = GroupedGemm {
        base,
        sizes: &sizes,
        pitches: None,
    };
    d.b.gemm_grouped(&mut d.ctx, &g, at(&ab, 0), at(&bb, 0), at_mut(&mut cb, 0))
        .unwrap();
    let got = d.get(&cb);
    assert!(
        got[sc..2 * sc].iter().all(|&x| x == 7.0),
        "the member of size 0 wrote"
    );
    for i in [0, 2] {
        let (m, n, k) = sizes[i];
        let pack = |src: &[f32], rows: usize, len: usize, ld: usize| -> Vec<f64> {
            (0..rows)
                .flat_map(|r| src[r * ld..r * ld + len].iter().map(|&x| x as f64))
                .collect()
        };
        let want = gemm_ref(
            m,
            n,
            k,
            false,
            false,
            &pack(&a[i * sa..], m, k, kk),
            &pack(&b[i * sb..], k, n, nn),
        );
        let block: Vec<f32> = (0..m)
            .flat_map(|r| got[i * sc + r * nn..i * sc + r * nn + n].to_vec())
            .collect();
        assert_close(&format!("member {i}"), &block, &want, 1e-5);
    }
}

/// Members of different sizes inside one padded layout (the pitches of
/// the largest), in the three forms an MLP layer multiplies: each member's
/// block equals the float64 product, and the same product alone on packed
/// operands (bit for bit on the CPU); nothing outside the blocks is written.
fn gemm_grouped_members_equal_their_products_alone<B: Backend>(d: &mut D<B>) {
    let sizes = [(16, 7, 5), (16, 30, 21), (16, 1, 9), (16, 12, 40)];
    let (mm, nn, kk) = (16, 30, 40);
    for (ta, tb) in [(false, false), (true, false), (false, true)] {
        // Stored shapes and their pitches, for the largest member.
        let (rows_a, ld_a) = if ta { (kk, mm) } else { (mm, kk) };
        let (rows_b, ld_b) = if tb { (nn, kk) } else { (kk, nn) };
        let (sa, sb, sc) = (rows_a * ld_a, rows_b * ld_b, mm * nn);
        let count = sizes.len();
        let a = rand_vec(sa * count, 21, 1.0);
        let b = rand_vec(sb * count, 22, 1.0);
        let (ab, bb) = (d.put(&a), d.put(&b));
        let sentinel = vec![7.0f32; sc * count];
        let mut cb = d.put(&sentinel);
        let mut base = Gemm::new(mm, nn, kk);
        base.trans_a = ta;
        base.trans_b = tb;
        let base = base.batched(count, sa, sb, sc).leading(ld_a, ld_b, nn);
        let g = GroupedGemm {
            base,
            sizes: &sizes,
            pitches: None,
        };
        d.b.gemm_grouped(&mut d.ctx, &g, at(&ab, 0), at(&bb, 0), at_mut(&mut cb, 0))
            .unwrap();
        let got = d.get(&cb);
        for (i, &(m, n, k)) in sizes.iter().enumerate() {
            let what = format!("member {i} ({m}x{n}x{k}) ta={ta} tb={tb}");
            // The member's operands, packed.
            let pack = |src: &[f32], rows: usize, len: usize, ld: usize| -> Vec<f32> {
                (0..rows)
                    .flat_map(|r| src[r * ld..r * ld + len].to_vec())
                    .collect()
            };
            let pa = match ta {
                false => pack(&a[i * sa..], m, k, ld_a),
                true => pack(&a[i * sa..], k, m, ld_a),
            };
            let pb = match tb {
                false => pack(&b[i * sb..], k, n, ld_b),
                true => pack(&b[i * sb..], n, k, ld_b),
            };
            let block = pack(&got[i * sc..], m, n, nn);
            let want = gemm_ref(m, n, k, ta, tb, &to64(&pa), &to64(&pb));
            assert_close(&what, &block, &want, 1e-5);
            let mut alone = Gemm::new(m, n, k);
            if ta {
                alone = alone.trans_a();
            }
            if tb {
                alone = alone.trans_b();
            }
            let (pab, pbb) = (d.put(&pa), d.put(&pb));
            let mut c1 = d.zeros(m * n);
            d.b.gemm(
                &mut d.ctx,
                &alone,
                at(&pab, 0),
                at(&pbb, 0),
                at_mut(&mut c1, 0),
            )
            .unwrap();
            let c1 = d.get(&c1);
            if d.b.kind() == DeviceKind::Cpu {
                assert_eq!(
                    block, c1,
                    "{what}: the CPU gives a member the bits of its product alone"
                );
            } else {
                assert_rel_max(&what, &block, &c1, 1e-5);
            }
            // Outside the member's block, C is untouched.
            for r in 0..mm {
                for c in 0..nn {
                    if r >= m || c >= n {
                        assert_eq!(got[i * sc + r * nn + c], 7.0, "{what}: ({r}, {c}) written");
                    }
                }
            }
        }
    }
}

fn bias_add_and_col_sum<B: Backend>(d: &mut D<B>) {
    let shape = Batched::new(3, 5, 4);
    let stride = 7;
    let x = rand_vec(shape.len(), 9, 1.0);
    let bias = rand_vec(stride * 3, 10, 1.0);
    let w = rand_vec(shape.len(), 11, 1.0);
    let mut xb = d.put(&x);
    let bb = d.put(&bias);
    d.b.bias_add(&mut d.ctx, shape, stride, at_mut(&mut xb, 0), at(&bb, 0))
        .unwrap();
    let want: Vec<f64> = (0..shape.len())
        .map(|i| x[i] as f64 + bias[(i / 20) * stride + i % 4] as f64)
        .collect();
    assert_close("bias_add", &d.get(&xb), &want, 1e-6);

    // col_sum is bias_add's backward: d/db of sum(w * (x + b)).
    let wb = d.put(&w);
    let mut db = d.put(&vec![9.0; stride * 3]);
    d.b.col_sum(&mut d.ctx, shape, stride, at(&wb, 0), at_mut(&mut db, 0))
        .unwrap();
    let got = d.get(&db);
    for s in 0..3 {
        let f = |b: &[f64]| -> f64 {
            (0..20)
                .map(|i| w[s * 20 + i] as f64 * (x[s * 20 + i] as f64 + b[i % 4]))
                .sum()
        };
        let b0 = to64(&bias[s * stride..s * stride + 4]);
        assert_close(
            "col_sum",
            &got[s * stride..s * stride + 4],
            &numeric_grad(f, &b0),
            1e-6,
        );
        assert_eq!(
            got[s * stride + 4],
            9.0,
            "col_sum wrote outside its columns"
        );
    }
}

fn activations_forward_and_finite_differences<B: Backend>(d: &mut D<B>) {
    let n = 64;
    let x = rand_vec(n, 12, 3.0);
    let w = rand_vec(n, 13, 1.0);
    for act in Activation::ALL {
        let xb = d.put(&x);
        let mut yb = d.zeros(n);
        d.b.activation(
            &mut d.ctx,
            ActivationOp { activation: act, n },
            at(&xb, 0),
            at_mut(&mut yb, 0),
        )
        .unwrap();
        let want: Vec<f64> = x.iter().map(|&v| act_ref(act, v as f64)).collect();
        assert_close(act.name(), &d.get(&yb), &want, 1e-6);

        let wb = d.put(&w);
        let mut dx = d.zeros(n);
        d.b.activation_backward(
            &mut d.ctx,
            ActivationOp { activation: act, n },
            at(&xb, 0),
            at(&yb, 0),
            at(&wb, 0),
            at_mut(&mut dx, 0),
        )
        .unwrap();
        let f = |x: &[f64]| -> f64 {
            x.iter()
                .zip(&w)
                .map(|(&x, &w)| act_ref(act, x) * w as f64)
                .sum()
        };
        // ReLU's kink: no sample lies within the FD step of 0.
        assert_close(
            &format!("{} backward", act.name()),
            &d.get(&dx),
            &numeric_grad(f, &to64(&x)),
            1e-5,
        );
    }
}

fn activation_large_input_splits_consistently<B: Backend>(d: &mut D<B>) {
    let n = 300_001;
    let x = rand_vec(n, 14, 4.0);
    let xb = d.put(&x);
    let mut yb = d.zeros(n);
    d.b.activation(
        &mut d.ctx,
        ActivationOp {
            activation: Activation::Tanh,
            n,
        },
        at(&xb, 0),
        at_mut(&mut yb, 0),
    )
    .unwrap();
    let want: Vec<f64> = x.iter().map(|&v| (v as f64).tanh()).collect();
    assert_close("tanh, large", &d.get(&yb), &want, 1e-6);
}

fn dropout_mask_rate_reproducibility_and_backward<B: Backend>(d: &mut D<B>) {
    let per = 20_000;
    let slots = [
        DropoutSlot::new(0.5, 1),
        DropoutSlot::new(0.2, 1),
        DropoutSlot::new(0.0, 2),
    ];
    let steps = d.dropout_steps(&[0, 1, 0]);
    let x = vec![1.0f32; per * 3];
    let xb = d.put(&x);
    let mut y = d.zeros(per * 3);
    d.b.dropout(
        &mut d.ctx,
        Slots {
            n: per,
            settings: &slots,
        },
        at(&steps, 0),
        at(&xb, 0),
        at_mut(&mut y, 0),
    )
    .unwrap();
    let y1 = d.get(&y);
    for (s, slot) in slots.iter().enumerate() {
        let part = &y1[s * per..(s + 1) * per];
        let dropped = part.iter().filter(|&&v| v == 0.0).count() as f64 / per as f64;
        assert!(
            (dropped - slot.p as f64).abs() < 0.02,
            "slot {s}: dropped {dropped}"
        );
        let kept = 1.0 / (1.0 - slot.p);
        assert!(part.iter().all(|&v| v == 0.0 || (v - kept).abs() < 1e-6));
    }
    // Same (seed, step): same mask. Another step: another mask, also for
    // a step past 2^32 (both words of the step are read).
    d.b.dropout(
        &mut d.ctx,
        Slots {
            n: per,
            settings: &slots,
        },
        at(&steps, 0),
        at(&xb, 0),
        at_mut(&mut y, 0),
    )
    .unwrap();
    assert_eq!(y1, d.get(&y));
    for later in [[1, 2, 1], [1 << 32, 1 + (1 << 32), 1 << 32]] {
        let later = d.dropout_steps(&later);
        d.b.dropout(
            &mut d.ctx,
            Slots {
                n: per,
                settings: &slots,
            },
            at(&later, 0),
            at(&xb, 0),
            at_mut(&mut y, 0),
        )
        .unwrap();
        assert_ne!(y1[..per], d.get(&y)[..per]);
    }
    // The mask is the one the CPU reference draws from (seed, step, index).
    let big = d.dropout_steps(&[(7 << 32) + 3]);
    let mut y7 = d.zeros(per);
    d.b.dropout(
        &mut d.ctx,
        Slots {
            n: per,
            settings: &slots[..1],
        },
        at(&big, 0),
        at(&xb, 0),
        at_mut(&mut y7, 0),
    )
    .unwrap();
    let want: Vec<f32> = (0..per)
        .map(|i| {
            if kernels::rng::uniform(1, (7 << 32) + 3, i as u64) < 0.5 {
                0.0
            } else {
                2.0
            }
        })
        .collect();
    assert_eq!(d.get(&y7), want);

    // Backward against finite differences of sum(w * dropout(x)).
    let small = 50;
    let one = [DropoutSlot::new(0.3, 9)];
    let step4 = d.dropout_steps(&[4]);
    let (xs, w) = (rand_vec(small, 15, 1.0), rand_vec(small, 16, 1.0));
    let (xb, wb) = (d.put(&xs), d.put(&w));
    let mut ys = d.zeros(small);
    d.b.dropout(
        &mut d.ctx,
        Slots {
            n: small,
            settings: &one,
        },
        at(&step4, 0),
        at(&xb, 0),
        at_mut(&mut ys, 0),
    )
    .unwrap();
    let mask: Vec<f64> = d
        .get(&ys)
        .iter()
        .zip(&xs)
        .map(|(y, x)| (*y / *x) as f64)
        .collect();
    let mut dx = d.zeros(small);
    d.b.dropout_backward(
        &mut d.ctx,
        Slots {
            n: small,
            settings: &one,
        },
        at(&step4, 0),
        at(&wb, 0),
        at_mut(&mut dx, 0),
    )
    .unwrap();
    let f = |x: &[f64]| -> f64 { (0..small).map(|i| x[i] * mask[i] * w[i] as f64).sum() };
    assert_close(
        "dropout backward",
        &d.get(&dx),
        &numeric_grad(f, &to64(&xs)),
        1e-6,
    );
}

/// Slots of different widths padded to one layout draw, forward and
/// backward, the masks they draw with their rows contiguous, and zero
/// their padding.
fn dropout_of_padded_rows_equals_the_rows_alone<B: Backend>(d: &mut D<B>) {
    let (rows, stride) = (37, 24);
    let widths = [24, 7, 13];
    let slots: Vec<DropoutSlot> = widths
        .iter()
        .enumerate()
        .map(|(s, &w)| DropoutSlot::new([0.3, 0.5, 0.0][s], 40 + s as u64).within(w, stride))
        .collect();
    let steps = d.dropout_steps(&[5, 2, 5]);
    let per = rows * stride;
    let x = rand_vec(widths.len() * per, 41, 1.0);
    let xb = d.put(&x);
    let padded = |d: &mut D<B>, backward: bool| {
        let mut y = d.put(&vec![7.0; x.len()]);
        let settings = Slots {
            n: per,
            settings: &slots,
        };
        let (src, dst) = (at(&xb, 0), at_mut(&mut y, 0));
        if backward {
            d.b.dropout_backward(&mut d.ctx, settings, at(&steps, 0), src, dst)
        } else {
            d.b.dropout(&mut d.ctx, settings, at(&steps, 0), src, dst)
        }
        .unwrap();
        d.get(&y)
    };
    let (fwd, bwd) = (padded(d, false), padded(d, true));
    assert_eq!(fwd, bwd, "backward recomputes the forward mask");
    let mut dropped = 0;
    for (s, &w) in widths.iter().enumerate() {
        let own: Vec<f32> = (0..rows)
            .flat_map(|r| x[s * per + r * stride..][..w].to_vec())
            .collect();
        let one = [DropoutSlot {
            rows: None,
            ..slots[s]
        }];
        let step = d.dropout_steps(&[[5, 2, 5][s]]);
        let ob = d.put(&own);
        let mut y = d.zeros(own.len());
        d.b.dropout(
            &mut d.ctx,
            Slots {
                n: own.len(),
                settings: &one,
            },
            at(&step, 0),
            at(&ob, 0),
            at_mut(&mut y, 0),
        )
        .unwrap();
        let alone = d.get(&y);
        for r in 0..rows {
            for c in 0..stride {
                let got = fwd[s * per + r * stride + c];
                if c < w {
                    let want = alone[r * w + c];
                    assert_eq!(got.to_bits(), want.to_bits(), "slot {s} at ({r}, {c})");
                    dropped += usize::from(want == 0.0);
                } else {
                    assert_eq!(got, 0.0, "slot {s}'s padding at ({r}, {c})");
                }
            }
        }
    }
    assert!(dropped > 0, "some elements were dropped");
    // Rows that do not tile a slot are refused.
    let bad = [DropoutSlot::new(0.5, 1).within(5, 7)];
    let mut y = d.zeros(per);
    let err = d.b.dropout(
        &mut d.ctx,
        Slots {
            n: 20,
            settings: &bad,
        },
        at(&steps, 0),
        at(&xb, 0),
        at_mut(&mut y, 0),
    );
    assert!(err.is_err());
}

fn softmax_xent_loss_accuracy_and_gradient<B: Backend>(d: &mut D<B>) {
    let (rows, classes) = (9, 5);
    let shape = Batched::new(2, rows, classes);
    let z = rand_vec(shape.len(), 17, 4.0);
    let labels: Vec<f32> = (0..2 * rows).map(|i| ((i * 7) % classes) as f32).collect();
    let (zb, lb) = (d.put(&z), d.put(&labels));
    let mut dz = d.zeros(shape.len());
    let mut stats = d.put(&[1.0; 2 * STATS_LEN]);
    d.b.softmax_xent(
        &mut d.ctx,
        &Loss {
            shape,
            target_stride: rows,
            accumulate: false,
        },
        at(&zb, 0),
        at(&lb, 0),
        Some(at_mut(&mut dz, 0)),
        at_mut(&mut stats, 0),
    )
    .unwrap();
    let (grad, st) = (d.get(&dz), d.get(&stats));
    for s in 0..2 {
        let zs = to64(&z[s * rows * classes..(s + 1) * rows * classes]);
        let ls = &labels[s * rows..(s + 1) * rows];
        let loss = xent_ref(rows, classes, &zs, ls);
        assert_close(
            "xent loss_sum",
            &st[s * STATS_LEN..s * STATS_LEN + 1],
            &[loss * rows as f64],
            1e-5,
        );
        let correct = (0..rows)
            .filter(|&r| {
                let row = &zs[r * classes..(r + 1) * classes];
                let arg = (0..classes).fold(0, |b, j| if row[j] > row[b] { j } else { b });
                arg == ls[r] as usize
            })
            .count();
        assert_eq!(st[s * STATS_LEN + 1], correct as f32);
        assert_eq!(st[s * STATS_LEN + 2], rows as f32);
        let g = numeric_grad(|z| xent_ref(rows, classes, z, ls), &zs);
        assert_close(
            "xent gradient",
            &grad[s * rows * classes..(s + 1) * rows * classes],
            &g,
            1e-5,
        );
    }
    // Accumulating adds to the statistics; shared labels (stride 0) work.
    d.b.softmax_xent(
        &mut d.ctx,
        &Loss {
            shape,
            target_stride: 0,
            accumulate: true,
        },
        at(&zb, 0),
        at(&lb, 0),
        None,
        at_mut(&mut stats, 0),
    )
    .unwrap();
    let st2 = d.get(&stats);
    assert_eq!(st2[2], 2.0 * rows as f32);
    let shared = xent_ref(rows, classes, &to64(&z[rows * classes..]), &labels[..rows]);
    assert_close(
        "shared labels",
        &[st2[STATS_LEN] - st[STATS_LEN]],
        &[shared * rows as f64],
        1e-5,
    );
    // Labels that are not class indices are counted in stats[3] on every
    // device (loaders reject them; a count means corrupt data), add no loss
    // and no gradient, and never read out of bounds.
    let mut mixed = labels.clone();
    mixed[1] = 7.0;
    mixed[3] = -1.0;
    mixed[rows + 2] = 1.5;
    mixed[rows + 4] = f32::NAN;
    let lb = d.put(&mixed);
    let mut dz = d.put(&vec![9.0; shape.len()]);
    d.b.softmax_xent(
        &mut d.ctx,
        &Loss {
            shape,
            target_stride: rows,
            accumulate: false,
        },
        at(&zb, 0),
        at(&lb, 0),
        Some(at_mut(&mut dz, 0)),
        at_mut(&mut stats, 0),
    )
    .unwrap();
    let st = d.get(&stats);
    assert_eq!(
        (st[3], st[STATS_LEN + 3]),
        (2.0, 2.0),
        "bad labels per slot: {st:?}"
    );
    let good: Vec<usize> = (0..rows).filter(|&r| r != 1 && r != 3).collect();
    let z0: Vec<f64> = good
        .iter()
        .flat_map(|&r| to64(&z[r * classes..(r + 1) * classes]))
        .collect();
    let l0: Vec<f32> = good.iter().map(|&r| labels[r]).collect();
    assert_close(
        "loss over the good rows",
        &[st[0]],
        &[xent_ref(good.len(), classes, &z0, &l0) * good.len() as f64],
        1e-5,
    );
    let g = d.get(&dz);
    for r in [1, 3, rows + 2, rows + 4] {
        assert!(
            g[r * classes..(r + 1) * classes].iter().all(|&v| v == 0.0),
            "row {r}: {g:?}"
        );
    }
    // Accumulating adds the counts.
    d.b.softmax_xent(
        &mut d.ctx,
        &Loss {
            shape,
            target_stride: rows,
            accumulate: true,
        },
        at(&zb, 0),
        at(&lb, 0),
        None,
        at_mut(&mut stats, 0),
    )
    .unwrap();
    assert_eq!(d.get(&stats)[3], 4.0);
    // Logits without a class are an error on every device, checked on the host.
    let e =
        d.b.softmax_xent(
            &mut d.ctx,
            &Loss {
                shape: Batched::new(2, rows, 0),
                target_stride: rows,
                accumulate: false,
            },
            at(&zb, 0),
            at(&lb, 0),
            None,
            at_mut(&mut stats, 0),
        )
        .unwrap_err();
    assert!(e.to_string().contains("at least one class"), "{e}");
}

/// `k == 0` is `C = beta * C` on every device (cuBLAS needs leading
/// dimensions of at least 1 for it).
fn gemm_with_empty_inner_dimension_scales_c<B: Backend>(d: &mut D<B>) {
    let a = d.zeros(4);
    for (trans_a, trans_b) in [(false, false), (true, true)] {
        for (beta, want) in [(0.0, 0.0), (0.5, 1.5)] {
            let mut c = d.put(&[3.0; 2 * 3 * 4]);
            let mut g = Gemm::new(3, 4, 0).beta(beta).batched(2, 0, 0, 12);
            g.trans_a = trans_a;
            g.trans_b = trans_b;
            d.b.gemm(&mut d.ctx, &g, at(&a, 0), at(&a, 0), at_mut(&mut c, 0))
                .unwrap();
            assert_eq!(d.get(&c), vec![want; 24], "beta {beta}, trans {trans_a}");
        }
    }
}

fn mse_loss_and_gradient<B: Backend>(d: &mut D<B>) {
    let shape = Batched::new(2, 6, 3);
    let (p, t) = (
        rand_vec(shape.len(), 18, 2.0),
        rand_vec(shape.len(), 19, 2.0),
    );
    let (pb, tb) = (d.put(&p), d.put(&t));
    let mut dp = d.zeros(shape.len());
    let mut stats = d.zeros(2 * STATS_LEN);
    d.b.mse(
        &mut d.ctx,
        &Loss {
            shape,
            target_stride: 18,
            accumulate: false,
        },
        at(&pb, 0),
        at(&tb, 0),
        Some(at_mut(&mut dp, 0)),
        at_mut(&mut stats, 0),
    )
    .unwrap();
    let (grad, st) = (d.get(&dp), d.get(&stats));
    for s in 0..2 {
        let ts = to64(&t[s * 18..(s + 1) * 18]);
        let loss = |p: &[f64]| p.iter().zip(&ts).map(|(p, t)| (p - t).powi(2)).sum::<f64>() / 18.0;
        let ps = to64(&p[s * 18..(s + 1) * 18]);
        assert_close(
            "mse sse",
            &st[s * STATS_LEN + 1..s * STATS_LEN + 2],
            &[loss(&ps) * 18.0],
            1e-5,
        );
        assert_close(
            "mse loss_sum",
            &st[s * STATS_LEN..s * STATS_LEN + 1],
            &[loss(&ps) * 6.0],
            1e-5,
        );
        assert_close(
            "mse gradient",
            &grad[s * 18..(s + 1) * 18],
            &numeric_grad(loss, &ps),
            1e-6,
        );
    }
}

fn sgd_hand_computed<B: Backend>(d: &mut D<B>) {
    let slots = [
        SgdSlot {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.01,
            nesterov: false,
        },
        SgdSlot {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
            nesterov: true,
        },
        SgdSlot {
            lr: 0.5,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        },
    ];
    let mut p = d.put(&[1.0, 1.0, 1.0]);
    let g = d.put(&[0.5, 0.5, 0.5]);
    let mut v = d.zeros(3);
    for _ in 0..2 {
        d.b.sgd_step(
            &mut d.ctx,
            ParamRun::whole(1, &slots),
            at_mut(&mut p, 0),
            at(&g, 0),
            Some(at_mut(&mut v, 0)),
        )
        .unwrap();
    }
    // Slot 0: g' = 0.51, v = 0.51, p = 0.949; then g' = 0.50949, v = 0.96849, p = 0.852151.
    // Slot 1: v = 0.5, p = 1 - 0.1 * 0.95 = 0.905; v = 0.95, p = 0.905 - 0.1 * 1.355 = 0.7695.
    // Slot 2: p = 1 - 0.25 - 0.25 = 0.5.
    assert_rel("sgd", &d.get(&p), &[0.852151, 0.7695, 0.5], 1e-6);
    assert_rel("sgd velocity", &d.get(&v), &[0.96849, 0.95, 0.0], 1e-6);
    let none = [SgdSlot {
        momentum: 0.9,
        ..slots[0]
    }];
    assert!(
        d.b.sgd_step(
            &mut d.ctx,
            ParamRun::whole(1, &none),
            at_mut(&mut p, 0),
            at(&g, 0),
            None
        )
        .is_err()
    );
}

fn adam_hand_computed<B: Backend>(d: &mut D<B>) {
    let base = AdamSlot {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
    };
    let slots = [
        base,
        AdamSlot {
            weight_decay: 0.1,
            decoupled: true,
            ..base
        },
        AdamSlot {
            weight_decay: 0.1,
            ..base
        },
    ];
    let mut p = d.put(&[1.0; 3]);
    let (mut m, mut v) = (d.zeros(3), d.zeros(3));
    let g1 = d.put(&[0.5; 3]);
    let step1 = d.adam_scalars(&slots, &[1, 1, 1]);
    d.b.adam_step(
        &mut d.ctx,
        ParamRun::whole(1, &slots),
        at(&step1, 0),
        at_mut(&mut p, 0),
        at(&g1, 0),
        Moments {
            m: at_mut(&mut m, 0),
            v: at_mut(&mut v, 0),
        },
    )
    .unwrap();
    // Step 1: m-hat / sqrt(v-hat) = 1, so p = 1 - 0.1 = 0.9; AdamW first decays: 0.99 - 0.1 = 0.89.
    // Adam with L2: g' = 0.6, same unit step, p = 0.9.
    assert_rel("adam step 1", &d.get(&p), &[0.9, 0.89, 0.9], 1e-6);
    let g2 = d.put(&[-0.25; 3]);
    let step2 = d.adam_scalars(&slots[..1], &[2]);
    d.b.adam_step(
        &mut d.ctx,
        ParamRun::whole(1, &slots[..1]),
        at(&step2, 0),
        at_mut(&mut p, 0),
        at(&g2, 0),
        Moments {
            m: at_mut(&mut m, 0),
            v: at_mut(&mut v, 0),
        },
    )
    .unwrap();
    // m = 0.02, v = 0.00031225, m-hat = 0.02 / 0.19, v-hat = 0.00031225 / 0.001999.
    // p = 0.9 - 0.1 * 0.1052632 / 0.3952251 = 0.8733667.
    assert_rel("adam step 2", &d.get(&p)[..1], &[0.873_366_7], 1e-6);
    assert_rel(
        "adam moments",
        &[d.get(&m)[0], d.get(&v)[0]],
        &[0.02, 0.000_312_25],
        5e-5,
    ); // f32(1 - 0.999) is off by 1.3e-5
}

/// Each batched op equals K single-slot calls with the same per-slot scalars.
fn batched_ops_equal_single_slot_calls<B: Backend>(d: &mut D<B>) {
    let k = 3;
    let n = 40;
    let x = rand_vec(k * n, 20, 1.0);
    let g = rand_vec(k * n, 21, 1.0);
    let (xb, gb) = (d.put(&x), d.put(&g));

    let drops: Vec<_> = (0..k)
        .map(|s| DropoutSlot::new(0.1 * s as f32, s as u64))
        .collect();
    let steps = d.dropout_steps(&[3, 4, 3]);
    let mut y = d.zeros(k * n);
    d.b.dropout(
        &mut d.ctx,
        Slots {
            n,
            settings: &drops,
        },
        at(&steps, 0),
        at(&xb, 0),
        at_mut(&mut y, 0),
    )
    .unwrap();
    let batched = d.get(&y);
    for s in 0..k {
        let mut y1 = d.zeros(n);
        d.b.dropout(
            &mut d.ctx,
            Slots {
                n,
                settings: &drops[s..s + 1],
            },
            at(&steps, s * DROPOUT_STEP_WORDS),
            at(&xb, s * n),
            at_mut(&mut y1, 0),
        )
        .unwrap();
        assert_rel(
            "dropout slot",
            &batched[s * n..(s + 1) * n],
            &d.get(&y1),
            1e-6,
        );
    }

    let sgds: Vec<_> = (0..k)
        .map(|s| SgdSlot {
            lr: 0.1 + s as f32,
            momentum: 0.5 * s as f32,
            weight_decay: 0.01,
            nesterov: s == 2,
        })
        .collect();
    let adams: Vec<_> = (0..k)
        .map(|s| AdamSlot {
            lr: 0.01 * (s + 1) as f32,
            beta1: 0.8 + 0.05 * s as f32,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 0.01,
            decoupled: s == 1,
        })
        .collect();
    let adam_steps: Vec<u64> = (0..k as u64).map(|s| 1 + s).collect();
    let scalars = d.adam_scalars(&adams, &adam_steps);
    let (mut p, mut v) = (d.put(&x), d.put(&g));
    d.b.sgd_step(
        &mut d.ctx,
        ParamRun::whole(n, &sgds),
        at_mut(&mut p, 0),
        at(&gb, 0),
        Some(at_mut(&mut v, 0)),
    )
    .unwrap();
    let (mut pa, mut ma, mut va) = (d.put(&x), d.put(&g), d.put(&vec![0.1; k * n]));
    d.b.adam_step(
        &mut d.ctx,
        ParamRun::whole(n, &adams),
        at(&scalars, 0),
        at_mut(&mut pa, 0),
        at(&gb, 0),
        Moments {
            m: at_mut(&mut ma, 0),
            v: at_mut(&mut va, 0),
        },
    )
    .unwrap();
    let (bp, bv, bpa) = (d.get(&p), d.get(&v), d.get(&pa));
    for s in 0..k {
        let r = s * n..(s + 1) * n;
        let (mut p1, mut v1) = (d.put(&x[r.clone()]), d.put(&g[r.clone()]));
        d.b.sgd_step(
            &mut d.ctx,
            ParamRun::whole(n, &sgds[s..s + 1]),
            at_mut(&mut p1, 0),
            at(&gb, s * n),
            Some(at_mut(&mut v1, 0)),
        )
        .unwrap();
        assert_rel("sgd slot", &bp[r.clone()], &d.get(&p1), 1e-6);
        assert_rel("sgd velocity slot", &bv[r.clone()], &d.get(&v1), 1e-6);
        let (mut p1, mut m1, mut v1) = (
            d.put(&x[r.clone()]),
            d.put(&g[r.clone()]),
            d.put(&vec![0.1; n]),
        );
        d.b.adam_step(
            &mut d.ctx,
            ParamRun::whole(n, &adams[s..s + 1]),
            at(&scalars, s * ADAM_STEP_WORDS),
            at_mut(&mut p1, 0),
            at(&gb, s * n),
            Moments {
                m: at_mut(&mut m1, 0),
                v: at_mut(&mut v1, 0),
            },
        )
        .unwrap();
        assert_rel("adam slot", &bpa[r.clone()], &d.get(&p1), 1e-6);
    }

    // Losses: the batched statistics equal per-slot calls.
    let shape = Batched::new(k, 4, 10);
    let labels: Vec<f32> = (0..k * 4).map(|i| (i % 10) as f32).collect();
    let (zb, lb) = (d.put(&rand_vec(shape.len(), 22, 3.0)), d.put(&labels));
    let mut st = d.zeros(k * STATS_LEN);
    let mut dz = d.zeros(shape.len());
    d.b.softmax_xent(
        &mut d.ctx,
        &Loss {
            shape,
            target_stride: 4,
            accumulate: false,
        },
        at(&zb, 0),
        at(&lb, 0),
        Some(at_mut(&mut dz, 0)),
        at_mut(&mut st, 0),
    )
    .unwrap();
    let (bst, bdz) = (d.get(&st), d.get(&dz));
    for s in 0..k {
        let one = Batched::new(1, 4, 10);
        let mut st1 = d.zeros(STATS_LEN);
        let mut dz1 = d.zeros(40);
        d.b.softmax_xent(
            &mut d.ctx,
            &Loss {
                shape: one,
                target_stride: 4,
                accumulate: false,
            },
            at(&zb, s * 40),
            at(&lb, s * 4),
            Some(at_mut(&mut dz1, 0)),
            at_mut(&mut st1, 0),
        )
        .unwrap();
        assert_rel(
            "xent stats slot",
            &bst[s * STATS_LEN..(s + 1) * STATS_LEN],
            &d.get(&st1),
            1e-6,
        );
        assert_rel(
            "xent grad slot",
            &bdz[s * 40..(s + 1) * 40],
            &d.get(&dz1),
            1e-6,
        );
    }
}

/// The fused bias and activation gives the bits of `bias_add` then
/// `activation`, for every activation, over several blocks with ragged edges.
fn bias_activation_equals_bias_add_then_activation<B: Backend>(d: &mut D<B>) {
    let (k, rows, cols, stride) = (3, 37, 70, 75);
    let shape = Batched::new(k, rows, cols);
    let x = rand_vec(shape.len(), 51, 3.0);
    let bias = rand_vec(k * stride, 52, 1.0);
    let bb = d.put(&bias);
    for act in Activation::ALL {
        let (mut z1, mut y1) = (d.put(&x), d.put(&vec![5.0; shape.len()]));
        d.b.bias_add(&mut d.ctx, shape, stride, at_mut(&mut z1, 0), at(&bb, 0))
            .unwrap();
        let op = ActivationOp {
            activation: act,
            n: shape.len(),
        };
        d.b.activation(&mut d.ctx, op, at(&z1, 0), at_mut(&mut y1, 0))
            .unwrap();
        let (mut z2, mut y2) = (d.put(&x), d.put(&vec![5.0; shape.len()]));
        d.b.bias_activation(
            &mut d.ctx,
            shape,
            stride,
            act,
            at_mut(&mut z2, 0),
            at(&bb, 0),
            at_mut(&mut y2, 0),
        )
        .unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(d.get(&z2)), bits(d.get(&z1)), "{act:?}: x + bias");
        assert_eq!(bits(d.get(&y2)), bits(d.get(&y1)), "{act:?}: act(x + bias)");
    }
}

/// Column sums over more rows and columns than one block of the CUDA kernel
/// covers (32 columns, 8 row lanes), with ragged edges, against float64.
fn col_sum_of_many_rows_and_columns<B: Backend>(d: &mut D<B>) {
    let (k, rows, cols, stride) = (3, 131, 70, 75);
    let shape = Batched::new(k, rows, cols);
    let dy = rand_vec(shape.len(), 41, 1.0);
    let dyb = d.put(&dy);
    let mut db = d.put(&vec![7.0; k * stride]);
    d.b.col_sum(&mut d.ctx, shape, stride, at(&dyb, 0), at_mut(&mut db, 0))
        .unwrap();
    let got = d.get(&db);
    for s in 0..k {
        let want: Vec<f64> = (0..cols)
            .map(|c| {
                (0..rows)
                    .map(|r| dy[(s * rows + r) * cols + c] as f64)
                    .sum()
            })
            .collect();
        assert_close("col_sum", &got[s * stride..s * stride + cols], &want, 1e-5);
        assert!(
            got[s * stride + cols..(s + 1) * stride]
                .iter()
                .all(|&v| v == 7.0),
            "col_sum wrote outside its columns"
        );
    }
}

/// Bias, column sums and MSE: the batched call equals per-slot calls.
fn batched_bias_colsum_mse_equal_single_slot_calls<B: Backend>(d: &mut D<B>) {
    let (k, rows, cols, stride) = (3, 5, 4, 6);
    let shape = Batched::new(k, rows, cols);
    let (x, bias) = (
        rand_vec(shape.len(), 30, 1.0),
        rand_vec(k * stride, 31, 1.0),
    );
    let (bb, tb) = (d.put(&bias), d.put(&rand_vec(shape.len(), 32, 1.0)));
    let mut xb = d.put(&x);
    d.b.bias_add(&mut d.ctx, shape, stride, at_mut(&mut xb, 0), at(&bb, 0))
        .unwrap();
    let mut db = d.zeros(k * stride);
    d.b.col_sum(&mut d.ctx, shape, stride, at(&xb, 0), at_mut(&mut db, 0))
        .unwrap();
    let mut st = d.zeros(k * STATS_LEN);
    let mut dp = d.zeros(shape.len());
    d.b.mse(
        &mut d.ctx,
        &Loss {
            shape,
            target_stride: rows * cols,
            accumulate: false,
        },
        at(&xb, 0),
        at(&tb, 0),
        Some(at_mut(&mut dp, 0)),
        at_mut(&mut st, 0),
    )
    .unwrap();
    let (bx, bdb, bst, bdp) = (d.get(&xb), d.get(&db), d.get(&st), d.get(&dp));
    let one = Batched::new(1, rows, cols);
    let n = rows * cols;
    for s in 0..k {
        let mut x1 = d.put(&x[s * n..(s + 1) * n]);
        d.b.bias_add(&mut d.ctx, one, 0, at_mut(&mut x1, 0), at(&bb, s * stride))
            .unwrap();
        assert_rel("bias_add slot", &bx[s * n..(s + 1) * n], &d.get(&x1), 1e-6);
        let mut db1 = d.zeros(cols);
        d.b.col_sum(&mut d.ctx, one, 0, at(&x1, 0), at_mut(&mut db1, 0))
            .unwrap();
        assert_rel(
            "col_sum slot",
            &bdb[s * stride..s * stride + cols],
            &d.get(&db1),
            1e-6,
        );
        let (mut st1, mut dp1) = (d.zeros(STATS_LEN), d.zeros(n));
        d.b.mse(
            &mut d.ctx,
            &Loss {
                shape: one,
                target_stride: 0,
                accumulate: false,
            },
            at(&x1, 0),
            at(&tb, s * n),
            Some(at_mut(&mut dp1, 0)),
            at_mut(&mut st1, 0),
        )
        .unwrap();
        assert_rel(
            "mse stats slot",
            &bst[s * STATS_LEN..(s + 1) * STATS_LEN],
            &d.get(&st1),
            1e-6,
        );
        assert_rel(
            "mse grad slot",
            &bdp[s * n..(s + 1) * n],
            &d.get(&dp1),
            1e-6,
        );
    }
}

fn out_of_bounds_views_are_errors<B: Backend>(d: &mut D<B>) {
    let a = d.zeros(10);
    let mut c = d.zeros(10);
    let err =
        d.b.gemm(
            &mut d.ctx,
            &Gemm::new(4, 4, 4),
            at(&a, 0),
            at(&a, 0),
            at_mut(&mut c, 0),
        )
        .unwrap_err();
    assert!(err.to_string().contains("gemm"), "{err}");
    assert!(
        d.b.activation(
            &mut d.ctx,
            ActivationOp {
                activation: Activation::Relu,
                n: 5
            },
            at(&a, 8),
            at_mut(&mut c, 0)
        )
        .is_err()
    );
    // Three indices need three words; the index buffer holds two.
    let idx = d.indices(&[0, 1]);
    assert!(
        d.b.gather_rows(&mut d.ctx, 2, 3, at(&idx, 0), at(&a, 0), at_mut(&mut c, 0))
            .is_err()
    );
    // Six rows of two need twelve elements; `c` holds ten.
    let idx = d.indices(&[0; 6]);
    assert!(
        d.b.gather_rows(&mut d.ctx, 2, 6, at(&idx, 0), at(&a, 0), at_mut(&mut c, 0))
            .is_err()
    );
}

fn gather_rows_copies_indexed_rows<B: Backend>(d: &mut D<B>) {
    let src: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let sb = d.put(&src);
    let mut out = d.zeros(8);
    let idx = d.indices(&[5, 0, 3, 4]);
    d.b.gather_rows(
        &mut d.ctx,
        2,
        4,
        at(&idx, 0),
        at(&sb, 0),
        at_mut(&mut out, 0),
    )
    .unwrap();
    assert_eq!(d.get(&out), vec![10.0, 11.0, 0.0, 1.0, 6.0, 7.0, 8.0, 9.0]);
    // From an offset view, and an index past the end reads a zero row
    // (never out of bounds) on every device: the host checks indices.
    let idx = d.indices(&[1, 4, 2]);
    let mut out = d.put(&[7.0; 6]);
    d.b.gather_rows(
        &mut d.ctx,
        2,
        3,
        at(&idx, 0),
        at(&sb, 4),
        at_mut(&mut out, 0),
    )
    .unwrap();
    assert_eq!(d.get(&out), vec![6.0, 7.0, 0.0, 0.0, 8.0, 9.0]);
    // Large indices (past 2^24, where an f32 would round) stay exact words.
    let idx = d.indices(&[(1 << 24) + 1]);
    let mut out = d.put(&[7.0; 2]);
    d.b.gather_rows(
        &mut d.ctx,
        2,
        1,
        at(&idx, 0),
        at(&sb, 0),
        at_mut(&mut out, 0),
    )
    .unwrap();
    assert_eq!(d.get(&out), vec![0.0, 0.0]);
}

/// A download larger than CUDA's pinned staging buffer (32 MiB) comes back
/// whole, through several chunks, from an offset.
fn downloads_larger_than_the_staging_buffer_round_trip<B: Backend>(d: &mut D<B>) {
    let n = 2 * (8 << 20) + 5;
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let buf = d.put(&v);
    let mut back = vec![0.0f32; n - 3];
    d.b.download(&mut d.ctx, at(&buf, 3), &mut back).unwrap();
    assert!(back.iter().enumerate().all(|(i, &x)| x == (i + 3) as f32));
}

/// `copy_within` moves one slot over another and leaves the rest; ranges
/// that overlap or leave the buffer are errors.
fn copy_within_moves_one_range_over_another<B: Backend>(d: &mut D<B>) {
    let v: Vec<f32> = (0..40).map(|i| i as f32).collect();
    let mut buf = d.put(&v);
    d.b.copy_within(&mut d.ctx, 10, &mut buf, 25, 5).unwrap();
    let want: Vec<f32> = (0..40)
        .map(|i| {
            if (5..15).contains(&i) {
                (i + 20) as f32
            } else {
                i as f32
            }
        })
        .collect();
    assert_eq!(d.get(&buf), want);
    assert!(
        d.b.copy_within(&mut d.ctx, 10, &mut buf, 0, 9).is_err(),
        "overlap"
    );
    assert!(
        d.b.copy_within(&mut d.ctx, 10, &mut buf, 35, 0).is_err(),
        "out of bounds"
    );
    assert_eq!(d.get(&buf), want, "nothing written by a refused copy");
}

/// An optimizer step over one run of every slot (a layer of a group laid
/// out `[slot][n]`) equals the whole step there, bit for bit, and leaves
/// the rest alone; queued [`Backend::beside`] and joined, it gives the same
/// bits as in order. Runs that overlap are refused.
/// `k` slots of Adam (AdamW in slot 1) and of SGD (no momentum in slot 0,
/// Nesterov in slot 2), each with its own learning rate or momentum.
fn optimizer_slots(k: usize) -> (Vec<AdamSlot>, Vec<SgdSlot>) {
    let adams = (0..k)
        .map(|s| AdamSlot {
            lr: 0.01 * (s + 1) as f32,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 0.01,
            decoupled: s == 1,
        })
        .collect();
    let sgds = (0..k)
        .map(|s| SgdSlot {
            lr: 0.1,
            momentum: 0.5 * s as f32,
            weight_decay: 0.01,
            nesterov: s == 2,
        })
        .collect();
    (adams, sgds)
}

/// A ragged run (each slot its own length from the run's start, as a
/// group of mixed shapes steps its slots' own parameters) steps exactly
/// those, as the whole step does, and leaves the rest of each slot as it
/// was; lengths past the run are cut to it.
fn optimizer_ragged_runs_step_each_slot_s_own_length<B: Backend>(d: &mut D<B>) {
    let (k, n) = (3, 40);
    let lens = [40, 7, 0];
    let x = rand_vec(k * n, 51, 1.0);
    let g = rand_vec(k * n, 52, 0.5);
    let (adams, sgds) = optimizer_slots(k);
    let scalars = d.adam_scalars(&adams, &[3, 1, 7]);
    let gb = d.put(&g);
    let own = |j: usize| j % n < lens[j / n];
    let check = |what: &str, whole: &[f32], ragged: &[f32], start: &[f32]| {
        for j in 0..k * n {
            let want = if own(j) { whole[j] } else { start[j] };
            assert_eq!(ragged[j].to_bits(), want.to_bits(), "{what} at {j}");
        }
    };
    let v0 = vec![0.1; k * n];
    let adam = |ragged: bool, d: &mut D<B>| {
        let (mut p, mut m, mut v) = (d.put(&x), d.put(&g), d.put(&v0));
        let run = ParamRun {
            lens: ragged.then_some(&lens[..]),
            ..ParamRun::whole(n, &adams)
        };
        let moments = Moments {
            m: at_mut(&mut m, 0),
            v: at_mut(&mut v, 0),
        };
        d.b.adam_step(
            &mut d.ctx,
            run,
            at(&scalars, 0),
            at_mut(&mut p, 0),
            at(&gb, 0),
            moments,
        )
        .unwrap();
        [d.get(&p), d.get(&m), d.get(&v)]
    };
    let (whole, ragged) = (adam(false, d), adam(true, d));
    for (i, what) in ["adam params", "adam m", "adam v"].iter().enumerate() {
        check(what, &whole[i], &ragged[i], [&x, &g, &v0][i]);
    }
    let sgd = |lens: Option<&[usize]>, d: &mut D<B>| {
        let (mut p, mut vel) = (d.put(&x), d.put(&v0));
        let run = ParamRun {
            lens,
            ..ParamRun::whole(n, &sgds)
        };
        d.b.sgd_step(
            &mut d.ctx,
            run,
            at_mut(&mut p, 0),
            at(&gb, 0),
            Some(at_mut(&mut vel, 0)),
        )
        .unwrap();
        [d.get(&p), d.get(&vel)]
    };
    // A length past the run counts as the run's.
    let (whole, ragged) = (sgd(None, d), sgd(Some(&[400, 7, 0]), d));
    check("sgd params", &whole[0], &ragged[0], &x);
    check("sgd velocity", &whole[1], &ragged[1], &v0);
    // Lengths for some slots only are refused.
    let mut p = d.put(&x);
    let short = ParamRun {
        lens: Some(&lens[..2]),
        ..ParamRun::whole(n, &sgds)
    };
    let mut vel = d.put(&v0);
    assert!(
        d.b.sgd_step(
            &mut d.ctx,
            short,
            at_mut(&mut p, 0),
            at(&gb, 0),
            Some(at_mut(&mut vel, 0))
        )
        .is_err()
    );
}

fn optimizer_runs_step_one_layer_of_every_slot<B: Backend>(d: &mut D<B>) {
    let (k, n, start, len) = (3, 50, 12, 20);
    let x = rand_vec(k * n, 31, 1.0);
    let g = rand_vec(k * n, 32, 0.5);
    let (adams, sgds) = optimizer_slots(k);
    let scalars = d.adam_scalars(&adams, &[3, 1, 7]);
    let gb = d.put(&g);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let in_run = |i: usize| (start..start + len).contains(&(i % n));
    // Adam: whole, run in order, run beside; params and both moments.
    let mut results = Vec::new();
    for how in 0..3 {
        let (mut p, mut m, mut v) = (d.put(&x), d.put(&g), d.put(&vec![0.1; k * n]));
        let (off, run) = match how {
            0 => (0, ParamRun::whole(n, &adams)),
            _ => (
                start,
                ParamRun {
                    len,
                    stride: n,
                    settings: &adams,
                    lens: None,
                },
            ),
        };
        let mut step = |b: &B, ctx: &mut B::Ctx| {
            b.adam_step(
                ctx,
                run,
                at(&scalars, 0),
                at_mut(&mut p, off),
                at(&gb, off),
                Moments {
                    m: at_mut(&mut m, off),
                    v: at_mut(&mut v, off),
                },
            )
        };
        if how == 2 {
            d.b.beside(&mut d.ctx, step).unwrap();
            d.b.join_beside(&mut d.ctx).unwrap();
        } else {
            step(&d.b, &mut d.ctx).unwrap();
        }
        results.push([d.get(&p), d.get(&m), d.get(&v)]);
    }
    let v0 = vec![0.1; k * n];
    for (what, i) in [("params", 0), ("m", 1), ("v", 2)] {
        let start_values = [&x, &g, &v0][i];
        for how in 1..3 {
            let (whole, run) = (&results[0][i], &results[how][i]);
            for j in 0..k * n {
                let want = if in_run(j) { whole[j] } else { start_values[j] };
                assert_eq!(run[j].to_bits(), want.to_bits(), "adam {what} {how} at {j}");
            }
        }
        assert_eq!(bits(&results[1][i]), bits(&results[2][i]), "beside {what}");
    }
    // SGD with momentum: the run equals the whole step there.
    let mut sgd = Vec::new();
    for whole in [true, false] {
        let (mut p, mut v) = (d.put(&x), d.put(&g));
        let (off, run) = if whole {
            (0, ParamRun::whole(n, &sgds))
        } else {
            (
                start,
                ParamRun {
                    len,
                    stride: n,
                    settings: &sgds,
                    lens: None,
                },
            )
        };
        let (pv, vv) = (at_mut(&mut p, off), Some(at_mut(&mut v, off)));
        d.b.sgd_step(&mut d.ctx, run, pv, at(&gb, off), vv).unwrap();
        sgd.push(d.get(&p));
    }
    for j in 0..k * n {
        let want = if in_run(j) { sgd[0][j] } else { x[j] };
        assert_eq!(sgd[1][j].to_bits(), want.to_bits(), "sgd at {j}");
    }
    // A run longer than the slots' stride would step elements twice.
    let mut p = d.put(&x);
    let overlapping = ParamRun {
        len: n + 1,
        stride: n,
        settings: &sgds[..1].repeat(2),
        lens: None,
    };
    assert!(
        d.b.sgd_step(&mut d.ctx, overlapping, at_mut(&mut p, 0), at(&gb, 0), None)
            .is_err()
    );
}

kernels::device_tests!(
    // Three threads exercise the uneven task splits.
    cpu: crate::common::Dev::new(kernels::CpuBackend::new(), 3),
    cuda: |b| crate::common::Dev::new(b, 1);
    gemm_matches_reference,
    gemm_precisions_within_their_formats,
    gemm_backward_finite_differences,
    gemm_batched_equals_single_calls,
    gemm_grouped_members_equal_their_products_alone,
    gemm_grouped_members_of_size_0_write_nothing,
    gemm_grouped_members_in_pitches_of_their_own,
    bias_add_and_col_sum,
    col_sum_of_many_rows_and_columns,
    bias_activation_equals_bias_add_then_activation,
    activations_forward_and_finite_differences,
    activation_large_input_splits_consistently,
    dropout_mask_rate_reproducibility_and_backward,
    dropout_of_padded_rows_equals_the_rows_alone,
    softmax_xent_loss_accuracy_and_gradient,
    mse_loss_and_gradient,
    sgd_hand_computed,
    adam_hand_computed,
    optimizer_runs_step_one_layer_of_every_slot,
    optimizer_ragged_runs_step_each_slot_s_own_length,
    batched_ops_equal_single_slot_calls,
    batched_bias_colsum_mse_equal_single_slot_calls,
    out_of_bounds_views_are_errors,
    gather_rows_copies_indexed_rows,
    gemm_with_empty_inner_dimension_scales_c,
    downloads_larger_than_the_staging_buffer_round_trip,
    copy_within_moves_one_range_over_another,
);
