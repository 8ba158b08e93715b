//! `pip install salus-tune`: the wheel that maturin builds from
//! `clients/python/pyproject.toml` carries the binary and the
//! `salus_worker` package. Built, installed into a fresh venv, and used
//! from there to run an external-worker study, with no Rust toolchain and
//! no PYTHONPATH.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use salus_tune::storage::TrialState;

#[test]
fn the_wheel_installs_the_binary_and_the_client_and_runs_a_study() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // maturin beside the test's Python (scripts/test.sh installs it in .venv).
    let maturin = Path::new(&python()).with_file_name("maturin");
    if !maturin.exists() {
        if std::env::var_os("SALUS_TUNE_REQUIRE_MATURIN").is_some() {
            panic!(
                "no maturin beside {} (scripts/test.sh installs it)",
                python()
            );
        }
        eprintln!(
            "the_wheel_installs_the_binary_and_the_client_and_runs_a_study: skipped: no maturin beside {}",
            python()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wheels = dir.path().join("wheels");
    // The dev profile's build (a release wheel is the same command with
    // --release). maturin's build of the binary alone does not reuse all of
    // `cargo test`'s artefacts: in a fresh clone it compiled ring, rustls,
    // sqlx and the workspace again, past a run's deadline on two busy cores.
    let out = Running::spawn(
        Command::new(&maturin)
            .current_dir(root.join("clients/python"))
            .args(["build", "--profile", "dev", "--out"])
            .arg(&wheels),
    )
    .within(deadline() * 4)
    .wait();
    assert!(out.status.success(), "maturin build: {}", text(&out));
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("a wheel");
    let venv = dir.path().join("venv");
    let out = output_of(Command::new(python()).args(["-m", "venv"]).arg(&venv));
    assert!(out.status.success(), "venv: {}", text(&out));
    let out = output_of(
        Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--no-index",
                "--disable-pip-version-check",
            ])
            .arg(&wheel),
    );
    assert!(out.status.success(), "pip install: {}", text(&out));

    // From here on, only the venv and the system's own programs.
    let path = format!("{}:/usr/bin:/bin", venv.join("bin").display());
    let study = dir.path().join("study");
    std::fs::create_dir_all(&study).unwrap();
    std::fs::copy(
        root.join("studies/workers/objective.py"),
        study.join("objective.py"),
    )
    .unwrap();
    write(
        &study,
        "s.toml",
        "[study]\nname = \"rosenbrock\"\ntrials = 6\nseed = 3\n\n\
         [worker]\nkind = \"command\"\ncommand = [\"python\", \"objective.py\"]\nmemory = \"16MiB\"\niterations = 1\n\n\
         [params]\nx = { float = [-2.0, 2.0] }\ny = { float = [-1.0, 3.0] }\n",
    );
    let which = output_of(
        Command::new("sh")
            .args([
                "-c",
                "command -v salus-tune; command -v cargo || echo no-cargo",
            ])
            .env("PATH", &path),
    );
    let found = String::from_utf8_lossy(&which.stdout).to_string();
    assert!(
        found.starts_with(&venv.join("bin/salus-tune").display().to_string())
            && found.contains("no-cargo"),
        "{found}"
    );
    let out = output_of(
        Command::new(venv.join("bin/salus-tune"))
            .current_dir(&study)
            .args(["s.toml", "--no-progress"])
            .env("PATH", &path)
            .env_remove("PYTHONPATH")
            .env_remove("SALUS_TUNE_PYTHON"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&study.join("rosenbrock.db"), None);
    assert_eq!(rows.len(), 6);
    assert!(
        rows.iter().all(|t| t.state == TrialState::Complete),
        "{rows:?}"
    );
}
