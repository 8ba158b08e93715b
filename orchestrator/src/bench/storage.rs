//! `salus-tune bench storage`: P processes on one study, as users start
//! them (one per GPU), with the smallest built-in trial, so that the
//! database and the processes' coordination are what is measured: trials
//! per second, errors, and the writer's time per trial (transactions,
//! waiting for locks included, from each run's `study_stop`).
//!
//! It runs this binary itself, one process per slot: on a fresh SQLite
//! file per configuration, and with `--postgres URL` also on that
//! PostgreSQL database (a new study per configuration), with Optuna 5.0's
//! own processes on the same database beside it (`scripts/anchors/optuna_storage.py`:
//! Optuna's default sampler, a trivial objective on the same space).
//! Optuna's processes import and connect first and then start together,
//! so that Python's start-up is not counted against it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::json;

use crate::error::{Error, Result};

/// Optuna's side, written beside each run's study.
const OPTUNA_SCRIPT: &str = include_str!("../../../scripts/anchors/optuna_storage.py");
/// The variable that gives Optuna's side its storage URL (not an argument,
/// which `ps` would show).
const OPTUNA_URL: &str = "SALUS_TUNE_OPTUNA_URL";

/// Who ran the trials, on what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    SalusSqlite,
    SalusPostgres,
    OptunaPostgres,
}

impl System {
    pub fn label(self) -> &'static str {
        match self {
            System::SalusSqlite => "salus-tune, SQLite",
            System::SalusPostgres => "salus-tune, PostgreSQL",
            System::OptunaPostgres => "Optuna 5.0, PostgreSQL",
        }
    }
    fn key(self) -> &'static str {
        match self {
            System::SalusSqlite => "salus_sqlite",
            System::SalusPostgres => "salus_postgres",
            System::OptunaPostgres => "optuna_postgres",
        }
    }
}

/// Where the bench runs beside SQLite.
pub struct Options<'a> {
    pub processes: &'a [usize],
    pub trials: u64,
    /// A PostgreSQL database for salus-tune and Optuna.
    pub postgres: Option<String>,
    /// A Python with Optuna 5.0 and psycopg2 (for Optuna's rows).
    pub python: Option<PathBuf>,
}

