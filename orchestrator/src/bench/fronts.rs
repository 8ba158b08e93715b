//! The part of `salus-tune bench samplers` with several objectives: each
//! sampler searches ZDT1, ZDT2 (two objectives, 5 variables), DTLZ2
//! (three objectives, 7 variables), Binh and Korn's problem (two
//! objectives, two constraints) and the built-in MLP on the digits
//! (validation error against parameter count, from the tabulated
//! benchmark) for 300 trials under each seed; a row
//! gives the median hypervolume of the trials after 100 and after 300
//! (higher is better), against fixed reference points, and the time per
//! proposal once 290 trials are in the history. Ours are NSGA-II,
//! NSGA-III and multi-objective TPE; Optuna 5.0's `NSGAIISampler`,
//! `NSGAIIISampler` and `TPESampler` run the same functions through
//! `scripts/anchors/optuna_fronts.py`, which returns every trial's values,
//! so that both sides' hypervolumes are computed here, by one function
//! ([`crate::pareto::hypervolume`]). Where ours and Optuna's same
//! sampler both ran, the table ends with how sure each comparison of
//! their median hypervolumes is (`samplers::PairedVerdict`).

use std::time::Instant;

use serde_json::json;

use super::samplers::{Plan, SeedValues, against_optuna, float, median, verdicts_json};
use crate::error::Result;
use crate::pareto;
use crate::sampler::{Nsga2Sampler, RandomSampler, Sampler, TpeSampler, TrialRecord};
use crate::space::{Params, SearchSpace};
use crate::study::Direction;

/// A problem's values at a point (each minimised).
pub type Objectives = Box<dyn Fn(&Params) -> Vec<f64> + Send + Sync>;

/// A test problem of several objectives, all minimised.
pub struct FrontProblem {
    pub name: &'static str,
    pub space: SearchSpace,
    pub f: Objectives,
    /// The hypervolume's reference point: no worse than any point of the
    /// space in every objective, so every trial counts.
    pub reference: Vec<f64>,
    /// Constraint values (at most 0 holds), for a constrained problem:
    /// only the trials that hold them all count toward the hypervolume.
    pub constraints: Option<fn(&Params) -> Vec<f64>>,
}

/// Our samplers of several objectives, then Optuna's.
pub const SAMPLERS: [&str; 7] = [
    "random",
    "nsga2",
    "nsga3",
    "tpe",
    "optuna-nsga2",
    "optuna-nsga3",
    "optuna-tpe",
];

/// Trials per run, and where the first hypervolume is read.
const TRIALS: usize = 300;
const EARLY: usize = 100;

fn unit_space(n: usize) -> SearchSpace {
    SearchSpace::new(
        (0..n)
            .map(|i| float(&format!("x{i}"), 0.0, 1.0, false, None))
            .collect(),
    )
    .expect("a valid space")
}

fn xs(p: &Params) -> Vec<f64> {
    // `x0`, `x1`, ... in order (the names sort as numbers below 10).
    p.values().map(|v| v.internal()).collect()
}

fn zdt(p: &Params, f2: fn(f64, f64) -> f64) -> Vec<f64> {
    let x = xs(p);
    let g = 1.0 + 9.0 * x[1..].iter().sum::<f64>() / (x.len() - 1) as f64;
    vec![x[0], g * f2(x[0], g)]
}

fn zdt1(p: &Params) -> Vec<f64> {
    zdt(p, |f1, g| 1.0 - (f1 / g).sqrt())
}

fn zdt2(p: &Params) -> Vec<f64> {
    zdt(p, |f1, g| 1.0 - (f1 / g).powi(2))
}

