//! TPE against its reference behaviour: concentration near optima, the
//! kernel clip, the good group's weights, determinism.

use super::*;
use crate::sampler::RandomSampler;
use crate::space::{Choice, Param};

fn space(params: Vec<(&str, Distribution)>) -> SearchSpace {
    SearchSpace::new(
        params
            .into_iter()
            .map(|(n, d)| Param {
                name: n.into(),
                dist: d,
                condition: None,
            })
            .collect(),
    )
    .unwrap()
}

/// Runs `n` sequential trials of `f` and returns the history.
fn optimise(
    s: &mut dyn Sampler,
    space: &SearchSpace,
    n: usize,
    f: impl Fn(&Params) -> f64,
) -> Vec<TrialRecord> {
    let mut h: Vec<TrialRecord> = Vec::new();
    for _ in 0..n {
        let p = s.propose(space, &h).unwrap();
        let v = f(&p);
        h.push(TrialRecord {
            params: p,
            value: Some(v),
            values: Vec::new(),
            violation: 0.0,
            stopped: None,
        });
    }
    h
}

#[test]
fn concentrates_near_the_optimum_of_a_1d_function() {
    let sp = unit_floats(&["x"]);
    let f = |p: &Params| (p["x"].internal() - 0.3).powi(2);
    let h = optimise(&mut TpeSampler::new(1, Direction::Minimize), &sp, 80, f);
    let late: Vec<f64> = h[40..]
        .iter()
        .map(|t| (t.params["x"].internal() - 0.3).abs())
        .collect();
    let near = late.iter().filter(|d| **d < 0.1).count();
    // Uniform sampling puts 20% of the samples there; TPE at least 60%.
    assert!(
        near >= 24,
        "{near} of 40 late samples within 0.1 of the optimum"
    );
    let r = optimise(&mut RandomSampler::new(1), &sp, 80, f);
    let near_random = r[40..]
        .iter()
        .filter(|t| (t.params["x"].internal() - 0.3).abs() < 0.1)
        .count();
    assert!(near > 2 * near_random, "TPE {near} vs random {near_random}");
}

#[test]
fn handles_log_int_and_categorical_and_is_deterministic() {
    let sp = space(vec![
        (
            "lr",
            Distribution::Float {
                low: 1e-5,
                high: 1.0,
                log: true,
                step: None,
            },
        ),
        (
            "width",
            Distribution::Int {
                low: 8,
                high: 512,
                log: true,
                step: 1,
            },
        ),
        (
            "opt",
            Distribution::Categorical {
                choices: vec![
                    Choice::Str("a".into()),
                    Choice::Str("b".into()),
                    Choice::Str("c".into()),
                ],
            },
        ),
    ]);
    // Best at lr = 1e-3, width = 64, opt = "c".
    let f = |p: &Params| {
        (p["lr"].internal().log10() + 3.0).powi(2)
            + ((p["width"].internal()).log2() - 6.0).powi(2)
            + if p["opt"] == ParamValue::Choice(2) {
                0.0
            } else {
                1.0
            }
    };
    let a = optimise(&mut TpeSampler::new(3, Direction::Minimize), &sp, 60, f);
    let b = optimise(&mut TpeSampler::new(3, Direction::Minimize), &sp, 60, f);
    assert_eq!(a, b, "the same seed gives the same sequence");
    for t in &a {
        for p in sp.params() {
            assert!(p.dist.contains(t.params[&p.name]), "{:?}", t.params);
        }
    }
    let best = |h: &[TrialRecord]| {
        h.iter()
            .map(|t| t.value.unwrap())
            .fold(f64::INFINITY, f64::min)
    };
    let r = optimise(&mut RandomSampler::new(3), &sp, 60, f);
    assert!(
        best(&a) < best(&r),
        "TPE {} vs random {}",
        best(&a),
        best(&r)
    );
    let late_c = a[30..]
        .iter()
        .filter(|t| t.params["opt"] == ParamValue::Choice(2))
        .count();
    assert!(
        late_c >= 18,
        "the good category dominates late: {late_c} of 30"
    );
}