/// One configuration's figures.
#[derive(Debug, Clone)]
pub struct Row {
    pub system: System,
    pub processes: usize,
    pub trials: u64,
    pub seconds: f64,
    /// Processes that did not exit 0, and lock errors in their output.
    pub errors: usize,
    /// Trials the study ended with (the target, when all is well).
    pub stored: u64,
    /// Not measured for Optuna.
    pub storage_ms_per_trial: Option<f64>,
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

/// Runs each process count: on its own SQLite file, then (with
/// `--postgres`) on the PostgreSQL database, salus-tune's and Optuna's.
pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Vec<Row>> {
    let exe = std::env::current_exe().map_err(Error::io("finding this program"))?;
    let trials = options.trials;
    let mut rows = Vec::new();
    let mut systems = vec![System::SalusSqlite];
    if options.postgres.is_some() {
        systems.push(System::SalusPostgres);
        if options.python.is_some() {
            systems.push(System::OptunaPostgres);
        }
    }
    for (config, &p) in options.processes.iter().enumerate() {
        for &system in &systems {
            let dir = tempfile::tempdir().map_err(Error::io("creating a temporary folder"))?;
            // A study of its own in a shared database.
            let name = format!(
                "bench-storage-{}-p{p}-c{config}-{}",
                system.key(),
                std::process::id()
            );
            progress(&format!(
                "{}: {p} processes, {trials} trials",
                system.label()
            ));
            let row = match system {
                System::OptunaPostgres => optuna(
                    options.python.as_deref().expect("python given"),
                    options.postgres.as_deref().expect("postgres given"),
                    dir.path(),
                    &name,
                    p,
                    trials,
                )?,
                _ => {
                    let storage = match system {
                        System::SalusSqlite => dir.path().join("bench.db").display().to_string(),
                        _ => options.postgres.clone().expect("postgres given"),
                    };
                    salus(&exe, &storage, dir.path(), &name, p, trials, system)?
                }
            };
            rows.push(row);
        }
    }
    Ok(rows)
}

/// `p` processes of this binary on study `name` in `storage`.
fn salus(
    exe: &Path,
    storage: &str,
    dir: &Path,
    name: &str,
    p: usize,
    trials: u64,
    system: System,
) -> Result<Row> {
    std::fs::write(
        dir.join("s.toml"),
        STUDY
            .replace("TRIALS", &trials.to_string())
            .replace("bench-storage", name),
    )
    .map_err(Error::io("writing the study"))?;
    let t0 = Instant::now();
    let children: Vec<_> = (0..p)
        .map(|_| {
            Command::new(exe)
                .args(["s.toml", "--no-progress", "--device", "cpu"])
                // By the environment, not the command line: `ps` shows
                // every process's arguments to every user.
                .env("SALUS_TUNE_STORAGE", storage)
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect::<std::io::Result<_>>()
        .map_err(Error::io(format!("starting {}", exe.display())))?;
    let mut errors = 0;
    for c in children {
        let out = c
            .wait_with_output()
            .map_err(Error::io("waiting for a process"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        errors += usize::from(!out.status.success() || log.contains("locked"));
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (stored, writer_ms) = tally(storage, name)?;
    Ok(Row {
        system,
        processes: p,
        trials,
        seconds,
        errors,
        stored,
        storage_ms_per_trial: Some(writer_ms / stored.max(1) as f64),
    })
}

/// `p` Optuna processes on study `name` in the PostgreSQL at `url`,
/// started together once all have imported Optuna and connected.
fn optuna(python: &Path, url: &str, dir: &Path, name: &str, p: usize, trials: u64) -> Result<Row> {
    let script = dir.join("optuna_storage.py");
    std::fs::write(&script, OPTUNA_SCRIPT)
        .map_err(Error::io(format!("writing {}", script.display())))?;
    let sqlalchemy = format!(
        "postgresql+psycopg2://{}",
        url.split_once("://").map_or(url, |(_, rest)| rest)
    );
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::Bench(format!("Optuna's side ({}): {what}: {e}", python.display()))
    };
    let created = Command::new(python)
        .arg(&script)
        .args(["create", name, "1"])
        .env(OPTUNA_URL, &sqlalchemy)
        .output()
        .map_err(|e| failed("starting", &e))?;
    if !created.status.success() {
        return Err(failed(
            "creating the study",
            &crate::storage::masked(&String::from_utf8_lossy(&created.stderr)),
        ));
    }
    let go = dir.join("go");
    let mut children = Vec::new();
    for i in 0..p {
        let mut c = Command::new(python)
            .arg(&script)
            .env(OPTUNA_URL, &sqlalchemy)
            .args(["work", name, "1", &i.to_string(), &trials.to_string()])
            .arg(&go)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed("starting", &e))?;
        // Ready: imported, connected, its sampler made.
        let mut line = String::new();
        use std::io::BufRead;
        let mut out = std::io::BufReader::new(c.stdout.take().expect("piped"));
        out.read_line(&mut line)
            .map_err(|e| failed("reading", &e))?;
        children.push(c);
    }
    let t0 = Instant::now();
    std::fs::write(&go, "").map_err(|e| failed("the start signal", &e))?;
    let mut errors = 0;
    for c in children {
        let out = c.wait_with_output().map_err(|e| failed("waiting", &e))?;
        let log = String::from_utf8_lossy(&out.stderr);
        errors += usize::from(
            !out.status.success()
                || log.contains("Traceback")
                || log.contains("already finished")
                || log.contains("locked"),
        );
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (stored, _) = tally(url, name)?;
    Ok(Row {
        system: System::OptunaPostgres,
        processes: p,
        trials,
        seconds,
        errors,
        stored,
        storage_ms_per_trial: None,
    })
}

/// Study `name`'s finished trials, and the writers' time summed over its runs.
fn tally(url: &str, name: &str) -> Result<(u64, f64)> {
    // On a thread of its own: the command itself runs inside tokio.
    std::thread::scope(|s| s.spawn(|| tally_on(url, name)).join())
        .unwrap_or_else(|_| Err(Error::Input("reading the results failed".into())))
}

fn tally_on(url: &str, name: &str) -> Result<(u64, f64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting a runtime"))?;
    runtime.block_on(async {
        let mut store = crate::storage::Store::open_existing(url).await?;
        let study = store.pick_study(Some(name)).await?;
        Ok(crate::storage::audit::finished_and_writer_ms(&mut store, study.id).await?)
    })
}

pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "bench storage (one study, the smallest built-in trial; Optuna: a trivial objective)\n\
         system                   processes  trials  seconds  trials/s  storage ms/trial  errors\n",
    );
    for r in rows {
        let ms = r
            .storage_ms_per_trial
            .map_or("-".to_string(), |m| format!("{m:.2}"));
        out += &format!(
            "{:<23}  {:>9}  {:>6}  {:>7.2}  {:>8.1}  {:>16}  {:>6}\n",
            r.system.label(),
            r.processes,
            r.stored,
            r.seconds,
            r.trials_per_s(),
            ms,
            r.errors,
        );
    }
    for (p, ratio) in optuna_ratios(rows) {
        out += &format!(
            "{p} processes on PostgreSQL: salus-tune {ratio:.2}x Optuna's trials per second\n"
        );
    }
    out
}

/// Per process count measured on both: salus-tune's trials per second
/// on PostgreSQL over Optuna's.
pub fn optuna_ratios(rows: &[Row]) -> Vec<(usize, f64)> {
    rows.iter()
        .filter(|r| r.system == System::SalusPostgres)
        .filter_map(|ours| {
            let theirs = rows
                .iter()
                .find(|r| r.system == System::OptunaPostgres && r.processes == ours.processes)?;
            Some((
                ours.processes,
                ours.trials_per_s() / theirs.trials_per_s().max(1e-9),
            ))
        })
        .collect()
}

pub fn json(rows: &[Row]) -> serde_json::Value {
    json!({
        "rows": rows
            .iter()
            .map(|r| json!({
                "system": r.system.key(),
                "processes": r.processes,
                "target": r.trials,
                "stored": r.stored,
                "seconds": r.seconds,
                "trials_per_s": r.trials_per_s(),
                "storage_ms_per_trial": r.storage_ms_per_trial,
                "errors": r.errors,
            }))
            .collect::<Vec<_>>(),
        "salus_over_optuna_postgres": optuna_ratios(rows)
            .iter()
            .map(|(p, x)| json!({ "processes": p, "ratio": x }))
            .collect::<Vec<_>>(),
    })
}
