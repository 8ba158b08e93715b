//! Helpers for the end-to-end tests: run the real binary, read its database.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use salus_tune::storage::{Dialect, Store, TrialRow};

pub mod postgres;

pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_salus-tune"));
    c.env_remove("SALUS_TUNE_STORAGE");
    c
}

/// How long one run of a program may take in a test before it is killed
/// and the test fails with what it printed, so that a hang fails CI in
/// minutes rather than at its 90-minute limit. `SALUS_TUNE_TEST_DEADLINE_S`
/// overrides the default of 180 s.
pub fn deadline() -> Duration {
    let s = std::env::var("SALUS_TUNE_TEST_DEADLINE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(180);
    Duration::from_secs(s)
}

/// A running program whose output is collected while it runs, so that a
/// run killed at its deadline still shows its log.
pub struct Running {
    child: Child,
    what: String,
    started: Instant,
    /// How long it may run ([`deadline`] unless told otherwise).
    limit: Duration,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
}

fn drain(r: Option<impl Read + Send + 'static>) -> Option<JoinHandle<Vec<u8>>> {
    r.map(|mut r| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    })
}

impl Running {
    /// Starts `cmd` with its output piped.
    pub fn spawn(cmd: &mut Command) -> Running {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
        let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
        Running {
            child,
            what,
            started: Instant::now(),
            limit: deadline(),
            out,
            err,
        }
    }

    /// Allows it `limit` instead of [`deadline`] (a build).
    pub fn within(mut self, limit: Duration) -> Running {
        self.limit = limit;
        self
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status once it has ended; panics with its log once it has
    /// run past [`deadline`].
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().expect("try_wait");
        if status.is_none() && self.started.elapsed() > self.limit {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let out = self.collect(None);
            panic!(
                "{} still ran after {:?}: killed. Its output:\n{}",
                self.what,
                self.limit,
                text(&out)
            );
        }
        status
    }