#[test]
fn gaussian_masses_are_accurate_in_the_tails() {
    // Against float64 references (Python's math.erfc).
    let cases = [
        (-1.0, 1.0, 0.682_689_492_137_085_9f64),
        (0.0, 0.5, 0.191_462_461_274_013_1),
        (2.0, 3.0, 0.021_400_233_916_549_105),
        (-3.0, -2.0, 0.021_400_233_916_549_105),
        (10.0, 11.0, 7.619_661_958_203_143e-24),
    ];
    for (a, b, mass) in cases {
        let got = log_gauss_mass(a, b);
        assert!(
            (got - mass.ln()).abs() < 1e-9,
            "[{a}, {b}]: {got} vs {}",
            mass.ln()
        );
    }
}

#[test]
fn a_discrete_kernel_is_a_distribution_over_its_grid() {
    // Ints, a log int and a stepped float: every kernel's masses over
    // the grid sum to 1, and its samples are grid values.
    let dists = [
        Distribution::Int {
            low: 0,
            high: 4,
            log: false,
            step: 1,
        },
        Distribution::Int {
            low: 2,
            high: 20,
            log: false,
            step: 3,
        },
        Distribution::Int {
            low: 8,
            high: 1024,
            log: true,
            step: 1,
        },
        Distribution::Float {
            low: 0.0,
            high: 0.5,
            log: false,
            step: Some(0.1),
        },
    ];
    let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(1);
    for d in dists {
        let g = grid(&d).unwrap();
        let (low, high, _) = bounds(&d);
        let obs: Vec<f64> = [
            g.low,
            g.high,
            g.round(g.coord(g.low) * 0.6 + g.coord(g.high) * 0.4),
        ]
        .iter()
        .map(|&v| g.coord(v))
        .collect();
        let k = Kernels::numeric(&obs, &[], low, high, Some(g), CLIP_EXPONENT);
        let values: Vec<f64> = (0..)
            .map(|i| g.low + i as f64 * g.step)
            .take_while(|v| *v <= g.high + 1e-9)
            .collect();
        for kernel in 0..=obs.len() {
            let total: f64 = values.iter().map(|&v| k.log_pdf(kernel, v).exp()).sum();
            assert!((total - 1.0).abs() < 1e-9, "{d:?} kernel {kernel}: {total}");
            for _ in 0..20 {
                let v = k.sample(kernel, &mut rng);
                assert!(values.iter().any(|w| (w - v).abs() < 1e-9), "{d:?}: {v}");
            }
        }
    }
}

#[test]
fn kernels_narrow_faster_than_optunas_clip_but_not_below_half_a_cell() {
    // Optuna's clip for 5 good observations is a seventh of the range.
    for e in [CLIP_EXPONENT, CONTINUOUS_CLIP_EXPONENT] {
        let ours = min_bandwidth(1.0, 5, None, e);
        assert!((ours - 7f64.powf(-e)).abs() < 1e-12 && ours < 1.0 / 7.0);
        // Never narrower than Optuna's floor of a hundredth.
        assert_eq!(min_bandwidth(1.0, 1000, None, e), 0.01);
    }
    // Three levels over [-0.5, 2.5]: half a cell is 0.5.
    assert_eq!(min_bandwidth(3.0, 20, Some(3.0), CLIP_EXPONENT), 0.5);
    // Eleven levels, few observations: the clip is wider than the floor.
    assert_eq!(
        min_bandwidth(11.0, 5, Some(11.0), CLIP_EXPONENT),
        min_bandwidth(11.0, 5, None, CLIP_EXPONENT)
    );
}

