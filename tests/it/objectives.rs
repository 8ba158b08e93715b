//! Studies of several objectives: the study file's lists, the built-in
//! objectives, NSGA-II, the Pareto front `best` prints, and Optuna and
//! optuna-dashboard reading the same front, on SQLite and PostgreSQL.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// The digits MLP of several widths, for accuracy against size, searched
/// by NSGA-II (generations of 6) or, with `tpe`, multi-objective TPE
/// (after 5 random trials).
fn two_objectives(name: &str, trials: u64, tpe: bool) -> String {
    let study = StudyFile::new(name, trials, 5)
        .set("study", "metric", "[\"val_accuracy\", \"params\"]")
        .set("model", "depth", "1")
        .set("model", "width", "{ int = [4, 64], log = true }")
        .set("train", "optimizer", "\"adam\"")
        .set("train", "lr", "{ float = [1e-3, 1e-1], log = true }")
        .set("train", "batch_size", "64")
        .set("train", "epochs", "2");
    if tpe {
        // One trial at a time: each proposal sees every trial before it,
        // so the proposals do not depend on which trial ends first.
        study
            .set("sampler", "kind", "\"tpe\"")
            .set("sampler", "startup_trials", "5")
            .set("scheduler", "max_concurrent", "1")
            .build()
    } else {
        study.set("sampler", "population", "6").build()
    }
}

/// Whether this Python has Optuna; says why not.
fn has_optuna(test: &str) -> bool {
    python_imports(test, "optuna, pandas", "SALUS_TUNE_REQUIRE_OPTUNA")
}

fn width_of(t: &serde_json::Value) -> i64 {
    t["params"]["width"].as_i64().unwrap()
}

/// Runs the study of `trials` trials in `dir` on `storage`, checks what
/// was stored and what `best` prints, and has Optuna read it from
/// `optuna_db`. `constraint`: a bound on `params`, which keeps the trials
/// above it off the front. `tpe`: searched by multi-objective TPE.
fn front_agrees(
    dir: &Path,
    storage: &[&str],
    optuna_db: Option<String>,
    trials: u64,
    constraint: Option<f64>,
    tpe: bool,
) -> Vec<serde_json::Value> {
    let mut study = two_objectives("mo", trials, tpe);
    if let Some(c) = constraint {
        study = study.replace(
            "[study]\n",
            &format!("[study]\nconstraints = [\"params <= {c}\"]\n"),
        );
    }
    write(dir, "s.toml", &study);
    let out = run_in(dir, &[&["s.toml", "--no-progress"], storage].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("Pareto front: "), "{}", text(&out));
    let out = run_in(
        dir,
        &[&["best", "s.toml", "--format", "json"], storage].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::fs::write(dir.join("front.json"), &out.stdout).unwrap();
    let front: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let out = run_in(
        dir,
        &[&["trials", "s.toml", "--format", "json"], storage].concat(),
    );
    let all: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.len() as u64, trials);
    // `params` is the MLP's parameter count: 64 inputs, 10 classes.
    for t in &all {
        let w = width_of(t);
        assert_eq!(
            t["values"][1].as_f64().unwrap(),
            (64 * w + w + w * 10 + 10) as f64
        );
    }
    // The front: nothing in the study beats one of its trials in both.
    let values = |t: &serde_json::Value| {
        (
            t["values"][0].as_f64().unwrap(),
            t["values"][1].as_f64().unwrap(),
        )
    };
    let feasible = |t: &serde_json::Value| constraint.is_none_or(|c| values(t).1 <= c);
    assert!(!front.is_empty());
    for f in &front {
        assert!(feasible(f), "{f} breaks the constraint");
        let (acc, size) = values(f);
        for t in all.iter().filter(|t| feasible(t)) {
            let (a, s) = values(t);
            assert!(
                !(a >= acc && s <= size && (a > acc || s < size)),
                "{t} beats {f}"
            );
        }
    }
    // Every feasible trial off the front is beaten by one on it.
    let on: Vec<i64> = front
        .iter()
        .map(|t| t["number"].as_i64().unwrap())
        .collect();
    for t in all
        .iter()
        .filter(|t| feasible(t) && !on.contains(&t["number"].as_i64().unwrap()))
    {
        let (a, s) = values(t);
        assert!(
            front.iter().any(|f| {
                let (fa, fs) = values(f);
                fa >= a && fs <= s && (fa > a || fs < s)
            }),
            "nothing on the front beats {t}"
        );
    }
    if let Some(db) = optuna_db {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/optuna_objectives.py");
        let out = output_of(Command::new(python()).current_dir(dir).arg(script).args([
            db,
            "mo".into(),
            "front.json".into(),
            trials.to_string(),
        ]));
        assert!(out.status.success(), "{}", text(&out));
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    }
    all
}