    /// Waits for the end, within [`deadline`].
    pub fn wait(mut self) -> Output {
        loop {
            if let Some(status) = self.try_wait() {
                return self.collect(Some(status));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills it (a `kill -9`) and reaps it.
    pub fn kill(mut self) -> Output {
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        self.collect(status)
    }

    fn collect(&mut self, status: Option<ExitStatus>) -> Output {
        let join = |h: Option<JoinHandle<Vec<u8>>>| h.map(|h| h.join().unwrap_or_default());
        Output {
            status: status.unwrap_or_else(|| self.child.wait().expect("wait")),
            stdout: join(self.out.take()).unwrap_or_default(),
            stderr: join(self.err.take()).unwrap_or_default(),
        }
    }
}

/// A program a failing test leaves behind is killed, not left running
/// (it would hold its files, ports and cores after the test has ended).
impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the binary with `args` in `dir`, within [`deadline`].
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    Running::spawn(bin().current_dir(dir).args(args)).wait()
}

/// Runs `cmd` to its end within [`deadline`].
pub fn output_of(cmd: &mut Command) -> Output {
    Running::spawn(cmd).wait()
}

/// Waits until `ok()` holds, checking every 20 ms; fails naming `what`
/// after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A fresh folder inside `dir` to run the binary with as its `TMPDIR`, so
/// that [`left_in`] can see what a run leaves behind.
pub fn private_tmp(dir: &Path) -> PathBuf {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    tmp
}

/// What runs with `tmp` as their `TMPDIR` left in it under salus-tune's
/// names (a worker's own libraries keep caches there, as torch's
/// `torchinductor_*`): those entries and theirs, one level down, sorted.
pub fn left_in(tmp: &Path) -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir(tmp).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("salus") {
            continue;
        }
        let inner = std::fs::read_dir(e.path())
            .map(|d| {
                d.flatten()
                    .map(|f| f.file_name().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        left.push(format!("{name} {inner:?}"));
    }
    left.sort();
    left
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

/// Every trial of the only (or named) study in the database at `db`, as
/// stored (see [`as_stored`]).
pub fn trials(db: &Path, study: Option<&str>) -> Vec<TrialRow> {
    TestDb::Sqlite(db.to_path_buf()).trials(study)
}

/// The rows without their heartbeats' ages: an age is a reading of the
/// database's clock, which moves between two reads of the same trials.
pub fn as_stored(mut rows: Vec<TrialRow>) -> Vec<TrialRow> {
    for t in &mut rows {
        t.heartbeat_age_s = None;
        if let Some(o) = &mut t.owner {
            o.heartbeat_age_s = None;
        }
    }
    rows
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

/// What ASHA (`reduction_factor = 2`) promises of a finished study `rows`
/// in `db`, whatever order the reports came in: some trial paused; a trial
/// paused at a rung (whose steps are `rung_steps`) ran on past it exactly
/// when it was promoted there; and at each rung the better half of the
/// trials that reached it went on, at once or promoted (the runner asks
/// for promotions after every report, so the last report at a rung sees
/// the whole rung).
#[track_caller]
pub fn assert_asha_promises(db: &Path, rows: &[TrialRow], rung_steps: &[i64], maximize: bool) {
    assert!(
        scalar(
            db,
            "SELECT COUNT(*) FROM salus_priority WHERE reason = 'paused'"
        ) > 0,
        "ASHA paused nobody"
    );
    // Each pause and promotion as "number rung reason", read once.
    let marks = TestDb::Sqlite(db.to_path_buf()).texts(
        "SELECT t.number || ' ' || p.rung || ' ' || p.reason FROM salus_priority p \
         JOIN trials t USING (trial_id) WHERE p.reason IN ('paused', 'promoted')",
    );
    for t in rows {
        let last = t.intermediate.last().map_or(0, |(s, _)| *s);
        for (rung, step) in rung_steps.iter().enumerate() {
            let count = |reason: &str| {
                let mark = format!("{} {rung} {reason}", t.number);
                marks.iter().filter(|m| **m == mark).count()
            };
            let (paused, promoted) = (count("paused"), count("promoted"));
            assert!(promoted <= paused, "trial {}: promoted unpaused", t.number);
            if paused > 0 {
                assert_eq!(
                    promoted > 0,
                    last > *step,
                    "trial {} paused at rung {rung} (step {step}), last step {last}",
                    t.number
                );
            }
        }
    }
    for &step in rung_steps {
        let mut at: Vec<(f64, i64)> = rows
            .iter()
            .filter_map(|t| {
                let v = t.intermediate.iter().find(|(s, _)| *s == step)?.1;
                Some((v, t.intermediate.last()?.0))
            })
            .collect();
        at.sort_by(|a, b| a.0.total_cmp(&b.0));
        if maximize {
            at.reverse();
        }
        for (v, last) in &at[..at.len() / 2] {
            assert!(
                *last > step,
                "{v} at step {step}, in the better half, stopped there: {at:?}"
            );
        }
    }
}

/// A study file for a test, built section by section: the one builder
/// of the test modules (files that must be malformed are written out as
/// text instead). Values are TOML as written (`"\"adam\""`, `"{ int =
/// [1, 4] }"`); sections and keys keep the order they were first set in.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyFile {
    sections: Vec<(String, Vec<(String, String)>)>,
    /// Text after the sections (a `[data]` table given whole, say).
    tail: String,
}

impl StudyFile {
    /// `[study]` with its name, trial budget and seed, and nothing else.
    pub fn new(name: &str, trials: u64, seed: u64) -> Self {
        StudyFile {
            sections: Vec::new(),
            tail: String::new(),
        }
        .set("study", "name", &format!("\"{name}\""))
        .set("study", "trials", &trials.to_string())
        .set("study", "seed", &seed.to_string())
    }

    /// The small, fast digits MLP most tests train: one hidden layer of 16
    /// or 32, SGD (with momentum) or Adam, a log-uniform learning rate,
    /// three epochs.
    pub fn digits(name: &str, trials: u64) -> Self {
        Self::new(name, trials, 3)
            .set("model", "depth", "1")
            .set("model", "width", "{ choices = [16, 32] }")
            .set("train", "optimizer", "{ choices = [\"sgd\", \"adam\"] }")
            .set("train", "lr", "{ float = [1e-3, 1e-1], log = true }")
            .set("train", "batch_size", "64")
            .set("train", "epochs", "3")
            .set("train.sgd", "momentum", "{ float = [0.5, 0.95] }")
    }

    /// Sets `key` of `[section]` to the TOML `value`.
    pub fn set(mut self, section: &str, key: &str, value: &str) -> Self {
        let i = match self.sections.iter().position(|(s, _)| s == section) {
            Some(i) => i,
            None => {
                self.sections.push((section.to_string(), Vec::new()));
                self.sections.len() - 1
            }
        };
        let keys = &mut self.sections[i].1;
        match keys.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value.to_string(),
            None => keys.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// Removes `key` of `[section]`, and the section once it is empty.
    pub fn without(mut self, section: &str, key: &str) -> Self {
        for (s, keys) in &mut self.sections {
            if s == section {
                keys.retain(|(k, _)| k != key);
            }
        }
        self.sections.retain(|(_, keys)| !keys.is_empty());
        self
    }

    /// Appends TOML text after the sections.
    pub fn with_text(mut self, text: &str) -> Self {
        self.tail.push_str(text);
        self
    }

    /// The file's text.
    pub fn build(&self) -> String {
        let mut out = String::new();
        for (section, keys) in &self.sections {
            out += &format!("[{section}]\n");
            for (k, v) in keys {
                out += &format!("{k} = {v}\n");
            }
            out += "\n";
        }
        out + &self.tail
    }
}

/// [`StudyFile::digits`]' text.
pub fn small_study(name: &str, trials: u64) -> String {
    StudyFile::digits(name, trials).build()
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

/// A database for `test`: a SQLite file in `dir`, or a new database in a
/// throwaway PostgreSQL cluster (`None` where PostgreSQL is missing).
pub fn database(
    dir: &Path,
    test: &str,
    postgres: bool,
) -> Option<(TestDb, Option<postgres::Cluster>)> {
    if !postgres {
        return Some((TestDb::Sqlite(dir.join(format!("{test}.db"))), None));
    }
    let cluster = postgres::Cluster::start(test)?;
    let url = cluster.database(test);
    Some((TestDb::Postgres(url), Some(cluster)))
}

/// A study's database as a test reads it, as another process would:
/// a SQLite file, or a PostgreSQL database (see [`postgres::Cluster`]).
pub enum TestDb {
    Sqlite(PathBuf),
    Postgres(String),
}

impl TestDb {
    /// The storage URL to give salus-tune.
    pub fn url(&self) -> String {
        match self {
            TestDb::Sqlite(path) => path.display().to_string(),
            TestDb::Postgres(url) => url.clone(),
        }
    }

    pub fn dialect(&self) -> Dialect {
        match self {
            TestDb::Sqlite(_) => Dialect::Sqlite,
            TestDb::Postgres(_) => Dialect::Postgres,
        }
    }

    async fn connect(&self) -> sqlx::AnyConnection {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let url = match self {
            TestDb::Sqlite(path) => format!("sqlite://{}", path.display()),
            TestDb::Postgres(url) => url.replacen("postgresql://", "postgres://", 1),
        };
        sqlx::AnyConnection::connect(&url).await.unwrap()
    }

    /// Holds the lock every writer needs (on SQLite the database's write
    /// lock, as a process stopped inside its transaction would; on
    /// PostgreSQL the studies' rows) for `hold`, as another process would;
    /// calls `taken` once it is held, and answers the local time (as the
    /// writers stamp trials) just before it is let go.
    pub fn hold_the_writers_lock(&self, hold: Duration, taken: impl FnOnce()) -> String {
        let take = match self {
            TestDb::Sqlite(_) => "BEGIN IMMEDIATE",
            TestDb::Postgres(_) => "BEGIN; SELECT study_id FROM studies FOR UPDATE",
        };
        block_on(async {
            let mut conn = self.connect().await;
            sqlx::raw_sql(take).execute(&mut conn).await.unwrap();
            taken();
            tokio::time::sleep(hold).await;
            sqlx::raw_sql("SELECT 1").execute(&mut conn).await.unwrap();
            let released = salus_tune::storage::now();
            sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
            released
        })
    }

    /// Every trial of the only (or named) study, as stored ([`as_stored`]).
    pub fn trials(&self, study: Option<&str>) -> Vec<TrialRow> {
        as_stored(block_on(async {
            let mut store = Store::open_existing(&self.url()).await.unwrap();
            let info = store.pick_study(study).await.unwrap();
            store.trials(info.id).await.unwrap()
        }))
    }

    /// A single integer a query answers (SQL in SQLite's form, `?`-free).
    pub fn scalar(&self, sql: &str) -> i64 {
        if let TestDb::Sqlite(path) = self {
            return scalar(path, sql);
        }
        block_on(async {
            let mut conn = self.connect().await;
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
    }

    /// Most trials alive at once where a trial numbered `from` to `to`
    /// starts, by the times Optuna's table stores.
    pub fn most_alive_at_once(&self, from: i64, to: i64) -> i64 {
        self.scalar(&format!(
            "SELECT MAX(c) FROM (SELECT (SELECT COUNT(*) FROM trials b \
             WHERE b.datetime_start <= a.datetime_start AND b.datetime_complete > a.datetime_start) AS c \
             FROM trials a WHERE a.number BETWEEN {from} AND {to}) AS alive"
        ))
    }

    /// Runs one statement, as another process would.
    pub fn execute(&self, sql: &str) {
        if let TestDb::Sqlite(path) = self {
            return execute(path, sql);
        }
        block_on(async {
            let mut conn = self.connect().await;
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        })
    }

    /// Whether process `pid` (a salus-tune) may hold a write lock now: on
    /// SQLite, whether anyone holds the write lock; on PostgreSQL, whether
    /// any of `pid`'s connections (its `application_name`) is not idle,
    /// a statement in flight or a transaction open.
    pub fn write_held(&self, pid: u32) -> bool {
        match self {
            TestDb::Sqlite(path) => block_on(async {
                use sqlx::ConnectOptions;
                let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(path)
                    .busy_timeout(Duration::ZERO)
                    .connect()
                    .await
                    .unwrap();
                let held = sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut conn)
                    .await
                    .is_err();
                if !held {
                    sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
                }
                held
            }),
            TestDb::Postgres(_) => {
                self.scalar(&format!(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
                     AND datname = current_database() \
                     AND application_name = 'salus-tune-{pid}' AND state <> 'idle'"
                )) > 0
            }
        }
    }

    /// The text column of every row a query answers.
    pub fn texts(&self, sql: &str) -> Vec<String> {
        block_on(async {
            let mut conn = self.connect().await;
            sqlx::query_scalar::<_, String>(sql)
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
    }

    /// Whether the database holds every table yet: a run creates the
    /// database first and its tables a moment later.
    pub fn migrated(&self) -> bool {
        match self {
            TestDb::Sqlite(path) => migrated(path),
            TestDb::Postgres(_) => {
                self.scalar(
                    "SELECT COUNT(*) FROM information_schema.tables \
                     WHERE table_schema = current_schema() AND table_name = 'salus_claims'",
                ) == 1
            }
        }
    }
}

/// Exploits stored in a PBT study's database (0 before it exists).
pub fn pbt_events(db: &Path) -> i64 {
    if migrated(db) {
        scalar(db, "SELECT COUNT(*) FROM salus_pbt_events")
    } else {
        0
    }
}

/// Runs `file` in `dir` and kills it (`kill -9`) once `db` holds
/// `exploits` PBT exploits; it must not have ended by then.
pub fn kill_after_exploits(dir: &Path, file: &str, db: &Path, exploits: i64) {
    let child = Running::spawn(bin().current_dir(dir).args([file, "--no-progress"]));
    wait_until("a few exploits", Duration::from_secs(120), || {
        pbt_events(db) >= exploits
    });
    let out = child.kill();
    assert_ne!(
        out.status.code(),
        Some(0),
        "killed before the end: {}",
        text(&out)
    );
}

/// The Python the tests run workers and anchors with: `SALUS_TUNE_PYTHON`
/// (scripts/test.sh's `.venv`), else `python3`.
pub fn python() -> String {
    std::env::var("SALUS_TUNE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether [`python`] can `import` `modules` (say `"torch, sklearn"`).
/// When it cannot, `test` fails if `require` (an environment variable that
/// scripts/test.sh sets) is set, else it prints that it is skipped.
pub fn python_imports(test: &str, modules: &str, require: &str) -> bool {
    let ok = Command::new(python())
        .args(["-c", &format!("import {modules}")])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var_os(require).is_some() {
            panic!(
                "{test}: {} cannot import {modules} (scripts/test.sh installs them)",
                python()
            );
        }
        eprintln!("{test}: skipped: {} cannot import {modules}", python());
    }
    ok
}

/// Sends `sig` (`STOP`, `CONT`, `KILL`) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// Waits (up to 5 s) until every thread of process `pid` is stopped, as
/// `/proc` tells it (state `T`).
pub fn wait_stopped(pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let all_stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true; // gone
        };
        tasks.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("stat")).map_or(true, |stat| {
                // The state follows the command name's closing parenthesis.
                let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
                matches!(state.and_then(|r| r.chars().next()), Some('T' | 't'))
            })
        })
    };
    while !all_stopped() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Stops process `pid` (SIGSTOP) at a moment it holds no write transaction
/// of `db` open, so that other processes are not blocked while it stands
/// still; it is the only writer then.
pub fn stop_between_writes(pid: u32, db: &TestDb) {
    if let TestDb::Postgres(_) = db {
        let named = db.scalar(&format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'salus-tune-{pid}'"
        ));
        assert!(named > 0, "process {pid} has no connection named for it");
    }
    for _ in 0..1000 {
        signal(pid, "STOP");
        // A stop lands when each thread is next scheduled: a thread still
        // running after `kill` returned could take the lock after the check.
        wait_stopped(pid);
        if !db.write_held(pid) {
            return;
        }
        signal(pid, "CONT");
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("process {pid} held a write transaction every time it was stopped");
}