#[test]
fn continuous_dimensions_of_one_objective_clip_wider() {
    let one = TpeSampler::new(0, Direction::Minimize);
    let two = TpeSampler::multi(0, vec![Direction::Minimize; 2]);
    assert_eq!(one.clip_exponent(false), CONTINUOUS_CLIP_EXPONENT);
    assert_eq!(one.clip_exponent(true), CLIP_EXPONENT);
    assert_eq!(two.clip_exponent(false), CLIP_EXPONENT);
    // Wider: among 20 observations, the narrowest kernel is wider.
    let narrowest = |discrete| min_bandwidth(1.0, 20, None, one.clip_exponent(discrete));
    assert!(narrowest(false) > narrowest(true));
}

/// The widths of numeric kernels, the prior's last.
fn sigmas(k: Kernels) -> Vec<f64> {
    match k {
        Kernels::Numeric { sigmas, .. } => sigmas,
        Kernels::Categorical { .. } => unreachable!(),
    }
}

/// The kernels' widths of `points` on [0, 1] with a clip of a hundredth,
/// the prior's last.
fn widths(points: &[f64], believed: &[bool]) -> Vec<f64> {
    // (n + 2)^3 is above 100 for any n here: the clip is Optuna's floor.
    sigmas(Kernels::numeric(points, believed, 0.0, 1.0, None, 3.0))
}

#[test]
fn believed_kernels_neither_narrow_nor_are_narrowed_and_are_wider() {
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    // All finished: 0.25 narrows 0.2's kernel to their distance.
    let all = widths(&[0.2, 0.6, 0.25], &[]);
    assert!(close(&all, &[0.05, 0.35, 0.35, 1.0]), "{all:?}");
    assert_eq!(all, widths(&[0.2, 0.6, 0.25], &[false; 3]));
    // 0.25 believed: the finished ones are measured among themselves, and
    // 0.25 by its farther finished neighbour, BELIEVED_WIDTH times.
    let b = widths(&[0.2, 0.6, 0.25], &[false, false, true]);
    assert!(close(&b, &[0.4, 0.4, BELIEVED_WIDTH * 0.35, 1.0]), "{b:?}");
    // Outside the finished ones: its one inner neighbour; alone: the
    // farther bound; two believed do not measure each other.
    let b = widths(&[0.2, 0.6, 0.1, 0.9], &[false, false, true, true]);
    assert!(
        close(
            &b,
            &[0.4, 0.4, BELIEVED_WIDTH * 0.1, BELIEVED_WIDTH * 0.3, 1.0]
        ),
        "{b:?}"
    );
    let b = widths(&[0.5, 0.45], &[true, true]);
    assert!(
        close(&b, &[BELIEVED_WIDTH * 0.5, BELIEVED_WIDTH * 0.55, 1.0]),
        "{b:?}"
    );
    // Clipped after widening: never below the floor, never above the range.
    let b = widths(&[0.5, 0.501, 0.0], &[false, true, false]);
    assert!(close(&b, &[0.5, 0.01, 0.5, 1.0]), "{b:?}");
    let b = widths(&[0.9, 0.1], &[false, true]);
    assert!(close(&b, &[0.9, 1.0, 1.0]), "{b:?}");
    // A discrete dimension ignores the flags.
    let g = Grid {
        low: 0.0,
        high: 20.0,
        step: 1.0,
        log: false,
    };
    let on_grid = |believed: &[bool]| {
        sigmas(Kernels::numeric(
            &[4.0, 12.0, 5.0],
            believed,
            -0.5,
            20.5,
            Some(g),
            3.0,
        ))
    };
    assert_eq!(on_grid(&[false, false, true]), on_grid(&[]));
    assert_eq!(on_grid(&[]), vec![1.0, 7.0, 7.0, 21.0]);
}

