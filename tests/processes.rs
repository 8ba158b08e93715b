//! Many processes on one study, as users start them (one per GPU, one per
//! machine, or a second terminal), on SQLite and on PostgreSQL: trials are
//! numbered, claimed and counted in the database, so the study gets
//! exactly its target, no trial runs twice, and a killed process's trials
//! are finished by the others from their checkpoints.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use salus_tune::storage::TrialState;

fn study(name: &str, trials: u64, epochs: u64) -> String {
    format!(
        "[study]\nname = \"{name}\"\ntrials = {trials}\nseed = 5\n\n\
         [model]\ndepth = 1\nwidth = {{ choices = [16, 32] }}\n\n\
         [train]\noptimizer = {{ choices = [\"sgd\", \"adam\"] }}\nlr = {{ float = [1e-3, 1e-1], log = true }}\n\
         batch_size = 64\nepochs = {epochs}\n\n[scheduler]\nmax_concurrent = 2\nlanes = 1\n"
    )
}

fn start(dir: &Path, n: usize, db: &TestDb) -> Vec<Running> {
    (0..n)
        .map(|_| {
            Running::spawn(bin().current_dir(dir).args([
                "s.toml",
                "--no-progress",
                "--storage",
                &db.url(),
            ]))
        })
        .collect()
}

/// The study holds exactly `target` trials, all finished, numbered 0..target
/// once each, and no two with the same parameters.
fn exactly(db: &TestDb, target: usize) {
    let rows = db.trials(None);
    let numbers: Vec<i64> = rows.iter().map(|t| t.number.0).collect();
    assert_eq!(numbers, (0..target as i64).collect::<Vec<_>>());
    assert!(
        rows.iter().all(|t| t.state.is_finished()),
        "{:?}",
        rows.iter().map(|t| t.state).collect::<Vec<_>>()
    );
    let params: BTreeSet<String> = rows.iter().map(|t| format!("{:?}", t.params)).collect();
    let runs = db.texts(
        "SELECT CAST(t.number AS TEXT) || ' run ' || CAST(c.run_id AS TEXT) || ' index ' || \
         CAST(r.process_index AS TEXT) FROM trials t JOIN salus_claims c ON c.trial_id = t.trial_id \
         JOIN salus_runs r ON r.run_id = c.run_id ORDER BY t.number",
    );
    assert_eq!(
        params.len(),
        target,
        "two trials with the same parameters: {:#?}\nclaims: {runs:?}",
        rows.iter()
            .map(|t| (t.number.0, &t.params))
            .collect::<Vec<_>>()
    );
}

/// A database for `test`: a SQLite file in `dir`, or a new database in a
/// throwaway PostgreSQL cluster (`None` where PostgreSQL is missing).
fn database(dir: &Path, test: &str, postgres: bool) -> Option<(TestDb, Option<postgres::Cluster>)> {
    if !postgres {
        return Some((TestDb::Sqlite(dir.join(format!("{test}.db"))), None));
    }
    let cluster = postgres::Cluster::start(test)?;
    let url = cluster.database(test);
    Some((TestDb::Postgres(url), Some(cluster)))
}

fn four_processes_at_once_make_exactly_the_target(postgres: bool) {
    let dir = tempfile::tempdir().unwrap();
    let Some((db, _cluster)) = database(dir.path(), "many", postgres) else {
        return;
    };
    write(dir.path(), "s.toml", &study("many", 24, 2));
    for (i, p) in start(dir.path(), 4, &db).into_iter().enumerate() {
        let out = p.wait();
        assert_eq!(out.status.code(), Some(0), "process {i}: {}", text(&out));
    }
    exactly(&db, 24);
    assert!(
        db.trials(None)
            .iter()
            .all(|t| t.state == TrialState::Complete)
    );
    // Each process drew from its own stream: distinct indices while alive.
    let indices = db.scalar("SELECT COUNT(DISTINCT process_index) FROM salus_runs");
    assert!(indices >= 2, "{indices} process indices");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM salus_runs WHERE ended IS NULL"),
        0,
        "every run ended cleanly"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM trials WHERE CAST(state AS TEXT) = 'RUNNING'"),
        0
    );
}

#[test]
fn four_processes_at_once_make_exactly_the_target_on_sqlite() {
    four_processes_at_once_make_exactly_the_target(false);
}

#[test]
fn four_processes_at_once_make_exactly_the_target_on_postgres() {
    four_processes_at_once_make_exactly_the_target(true);
}

