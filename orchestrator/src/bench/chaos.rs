//! `salus-tune bench chaos`: many processes on one study while a driver
//! does its worst, then a check of everything fenced writes promise.
//!
//! P processes of this binary run one study (on a fresh SQLite file, and
//! with `--postgres` on that database). A driver, drawing from a recorded
//! seed, keeps doing one of these at random moments:
//! * **stop**: SIGSTOP a process for longer than the liveness limit, then
//!   SIGCONT it (its peers requeue its trials meanwhile);
//! * **kill**: `kill -9` a process and start a new one in its place;
//! * **command**: the dashboard's pause, resume or prune for a RUNNING
//!   trial, whichever process holds it.
//!
//! Two studies exercise every writer: `builtin` (fused groups of MLPs,
//! ASHA, checkpoints, `keep = "best"`) and `external` (the NumPy training
//! script as a worker per trial, ASHA, a memory budget that swaps workers
//! out through their own checkpoints). While it runs, every checkpoint
//! file in the folder must load. At the end it checks, from the database:
//! * the exact trial count, and nothing RUNNING or WAITING;
//! * each finished trial ended once, by the claim it ended under
//!   (`salus_writes`), which is its final claim;
//! * each trial's steps run 1, 2, ... without a gap, and every step written
//!   under an earlier claim is one the requeues that followed kept;
//! * each command was taken by the run that held its trial then (the
//!   `command_taken` event against the claims before it), or for a
//!   finished trial;
//! * no checkpoint outlives its trial, and every process ended with 0.
//!
//! Any breach is a violation; the command exits 1 when there is one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::error::{Error, Result};
use crate::storage::dashboard::DashCommand;
use crate::storage::{Location, Store, TrialState};

/// Which study the processes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Builtin,
    External,
}

impl Kind {
    pub const NAMES: [&'static str; 2] = ["builtin", "external"];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "builtin" => Some(Kind::Builtin),
            "external" => Some(Kind::External),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Builtin => "builtin",
            Kind::External => "external",
        }
    }

    /// The study's name: one per kind, so both fit one database.
    fn study(self) -> String {
        format!("chaos-{}", self.name())
    }

    /// Steps a trial that runs to its end reports.
    fn steps(self) -> i64 {
        match self {
            Kind::Builtin => 600,
            Kind::External => 400,
        }
    }
}

pub struct Options {
    pub processes: usize,
    /// How long the driver acts; then the study is let finish.
    pub seconds: f64,
    pub seed: u64,
    pub trials: u64,
    pub liveness_s: u64,
    pub kinds: Vec<Kind>,
    pub postgres: Option<String>,
    /// Run on PostgreSQL only (with `postgres`), not also on SQLite.
    pub no_sqlite: bool,
    /// The Python (with NumPy) for the external study's workers.
    pub python: PathBuf,
}