#[test]
fn believed_kernels_widen_from_three_pending_trials() {
    let mut h = bowl();
    h.extend([0.29, 0.31].map(|x| at_x(x, None)));
    let believed = crate::sampler::gp::believed(&unit_floats(&["x"]), &h).unwrap();
    assert!(
        widened(2, &h, &believed).is_empty(),
        "two pending: as before"
    );
    h.push(at_x(0.3, None));
    let believed = crate::sampler::gp::believed(&unit_floats(&["x"]), &h).unwrap();
    let w = widened(3, &h, &believed);
    assert_eq!(w, [vec![false; 12], vec![true; 3]].concat());
    // A pending trial the believer left without a value (a parameter it
    // does not model) stays a liar's bad observation, of usual width.
    let mut unbelieved = believed.clone();
    unbelieved[13].value = None;
    assert!(!widened(3, &h, &unbelieved)[13]);
}

#[test]
fn the_good_groups_kernels_weigh_by_rank() {
    // Trial order, ranks 2, 0, 1: the best weighs BEST_WEIGHT, the worst 1.
    assert_eq!(good_weights(&[2, 0, 1]), vec![1.0, BEST_WEIGHT, 2.0]);
    assert_eq!(good_weights(&[0]), vec![1.0]);
}

/// With several objectives the good group's kernels weigh alike, as
/// Optuna's (`weights_below` of ones), however many it holds; with one,
/// by age and rank. The bad group weighs by age either way.
#[test]
fn the_good_group_of_several_objectives_weighs_alike() {
    let d = Distribution::Float {
        low: 0.0,
        high: 1.0,
        log: false,
        step: None,
    };
    // 30 observations: past the 25 from which older ones weigh less.
    let obs: Vec<Vec<ParamValue>> = (0..30)
        .map(|i| vec![ParamValue::Float(i as f64 / 30.0)])
        .collect();
    let ranks: Vec<usize> = (0..30).rev().collect();
    let kernel_weights = |tpe: &TpeSampler, weighting| {
        let mut w = tpe.estimator(&[&d], &obs, weighting, &[]).weights;
        // The prior's, last, and the normalisation aside.
        let prior = w.pop().unwrap();
        w.iter().map(|x| x / prior).collect::<Vec<f64>>()
    };
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    let by_age = observation_weights(30);
    assert!(by_age[0] < 0.1 && by_age[29] == 1.0);

    let several = TpeSampler::multi(1, vec![Direction::Minimize, Direction::Maximize]);
    let good = several.good_weighting(Weighting::ByAgeAndRank(&ranks));
    assert!(close(&kernel_weights(&several, good), &[1.0; 30]));
    assert!(close(&kernel_weights(&several, Weighting::ByAge), &by_age));

    let one = TpeSampler::new(1, Direction::Minimize);
    let good = one.good_weighting(Weighting::ByAgeAndRank(&ranks));
    let by_age_and_rank: Vec<f64> = by_age
        .iter()
        .zip(good_weights(&ranks))
        .map(|(a, r)| a * r)
        .collect();
    assert!(close(&kernel_weights(&one, good), &by_age_and_rank));
}

#[test]
fn pending_trials_push_proposals_apart() {
    let sp = unit_floats(&["x"]);
    let f = |p: &Params| (p["x"].internal() - 0.5).powi(2);
    // The constant liar (a discrete space's treatment).
    let mut s = TpeSampler::new(5, Direction::Minimize);
    s.pending = Pending::Lie;
    let mut h = optimise(&mut s, &sp, 30, f);
    // Four proposals in a row with none finished: each sees the others as pending.
    let mut xs = Vec::new();
    for _ in 0..4 {
        let p = s.propose(&sp, &h).unwrap();
        xs.push(p["x"].internal());
        h.push(TrialRecord {
            params: p,
            value: None,
            values: Vec::new(),
            violation: 0.0,
            stopped: None,
        });
    }
    xs.sort_by(f64::total_cmp);
    assert!(
        xs.windows(2).all(|w| w[1] - w[0] > 1e-9),
        "distinct proposals: {xs:?}"
    );
    assert!(gamma(10) == 1 && gamma(100) == 10 && gamma(1000) == 25);
}

fn rec(values: Vec<f64>, violation: f64) -> TrialRecord {
    TrialRecord {
        params: Params::new(),
        value: values.first().copied(),
        values,
        violation,
        stopped: None,
    }
}

