//! `salus-tune bench storage`: P processes on one study, as users start
//! them (one per GPU), with the smallest built-in trial, so that the
//! database and the processes' coordination are what is measured: trials
//! per second, errors, and the writer's time per trial (transactions,
//! waiting for SQLite's write lock included, from each run's `study_stop`).
//!
//! It runs this binary itself, one process per slot, on a fresh SQLite
//! file per configuration. (PostgreSQL and Optuna's numbers beside ours
//! come with the PostgreSQL storage.)

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::json;

use crate::error::{Error, Result};

/// One configuration's figures.
#[derive(Debug, Clone)]
pub struct Row {
    pub processes: usize,
    pub trials: u64,
    pub seconds: f64,
    /// Processes that did not exit 0, and lock errors in their output.
    pub errors: usize,
    /// Trials the study ended with (the target, when all is well).
    pub stored: u64,
    pub storage_ms_per_trial: f64,
}

impl Row {
    pub fn trials_per_s(&self) -> f64 {
        self.stored as f64 / self.seconds.max(1e-9)
    }
}

const STUDY: &str = "[study]\nname = \"bench-storage\"\ntrials = TRIALS\nseed = 1\nkeep = \"none\"\n\n\
[model]\ndepth = 1\nwidth = { int = [2, 8] }\n\n\
[train]\nlr = { float = [1e-3, 1e-1], log = true }\nbatch_size = 256\nepochs = 1\n\n\
[scheduler]\nlanes = 1\nmax_concurrent = 1\nfuse = 1\n";

/// Runs each process count on its own database.
pub fn run(processes: &[usize], trials: u64, progress: &mut dyn FnMut(&str)) -> Result<Vec<Row>> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Input(format!("cannot find this program: {e}")))?;
    let mut rows = Vec::new();
    for &p in processes {
        let dir =
            tempfile::tempdir().map_err(|e| Error::Input(format!("a temporary folder: {e}")))?;
        std::fs::write(
            dir.path().join("s.toml"),
            STUDY.replace("TRIALS", &trials.to_string()),
        )
        .map_err(|e| Error::Input(format!("writing the study: {e}")))?;
        progress(&format!("{p} processes, {trials} trials"));
        let t0 = Instant::now();
        let children: Vec<_> = (0..p)
            .map(|_| {
                Command::new(&exe)
                    .args(["s.toml", "--no-progress", "--device", "cpu"])
                    .current_dir(dir.path())
                    .env_remove("SALUS_TUNE_STORAGE")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
            })
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::Input(format!("starting {}: {e}", exe.display())))?;
        let mut errors = 0;
        for c in children {
            let out = c
                .wait_with_output()
                .map_err(|e| Error::Input(format!("waiting for a process: {e}")))?;
            let log = String::from_utf8_lossy(&out.stderr);
            errors += usize::from(!out.status.success() || log.contains("locked"));
        }
        let seconds = t0.elapsed().as_secs_f64();
        let (stored, writer_ms) = tally(&dir.path().join("bench-storage.db"))?;
        rows.push(Row {
            processes: p,
            trials,
            seconds,
            errors,
            stored,
            storage_ms_per_trial: writer_ms / stored.max(1) as f64,
        });
    }
    Ok(rows)
}

/// Finished trials, and the writers' time summed over the runs.
fn tally(db: &Path) -> Result<(u64, f64)> {
    let url = db.display().to_string();
    // On a thread of its own: the command itself runs inside tokio.
    std::thread::scope(|s| s.spawn(|| tally_on(&url)).join())
        .unwrap_or_else(|_| Err(Error::Input("reading the results failed".into())))
}

fn tally_on(url: &str) -> Result<(u64, f64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| Error::Input(format!("a runtime: {e}")))?;
    runtime.block_on(async {
        use sqlx::Connection;
        let err = |e: sqlx::Error| Error::storage(url, e);
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{url}"))
            .await
            .map_err(err)?;
        let stored: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED', 'FAIL')",
        )
        .fetch_one(&mut c)
        .await
        .map_err(err)?;
        let ms: Option<f64> = sqlx::query_scalar(
            "SELECT SUM(json_extract(detail, '$.writer_total_ms')) FROM salus_events WHERE kind = 'study_stop'",
        )
        .fetch_one(&mut c)
        .await
        .map_err(err)?;
        Ok((stored as u64, ms.unwrap_or(0.0)))
    })
}

pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "bench storage (SQLite, one study, the smallest built-in trial)\n\
         processes  trials  seconds  trials/s  storage ms/trial  errors\n",
    );
    let base = rows.first().map_or(1.0, Row::trials_per_s);
    for r in rows {
        out += &format!(
            "{:>9}  {:>6}  {:>7.2}  {:>8.1}  {:>16.2}  {:>6}   ({:.2}x one process)\n",
            r.processes,
            r.stored,
            r.seconds,
            r.trials_per_s(),
            r.storage_ms_per_trial,
            r.errors,
            r.trials_per_s() / base
        );
    }
    out
}

pub fn json(rows: &[Row]) -> serde_json::Value {
    json!(
        rows.iter()
            .map(|r| json!({
                "processes": r.processes,
                "target": r.trials,
                "stored": r.stored,
                "seconds": r.seconds,
                "trials_per_s": r.trials_per_s(),
                "storage_ms_per_trial": r.storage_ms_per_trial,
                "errors": r.errors,
            }))
            .collect::<Vec<_>>()
    )
}