/// DTLZ2 with three objectives: its front is the positive octant of the
/// unit sphere.
fn dtlz2(p: &Params) -> Vec<f64> {
    use std::f64::consts::FRAC_PI_2;
    let x = xs(p);
    let g: f64 = x[2..].iter().map(|v| (v - 0.5).powi(2)).sum();
    let (a, b) = (x[0] * FRAC_PI_2, x[1] * FRAC_PI_2);
    vec![
        (1.0 + g) * a.cos() * b.cos(),
        (1.0 + g) * a.cos() * b.sin(),
        (1.0 + g) * a.sin(),
    ]
}

/// Binh and Korn's problem, with its two constraints.
fn bnh(p: &Params) -> Vec<f64> {
    let x = xs(p);
    vec![
        4.0 * x[0] * x[0] + 4.0 * x[1] * x[1],
        (x[0] - 5.0).powi(2) + (x[1] - 5.0).powi(2),
    ]
}

fn bnh_constraints(p: &Params) -> Vec<f64> {
    let x = xs(p);
    vec![
        (x[0] - 5.0).powi(2) + x[1] * x[1] - 25.0,
        7.7 - ((x[0] - 8.0).powi(2) + (x[1] + 3.0).powi(2)),
    ]
}

fn bnh_space() -> SearchSpace {
    SearchSpace::new(vec![
        float("x0", 0.0, 5.0, false, None),
        float("x1", 0.0, 3.0, false, None),
    ])
    .expect("a valid space")
}

pub fn front_problems() -> Vec<FrontProblem> {
    vec![
        FrontProblem {
            name: "zdt1",
            space: unit_space(5),
            f: Box::new(zdt1),
            reference: vec![1.1, 11.0],
            constraints: None,
        },
        FrontProblem {
            name: "zdt2",
            space: unit_space(5),
            f: Box::new(zdt2),
            reference: vec![1.1, 11.0],
            constraints: None,
        },
        FrontProblem {
            name: "dtlz2",
            space: unit_space(7),
            f: Box::new(dtlz2),
            reference: vec![2.5, 2.5, 2.5],
            constraints: None,
        },
        FrontProblem {
            name: "bnh",
            space: bnh_space(),
            f: Box::new(bnh),
            reference: vec![140.0, 55.0],
            constraints: Some(bnh_constraints),
        },
        mlp_digits(),
    ]
}

/// The built-in MLP on the digits, from the tabulated benchmark
/// (`super::tables`): validation error (1 - accuracy) against the
/// parameter count. A diverged configuration has an error of 1.
fn mlp_digits() -> FrontProblem {
    let table = super::tables::table("tab-digits");
    let reference = vec![1.0, 1.1 * table.most_params()];
    FrontProblem {
        name: "mlp-digits",
        space: table.space(),
        f: Box::new(move |p| {
            let e = table.at(p);
            let error = 1.0 - e.val_accuracy;
            vec![if error.is_finite() { error } else { 1.0 }, e.params]
        }),
        reference,
        constraints: None,
    }
}

/// One row: problem, sampler, median hypervolume after 100 and after 300
/// trials, the median time per proposal at 290-299 trials, and each seed's
/// hypervolumes (in seed order).
#[derive(Debug, Clone)]
pub struct FrontRow {
    pub problem: &'static str,
    pub sampler: String,
    pub hv_100: f64,
    pub hv_300: f64,
    pub ms_per_proposal: f64,
    pub per_seed_100: Vec<f64>,
    pub per_seed_300: Vec<f64>,
}

/// Hypervolumes after 100 and 300 trials of one run: its trials' values
/// in order, and whether each holds the problem's constraints (only those
/// that do count).
fn hypervolumes(trials: &[(Vec<f64>, bool)], reference: &[f64]) -> (f64, f64) {
    let feasible = |ts: &[(Vec<f64>, bool)]| -> Vec<Vec<f64>> {
        ts.iter().filter(|t| t.1).map(|t| t.0.clone()).collect()
    };
    (
        pareto::hypervolume(&feasible(&trials[..EARLY.min(trials.len())]), reference),
        pareto::hypervolume(&feasible(trials), reference),
    )
}