/// Three processes; the first is killed (`kill -9`) once it has
/// checkpointed a trial it holds. On PostgreSQL the checkpoints are in a
/// `[study] checkpoints` folder, as processes on several machines share one.
fn a_killed_process_s_trials_are_requeued_once_and_finished_by_the_others(postgres: bool) {
    let dir = tempfile::tempdir().unwrap();
    let Some((db, _cluster)) = database(dir.path(), "kill", postgres) else {
        return;
    };
    let (body, checkpoints) = if postgres {
        (
            study("kill", 12, 30).replace("[study]\n", "[study]\ncheckpoints = \"shared/ckpt\"\n"),
            dir.path().join("shared/ckpt"),
        )
    } else {
        (
            study("kill", 12, 30),
            dir.path().join("kill.db.checkpoints"),
        )
    };
    write(dir.path(), "s.toml", &body);
    let mut procs = start(dir.path(), 3, &db);
    // Wait until the first process has checkpointed a trial it holds.
    let victim_pid = procs[0].id() as i64;
    let t0 = Instant::now();
    let checkpointed = || {
        db.migrated()
            && db
                .texts(&format!(
                    "SELECT CAST(c.trial_id AS TEXT) FROM salus_claims c JOIN salus_runs r ON r.run_id = c.run_id \
                     JOIN trials t ON t.trial_id = c.trial_id \
                     WHERE r.pid = {victim_pid} AND CAST(t.state AS TEXT) = 'RUNNING'"
                ))
                .iter()
                .any(|id| checkpoints.join(format!("trial-{id}.state")).is_file())
    };
    while !checkpointed() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no report from the victim"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    procs.remove(0).kill();
    for (i, p) in procs.into_iter().enumerate() {
        let out = p.wait();
        assert_eq!(
            out.status.code(),
            Some(0),
            "process {}: {}",
            i + 1,
            text(&out)
        );
    }
    exactly(&db, 12);
    // Each of the victim's trials was requeued exactly once, and at least
    // one continued from its checkpoint (kept steps).
    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM (SELECT trial_id FROM salus_events WHERE kind = 'trial_requeue' \
             GROUP BY trial_id HAVING COUNT(*) > 1) AS twice"
        ),
        0
    );
    let kept = db.dialect().json_member("detail", "kept_steps");
    assert!(
        db.scalar(&format!(
            "SELECT COUNT(*) FROM salus_events WHERE kind = 'trial_requeue' \
             AND CAST({kept} AS INTEGER) >= 1"
        )) >= 1,
        "a requeued trial resumed from its checkpoint"
    );
}

#[test]
fn a_killed_process_s_trials_are_requeued_once_and_finished_by_the_others_on_sqlite() {
    a_killed_process_s_trials_are_requeued_once_and_finished_by_the_others(false);
}

#[test]
fn a_killed_process_s_trials_are_requeued_once_and_finished_by_the_others_on_postgres() {
    a_killed_process_s_trials_are_requeued_once_and_finished_by_the_others(true);
}

#[test]
fn the_readme_s_one_process_per_gpu_loop_runs_the_study() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &study("loop", 8, 2));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/one-process-per-gpu.sh");
    // `salus-tune` on the PATH is this build's binary.
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_salus-tune"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = output_of(
        std::process::Command::new("bash")
            .arg(&script)
            .args(["s.toml", "3"])
            .current_dir(dir.path())
            .env("PATH", path)
            .env("DEVICE_PREFIX", "cpu")
            .env_remove("SALUS_TUNE_STORAGE"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for i in 0..3 {
        let log = std::fs::read_to_string(dir.path().join(format!("gpu-{i}.log"))).unwrap();
        assert!(log.contains("results: loop.db"), "process {i}: {log}");
    }
    exactly(&TestDb::Sqlite(dir.path().join("loop.db")), 8);
}

/// `PATH` with this build's `salus-tune` first, as the examples call it.
fn path_with_this_build() -> String {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_salus-tune"))
        .parent()
        .unwrap();
    format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The Slurm job array's script and the Kubernetes Indexed Job's command
/// line, as the files under `examples/` have them, each started twice at
/// once (two array tasks, two pods) on one study in PostgreSQL.
#[test]
fn the_slurm_array_and_the_kubernetes_indexed_job_run_one_study_on_postgres() {
    let Some(cluster) = postgres::Cluster::start("scale_examples") else {
        return;
    };
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let yaml = std::fs::read_to_string(examples.join("kubernetes-indexed-job.yaml")).unwrap();
    let pod_command: Vec<String> = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("command:"))
        .map(|list| serde_json::from_str(list.trim()).expect("command: a JSON-style list"))
        .expect("a command: line");
    let slurm = examples.join("slurm-array.sbatch").display().to_string();
    let slurm_command = vec!["bash".to_string(), slurm];
    for (name, command, index_var) in [
        ("slurm", slurm_command, "SLURM_ARRAY_TASK_ID"),
        ("k8s", pod_command, "JOB_COMPLETION_INDEX"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let url = cluster.database(name);
        write(
            dir.path(),
            "s.toml",
            &study(name, 6, 2).replace("[study]\n", "[study]\ncheckpoints = \"shared\"\n"),
        );
        let workers: Vec<Running> = (0..2)
            .map(|i| {
                Running::spawn(
                    std::process::Command::new(&command[0])
                        .args(&command[1..])
                        .current_dir(dir.path())
                        .env("PATH", path_with_this_build())
                        .env("STUDY", "s.toml")
                        .env("DEVICE", "cpu")
                        .env("SALUS_TUNE_STORAGE", &url)
                        .env(index_var, i.to_string()),
                )
            })
            .collect();
        for (i, w) in workers.into_iter().enumerate() {
            let out = w.wait();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{name} worker {i}: {}",
                text(&out)
            );
        }
        exactly(&TestDb::Postgres(url), 6);
    }
}
