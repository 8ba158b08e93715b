//! Helpers for the end-to-end tests: run the real binary, read its database.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use salus_tune::storage::{Store, TrialRow};

pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_salus-tune"));
    c.env_remove("SALUS_TUNE_STORAGE");
    c
}

/// Runs the binary with `args` in `dir`.
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    bin()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the binary runs")
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Every trial of the only (or named) study in the database at `db`.
pub fn trials(db: &Path, study: Option<&str>) -> Vec<TrialRow> {
    block_on(async {
        let mut store = Store::open_existing(&db.display().to_string())
            .await
            .unwrap();
        let info = store.pick_study(study).await.unwrap();
        store.trials(info.id).await.unwrap()
    })
}

/// A single-value SQL query against the database at `db`.
pub fn scalar(db: &Path, sql: &str) -> i64 {
    block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    })
}

/// Whether the database at `db` exists and holds every table: a run
/// creates the file first and its tables a moment later.
pub fn migrated(db: &Path) -> bool {
    db.exists()
        && scalar(
            db,
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'salus_commands'",
        ) == 1
}

/// One optional text value of a query.
pub fn scalar_text(db: &Path, sql: &str) -> Option<String> {
    block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query_scalar::<_, String>(sql)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
    })
}

/// A small, fast digits study.
pub fn small_study(name: &str, trials: u64) -> String {
    format!(
        "[study]\nname = \"{name}\"\ntrials = {trials}\nseed = 3\n\n[model]\ndepth = 1\nwidth = {{ choices = [16, 32] }}\n\n\
         [train]\noptimizer = {{ choices = [\"sgd\", \"adam\"] }}\nlr = {{ float = [1e-3, 1e-1], log = true }}\nbatch_size = 64\nepochs = 3\n\n\
         [train.sgd]\nmomentum = {{ float = [0.5, 0.95] }}\n"
    )
}

/// Runs one statement on the database at `db`, as another process would.
pub fn execute(db: &Path, sql: &str) {
    block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    });
}