/// One run's trials (values, feasible) and the time per proposal at the end.
fn run_one(s: &mut dyn Sampler, p: &FrontProblem) -> (Vec<(Vec<f64>, bool)>, f64) {
    let mut h: Vec<TrialRecord> = Vec::with_capacity(TRIALS);
    let mut late = std::time::Duration::ZERO;
    for i in 0..TRIALS {
        let t0 = Instant::now();
        let params = s
            .propose(&p.space, &h)
            .expect("these samplers always propose");
        if i + 10 >= TRIALS {
            late += t0.elapsed();
        }
        let values = (p.f)(&params);
        let violation = p
            .constraints
            .map_or(0.0, |c| c(&params).iter().map(|v| v.max(0.0)).sum());
        h.push(TrialRecord {
            params,
            value: Some(values[0]),
            values,
            violation,
            stopped: None,
        });
    }
    let trials = h
        .into_iter()
        .map(|t| (t.values, t.violation == 0.0))
        .collect();
    (trials, late.as_secs_f64() * 1e3 / 10.0)
}

fn row(
    problem: &'static str,
    sampler: &str,
    runs: Vec<((f64, f64), f64)>,
    progress: &mut dyn FnMut(&str),
) -> FrontRow {
    let per_seed_100: Vec<f64> = runs.iter().map(|r| r.0.0).collect();
    let per_seed_300: Vec<f64> = runs.iter().map(|r| r.0.1).collect();
    let row = FrontRow {
        problem,
        sampler: sampler.into(),
        hv_100: median(per_seed_100.clone()),
        hv_300: median(per_seed_300.clone()),
        ms_per_proposal: median(runs.iter().map(|r| r.1).collect()),
        per_seed_100,
        per_seed_300,
    };
    progress(&format!(
        "{:<18} {:<13} median hypervolume {:.4} at 100, {:.4} at 300; {:.2} ms per proposal",
        problem, sampler, row.hv_100, row.hv_300, row.ms_per_proposal
    ));
    row
}

pub fn run(plan: &Plan, progress: &mut dyn FnMut(&str)) -> Result<(Vec<FrontRow>, Vec<String>)> {
    let problems: Vec<FrontProblem> = front_problems()
        .into_iter()
        .filter(|p| plan.runs_problem(p.name))
        .collect();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let seeds = plan.first_seed..plan.first_seed + plan.seeds;
    for p in &problems {
        for name in ["random", "nsga2", "nsga3", "tpe"] {
            if !plan.runs_sampler(name) {
                continue;
            }
            let directions = vec![Direction::Minimize; p.reference.len()];
            let runs = seeds
                .clone()
                .map(|seed| {
                    let mut s: Box<dyn Sampler> = match name {
                        "random" => Box::new(RandomSampler::new(seed)),
                        "tpe" => Box::new(TpeSampler::multi(seed, directions.clone())),
                        "nsga3" => Box::new(Nsga2Sampler::nsga3(
                            seed,
                            directions.clone(),
                            crate::sampler::NSGA2_POPULATION,
                        )),
                        _ => Box::new(Nsga2Sampler::new(seed, directions.clone())),
                    };
                    let (values, ms) = run_one(s.as_mut(), p);
                    (hypervolumes(&values, &p.reference), ms)
                })
                .collect();
            rows.push(row(p.name, name, runs, progress));
        }
    }
    let optuna: Vec<&str> = ["nsga2", "nsga3", "tpe"]
        .into_iter()
        .filter(|s| plan.runs_sampler(&format!("optuna-{s}")))
        .collect();
    if !problems.is_empty() && !optuna.is_empty() {
        match super::samplers::optuna_python() {
            None => notes.push(format!("{}: skipped, no Python with optuna (set SALUS_TUNE_PYTHON or run scripts/test.sh to make .venv)", optuna.iter().map(|s| format!("optuna-{s}")).collect::<Vec<_>>().join(", "))),
            Some(py) => {
                let names: Vec<&str> = problems.iter().map(|p| p.name).collect();
                super::tables::carry()?;
                progress(&format!(
                    "running Optuna's {} through scripts/anchors/optuna_fronts.py ...",
                    optuna.join(" and ")
                ));
                let v = super::run_anchor_script(
                    &py,
                    "optuna_fronts.py",
                    include_str!("../../../scripts/anchors/optuna_fronts.py"),
                    &[
                        plan.seeds.to_string(),
                        names.join(","),
                        plan.first_seed.to_string(),
                        TRIALS.to_string(),
                        optuna.join(","),
                    ],
                )?;
                for r in v.as_array().into_iter().flatten() {
                    let Some(p) = problems.iter().find(|p| Some(p.name) == r["problem"].as_str()) else {
                        continue;
                    };
                    let runs = r["runs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|run| (hypervolumes(&optuna_trials(run), &p.reference), run["ms_per_trial"].as_f64().unwrap_or(f64::NAN)))
                        .collect();
                    let sampler = format!("optuna-{}", r["sampler"].as_str().unwrap_or("?"));
                    rows.push(row(p.name, &sampler, runs, progress));
                }
            }
        }
    }
    rows.sort_by_key(|r| front_problems().iter().position(|p| p.name == r.problem));
    Ok((rows, notes))
}

/// One run of Optuna's, as the anchor script prints it: each trial's
/// values and whether it holds the constraints.
fn optuna_trials(run: &serde_json::Value) -> Vec<(Vec<f64>, bool)> {
    let feasible = run["feasible"].as_array();
    run["values"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| {
            let values = t
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| x.as_f64().unwrap_or(f64::NAN))
                .collect();
            let ok = feasible
                .and_then(|f| f.get(i))
                .and_then(|b| b.as_bool())
                .unwrap_or(true);
            (values, ok)
        })
        .collect()
}

