//! Reliability end to end: kill -9 at random moments loses nothing, a
//! killed or stopped trial (lone, fused, or paused out of its group)
//! resumes from its checkpoint, heartbeats tell a
//! dead process's trials from a live one's, and a study, the dashboard and
//! readers share one database without a lock error.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use salus_tune::storage::{TrialRow, TrialState};

fn spawn(dir: &Path, args: &[&str]) -> Running {
    Running::spawn(bin().current_dir(dir).args(args))
}

fn signal(child: &Running, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn integrity_ok(db: &Path) {
    assert_eq!(
        scalar_text(db, "PRAGMA integrity_check").as_deref(),
        Some("ok")
    );
}

/// A finished trial's state, value and curve, as bits.
type Stored = (TrialState, Option<u64>, Vec<(i64, u64)>);

/// What a finished trial stored: it must never change afterwards.
fn finished(db: &Path) -> BTreeMap<i64, Stored> {
    trials(db, None)
        .into_iter()
        .filter(|t| t.state.is_finished())
        .map(|t| {
            let curve = t
                .intermediate
                .iter()
                .map(|&(s, v)| (s, v.to_bits()))
                .collect();
            (t.number.0, (t.state, t.value.map(f64::to_bits), curve))
        })
        .collect()
}

fn study(name: &str, trials: u64, epochs: u64, width: &str) -> String {
    StudyFile::digits(name, trials)
        .set("study", "seed", "4")
        .set("study", "metric", "\"val_loss\"")
        .set("model", "depth", "2")
        .set("model", "width", width)
        .set("train", "lr", "{ float = [1e-3, 3e-2], log = true }")
        .set("train", "epochs", &epochs.to_string())
        .set("train.sgd", "momentum", "0.9")
        .set("scheduler", "max_concurrent", "3")
        .set("scheduler", "fuse", "1")
        .build()
}

#[test]
fn ten_kills_at_random_moments_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "k.toml",
        &study("kills", 8, 150, "{ choices = [64, 128] }"),
    );
    let db = dir.path().join("kills.db");
    let mut rng = StdRng::seed_from_u64(9);
    let mut seen: BTreeMap<i64, Stored> = BTreeMap::new();
    let mut kills = 0;
    let values = |db: &Path| {
        if migrated(db) {
            scalar(db, "SELECT COUNT(*) FROM trial_intermediate_values")
        } else {
            0
        }
    };
    for _ in 0..10 {
        // Each kill lands after the run has made progress of its own (a new
        // value stored), at a random moment after that: a state read from
        // the database, not a guess at how long start-up takes.
        let before = values(&db);
        let mut child = spawn(dir.path(), &["k.toml", "--no-progress"]);
        wait_until("progress to kill", Duration::from_secs(60), || {
            values(&db) > before || child.try_wait().is_some()
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(0..400)));
        if child.try_wait().is_none() {
            signal(&child, "-9");
            kills += 1;
        }
        child.wait();
        if !migrated(&db) {
            continue;
        }
        integrity_ok(&db);
        let now = finished(&db);
        for (n, before) in &seen {
            assert_eq!(
                now.get(n),
                Some(before),
                "finished trial {n} changed after a kill"
            );
        }
        seen = now;
    }
    assert!(kills >= 5, "only {kills} kills landed while the study ran");
    let out = run_in(dir.path(), &["k.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    integrity_ok(&db);
    let all = trials(&db, None);
    assert_eq!(all.len(), 8, "exactly the budget, no duplicates");
    assert_eq!(
        all.iter().map(|t| t.number.0).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    for t in &all {
        assert!(t.state.is_finished(), "trial {} is {:?}", t.number, t.state);
        let steps: Vec<i64> = t.intermediate.iter().map(|&(s, _)| s).collect();
        assert!(
            steps.windows(2).all(|w| w[0] < w[1]),
            "trial {}: {steps:?}",
            t.number
        );
        if t.state == TrialState::Complete {
            assert_eq!(steps, (1..=150).collect::<Vec<_>>(), "trial {}", t.number);
        }
    }
    let now = finished(&db);
    for (n, before) in &seen {
        assert_eq!(now.get(n), Some(before), "finished trial {n} changed");
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join("kills.db.checkpoints")).map_or(0, |d| d.count()),
        0,
        "no checkpoint outlives its trial"
    );
}

fn values(rows: &[TrialRow]) -> Vec<(i64, Vec<(i64, f64)>)> {
    rows.iter()
        .map(|t| (t.number.0, t.intermediate.clone()))
        .collect()
}

/// A trial killed (or stopped) mid-run continues from its checkpoint and
/// ends exactly where an uninterrupted run ends. With `broken`, its
/// checkpoint files are unreadable by the rerun: it restarts from zero,
/// and still ends where the uninterrupted run ends.
fn resumes_from_checkpoint(stop: &str, fused: bool, broken: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut body = study("ckpt", 2, 30, "256");
    if fused {
        // One optimizer family and fusion on: the two trials form a group.
        body = body
            .replace(
                "optimizer = { choices = [\"sgd\", \"adam\"] }",
                "optimizer = \"adam\"",
            )
            .replace("[train.sgd]\nmomentum = 0.9\n", "")
            .replace("fuse = 1", "fuse = 4");
    }
    write(dir.path(), "c.toml", &body);
    let db = dir.path().join("ckpt.db");
    let ckpts = dir.path().join("ckpt.db.checkpoints");
    let child = spawn(dir.path(), &["c.toml", "--no-progress"]);
    let start = Instant::now();
    // Wait until both trials have a checkpoint and a few epochs done.
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no checkpoint appeared"
        );
        // Checkpoints in place (not staged files, not `.prev` ones), and
        // steps stored for both trials (a trial with none has no group:
        // MIN alone would overlook it).
        let n = std::fs::read_dir(&ckpts).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "state"))
            })
            .count()
        });
        let steps = if migrated(&db) {
            scalar(
                &db,
                "SELECT CASE WHEN COUNT(*) = 2 THEN MIN(c) ELSE 0 END \
                 FROM (SELECT COUNT(*) c FROM trial_intermediate_values GROUP BY trial_id)",
            )
        } else {
            0
        };
        if n == 2 && steps >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, stop);
    let status = child.wait().status;
    if stop == "-TERM" {
        assert_eq!(status.code(), Some(130), "a stop at the next boundary");
    }
    integrity_ok(&db);
    let requeued = trials(&db, None);
    assert!(
        requeued.iter().all(|t| !t.state.is_finished()),
        "{requeued:?}"
    );
    if broken {
        for e in std::fs::read_dir(&ckpts).unwrap() {
            std::fs::write(e.unwrap().path(), b"not a checkpoint").unwrap();
        }
    }
    let out = run_in(dir.path(), &["c.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    if fused {
        let groups = scalar(
            &db,
            "SELECT COUNT(*) FROM trial_system_attributes WHERE key = 'salus:fused_with'",
        );
        assert_eq!(groups, 2, "both trials ran as one group");
    }
    let kept: i64 = scalar(
        &db,
        "SELECT COALESCE(MIN(json_extract(detail, '$.kept_steps')), 0) FROM salus_events WHERE kind = 'trial_requeue'",
    );
    if broken {
        // The rerun requeued them finding no readable checkpoint: nothing kept.
        let kept_most: i64 = scalar(
            &db,
            "SELECT COALESCE(MAX(json_extract(detail, '$.kept_steps')), -1) FROM salus_events WHERE kind = 'trial_requeue'",
        );
        assert_eq!(kept_most, 0, "both trials restarted from zero");
    } else {
        assert!(kept >= 1, "both trials resumed from a checkpoint");
    }
    // The same study, never interrupted, gives the same curves.
    let clean = tempfile::tempdir().unwrap();
    write(clean.path(), "c.toml", &body);
    let out = run_in(clean.path(), &["c.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (resumed, straight) = (
        trials(&db, None),
        trials(&clean.path().join("ckpt.db"), None),
    );
    for ((n, a), (_, b)) in values(&resumed).into_iter().zip(values(&straight)) {
        assert_eq!(a.len(), 30, "trial {n}: every epoch once");
        for ((s, x), (_, y)) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-9 * y.abs().max(1.0),
                "trial {n} step {s}: resumed {x}, straight {y}"
            );
        }
    }
    assert!(!ckpts.exists() || std::fs::read_dir(&ckpts).unwrap().count() == 0);
}