/// One study's run under chaos, and what the check found.
#[derive(Debug, Clone)]
pub struct Report {
    pub kind: Kind,
    pub storage: &'static str,
    pub trials: u64,
    pub seconds: f64,
    pub stops: u64,
    pub kills: u64,
    pub commands: u64,
    pub requeues: i64,
    /// Lines in which a process said it lost a trial.
    pub lost: u64,
    /// The longest gap between two heartbeats of one run, in seconds.
    pub max_beat_gap_s: f64,
    /// Checkpoint files read (and loaded) while it ran.
    pub checkpoints_read: u64,
    pub violations: Vec<String>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

fn study_file(kind: Kind, o: &Options, dir: &Path) -> Result<String> {
    let head = format!(
        "[study]\nname = \"{}\"\ntrials = {}\nseed = {}\nliveness = \"{}s\"\ncheckpoints = \"ckpt\"\n",
        kind.study(),
        o.trials,
        o.seed,
        o.liveness_s
    );
    let asha = "\n[pruner]\nkind = \"asha\"\nmin_resource = 25\nreduction_factor = 2\n";
    Ok(match kind {
        Kind::Builtin => format!(
            "{head}keep = \"best\"\n\n[model]\ndepth = 1\nwidth = {{ choices = [32, 64] }}\n\n\
             [train]\noptimizer = \"adam\"\nlr = {{ float = [1e-3, 1e-1], log = true }}\n\
             batch_size = 64\nepochs = {}\n{asha}\n[scheduler]\nlanes = 1\nmax_concurrent = 6\nfuse = 4\n",
            kind.steps()
        ),
        Kind::External => {
            super::write_client(dir)?;
            std::fs::write(
                dir.join("numpy_mlp.py"),
                include_str!("../../../studies/workers/numpy_mlp.py"),
            )
            .map_err(io("writing numpy_mlp.py"))?;
            format!(
                "{head}\n[worker]\nkind = \"command\"\ncommand = [\"{}\", \"numpy_mlp.py\"]\n\
                 env = {{ PYTHONPATH = \".\" }}\nmemory = \"16MiB\"\niterations = {}\nheartbeat_timeout = \"60s\"\n\n\
                 [params]\nlr = {{ float = [1e-2, 2e-1], log = true }}\nhidden = {{ int = [8, 64] }}\nepochs = {}\n\
                 {asha}\n[scheduler]\nlanes = 2\nmax_concurrent = 6\nmemory = \"48MiB\"\n",
                o.python.display(),
                kind.steps(),
                kind.steps()
            )
        }
    })
}

/// One process of the study, and where its log goes.
struct Proc {
    child: Child,
    log: PathBuf,
    /// Set once it has ended (the study is done for it).
    status: Option<std::process::ExitStatus>,
}

/// The stopped processes (pid, when to go on), and whether the chaos ended.
type Stopped = (Vec<(u32, Instant)>, bool);

/// The stopped processes and when each is to go on.
#[derive(Clone, Default)]
struct Waker {
    state: std::sync::Arc<std::sync::Mutex<Stopped>>,
}

impl Waker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Stopped> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops `pid` until `until`; false when it is stopped already.
    fn stop(&self, pid: u32, until: Instant) -> bool {
        let mut s = self.lock();
        if s.0.iter().any(|&(p, _)| p == pid) {
            return false;
        }
        signal(pid, "STOP");
        s.0.push((pid, until));
        true
    }

    /// `pid` is being killed: no continuing it.
    fn forget(&self, pid: u32) {
        self.lock().0.retain(|&(p, _)| p != pid);
    }

    /// Continues every stopped process now, and ends the thread.
    fn finish(&self) {
        let mut s = self.lock();
        for (pid, _) in s.0.drain(..) {
            signal(pid, "CONT");
        }
        s.1 = true;
    }

