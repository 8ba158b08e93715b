//! Optuna itself reads what salus-tune writes.
//!
//! Needs a Python with Optuna 5.0 and pandas: `SALUS_TUNE_PYTHON`, else
//! `.venv/bin/python` (which `scripts/test.sh` creates). Without one the
//! test says so and passes, unless `SALUS_TUNE_REQUIRE_OPTUNA=1` (as CI
//! sets), where it fails.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("SALUS_TUNE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let ok = Command::new(&candidate)
        .args(["-c", "import optuna, pandas"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(candidate)
}

/// The Python to check with, or `None` after saying why the test skips.
fn python_or_skip() -> Option<PathBuf> {
    let python = python();
    if python.is_none() {
        let msg = "no Python with optuna and pandas (set SALUS_TUNE_PYTHON or run scripts/test.sh)";
        if std::env::var("SALUS_TUNE_REQUIRE_OPTUNA").is_ok_and(|v| v == "1") {
            panic!("{msg}");
        }
        eprintln!("skipped: {msg}");
    }
    python
}

/// Runs the study in `dir` (on `storage` when given), saves what `trials`
/// and `best` print, and has Optuna check the database at `optuna_db`.
fn optuna_agrees(dir: &std::path::Path, storage: &[&str], optuna_db: &str, python: PathBuf) {
    let out = run_in(dir, &[&["s.toml"], storage].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for (cmd, file) in [("trials", "trials.json"), ("best", "best.json")] {
        let out = run_in(
            dir,
            &[&[cmd, "s.toml", "--format", "json"], storage].concat(),
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        std::fs::write(dir.join(file), &out.stdout).unwrap();
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/optuna_interop.py");
    let out = output_of(Command::new(python).current_dir(dir).arg(script).args([
        optuna_db,
        "interop",
        "trials.json",
        "best.json",
        "5",
    ]));
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn optuna_loads_the_study_salus_tune_wrote() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "s.toml",
        &small_study("interop", 5)
            .replace("[study]", "[study]\nstorage = \"sqlite:///interop.db\""),
    );
    optuna_agrees(dir.path(), &[], "interop.db", python);
}

#[test]
fn optuna_loads_the_study_salus_tune_wrote_on_postgres() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let Some(cluster) = postgres::Cluster::start("optuna_interop") else {
        return;
    };
    let url = cluster.database("interop");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("interop", 5));
    optuna_agrees(
        dir.path(),
        &["--storage", &url],
        &cluster.optuna_url("interop"),
        python,
    );
}