#[test]
fn several_objectives_rank_by_front_then_by_hypervolume() {
    let s = TpeSampler::multi(0, vec![Direction::Minimize, Direction::Maximize]);
    // The second objective is maximised, so minimised these are (0, 4),
    // (1, 3), (1.1, 2.9), (4, 0): the first front. 18 more, dominated,
    // fill the history so that 10% is 3 trials.
    let mut h = vec![
        rec(vec![0.0, -4.0], 0.0),
        rec(vec![1.0, -3.0], 0.0),
        rec(vec![1.1, -2.9], 0.0),
        rec(vec![4.0, 0.0], 0.0),
    ];
    h.extend((0..18).map(|i| rec(vec![5.0 + i as f64, -1.0], 0.0)));
    let (good, bad) = s.rank(&h, (0..h.len()).collect());
    // ceil(0.1 * 22) = 3 of the four on the front: the greedy hypervolume
    // pick keeps the extremes and drops 1, which adds least beside 2.
    assert_eq!(good, vec![2, 3, 0]);
    assert_eq!(bad.len(), 19);
    assert!(bad.contains(&1));
}

#[test]
fn infeasible_trials_are_good_only_when_too_few_are_feasible() {
    let s = TpeSampler::new(0, Direction::Minimize);
    // Trial 0 has the best value but breaks a constraint.
    let mut h = vec![rec(vec![-10.0], 0.5)];
    h.extend((1..20).map(|i| rec(vec![i as f64], 0.0)));
    let (good, _) = s.rank(&h, (0..h.len()).collect());
    assert_eq!(good, vec![1, 2], "gamma(20) = 2 of the feasible ones");
    // With several objectives too: ceil(0.1 * 15) = 2, the one feasible
    // trial, then the least infeasible (trial 1), whatever their values.
    let s = TpeSampler::multi(0, vec![Direction::Minimize, Direction::Minimize]);
    let h: Vec<TrialRecord> = (0..15)
        .map(|i| {
            rec(
                vec![15.0 - i as f64, 1.0],
                if i == 0 { 0.0 } else { i as f64 },
            )
        })
        .collect();
    assert_eq!(s.rank(&h, (0..15).collect()).0, vec![0, 1]);
}

/// ZDT1 (two objectives, five variables), minimised.
fn zdt1(p: &Params) -> Vec<f64> {
    let x: Vec<f64> = (0..5).map(|i| p[&format!("x{i}")].internal()).collect();
    let g = 1.0 + 9.0 * x[1..].iter().sum::<f64>() / 4.0;
    vec![x[0], g * (1.0 - (x[0] / g).sqrt())]
}

#[test]
fn several_objectives_beat_random_search_on_zdt1_and_are_deterministic() {
    let sp = unit_floats(&["x0", "x1", "x2", "x3", "x4"]);
    let run = |s: &mut dyn Sampler, n: usize| -> Vec<TrialRecord> {
        let mut h: Vec<TrialRecord> = Vec::new();
        for _ in 0..n {
            let p = s.propose(&sp, &h).unwrap();
            let v = zdt1(&p);
            h.push(TrialRecord {
                params: p,
                value: Some(v[0]),
                values: v,
                violation: 0.0,
                stopped: None,
            });
        }
        h
    };
    let hv = |h: &[TrialRecord]| {
        let pts: Vec<Vec<f64>> = h.iter().map(|t| t.values.clone()).collect();
        pareto::hypervolume(&pts, &[1.1, 11.0])
    };
    let dirs = vec![Direction::Minimize; 2];
    let mut wins = 0;
    for seed in 0..5 {
        let ours = hv(&run(&mut TpeSampler::multi(seed, dirs.clone()), 100));
        let random = hv(&run(&mut RandomSampler::new(seed), 100));
        wins += usize::from(ours > random);
    }
    assert!(
        wins >= 4,
        "multi-objective TPE beat random search in {wins} of 5 seeds"
    );
    let a = run(&mut TpeSampler::multi(3, dirs.clone()), 40);
    let b = run(&mut TpeSampler::multi(3, dirs), 40);
    assert_eq!(a, b);
}