    fn run(self) {
        loop {
            {
                let mut s = self.lock();
                if s.1 {
                    return;
                }
                let now = Instant::now();
                s.0.retain(|&(pid, until)| {
                    let due = now >= until;
                    if due {
                        signal(pid, "CONT");
                    }
                    !due
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn spawn(exe: &Path, dir: &Path, storage: &str, n: usize) -> Result<Proc> {
    let log = dir.join(format!("process-{n}.log"));
    let file = std::fs::File::create(&log).map_err(io("a log file"))?;
    let child = Command::new(exe)
        .args(["run", "s.toml", "--no-progress"])
        // By the environment: `ps` shows arguments to every user.
        .env("SALUS_TUNE_STORAGE", storage)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .map_err(io(format!("starting {}", exe.display())))?;
    Ok(Proc {
        child,
        log,
        status: None,
    })
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// Runs each study on each storage.
pub fn run(o: &Options, progress: &mut dyn FnMut(&str)) -> Result<Vec<Report>> {
    let exe = std::env::current_exe().map_err(Error::io("finding this program"))?;
    let mut reports = Vec::new();
    for &kind in &o.kinds {
        if kind == Kind::External && !super::python_imports(&o.python, "numpy") {
            return Err(Error::Bench(format!(
                "the external study needs NumPy in {} (--python, or SALUS_TUNE_PYTHON)",
                o.python.display()
            )));
        }
        let mut storages = Vec::new();
        if !(o.no_sqlite && o.postgres.is_some()) {
            storages.push("sqlite");
        }
        if o.postgres.is_some() {
            storages.push("postgres");
        }
        for storage in storages {
            progress(&format!(
                "chaos: {} study on {storage}, {} processes, {} s (seed {})",
                kind.name(),
                o.processes,
                o.seconds,
                o.seed
            ));
            let dir = tempfile::tempdir().map_err(io("a temporary folder"))?;
            let url = match storage {
                "sqlite" => dir.path().join("chaos.db").display().to_string(),
                _ => {
                    let url = o.postgres.clone().expect("postgres");
                    refuse_used(&url, kind)?;
                    url
                }
            };
            let study = study_file(kind, o, dir.path())?;
            std::fs::write(dir.path().join("s.toml"), study).map_err(io("the study file"))?;
            let mut report = one(&exe, kind, storage, &url, dir.path(), o)?;
            if !report.violations.is_empty() {
                // The processes' logs (and a SQLite study) stay, to be read.
                let kept = dir.keep();
                report
                    .violations
                    .push(format!("logs kept in {}", kept.display()));
            }
            progress(&format!(
                "  {} trials, {} stops, {} kills, {} commands, {} requeues, {} lost, {} violations",
                report.trials,
                report.stops,
                report.kills,
                report.commands,
                report.requeues,
                report.lost,
                report.violations.len()
            ));
            reports.push(report);
        }
    }
    Ok(reports)
}

/// Refuses a PostgreSQL database that holds the study already: the
/// checks read every trial of it.
fn refuse_used(url: &str, kind: Kind) -> Result<()> {
    block(|| async {
        let mut store = Store::open(url).await?;
        if store
            .studies()
            .await?
            .iter()
            .any(|s| s.name == kind.study())
        {
            return Err(Error::Bench(format!(
                "{} already holds a study named '{}': give bench chaos an empty database",
                crate::storage::masked(url),
                kind.study()
            )));
        }
        Ok(())
    })
}

/// Runs the future `make` builds on a thread of its own with its own
/// runtime: the bench itself runs inside the command's runtime.
fn block<T: Send, F: std::future::Future<Output = Result<T>>>(
    make: impl FnOnce() -> F + Send,
) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Bench(format!("a runtime: {e}")))?
                .block_on(make())
        })
        .join()
        .unwrap_or_else(|_| Err(Error::Bench("the database thread panicked".into())))
    })
}

/// [`block`] again while SQLite answers "locked" at once (a killed
/// process's log being recovered, a checkpoint truncating it): the driver
/// is one more reader and writer, and must not stop the bench for that.
fn block_retrying<T: Send, F: std::future::Future<Output = Result<T>>>(
    make: impl Fn() -> F + Send + Sync,
) -> Result<T> {
    let mut tries = 0;
    loop {
        match block(&make) {
            Err(Error::Storage(e)) if e.is_locked() && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

fn one(
    exe: &Path,
    kind: Kind,
    storage: &'static str,
    url: &str,
    dir: &Path,
    o: &Options,
) -> Result<Report> {
    let mut rng = StdRng::seed_from_u64(o.seed);
    let mut next = 0;
    let mut procs = Vec::new();
    for _ in 0..o.processes {
        procs.push(spawn(exe, dir, url, next)?);
        next += 1;
    }
    let t0 = Instant::now();
    let liveness = Duration::from_secs(o.liveness_s);
    let ckpt = dir.join("ckpt");
    let mut report = Report {
        kind,
        storage,
        trials: o.trials,
        seconds: 0.0,
        stops: 0,
        kills: 0,
        commands: 0,
        requeues: 0,
        lost: 0,
        max_beat_gap_s: 0.0,
        checkpoints_read: 0,
        violations: Vec::new(),
    };
    let name = kind.study();
    let mut paused_by_us: BTreeMap<i64, bool> = BTreeMap::new();
    // Stopped processes are continued on time by a thread of their own: the
    // driver itself may wait on a lock that a stopped process holds.
    let waker = Waker::default();
    let waking = waker.clone();
    let waker_thread = std::thread::spawn(move || waking.run());
    // The driver's own errors (a process that cannot start, a database
    // that stops answering) end the bench, and leave nothing running.
    let driven = (|| -> Result<()> {
        while t0.elapsed().as_secs_f64() < o.seconds {
            std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
            for p in procs.iter_mut() {
                if p.status.is_none() {
                    p.status = p.child.try_wait().map_err(io("waiting for a process"))?;
                }
            }
            // Processes that ended (the study is done for them) stay ended.
            let live: Vec<usize> = (0..procs.len())
                .filter(|&i| procs[i].status.is_none())
                .collect();
            if live.is_empty() {
                break;
            }
            check_checkpoints(kind, &ckpt, &mut report);
            let i = live[rng.random_range(0..live.len())];
            match rng.random_range(0..10) {
                0..=1 => {
                    let extra = Duration::from_millis(rng.random_range(1000..3000));
                    if waker.stop(procs[i].child.id(), Instant::now() + liveness + extra) {
                        report.stops += 1;
                    }
                }
                2..=3 => {
                    waker.forget(procs[i].child.id());
                    let _ = procs[i].child.kill();
                    let _ = procs[i].child.wait();
                    procs[i] = spawn(exe, dir, url, next)?;
                    next += 1;
                    report.kills += 1;
                }
                _ => {
                    if command(url, &name, &mut rng, &mut paused_by_us)?.is_some() {
                        report.commands += 1;
                    }
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = driven {
        waker.finish();
        let _ = waker_thread.join();
        for p in procs.iter_mut() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        return Err(e);
    }
    // The chaos ends: everything continues, what we paused resumes, and
    // the study is let finish.
    waker.finish();
    let _ = waker_thread.join();
    resume_all(url, &name, &paused_by_us)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut statuses = Vec::new();
    for mut p in procs {
        loop {
            if let Some(status) = p.status {
                statuses.push((status, p.log.clone()));
                break;
            }
            p.status = p.child.try_wait().map_err(io("waiting for a process"))?;
            if p.status.is_none() {
                if Instant::now() > deadline {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    report.violations.push(format!(
                        "{} did not finish within 300 s after the chaos",
                        p.log.display()
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    report.seconds = t0.elapsed().as_secs_f64();
    // Every process's log, the killed ones' included.
    for n in 0..next {
        let text =
            std::fs::read_to_string(dir.join(format!("process-{n}.log"))).unwrap_or_default();
        report.lost += text.matches("lost to another process").count() as u64;
    }
    for (status, log) in &statuses {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if status.code() != Some(0) {
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            report.violations.push(format!(
                "{} ended with {status}: {}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
    }
    check_checkpoints(kind, &ckpt, &mut report);
    let left: Vec<String> = std::fs::read_dir(&ckpt)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if !left.is_empty() {
        report
            .violations
            .push(format!("checkpoint files outlived their trials: {left:?}"));
    }
    report = block_retrying(|| {
        let mut r = report.clone();
        async move {
            check(url, kind, o.trials, &mut r).await?;
            Ok(r)
        }
    })?;
    Ok(report)
}

/// Every built-in checkpoint in the folder loads (none is torn or mixed).
fn check_checkpoints(kind: Kind, ckpt: &Path, report: &mut Report) {
    if kind != Kind::Builtin {
        return;
    }
    let Ok(entries) = std::fs::read_dir(ckpt) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".state") {
            continue;
        }
        // A file removed between the listing and the read is no breach.
        let Ok(bytes) = std::fs::read(e.path()) else {
            continue;
        };
        report.checkpoints_read += 1;
        if let Err(why) = training::TrialSnapshot::from_bytes(&bytes) {
            report
                .violations
                .push(format!("checkpoint {name} does not load: {why}"));
        }
    }
}

/// A dashboard command for a RUNNING trial: pause, resume (one we paused)
/// or prune.
fn command(
    url: &str,
    name: &str,
    rng: &mut StdRng,
    paused: &mut BTreeMap<i64, bool>,
) -> Result<Option<(i64, &'static str)>> {
    let pick: u32 = rng.random_range(0..10);
    let roll: u64 = rng.random();
    // No process has created the SQLite file yet: nothing runs.
    if let Ok(Location::Sqlite(path)) = Location::parse(url)
        && !path.is_file()
    {
        return Ok(None);
    }
    let running: Vec<i64> = block_retrying(|| async {
        let mut store = Store::open_existing(url).await?;
        // No process has created the study yet: nothing runs.
        let Some(info) = store.studies().await?.into_iter().find(|s| s.name == name) else {
            return Ok(Vec::new());
        };
        Ok(store
            .trials(info.id)
            .await?
            .iter()
            .filter(|t| t.state == TrialState::Running)
            .map(|t| t.trial_id.0)
            .collect())
    })?;
    if running.is_empty() {
        return Ok(None);
    }
    let trial = running[(roll % running.len() as u64) as usize];
    let was_paused = paused.get(&trial).copied().unwrap_or(false);
    let action = match pick {
        0..=1 => DashCommand::Prune,
        _ if was_paused => DashCommand::Resume,
        _ => DashCommand::Pause,
    };
    paused.insert(trial, action == DashCommand::Pause);
    push(url, name, trial, action)?;
    Ok(Some((trial, action.as_str())))
}

/// Leaves a command for trial id `trial`, as the dashboard does.
fn push(url: &str, name: &str, trial: i64, action: DashCommand) -> Result<()> {
    block_retrying(|| async {
        let mut store = Store::open_existing(url).await?;
        let info = store.pick_study(Some(name)).await?;
        store
            .push_command(info.id, crate::storage::TrialId(trial), action)
            .await?;
        Ok(())
    })
}

/// Resumes every trial the driver left paused.
fn resume_all(url: &str, name: &str, paused: &BTreeMap<i64, bool>) -> Result<()> {
    for (&trial, _) in paused.iter().filter(|(_, p)| **p) {
        push(url, name, trial, DashCommand::Resume)?;
    }
    Ok(())
}

/// The checks of the module docs, from the database.
async fn check(url: &str, kind: Kind, target: u64, report: &mut Report) -> Result<()> {
    let name = kind.study();
    let name = name.as_str();
    let mut store = Store::open_existing(url).await?;
    let info = store.pick_study(Some(name)).await?;
    let rows = store.trials(info.id).await?;
    let v = &mut report.violations;
    if rows.len() as u64 != target {
        v.push(format!("{} trials, not {target}", rows.len()));
    }
    for t in &rows {
        if !t.state.is_finished() {
            v.push(format!("trial {} left {:?}", t.number, t.state));
        }
        let steps: Vec<i64> = t.intermediate.iter().map(|&(s, _)| s).collect();
        if steps != (1..=steps.len() as i64).collect::<Vec<_>>() {
            v.push(format!("trial {}: steps {steps:?}", t.number));
        }
        if t.state == TrialState::Complete && steps.len() as i64 != kind.steps() {
            v.push(format!(
                "trial {} COMPLETE with {} steps, not {}",
                t.number,
                steps.len(),
                kind.steps()
            ));
        }
    }
    let audit = crate::storage::audit::fencing(&mut store, info.id).await?;
    v.extend(audit.violations);
    report.requeues += audit.requeues;
    report.max_beat_gap_s = audit.max_beat_gap_s;
    Ok(store.close().await?)
}

/// The reports as a table.
pub fn table(reports: &[Report]) -> String {
    let mut out = String::from(
        "study     storage   trials  seconds  stops  kills  commands  requeues  lost  max beat gap  checkpoints read  violations\n",
    );
    for r in reports {
        out += &format!(
            "{:<9} {:<9} {:>6} {:>8.1} {:>6} {:>6} {:>9} {:>9} {:>5} {:>11.2}s {:>17} {:>11}\n",
            r.kind.name(),
            r.storage,
            r.trials,
            r.seconds,
            r.stops,
            r.kills,
            r.commands,
            r.requeues,
            r.lost,
            r.max_beat_gap_s,
            r.checkpoints_read,
            r.violations.len()
        );
    }
    for r in reports {
        for v in &r.violations {
            out += &format!("violation ({} on {}): {v}\n", r.kind.name(), r.storage);
        }
    }
    out
}

/// The reports as JSON.
pub fn json(reports: &[Report]) -> serde_json::Value {
    serde_json::Value::Array(
        reports
            .iter()
            .map(|r| {
                serde_json::json!({
                    "study": r.kind.name(),
                    "storage": r.storage,
                    "trials": r.trials,
                    "seconds": r.seconds,
                    "stops": r.stops,
                    "kills": r.kills,
                    "commands": r.commands,
                    "requeues": r.requeues,
                    "lost": r.lost,
                    "max_beat_gap_s": r.max_beat_gap_s,
                    "checkpoints_read": r.checkpoints_read,
                    "violations": r.violations,
                })
            })
            .collect(),
    )
}
