//! Trials that others put in the study: `salus-tune enqueue` and Optuna's
//! own `study.enqueue_trial`. They run first, with their values; the
//! parameters they leave out are sampled; values outside the space FAIL
//! the trial with the reason, and the study goes on.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use salus_tune::storage::{TrialRow, TrialState};

fn param(t: &TrialRow, name: &str) -> Option<f64> {
    t.params.iter().find(|p| p.name == name).map(|p| p.internal)
}

#[test]
fn the_cli_enqueues_trials_that_run_first_with_their_values() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("enq", 3));
    let enqueue = |args: &[&str]| {
        let mut all = vec!["enqueue", "s.toml"];
        all.extend_from_slice(args);
        run_in(dir.path(), &all)
    };
    let out = enqueue(&[
        "--param",
        "lr=0.01",
        "--param",
        "optimizer=sgd",
        "--param",
        "width=32",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("enqueued trial 0 of study 'enq'"),
        "{}",
        text(&out)
    );
    let out = enqueue(&["--param", "lr=0.05"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Mistakes are refused before anything is stored.
    for (args, words) in [
        (
            &["--param", "lr=5"][..],
            "'lr' = 5.0 is not in the study's float",
        ),
        (
            &["--param", "depth=2"][..],
            "'depth' is not a searched parameter",
        ),
        (
            &["--param", "optimizer=rmsprop"][..],
            "'rmsprop' is not a value of",
        ),
        (&["--param", "lr"][..], "expected NAME=VALUE"),
        (
            &["--param", "optimizer=adam", "--param", "sgd.momentum=0.9"][..],
            "'sgd.momentum' does not apply",
        ),
    ] {
        let out = enqueue(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(words), "{args:?}: {}", text(&out));
    }
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&dir.path().join("enq.db"), None);
    assert_eq!(rows.len(), 3, "the enqueued trials are part of the target");
    assert!(rows.iter().all(|t| t.state == TrialState::Complete));
    assert_eq!(param(&rows[0], "lr"), Some(0.01));
    assert_eq!(
        param(&rows[0], "optimizer"),
        Some(0.0),
        "sgd, the first choice"
    );
    assert_eq!(param(&rows[0], "width"), Some(1.0), "32, the second choice");
    assert!(
        param(&rows[0], "sgd.momentum").is_some(),
        "sampled: sgd applies"
    );
    assert_eq!(param(&rows[1], "lr"), Some(0.05));
    assert!(param(&rows[1], "optimizer").is_some() && param(&rows[1], "width").is_some());
}

fn optuna_python() -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let ok = Command::new(&venv)
        .args(["-c", "import optuna"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var("SALUS_TUNE_REQUIRE_OPTUNA").is_ok_and(|v| v == "1") {
        panic!(
            "no Optuna in {} (scripts/test.sh installs it)",
            venv.display()
        );
    }
    ok.then_some(venv)
}

fn optuna(python: &Path, dir: &Path, script: &str) {
    let out = output_of(Command::new(python).current_dir(dir).args(["-c", script]));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn trials_enqueued_by_optuna_run_with_their_parameters_or_fail_with_the_reason() {
    let Some(python) = optuna_python() else {
        eprintln!("skipped: no Python with Optuna (run scripts/test.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("opt", 1));
    assert_eq!(run_in(dir.path(), &["s.toml"]).status.code(), Some(0));
    optuna(
        &python,
        dir.path(),
        "import optuna\n\
         s = optuna.load_study(study_name='opt', storage='sqlite:///opt.db')\n\
         s.enqueue_trial({'lr': 0.02, 'optimizer': 'adam'})\n\
         s.enqueue_trial({'lr': 5.0})\n",
    );
    let out = run_in(dir.path(), &["s.toml", "--trials", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&dir.path().join("opt.db"), None);
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[1].state, TrialState::Complete, "{:?}", rows[1]);
    assert_eq!(param(&rows[1], "lr"), Some(0.02));
    assert_eq!(
        param(&rows[1], "optimizer"),
        Some(1.0),
        "adam, the second choice"
    );
    assert!(param(&rows[1], "width").is_some(), "the rest is sampled");
    assert_eq!(rows[2].state, TrialState::Fail);
    assert!(
        rows[2]
            .fail_reason
            .as_deref()
            .is_some_and(|r| r
                .contains("enqueued parameters refused: 'lr' = 5.0 is not in the study's float")),
        "{:?}",
        rows[2]
    );
    assert_eq!(rows[3].state, TrialState::Complete, "the study went on");
    // Optuna reads the enqueued trial back with the values it asked for.
    optuna(
        &python,
        dir.path(),
        "import optuna\n\
         s = optuna.load_study(study_name='opt', storage='sqlite:///opt.db')\n\
         t = s.trials[1]\n\
         assert t.params['lr'] == 0.02 and t.params['optimizer'] == 'adam', t.params\n\
         assert s.trials[2].state == optuna.trial.TrialState.FAIL\n",
    );
}