#[test]
fn a_killed_trial_resumes_from_its_checkpoint() {
    resumes_from_checkpoint("-9", false, false);
}

#[test]
fn a_killed_trial_with_an_unreadable_checkpoint_restarts_from_zero() {
    resumes_from_checkpoint("-9", false, true);
}

#[test]
fn a_killed_fused_group_resumes_its_members_from_their_checkpoints() {
    resumes_from_checkpoint("-9", true, false);
}

#[test]
fn sigterm_stops_at_a_boundary_with_checkpoints_and_resumes() {
    resumes_from_checkpoint("-TERM", true, false);
}

/// SIGTERM while ASHA has members paused out of their groups (waiting on
/// the host): they go back to WAITING with their checkpoints like running
/// ones, and the rerun ends the study with every curve whole and equal to
/// an unfused, uninterrupted run's.
#[test]
fn sigterm_with_members_paused_out_of_their_groups_resumes_them() {
    let dir = tempfile::tempdir().unwrap();
    let body = study("parked", 6, 30, "128")
        .replace(
            "optimizer = { choices = [\"sgd\", \"adam\"] }",
            "optimizer = \"adam\"",
        )
        .replace("[train.sgd]\nmomentum = 0.9\n", "")
        .replace(
            "max_concurrent = 3\nfuse = 1",
            "max_concurrent = 6\nfuse = 4",
        )
        + "\n[pruner]\nkind = \"asha\"\nmin_resource = 2\nreduction_factor = 3\n";
    write(dir.path(), "p.toml", &body);
    let db = dir.path().join("parked.db");
    let child = spawn(dir.path(), &["p.toml", "--no-progress"]);
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < Duration::from_secs(60), "no trial paused");
        if migrated(&db)
            && scalar(
                &db,
                "SELECT COUNT(*) FROM salus_priority WHERE reason = 'paused'",
            ) >= 1
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, "-TERM");
    let status = child.wait().status;
    integrity_ok(&db);
    let unfinished = trials(&db, None)
        .iter()
        .filter(|t| !t.state.is_finished())
        .count();
    assert!(
        status.code() == Some(130) && unfinished > 0,
        "stopped mid-study: {status:?}, {unfinished} unfinished"
    );
    let parked_kept = scalar(
        &db,
        "SELECT COUNT(*) FROM salus_events WHERE kind = 'trial_requeue' \
         AND json_extract(detail, '$.kept_steps') >= 1 \
         AND trial_id IN (SELECT trial_id FROM salus_priority WHERE reason = 'paused')",
    );
    assert!(parked_kept >= 1, "a paused member kept its steps");
    let out = run_in(dir.path(), &["p.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let clean = tempfile::tempdir().unwrap();
    write(
        clean.path(),
        "p.toml",
        &body.replace(
            "max_concurrent = 6\nfuse = 4",
            "max_concurrent = 6\nfuse = 1",
        ),
    );
    let out = run_in(clean.path(), &["p.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (resumed, straight) = (
        trials(&db, None),
        trials(&clean.path().join("parked.db"), None),
    );
    assert_eq!(resumed.len(), 6);
    for (t, u) in resumed.iter().zip(&straight) {
        assert!(t.state.is_finished(), "trial {}: {:?}", t.number, t.state);
        let steps: Vec<i64> = t.intermediate.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            steps,
            (1..=steps.len() as i64).collect::<Vec<_>>(),
            "trial {}: every step once",
            t.number
        );
        for ((s, x), (_, y)) in t.intermediate.iter().zip(&u.intermediate) {
            assert!(
                (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                "trial {} step {s}: resumed {x}, straight {y}",
                t.number
            );
        }
    }
}

/// On SQLite, and on PostgreSQL where the other host's heartbeats are
/// written by the database's clock, as a real process there writes them.
fn heartbeats_tell_a_dead_process_from_a_live_one(postgres: bool) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "h.toml", &study("beats", 3, 200, "256"));
    let cluster = if postgres {
        let Some(c) = crate::common::postgres::Cluster::start("heartbeats") else {
            return;
        };
        Some(c)
    } else {
        None
    };
    let db = match &cluster {
        Some(c) => TestDb::Postgres(c.database("beats")),
        None => TestDb::Sqlite(dir.path().join("beats.db")),
    };
    let url = db.url();
    let beat_now = match &db {
        TestDb::Sqlite(_) => format!("'{}'", salus_tune::storage::now()),
        TestDb::Postgres(_) => "LOCALTIMESTAMP".to_string(),
    };
    let child = spawn(dir.path(), &["h.toml", "--no-progress", "--storage", &url]);
    let start = Instant::now();
    while !(db.migrated() && db.scalar("SELECT COUNT(*) FROM trial_heartbeats") >= 3) {
        assert!(start.elapsed() < Duration::from_secs(30), "no heartbeats");
        std::thread::sleep(Duration::from_millis(50));
    }
    let snap = block_on(salus_tune::dash::read(&url, None)).unwrap();
    assert!(snap.running, "the dashboard sees the live run");
    signal(&child, "-9");
    child.wait();
    let snap = block_on(salus_tune::dash::read(&url, None)).unwrap();
    assert!(!snap.running, "a killed run shows as stopped at once");
    // Pretend another process, on another host, still runs trial 0: its
    // run beats (a thread here keeps it fresh) and holds the trial.
    let set = |sql: &str| db.execute(sql);
    set(&format!(
        "INSERT INTO salus_runs (study_id, started_at, device, policy, lanes, threads_per_lane, budget_bytes, \
         host, pid, process_index, heartbeat) SELECT study_id, started_at, device, policy, lanes, threads_per_lane, \
         budget_bytes, 'another-host', 1, 1, {beat_now} FROM salus_runs LIMIT 1"
    ));
    set(
        "UPDATE salus_claims SET run_id = (SELECT MAX(run_id) FROM salus_runs) \
         WHERE trial_id = (SELECT trial_id FROM trials WHERE number = 0)",
    );
    let beating = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let beat = {
        let (beating, url, postgres) = (beating.clone(), url.clone(), postgres);
        std::thread::spawn(move || {
            let db = if postgres {
                TestDb::Postgres(url)
            } else {
                TestDb::Sqlite(url.into())
            };
            while beating.load(std::sync::atomic::Ordering::SeqCst) {
                let now = match &db {
                    TestDb::Sqlite(_) => format!("'{}'", salus_tune::storage::now()),
                    TestDb::Postgres(_) => "LOCALTIMESTAMP".to_string(),
                };
                db.execute(&format!(
                    "UPDATE salus_runs SET heartbeat = {now} WHERE host = 'another-host'"
                ));
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    // Trials 1 and 2 are the killed process's (its pid is gone): this run
    // takes them at once. Trial 0 is the live one's: left alone, and the
    // run waits for it, as every process waits for the study to be done.
    let mut run = Running::spawn(bin().current_dir(dir.path()).args([
        "h.toml",
        "--no-progress",
        "--trials",
        "3",
        "--storage",
        &url,
    ]));
    let t0 = Instant::now();
    while db.scalar("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'") < 2 {
        assert!(run.try_wait().is_none(), "the run ended early");
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "trials 1 and 2 did not finish"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let rows = db.trials(None);
    assert_eq!(
        rows[0].state,
        TrialState::Running,
        "a live process's trial is left alone"
    );
    assert!(
        rows[1..].iter().all(|t| t.state == TrialState::Complete),
        "{rows:?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        run.try_wait().is_none(),
        "the run waits for the study to be done"
    );
    // The other process dies: once its heartbeat is stale, the waiting run
    // requeues its trial (once) and finishes the study.
    beating.store(false, std::sync::atomic::Ordering::SeqCst);
    beat.join().unwrap();
    let out = run.wait();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        db.trials(None)
            .iter()
            .all(|t| t.state == TrialState::Complete)
    );
    let requeues: i64 = db.scalar("SELECT COUNT(*) FROM salus_events WHERE kind = 'trial_requeue'");
    assert_eq!(requeues, 3, "each orphan was requeued once");
}

#[test]
fn heartbeats_tell_a_dead_process_from_a_live_one_on_sqlite() {
    heartbeats_tell_a_dead_process_from_a_live_one(false);
}

#[test]
fn heartbeats_tell_a_dead_process_from_a_live_one_on_postgres() {
    heartbeats_tell_a_dead_process_from_a_live_one(true);
}

#[test]
fn a_study_the_dashboard_and_readers_share_the_database_for_60_seconds() {
    let secs: u64 = std::env::var("SALUS_TUNE_CONCURRENCY_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "c.toml",
        &study("shared", 10_000, 3, "{ int = [16, 128], log = true }"),
    );
    let db = dir.path().join("shared.db");
    let url = db.display().to_string();
    let child = spawn(dir.path(), &["c.toml", "--no-progress"]);
    let start = Instant::now();
    wait_until("the study's row", Duration::from_secs(60), || {
        migrated(&db) && scalar(&db, "SELECT COUNT(*) FROM studies") == 1
    });
    let (mut reads, mut snaps) = (0, 0);
    let mut read_errors = Vec::new();
    while start.elapsed() < Duration::from_secs(secs) {
        // The dashboard's read, then the two read commands. A failed read
        // (a "database is locked" among them) is counted, not skipped.
        match block_on(salus_tune::dash::read(&url, None)) {
            Ok(s) => {
                assert_eq!(s.study, "shared");
                snaps += 1;
            }
            Err(e) => read_errors.push(e.to_string()),
        }
        for cmd in ["trials", "best"] {
            let out = run_in(dir.path(), &[cmd, "c.toml"]);
            let t = text(&out);
            assert!(!t.contains("locked"), "{cmd}: {t}");
            assert!(
                out.status.code() == Some(0) || t.contains("no complete trial yet"),
                "{cmd}: {t}"
            );
            reads += 1;
        }
    }
    signal(&child, "-TERM");
    let out = child.wait();
    assert!(
        read_errors.is_empty(),
        "{} of {} dashboard reads failed, first: {:?}",
        read_errors.len(),
        snaps + read_errors.len(),
        read_errors.first()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("locked"), "{stderr}");
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let max_ms: f64 = scalar_text(
        &db,
        "SELECT CAST(json_extract(detail, '$.writer_max_ms') AS TEXT) FROM salus_events WHERE kind = 'study_stop' ORDER BY event_id DESC LIMIT 1",
    )
    .unwrap()
    .parse()
    .unwrap();
    let over: i64 = scalar(
        &db,
        "SELECT json_extract(detail, '$.writer_over_100ms') FROM salus_events WHERE kind = 'study_stop' ORDER BY event_id DESC LIMIT 1",
    );
    let done: i64 = scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'");
    println!(
        "{secs} s: {done} trials finished, {snaps} dashboard reads, {reads} trials/best calls; \
         writer: longest transaction {max_ms:.1} ms, {over} over 100 ms"
    );
    assert!(done > 0 && snaps > 10 && reads > 10);
    integrity_ok(&db);
}