#[test]
fn accuracy_against_size_gives_the_front_optuna_reads_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let optuna = has_optuna("accuracy_against_size_gives_the_front_optuna_reads_on_sqlite")
        .then(|| dir.path().join("mo.db").display().to_string());
    front_agrees(dir.path(), &[], optuna, 14, None, false);
}

#[test]
fn accuracy_against_size_gives_the_front_optuna_reads_on_postgres() {
    let Some(cluster) = postgres::Cluster::start("objectives") else {
        return;
    };
    let url = cluster.database("objectives");
    let dir = tempfile::tempdir().unwrap();
    let optuna = has_optuna("accuracy_against_size_gives_the_front_optuna_reads_on_postgres")
        .then(|| cluster.optuna_url("objectives"));
    front_agrees(dir.path(), &["--storage", &url], optuna, 8, None, false);
}

/// Optuna's constrained optimisation: each trial's `constraints:KEY`, the
/// front among feasible trials only, and Optuna's `best_trials` the same.
#[test]
fn a_constraint_keeps_the_trials_that_break_it_off_the_front() {
    let dir = tempfile::tempdir().unwrap();
    let optuna = has_optuna("a_constraint_keeps_the_trials_that_break_it_off_the_front")
        .then(|| dir.path().join("mo.db").display().to_string());
    let all = front_agrees(dir.path(), &[], optuna, 14, Some(1500.0), false);
    let broken = all
        .iter()
        .filter(|t| t["values"][1].as_f64().unwrap() > 1500.0)
        .count();
    assert!(broken > 0, "some trials break the constraint");
    // Stored as Optuna's `trial.set_constraint` stores one.
    let db = dir.path().join("mo.db");
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM trial_system_attributes WHERE key = 'constraints:params <= 1500' \
             AND CAST(value_json AS REAL) > 0"
        ),
        broken as i64
    );
}

