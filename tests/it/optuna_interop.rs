//! Optuna itself reads what salus-tune writes.
//!
//! Needs a Python with Optuna 5.0 and pandas: `SALUS_TUNE_PYTHON`, else
//! `.venv/bin/python` (which `scripts/test.sh` creates). Without one the
//! test says so and passes, unless `SALUS_TUNE_REQUIRE_OPTUNA=1` (as CI
//! sets), where it fails.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

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

/// Optuna processes hold RUNNING trials in a salus-tune study (Optuna
/// writes no heartbeat by default, and no salus-tune claim): a run leaves
/// such a trial alone, and waits for it, while its heartbeat moves or
/// when it has none; one whose heartbeat stands still past the liveness
/// limit (its process was killed) is requeued once and run.
#[test]
fn optuna_s_own_running_trials_are_left_alone_while_their_process_lives() {
    let Some(python) = python_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let body = small_study("holders", 1)
        .replace("[study]", "[study]\nliveness = \"5s\"")
        .replace("[train.sgd]\nmomentum = { float = [0.5, 0.95] }\n", "");
    write(dir.path(), "s.toml", &body);
    let db = dir.path().join("holders.db");
    let out = run_in(dir.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/optuna_holder.py");
    let url = format!("sqlite:///{}", db.display());
    let tell = dir.path().join("tell");
    let holder = |beat: &str| {
        let mut child = Command::new(&python)
            .arg(&script)
            .args([url.as_str(), "holders", beat])
            .arg(&tell)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("asked"), "{line}");
        child
    };
    // Killed with the test, should it fail.
    struct Holder(std::process::Child);
    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut silent = Holder(holder("0"));
    let mut beating = holder("1");
    // The beating holder dies: its heartbeat stands still from now on.
    beating.kill().unwrap();
    beating.wait().unwrap();
    let run = Running::spawn(bin().current_dir(dir.path()).args([
        "s.toml",
        "--no-progress",
        "--trials",
        "5",
    ]));
    let state = |number: i64| {
        scalar_text(
            &db,
            &format!("SELECT state FROM trials WHERE number = {number}"),
        )
        .unwrap()
    };
    wait_until(
        "the killed holder's trial is requeued and run",
        Duration::from_secs(90),
        || state(2) == "COMPLETE",
    );
    // The live holder's trial is still its own, and the run waits for it.
    assert_eq!(state(1), "RUNNING");
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'"),
        4
    );
    std::fs::write(&tell, "").unwrap();
    assert!(silent.0.wait().unwrap().success());
    let out = run.wait();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_events WHERE kind = 'trial_requeue'"
        ),
        1,
        "only the dead holder's trial was requeued"
    );
    let told: f64 = crate::common::block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query_scalar(
            "SELECT v.value FROM trial_values v JOIN trials t USING (trial_id) WHERE t.number = 1",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
    });
    assert_eq!(told, 0.5, "the live holder's own value");
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM trials"), 5);
}