/// Each row's hypervolumes per seed, as [`against_optuna`] reads them.
fn seed_values(rows: &[FrontRow]) -> Vec<SeedValues<'_>> {
    rows.iter()
        .map(|r| {
            (
                r.problem,
                r.sampler.as_str(),
                [&r.per_seed_100[..], &r.per_seed_300[..]],
            )
        })
        .collect()
}

/// The rows as `--json` prints them; each of ours beside Optuna's same
/// sampler carries its verdicts on hypervolume (`against_optuna`).
pub fn json(rows: &[FrontRow]) -> serde_json::Value {
    let against = verdicts_json(
        &seed_values(rows),
        Direction::Maximize,
        ["at_100", "at_300"],
    );
    serde_json::Value::Array(
        rows.iter()
            .zip(against)
            .map(|(r, against)| {
                json!({
                    "problem": r.problem,
                    "sampler": r.sampler,
                    "median_hypervolume_100": r.hv_100,
                    "median_hypervolume_300": r.hv_300,
                    "ms_per_proposal_at_300": r.ms_per_proposal,
                    "hypervolume_100_per_seed": r.per_seed_100,
                    "hypervolume_300_per_seed": r.per_seed_300,
                    "against_optuna": against,
                })
            })
            .collect(),
    )
}

pub fn table(rows: &[FrontRow], seeds: u64) -> String {
    let mut out = format!(
        "\nseveral objectives: median hypervolume over {seeds} seeds (higher is better; reference \
         points: zdt1, zdt2 (1.1, 11), dtlz2 (2.5, 2.5, 2.5), bnh (140, 55), its feasible trials only, \
         mlp-digits (1, 1.1 x the most parameters));\n\
         ms: median time per proposal with 290-299 trials in the history (Optuna's: per trial)\n\n\
         problem            sampler        @100           @300           ms\n"
    );
    for r in rows {
        out += &format!(
            "{:<18} {:<14} {:<14.6} {:<14.6} {:.2}\n",
            r.problem, r.sampler, r.hv_100, r.hv_300, r.ms_per_proposal
        );
    }
    out + &against_optuna(&seed_values(rows), ["@100", "@300"], Direction::Maximize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{Distribution, ParamValue};

    #[test]
    fn the_table_says_how_sure_each_hypervolume_comparison_with_optuna_is() {
        let row = |sampler: &str, hv: Vec<f64>| FrontRow {
            problem: "zdt1",
            sampler: sampler.into(),
            hv_100: median(hv.clone()),
            hv_300: median(hv.clone()),
            ms_per_proposal: 1.0,
            per_seed_100: hv.clone(),
            per_seed_300: hv,
        };
        // Ours is higher (better) on every seed.
        let rows = vec![
            row("nsga2", vec![0.7, 0.8, 0.9]),
            row("optuna-nsga2", vec![0.6, 0.7, 0.8]),
            row("tpe", vec![0.5, 0.6, 0.7]),
        ];
        let t = table(&rows, 3);
        assert!(t.contains("seeds where ours is higher / lower"), "{t}");
        assert!(t.contains("our median is at least Optuna's"), "{t}");
        let line = t
            .lines()
            .rfind(|l| l.starts_with("zdt1") && l.contains("nsga2"))
            .expect("a verdict line");
        assert!(line.contains("3 / 0 (100%)"), "{line}");
        // No Optuna TPE, so no verdict for ours.
        assert!(
            !t.lines()
                .any(|l| l.starts_with("zdt1               tpe") && l.contains('%'))
        );
        assert!(!table(&rows[2..], 3).contains("ours against Optuna's"));
        // `--json` carries the same verdicts on our row, none elsewhere.
        let j = json(&rows);
        assert_eq!(
            j[0]["against_optuna"]["at_300"],
            serde_json::json!({ "better": 3, "worse": 0, "met_share": 1.0 })
        );
        assert_eq!(j[1]["against_optuna"], serde_json::Value::Null);
        assert_eq!(j[2]["against_optuna"], serde_json::Value::Null);
    }

    #[test]
    fn the_fronts_are_where_the_problems_say() {
        let at = |xs: &[f64]| -> Params {
            xs.iter()
                .enumerate()
                .map(|(i, &v)| (format!("x{i}"), ParamValue::Float(v)))
                .collect()
        };
        // On the front (the other variables at 0): f2 = 1 - sqrt(f1), 1 - f1^2.
        assert_eq!(zdt1(&at(&[0.25, 0.0, 0.0, 0.0, 0.0])), vec![0.25, 0.5]);
        assert_eq!(zdt2(&at(&[0.5, 0.0, 0.0, 0.0, 0.0])), vec![0.5, 0.75]);
        // DTLZ2's front is the unit sphere (the others at 0.5).
        let f = dtlz2(&at(&[0.3, 0.7, 0.5, 0.5, 0.5, 0.5, 0.5]));
        assert!((f.iter().map(|v| v * v).sum::<f64>() - 1.0).abs() < 1e-12);
        // BNH: the origin holds both constraints, (5, 3) breaks the first.
        assert!(bnh_constraints(&at(&[0.0, 0.0])).iter().all(|&c| c <= 0.0));
        assert!(bnh_constraints(&at(&[5.0, 3.0]))[0] <= 0.0);
        assert!(bnh_constraints(&at(&[0.0, 3.0]))[0] > 0.0);
        assert_eq!(bnh(&at(&[0.0, 0.0])), vec![0.0, 50.0]);
        // Every point of the space is inside its reference.
        for p in front_problems()
            .into_iter()
            .filter(|p| p.name != "mlp-digits")
        {
            let corner = at(&p
                .space
                .params()
                .iter()
                .map(|q| match q.dist {
                    Distribution::Float { high, .. } => high,
                    _ => 1.0,
                })
                .collect::<Vec<_>>());
            assert!(
                (p.f)(&corner).iter().zip(&p.reference).all(|(v, r)| v < r),
                "{}",
                p.name
            );
        }
    }
}