/// On a small discrete space, parameters sampled one at a time would soon
/// keep landing on tried configurations: TPE proposes the best untried
/// combination of its candidates instead, until none is left untried.
#[test]
fn several_objectives_on_a_discrete_space_propose_no_tried_configuration() {
    let sp = space(vec![
        (
            "a",
            Distribution::Int {
                low: 0,
                high: 3,
                step: 1,
                log: false,
            },
        ),
        (
            "b",
            Distribution::Int {
                low: 1,
                high: 16,
                step: 1,
                log: true,
            },
        ),
        (
            "c",
            Distribution::Categorical {
                choices: vec![
                    Choice::Str("x".into()),
                    Choice::Str("y".into()),
                    Choice::Str("z".into()),
                ],
            },
        ),
    ]);
    // 4 x 16 x 3 = 192 configurations; the best are small `a` with `c = x`.
    let f = |p: &Params| {
        let (a, b, c) = (p["a"].internal(), p["b"].internal(), p["c"].internal());
        vec![a + 0.1 * c, (b - 4.0).abs() + c]
    };
    let dirs = vec![Direction::Minimize; 2];
    for seed in 0..3 {
        let mut s = TpeSampler::multi(seed, dirs.clone());
        let mut h: Vec<TrialRecord> = Vec::new();
        for i in 0..80 {
            let p = s.propose(&sp, &h).unwrap();
            assert!(
                h.iter().all(|t| t.params != p),
                "seed {seed}: trial {i} repeats {p:?}"
            );
            let v = f(&p);
            h.push(TrialRecord {
                params: p,
                value: Some(v[0]),
                values: v,
                violation: 0.0,
                stopped: None,
            });
        }
    }
}

/// A finished (`Some`) or pending (`None`) trial of one float `x`.
fn at_x(x: f64, value: Option<f64>) -> TrialRecord {
    TrialRecord {
        params: [("x".to_string(), ParamValue::Float(x))].into(),
        value,
        values: Vec::new(),
        violation: 0.0,
        stopped: None,
    }
}

/// Floats on [0, 1], one per name.
fn unit_floats(names: &[&str]) -> SearchSpace {
    space(
        names
            .iter()
            .map(|&n| {
                (
                    n,
                    Distribution::Float {
                        low: 0.0,
                        high: 1.0,
                        log: false,
                        step: None,
                    },
                )
            })
            .collect(),
    )
}

/// Twelve finished trials of a bowl around 0.3, evenly over [0, 1].
fn bowl() -> Vec<TrialRecord> {
    (0..12)
        .map(|i| {
            let x = i as f64 / 11.0;
            at_x(x, Some(bowl_at(x)))
        })
        .collect()
}

fn bowl_at(x: f64) -> f64 {
    (x - 0.3).powi(2)
}

#[test]
fn a_pending_trial_is_believed_at_the_regressor_s_prediction() {
    let f = bowl_at;
    let mut h = bowl();
    assert!(crate::sampler::gp::believed(&unit_floats(&["x"]), &h).is_none());
    h.push(at_x(0.5, None));
    h.push(at_x(0.97, None));
    let believed = crate::sampler::gp::believed(&unit_floats(&["x"]), &h).unwrap();
    assert_eq!(believed[..12], h[..12], "finished trials keep their values");
    for (t, x) in believed[12..].iter().zip([0.5, 0.97]) {
        let v = t.value.unwrap();
        assert!(
            (v - f(x)).abs() < 0.03,
            "x = {x}: believed {v}, truly {}",
            f(x)
        );
    }
}