/// Multi-objective TPE (the good group by front, infeasible trials last)
/// searches a constrained study of two objectives: seeded (the same
/// proposals again), not the random sampler's, the front is Optuna's,
/// and the constraint keeps the large nets off it.
#[test]
fn multi_objective_tpe_searches_a_constrained_front() {
    let dir = tempfile::tempdir().unwrap();
    let optuna = has_optuna("multi_objective_tpe_searches_a_constrained_front")
        .then(|| dir.path().join("mo.db").display().to_string());
    let all = front_agrees(dir.path(), &[], optuna, 12, Some(1500.0), true);
    assert!(
        all.iter()
            .any(|t| t["values"][1].as_f64().unwrap() > 1500.0)
    );
    // The same study again, in a new folder: TPE is seeded, so the same
    // proposals, and they are not a random search's.
    let again = tempfile::tempdir().unwrap();
    let rerun = front_agrees(again.path(), &[], None, 12, Some(1500.0), true);
    let params = |v: &[serde_json::Value]| -> Vec<String> {
        v.iter().map(|t| t["params"].to_string()).collect()
    };
    assert_eq!(params(&all), params(&rerun));
    let random = two_objectives("mo", 12, false)
        .replace("population = 6", "")
        .replace("[sampler]\n", "[sampler]\nkind = \"random\"\n");
    write(again.path(), "r.toml", &random);
    let out = run_in(
        again.path(),
        &["r.toml", "--no-progress", "--storage", "r.db"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run_in(
        again.path(),
        &["trials", "r.toml", "--storage", "r.db", "--format", "json"],
    );
    let random: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    // TPE's proposals are its own, not the random sampler's stream.
    assert_eq!(random.len(), 12);
    assert_ne!(params(&all)[5..], params(&random)[5..]);
}

/// NSGA-III on three objectives (accuracy, size and training time): the
/// run breeds past its first generation, stores three values a trial, and
/// `best` prints the three-way front.
#[test]
fn nsga3_searches_a_front_of_three_objectives() {
    let dir = tempfile::tempdir().unwrap();
    let study = two_objectives("three", 12, false)
        .replace(
            "metric = [\"val_accuracy\", \"params\"]",
            "metric = [\"val_accuracy\", \"params\", \"train_time\"]",
        )
        .replace("[sampler]\n", "[sampler]\nkind = \"nsga3\"\n")
        .replace("population = 6", "population = 4");
    assert!(
        study.contains("nsga3") && study.contains("train_time"),
        "{study}"
    );
    write(dir.path(), "s.toml", &study);
    let out = run_in(dir.path(), &["check", "s.toml"]);
    assert!(
        text(&out).contains("nsga3 (population 4)"),
        "{}",
        text(&out)
    );
    let out = run_in(dir.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json = |args: &[&str]| -> Vec<serde_json::Value> {
        let out = run_in(dir.path(), args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let all = json(&["trials", "s.toml", "--format", "json"]);
    let front = json(&["best", "s.toml", "--format", "json"]);
    assert_eq!(all.len(), 12);
    let values = |t: &serde_json::Value| -> Vec<f64> {
        let v: Vec<f64> = t["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(v.len(), 3, "{t}");
        // Accuracy is maximised: negated, all three are minimised.
        vec![-v[0], v[1], v[2]]
    };
    let beats = |a: &[f64], b: &[f64]| {
        a.iter().zip(b).all(|(x, y)| x <= y) && a.iter().zip(b).any(|(x, y)| x < y)
    };
    assert!(!front.is_empty());
    for f in &front {
        assert!(
            !all.iter().any(|t| beats(&values(t), &values(f))),
            "{f} is beaten"
        );
    }
    let on: Vec<&serde_json::Value> = front.iter().map(|t| &t["number"]).collect();
    for t in all.iter().filter(|t| !on.contains(&&t["number"])) {
        assert!(
            front.iter().any(|f| beats(&values(f), &values(t))),
            "{t} is not beaten"
        );
    }
}

#[test]
fn the_built_in_objectives_are_what_the_core_and_the_model_say() {
    let dir = tempfile::tempdir().unwrap();
    let study = StudyFile::new("costs", 3, 2)
        .set(
            "study",
            "metric",
            "[\"val_loss\", \"flops\", \"train_time\", \"memory\"]",
        )
        .set("model", "depth", "1")
        .set("model", "width", "{ choices = [8, 32] }")
        .set("train", "epochs", "1")
        .set("sampler", "kind", "\"random\"")
        .build();
    write(dir.path(), "c.toml", &study);
    let out = run_in(dir.path(), &["c.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("costs.db");
    let one = |sql: &str| scalar_text(&db, sql).unwrap().parse::<f64>().unwrap();
    for t in trials(&db, None) {
        // A choice is stored as its index.
        let w = [8, 32][t
            .params
            .iter()
            .find(|p| p.name == "width")
            .unwrap()
            .internal as usize];
        let v = |objective: i64| {
            one(&format!(
                "SELECT CAST(value AS TEXT) FROM trial_values WHERE trial_id = {} AND objective = {objective}",
                t.trial_id
            ))
        };
        // Forward FLOPs of one example: two per multiply-add.
        assert_eq!(v(1), (2 * (64 * w + w * 10)) as f64);
        let seconds = one(&format!(
            "SELECT CAST(device_seconds AS TEXT) FROM salus_trials WHERE trial_id = {}",
            t.trial_id
        ));
        assert_eq!(v(2), seconds, "train_time is the core's device seconds");
        assert!(seconds > 0.0);
        let held = one(&format!(
            "SELECT CAST(persistent_bytes + ephemeral_bytes AS TEXT) FROM salus_trials WHERE trial_id = {}",
            t.trial_id
        ));
        assert_eq!(v(3), held, "memory is what the ledger held");
    }
}

/// `latency`: each trial's final validation pass, timed on the device,
/// per batch; its trials run unfused.
#[test]
fn latency_is_each_trial_s_own_inference_time() {
    let dir = tempfile::tempdir().unwrap();
    let study = StudyFile::new("fast", 6, 2)
        .set("study", "metric", "[\"val_accuracy\", \"latency\"]")
        .set("model", "depth", "1")
        .set("model", "width", "{ choices = [8, 256] }")
        .set("train", "epochs", "1")
        .set("sampler", "kind", "\"random\"")
        .build();
    write(dir.path(), "l.toml", &study);
    let out = run_in(dir.path(), &["l.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("fast.db");
    let rows = trials(&db, None);
    assert!(
        rows.iter()
            .all(|t| t.state == salus_tune::storage::TrialState::Complete)
    );
    for t in &rows {
        let latency = t.more_values[0];
        // A validation batch of the digits MLP: well under a second.
        assert!(
            latency > 0.0 && latency < 1.0,
            "trial {}: {latency}",
            t.number
        );
    }
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM trial_system_attributes WHERE key = 'salus:fused_with'"
        ),
        0,
        "no trial was fused"
    );
}

#[test]
fn study_files_of_several_objectives_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let base = || {
        StudyFile::digits("bad", 2)
            .without("train.sgd", "momentum")
            .set("train", "optimizer", "\"adam\"")
    };
    for (edit, key, words) in [
        (
            base()
                .set("study", "metric", "[\"val_accuracy\", \"params\"]")
                .set("study", "direction", "\"maximize\""),
            "study.direction",
            "1 directions for 2 metrics",
        ),
        (
            base().set("study", "metric", "[\"params\", \"val_accuracy\"]"),
            "study.metric",
            "list a reported metric first",
        ),
        (
            base().set("study", "metric", "[\"val_accuracy\", \"val_accuracy\"]"),
            "study.metric",
            "named twice",
        ),
        (
            base().set("study", "metric", "[\"val_accuracy\", \"energy\"]"),
            "study.metric",
            "expected one of: val_accuracy, val_loss, train_loss, params, flops, train_time, memory, latency",
        ),
        (
            base()
                .set("study", "metric", "[\"val_accuracy\", \"latency\"]")
                .set("scheduler", "fuse", "4"),
            "scheduler.fuse",
            "trials run unfused: set fuse = 1",
        ),
        (
            base()
                .set("study", "metric", "[\"val_accuracy\", \"params\"]")
                .set("study", "direction", "[\"maximize\", \"maximize\"]"),
            "study.direction",
            "params is to minimize",
        ),
        (
            base()
                .set("study", "metric", "[\"val_accuracy\", \"params\"]")
                .set("pruner", "kind", "\"asha\""),
            "pruner.kind",
            "Optuna refuses to prune them too",
        ),
        (
            base()
                .set("study", "metric", "[\"val_accuracy\", \"params\"]")
                .set("sampler", "kind", "\"gp\""),
            "sampler.kind",
            "models one objective",
        ),
        (
            base().set("sampler", "kind", "\"nsga2\""),
            "sampler.kind",
            "this study has one",
        ),
        (
            base().set("sampler", "kind", "\"nsga3\""),
            "sampler.kind",
            "kind = \"nsga3\" searches for the trade-offs",
        ),
        (
            base().set("sampler", "population", "10"),
            "sampler.population",
            "applies only to kind = \"nsga2\" and \"nsga3\"",
        ),
    ] {
        write(dir.path(), "b.toml", &edit.build());
        let out = run_in(dir.path(), &["check", "b.toml"]);
        let msg = text(&out);
        assert_eq!(out.status.code(), Some(2), "{msg}");
        assert!(
            msg.contains("b.toml:") && msg.contains(key) && msg.contains(words),
            "{key}: {msg}"
        );
    }
}

/// A command worker's study of several objectives: its `done([a, b])`
/// gives each, in order; a worker that sends one value fails its trial
/// with the reason.
#[test]
fn a_worker_sends_one_value_per_objective() {
    if !python_imports(
        "a_worker_sends_one_value_per_objective",
        "json",
        "SALUS_TUNE_REQUIRE_OPTUNA",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python");
    let script = write(
        dir.path(),
        "two.py",
        "import salus_worker\n\
         t = salus_worker.connect()\n\
         x = t.params['x']\n\
         for i in t.iterations(2):\n\
         \x20   t.report(i + 1, x)\n\
         t.done([x, (1 - x) ** 2] if x < 0.9 else x)\n",
    );
    let study = StudyFile::new("w2", 8, 4)
        .set("study", "metric", "[\"f1\", \"f2\"]")
        .set("worker", "kind", "\"command\"")
        .set(
            "worker",
            "command",
            &format!("[\"{}\", \"{}\"]", python(), script.display()),
        )
        .set(
            "worker",
            "env",
            &format!("{{ PYTHONPATH = \"{}\" }}", client.display()),
        )
        .set("worker", "iterations", "2")
        .set("sampler", "population", "4")
        .with_text("[params]\nx = { float = [0.0, 1.0] }\n")
        .build();
    write(dir.path(), "w.toml", &study);
    let out = run_in(dir.path(), &["w.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("w2.db");
    for t in trials(&db, None) {
        let x = t.params[0].internal;
        if x < 0.9 {
            assert_eq!(t.value, Some(x));
            assert_eq!(t.more_values, vec![(1.0 - x).powi(2)], "trial {}", t.number);
        } else {
            assert_eq!(t.state, salus_tune::storage::TrialState::Fail);
            let why = t.fail_reason.unwrap_or_default();
            assert!(
                why.contains("sent 1 values for the study's 2 objectives (f1, f2)"),
                "{why}"
            );
        }
    }
}