#[test]
fn believed_pending_trials_near_the_best_draw_proposals_to_them() {
    // Twenty trials of a bowl around 0.3, and three pending ones right at
    // it. Believed, they look as good as they will turn out and draw the
    // next proposal near them; as a constant liar's bad observations, they
    // push it away.
    let f = |x: f64| (x - 0.3).powi(2);
    let distance = |believer: bool| {
        let mut d: Vec<f64> = (0..21)
            .map(|seed| {
                let mut h: Vec<TrialRecord> = (0..20)
                    .map(|i| {
                        let x = ((i * 7 + seed) % 20) as f64 / 19.0;
                        at_x(x, Some(f(x)))
                    })
                    .collect();
                h.extend([0.29, 0.3, 0.31].map(|x| at_x(x, None)));
                let mut s = TpeSampler::new(seed as u64, Direction::Minimize);
                s.pending = if believer {
                    Pending::Believe
                } else {
                    Pending::Lie
                };
                (s.propose(&unit_floats(&["x"]), &h).unwrap()["x"].internal() - 0.3).abs()
            })
            .collect();
        d.sort_by(f64::total_cmp);
        d[10]
    };
    let (believed, lied) = (distance(true), distance(false));
    assert!(
        believed < 0.5 * lied,
        "median distance from the pending trials: believed {believed}, liar {lied}"
    );
}

#[test]
fn on_a_discrete_space_auto_lies_about_one_pending_trial_and_believes_more() {
    // The set-up where believing draws proposals to the pending trials
    // (above), on a grid of 101 integers.
    let sp = space(vec![(
        "x",
        Distribution::Int {
            low: 0,
            high: 100,
            log: false,
            step: 1,
        },
    )]);
    let int = |x: i64, value: Option<f64>| TrialRecord {
        params: [("x".to_string(), ParamValue::Int(x))].into(),
        value,
        values: Vec::new(),
        violation: 0.0,
        stopped: None,
    };
    let finished: Vec<TrialRecord> = (0..20)
        .map(|i| int(i * 5, Some(((i * 5 - 30) * (i * 5 - 30)) as f64)))
        .collect();
    let with_pending = |xs: &[i64]| -> Vec<TrialRecord> {
        let mut h = finished.clone();
        h.extend(xs.iter().map(|&x| int(x, None)));
        h
    };
    let as_with = |h: &[TrialRecord], pending: Pending, seed: u64| {
        let mut s = TpeSampler::new(seed, Direction::Minimize);
        s.pending = pending;
        s.propose(&sp, h)
    };
    let near = [29, 31, 32, 28];
    // Fewer pending than BELIEVE_ON_GRIDS_FROM (one): `auto` is the liar.
    let one = with_pending(&near[..BELIEVE_ON_GRIDS_FROM - 1]);
    for seed in 0..8 {
        assert_eq!(
            as_with(&one, Pending::Auto, seed),
            as_with(&one, Pending::Lie, seed),
            "seed {seed}"
        );
    }
    // From BELIEVE_ON_GRIDS_FROM pending on, `auto` is the believer, and
    // the two treatments propose differently.
    for n in [BELIEVE_ON_GRIDS_FROM, BELIEVE_ON_GRIDS_FROM + 1] {
        let h = with_pending(&near[..n]);
        let mut differ = 0;
        for seed in 0..8 {
            let auto = as_with(&h, Pending::Auto, seed);
            assert_eq!(auto, as_with(&h, Pending::Believe, seed), "seed {seed}");
            differ += usize::from(auto != as_with(&h, Pending::Lie, seed));
        }
        assert!(differ >= 4, "believing changed {differ} of 8 proposals");
    }
}

#[test]
fn with_many_trials_the_believer_rests_on_the_nearest() {
    // 400 finished trials, more than the regressor takes: it is fitted
    // on those nearest the pending ones and still predicts them well.
    let sp = unit_floats(&["a", "b"]);
    // A bowl with ripples: only trials near a point tell its value.
    let f = |a: f64, b: f64| {
        (a - 0.3).powi(2) + (b - 0.6).powi(2) + 0.1 * (12.0 * a).sin() * (12.0 * b).sin()
    };
    let trial = |a: f64, b: f64, value: Option<f64>| TrialRecord {
        params: [
            ("a".to_string(), ParamValue::Float(a)),
            ("b".to_string(), ParamValue::Float(b)),
        ]
        .into(),
        value,
        values: Vec::new(),
        violation: 0.0,
        stopped: None,
    };
    let mut h: Vec<TrialRecord> = (0..400)
        .map(|i| {
            let (a, b) = ((i % 20) as f64 / 19.0, (i / 20) as f64 / 19.0);
            trial(a, b, Some(f(a, b)))
        })
        .collect();
    assert!(h.len() > crate::sampler::gp::BELIEVER_POINTS);
    let pending = [(0.31, 0.58), (0.8, 0.1)];
    h.extend(pending.map(|(a, b)| trial(a, b, None)));
    let believed = crate::sampler::gp::believed(&sp, &h).unwrap();
    for (t, (a, b)) in believed[400..].iter().zip(pending) {
        let v = t.value.unwrap();
        assert!(
            (v - f(a, b)).abs() < 0.02,
            "({a}, {b}): {v} against {}",
            f(a, b)
        );
    }
}

/// A trial of one float `x` pruned after reporting `value` at `step`.
fn pruned_at(x: f64, step: i64, value: f64) -> TrialRecord {
    TrialRecord {
        stopped: Some(Stopped::Pruned { step, value }),
        ..at_x(x, None)
    }
}

#[test]
fn pruned_trials_rank_after_the_finished_ones_the_furthest_first() {
    let mut h = vec![
        at_x(0.0, Some(5.0)),
        at_x(0.1, Some(1.0)),
        pruned_at(0.2, 3, 9.0),
        pruned_at(0.3, 9, 7.0),
        pruned_at(0.4, 9, 2.0),
        pruned_at(0.5, 1, 0.5),
        pruned_at(0.6, -1, f64::NAN),
        pruned_at(0.7, 9, f64::NAN),
    ];
    // Fillers, so that the good group (gamma(51) = 6) reaches the pruned.
    h.extend((0..43).map(|i| pruned_at(0.8 + i as f64 * 1e-3, 0, 100.0)));
    let s = TpeSampler::new(0, Direction::Minimize);
    let (good, bad) = s.rank(&h, (0..h.len()).collect());
    // Finished by value, then pruned at step 9 by value (NaN last), then
    // at step 3; step 1, the fillers and the one that reported nothing
    // are bad.
    assert_eq!(good, vec![1, 0, 4, 3, 7, 2]);
    assert!(bad.contains(&5) && bad.contains(&6) && bad.len() == 45);
    // Maximising, the higher value at the same step ranks first.
    let s = TpeSampler::new(0, Direction::Maximize);
    let (good, _) = s.rank(&h, (0..h.len()).collect());
    assert_eq!(good, vec![0, 1, 3, 4, 7, 2]);
}

#[test]
fn pruned_and_failed_trials_are_not_pending() {
    let mut h = bowl();
    h.push(pruned_at(0.3, 1, 4.0));
    h.push(TrialRecord {
        stopped: Some(Stopped::Failed),
        ..at_x(0.31, None)
    });
    // Nothing is pending, so nothing is believed.
    assert!(crate::sampler::gp::believed(&unit_floats(&["x"]), &h).is_none());
    assert!(!h[12].is_pending() && !h[13].is_pending());
    // The pruned trial is a result, at the bottom; the failed one counts
    // as a bad observation, as a pending one does under the liar.
    let s = TpeSampler::new(0, Direction::Minimize);
    let split = s.split(&["x"], &h, &mut Proposal::default());
    assert_eq!(split.good.len(), gamma(13));
    assert_eq!(split.bad.len(), 14 - gamma(13));
    // Pruned trials count toward the random start, failed ones do not.
    let learned = h.iter().filter(|t| s.learned(t)).count();
    assert_eq!(learned, 13);
}
