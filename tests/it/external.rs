//! External workers end to end with real Python processes: a plain
//! objective, the NumPy training script, gating checked from the workers'
//! own timestamps, crashes, hangs, malformed messages and a killed worker,
//! and pause, swap (checkpoint) and resume keeping curves continuous.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use salus_tune::storage::TrialState;

fn client_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clients/python")
        .display()
        .to_string()
}

fn studies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("studies/workers")
}

/// Whether this Python can run the NumPy example; prints why not.
fn has_numpy(test: &str) -> bool {
    python_imports(test, "numpy", "SALUS_TUNE_REQUIRE_OPTUNA")
}

fn worker_study(name: &str, script: &Path, params: &str, extra: &str) -> String {
    let mut file = StudyFile::new(name, 8, 1);
    for line in extra.lines().filter(|l| !l.trim().is_empty()) {
        let (key, value) = line
            .split_once(" = ")
            .expect("extra [study] lines are `key = value`");
        file = file.set("study", key, value);
    }
    file.set("worker", "kind", "\"command\"")
        .set(
            "worker",
            "command",
            &format!("[\"{}\", \"{}\"]", python(), script.display()),
        )
        .set(
            "worker",
            "env",
            &format!("{{ PYTHONPATH = \"{}\" }}", client_dir()),
        )
        .set("worker", "memory", "\"16MiB\"")
        .set("worker", "iterations", "6")
        .set("worker", "heartbeat_timeout", "\"20s\"")
        .with_text(&format!("[params]\n{params}\n"))
        .build()
}

#[test]
fn a_plain_objective_stores_exactly_what_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let study = worker_study(
        "rosen",
        &studies_dir().join("objective.py"),
        "x = { float = [-2.0, 2.0] }\ny = { float = [-1.0, 3.0] }",
        "",
    )
    .replace("iterations = 6", "iterations = 1");
    write(dir.path(), "r.toml", &study);
    let out = run_in(dir.path(), &["r.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&dir.path().join("rosen.db"), None);
    assert_eq!(rows.len(), 8);
    for t in &rows {
        assert_eq!(t.state, TrialState::Complete, "{t:?}");
        let p = |n: &str| t.params.iter().find(|p| p.name == n).unwrap().internal;
        let (x, y) = (p("x"), p("y"));
        let want = (1.0 - x).powi(2) + 100.0 * (y - x * x).powi(2);
        assert!(
            (t.value.unwrap() - want).abs() <= 1e-9 * want.max(1.0),
            "{t:?}"
        );
        assert_eq!(t.intermediate.len(), 1);
    }
}

const NUMPY_PARAMS: &str =
    "lr = { float = [1e-2, 2e-1], log = true }\nhidden = { int = [8, 64] }\nepochs = 6";

#[test]
fn the_numpy_script_trains_and_reports_every_epoch_within_its_gate() {
    if !has_numpy("the_numpy_script_trains_and_reports_every_epoch_within_its_gate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("iterations.log");
    let study = worker_study("np", &studies_dir().join("numpy_mlp.py"), NUMPY_PARAMS, "").replace(
        "env = { PYTHONPATH",
        &format!(
            "env = {{ SALUS_TEST_LOG = \"{}\", PYTHONPATH",
            log.display()
        ),
    ) + "\n[scheduler]\nlanes = 2\nmax_concurrent = 6\n";
    write(dir.path(), "n.toml", &study);
    let out = run_in(dir.path(), &["n.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&dir.path().join("np.db"), None);
    assert_eq!(rows.len(), 8);
    for t in &rows {
        assert_eq!(t.state, TrialState::Complete, "{t:?}");
        let steps: Vec<i64> = t.intermediate.iter().map(|&(s, _)| s).collect();
        assert_eq!(steps, (1..=6).collect::<Vec<_>>());
        assert!(t.value.unwrap() < 1.0, "it learns: {t:?}");
    }
    // The workers' own clocks: never more than 2 (the lanes) inside an
    // iteration at once, though 6 were alive.
    let spans: Vec<(f64, f64)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<f64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[1], f[2])
        })
        .collect();
    assert_eq!(spans.len(), 8 * 6);
    let mut edges: Vec<(f64, i32)> = spans.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut inside, mut most) = (0, 0);
    for (_, d) in edges {
        inside += d;
        most = most.max(inside);
    }
    assert!(most <= 2, "{most} workers inside an iteration at once");
    assert!(most >= 1);
}

/// A worker that misbehaves in trial 1 only (after one good iteration).
fn misbehaving(dir: &Path, how: &str) -> PathBuf {
    let body = format!(
        "import os, sys, time, json, socket\nimport salus_worker\n\
         t = salus_worker.connect()\n\
         open(os.path.join({dir:?}, 'pid-%d' % t.number), 'w').write(str(os.getpid()))\n\
         for i in t.iterations(6):\n\
         \x20   t.report(i + 1, t.params['x'] * (i + 1))\n\
         \x20   if t.number == 1 and i == 1:\n\
         \x20       {how}\n\
         t.done(t.params['x'])\n",
        dir = dir.display().to_string()
    );
    let path = dir.join("bad.py");
    std::fs::write(&path, body).unwrap();
    path
}

fn run_misbehaving(
    how: &str,
    extra: &str,
) -> (Vec<salus_tune::storage::TrialRow>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let script = misbehaving(dir.path(), how);
    let study = worker_study("bad", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("heartbeat_timeout = \"20s\"", extra);
    write(dir.path(), "b.toml", &study);
    let out = run_in(dir.path(), &["b.toml", "--no-progress"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the study goes on: {}",
        text(&out)
    );
    (trials(&dir.path().join("bad.db"), None), dir)
}

fn assert_only_trial_1_failed(rows: &[salus_tune::storage::TrialRow], words: &str) {
    assert_eq!(rows.len(), 8);
    for t in rows {
        if t.number.0 == 1 {
            assert_eq!(t.state, TrialState::Fail, "{t:?}");
            let r = t.fail_reason.as_deref().unwrap_or("");
            assert!(r.contains(words), "reason: {r}");
            // What it reported before failing stays.
            assert_eq!(t.intermediate.len(), 1, "{t:?}");
        } else {
            assert_eq!(t.state, TrialState::Complete, "{t:?}");
        }
    }
}

#[test]
fn a_crashing_worker_fails_its_trial_with_its_stderr() {
    let (rows, _d) = run_misbehaving(
        "print('boom: the GPU caught fire', file=sys.stderr); sys.exit(3)",
        "heartbeat_timeout = \"20s\"",
    );
    assert_only_trial_1_failed(&rows, "boom: the GPU caught fire");
    let reason = rows[1].fail_reason.as_deref().unwrap();
    assert!(reason.contains("exit status: 3"), "{:?}", rows[1]);
    // A crash is a crash, not a configuration problem.
    assert!(!reason.contains("invalid configuration"), "{reason}");
}

#[test]
fn a_second_report_in_one_iteration_fails_the_trial_saying_how_to_fix_it() {
    // Only one report per iteration can be stored: a second is refused,
    // never silently dropped.
    let (rows, _d) = run_misbehaving("t.report(99, 0.5)", "heartbeat_timeout = \"20s\"");
    assert_only_trial_1_failed(&rows, "reported twice in one iteration");
}

#[test]
fn a_script_that_runs_past_its_declared_iterations_fails() {
    let dir = tempfile::tempdir().unwrap();
    // The script loops over 6 iterations; the study declares 3.
    let script = misbehaving(dir.path(), "pass");
    let study = worker_study("over", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("iterations = 6", "iterations = 3");
    write(dir.path(), "o.toml", &study);
    let out = run_in(dir.path(), &["o.toml", "--no-progress"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "no trial completed: {}",
        text(&out)
    );
    let rows = trials(&dir.path().join("over.db"), None);
    assert!(!rows.is_empty());
    for t in &rows {
        assert_eq!(t.state, TrialState::Fail, "{t:?}");
        let r = t.fail_reason.as_deref().unwrap_or("");
        assert!(
            r.contains("asked for iteration 4 but [worker] iterations = 3"),
            "{r}"
        );
        assert_eq!(
            t.intermediate.len(),
            3,
            "the declared iterations' reports stay"
        );
    }
}

#[test]
fn retry_failed_runs_failed_trials_again_with_their_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("obj.py");
    let study = worker_study("retry", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("iterations = 6", "iterations = 1")
        .replace("trials = 8", "trials = 3");
    write(dir.path(), "r.toml", &study);
    // The script is not there yet: every trial fails.
    let out = run_in(dir.path(), &["r.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let db = dir.path().join("retry.db");
    let failed = trials(&db, None);
    assert_eq!(failed.len(), 3);
    assert!(failed.iter().all(|t| t.state == TrialState::Fail));
    std::fs::write(
        &script,
        "import salus_worker\nsalus_worker.serve(lambda p: p['x'])\n",
    )
    .unwrap();
    let out = run_in(dir.path(), &["r.toml", "--no-progress", "--retry-failed"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("requeued 3 failed trials"),
        "{}",
        text(&out)
    );
    let retried = trials(&db, None);
    assert_eq!(retried.len(), 3, "the same trials, no new ones");
    for (before, after) in failed.iter().zip(&retried) {
        assert_eq!(after.state, TrialState::Complete, "{after:?}");
        assert_eq!(
            (after.trial_id, &after.params),
            (before.trial_id, &before.params)
        );
        assert_eq!(after.value, Some(before.params[0].internal));
    }
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_events WHERE kind = 'trial_retry'"
        ),
        3
    );
}

#[test]
fn a_hanging_worker_is_killed_after_the_heartbeat_timeout() {
    let (rows, _d) = run_misbehaving("time.sleep(600)", "heartbeat_timeout = \"1s\"");
    assert_only_trial_1_failed(&rows, "sent nothing for 1s");
}

#[test]
fn a_malformed_message_fails_its_trial_with_a_clear_reason() {
    let (rows, _d) = run_misbehaving(
        "t._sock.sendall(b'this is not json\\n'); time.sleep(5)",
        "heartbeat_timeout = \"20s\"",
    );
    assert_only_trial_1_failed(
        &rows,
        "malformed message from the worker: not a JSON object",
    );
}

#[test]
fn a_worker_killed_mid_run_fails_only_its_trial() {
    let (rows, _d) = run_misbehaving("os.kill(os.getpid(), 9)", "heartbeat_timeout = \"20s\"");
    assert_only_trial_1_failed(&rows, "signal: 9");
}

#[test]
fn pause_swap_and_resume_keep_curves_continuous() {
    if !has_numpy("pause_swap_and_resume_keep_curves_continuous") {
        return;
    }
    pause_swap_and_resume_with(&client_dir());
}

#[test]
fn a_version_1_client_still_pauses_swaps_and_resumes() {
    if !has_numpy("a_version_1_client_still_pauses_swaps_and_resumes") {
        return;
    }
    // The client as it was before protocol version 2, kept as a fixture.
    let v1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1_client");
    pause_swap_and_resume_with(&v1.display().to_string());
}

/// ASHA pauses the NumPy example's trials at rungs; a budget of 3 workers'
/// memory for 6 live trials makes the core swap paused ones out (through a
/// checkpoint: the script tracks nothing) and back, with the client in
/// `client`.
fn pause_swap_and_resume_with(client: &str) {
    let dir = tempfile::tempdir().unwrap();
    let study = worker_study(
        "asha",
        &studies_dir().join("numpy_mlp.py"),
        NUMPY_PARAMS,
        "metric = \"val_loss\"",
    )
    .replace(&client_dir(), client)
    .replace("trials = 8", "trials = 12")
        + "\n[pruner]\nkind = \"asha\"\nmin_resource = 1\nreduction_factor = 2\n\n\
           [scheduler]\nlanes = 2\nmax_concurrent = 6\nmemory = \"48MiB\"\n";
    write(dir.path(), "a.toml", &study);
    let out = run_in(dir.path(), &["a.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("asha.db");
    let rows = trials(&db, None);
    assert_eq!(rows.len(), 12);
    assert!(rows.iter().all(|t| t.state.is_finished()), "{rows:?}");
    assert!(rows.iter().any(|t| t.state == TrialState::Complete));
    for t in &rows {
        let steps: Vec<i64> = t.intermediate.iter().map(|&(s, _)| s).collect();
        assert_eq!(
            steps,
            (1..=steps.len() as i64).collect::<Vec<_>>(),
            "trial {}: {steps:?}",
            t.number
        );
    }
    let outs = scalar(
        &db,
        "SELECT COUNT(*) FROM salus_swaps WHERE direction = 'out' AND medium = 'checkpoint'",
    );
    let paused = scalar(
        &db,
        "SELECT COUNT(*) FROM salus_priority WHERE reason = 'paused'",
    );
    assert!(paused > 0, "ASHA paused trials");
    assert!(outs > 0, "paused workers were checkpointed out");
    // Every trial that went out and finished came back in first.
    let resumed = scalar(
        &db,
        "SELECT COUNT(DISTINCT s.trial_id) FROM salus_swaps s JOIN trials t ON t.trial_id = s.trial_id \
         WHERE s.direction = 'in' AND t.state = 'COMPLETE' AND s.trial_id IN (SELECT trial_id FROM salus_swaps WHERE direction = 'out')",
    );
    let out_and_complete = scalar(
        &db,
        "SELECT COUNT(DISTINCT s.trial_id) FROM salus_swaps s JOIN trials t ON t.trial_id = s.trial_id \
         WHERE s.direction = 'out' AND t.state = 'COMPLETE'",
    );
    assert_eq!(resumed, out_and_complete);
}

/// The distinct pids a script wrote to `log`, one a line.
fn pids_logged(log: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn serving_workers_take_trial_after_trial() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("pids.log");
    let script = dir.path().join("serve.py");
    std::fs::write(
        &script,
        format!(
            "import os, salus_worker\n\
             def f(p):\n\
             \x20   open({:?}, 'a').write('%d\\n' % os.getpid())\n\
             \x20   return p['x'] ** 2\n\
             salus_worker.serve(f)\n",
            log.display().to_string()
        ),
    )
    .unwrap();
    let study = worker_study("served", &script, "x = { float = [-1.0, 1.0] }", "")
        .replace("iterations = 6", "iterations = 1")
        .replace("trials = 8", "trials = 16")
        + "\n[scheduler]\nlanes = 2\nmax_concurrent = 2\n";
    write(dir.path(), "s.toml", &study);
    // Its own temporary folder, to see that the run leaves nothing there.
    let tmp = tempfile::tempdir().unwrap();
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .env("TMPDIR", tmp.path())
            .args(["s.toml", "--no-progress"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "sockets left behind: {left:?}");
    let rows = trials(&dir.path().join("served.db"), None);
    assert_eq!(rows.len(), 16);
    for t in &rows {
        assert_eq!(t.state, TrialState::Complete, "{t:?}");
        let x = t.params[0].internal;
        assert!((t.value.unwrap() - x * x).abs() < 1e-12);
    }
    let pids = pids_logged(&log);
    assert!(
        pids.len() <= 2,
        "16 trials served by {} processes",
        pids.len()
    );
    // The idle servers were told to exit when the study ended.
    for pid in &pids {
        let alive = std::process::Command::new("kill")
            .args(["-0", pid])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(!alive, "serving worker {pid} outlived the study");
    }
}

/// `serve_trials`: whole trials of several iterations, one after another in
/// the same processes, each with its own curve and value.
#[test]
fn serving_workers_run_whole_trials_one_after_another() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("pids.log");
    let script = dir.path().join("serve_trials.py");
    std::fs::write(
        &script,
        format!(
            "import os, salus_worker\n\
             def run(trial):\n\
             \x20   open({:?}, 'a').write('%d\\n' % os.getpid())\n\
             \x20   v = 0.0\n\
             \x20   for i in trial.iterations(3):\n\
             \x20       v = trial.params['x'] * (i + 1) + trial.number\n\
             \x20       trial.report(i + 1, v)\n\
             \x20   return v\n\
             salus_worker.serve_trials(run)\n",
            log.display().to_string()
        ),
    )
    .unwrap();
    let study = worker_study("whole", &script, "x = { float = [-1.0, 1.0] }", "")
        .replace("iterations = 6", "iterations = 3")
        + "\n[scheduler]\nlanes = 2\nmax_concurrent = 2\n";
    write(dir.path(), "s.toml", &study);
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .args(["s.toml", "--no-progress"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("whole.db");
    let rows = trials(&db, None);
    assert_eq!(rows.len(), 8);
    for t in &rows {
        assert_eq!(t.state, TrialState::Complete, "{t:?}");
        let x = t.params[0].internal;
        let n = t.number.0 as f64;
        assert!((t.value.unwrap() - (3.0 * x + n)).abs() < 1e-12, "{t:?}");
        // Its own curve, steps 1..3, nothing carried from the trial the
        // process ran before.
        let want: Vec<(i64, f64)> = (1..=3).map(|s| (s, x * s as f64 + n)).collect();
        assert_eq!(t.intermediate.len(), 3, "{t:?}");
        for (got, want) in t.intermediate.iter().zip(&want) {
            assert_eq!(got.0, want.0);
            assert!((got.1 - want.1).abs() < 1e-12, "{t:?}");
        }
    }
    let pids = pids_logged(&log);
    assert!(
        pids.len() <= 2,
        "8 trials served by {} processes",
        pids.len()
    );
}

#[test]
fn user_attributes_and_auxiliary_metrics_reach_the_database_and_optuna() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "aux.py",
        "import salus_worker\n\
         t = salus_worker.connect()\n\
         t.set_user_attr('arch', {'layers': [t.params['w'], 3], 'relu': True})\n\
         x = t.params['x']\n\
         for i in t.iterations(3):\n\
         \x20   t.report(i + 1, x * (i + 1), train_loss=1.0 / (i + 1), acc=float('nan') if i == 1 else 0.5)\n\
         t.set_user_attr('note', 'after the last report')\n\
         t.done(x * 3)\n",
    );
    let study = worker_study(
        "aux",
        &script,
        "x = { float = [0.0, 1.0] }\nw = { int = [8, 64] }",
        "",
    )
    .replace("trials = 8", "trials = 3")
    .replace("iterations = 6", "iterations = 3");
    write(dir.path(), "a.toml", &study);
    let out = run_in(dir.path(), &["a.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("aux.db");
    let attr = |key: &str| {
        scalar_text(
            &db,
            &format!(
                "SELECT a.value_json FROM trial_user_attributes a JOIN trials t USING (trial_id) \
                 WHERE t.number = 0 AND a.\"key\" = '{key}'"
            ),
        )
    };
    let arch: serde_json::Value = serde_json::from_str(&attr("arch").unwrap()).unwrap();
    assert_eq!(arch["relu"], serde_json::Value::Bool(true));
    assert!(arch["layers"][0].is_i64(), "{arch}");
    assert_eq!(attr("note").as_deref(), Some("\"after the last report\""));
    // The latest value of each curve, as a user attribute.
    assert_eq!(
        attr("train_loss").unwrap().parse::<f64>().unwrap(),
        1.0 / 3.0
    );
    assert_eq!(attr("acc").as_deref(), Some("0.5"));
    // Every point of every curve, NaN as NULL.
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM salus_metrics"), 18);
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_metrics WHERE name = 'acc' AND step = 2 AND value IS NULL"
        ),
        3
    );
    // Optuna sees them as user_attrs.
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let check = "import optuna, sys\n\
                 s = optuna.load_study(study_name='aux', storage='sqlite:///aux.db')\n\
                 t = s.trials[0]\n\
                 assert t.user_attrs['note'] == 'after the last report', t.user_attrs\n\
                 assert t.user_attrs['arch']['relu'] is True, t.user_attrs\n\
                 assert abs(t.user_attrs['train_loss'] - 1/3) < 1e-15, t.user_attrs\n";
    match std::process::Command::new(&venv)
        .current_dir(dir.path())
        .args(["-c", check])
        .output()
    {
        Ok(o) => assert!(o.status.success(), "{}", text(&o)),
        Err(e) if std::env::var_os("SALUS_TUNE_REQUIRE_OPTUNA").is_some() => {
            panic!("{}: {e}", venv.display())
        }
        Err(e) => eprintln!("the Optuna check skipped: {}: {e}", venv.display()),
    }
}

#[test]
fn a_reserved_user_attribute_fails_the_trial_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "bad.py",
        "import salus_worker\n\
         t = salus_worker.connect()\n\
         t.set_user_attr('fixed_params', 1)\n\
         for i in t.iterations(1):\n\
         \x20   t.report(1, 0.0)\n\
         t.done(0.0)\n",
    );
    let study = worker_study("reserved", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("trials = 8", "trials = 1")
        .replace("iterations = 6", "iterations = 1");
    write(dir.path(), "r.toml", &study);
    let out = run_in(dir.path(), &["r.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = &trials(&dir.path().join("reserved.db"), None)[0];
    assert_eq!(t.state, TrialState::Fail);
    assert!(
        t.fail_reason
            .as_deref()
            .is_some_and(|r| r.contains("the user attribute 'fixed_params' is salus-tune's own")),
        "{t:?}"
    );
}

#[test]
fn conditional_parameters_reach_the_worker_only_when_they_apply() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "cond.py",
        "import salus_worker\n\
         def objective(p):\n\
         \x20   if p['opt'] == 'sgd':\n\
         \x20       assert 'adam.beta2' not in p, p\n\
         \x20       return p['sgd.momentum']\n\
         \x20   assert 'sgd.momentum' not in p, p\n\
         \x20   return p['adam.beta2']\n\
         salus_worker.run_objective(objective)\n",
    );
    let study = worker_study(
        "cond",
        &script,
        "opt = { choices = [\"sgd\", \"adam\"] }\n\
         [params.when.opt.sgd]\nmomentum = { float = [0.5, 0.99] }\n\
         [params.when.opt.adam]\nbeta2 = { float = [0.9, 0.999] }",
        "",
    )
    .replace("iterations = 6", "iterations = 1")
    .replace("trials = 8", "trials = 10");
    write(dir.path(), "c.toml", &study);
    let out = run_in(dir.path(), &["c.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&dir.path().join("cond.db"), None);
    let mut seen = std::collections::BTreeSet::new();
    for t in &rows {
        assert_eq!(t.state, TrialState::Complete, "{t:?}");
        let names: Vec<&str> = t.params.iter().map(|p| p.name.as_str()).collect();
        // choices = ["sgd", "adam"]: the internal value is the index.
        let opt = t.params.iter().find(|p| p.name == "opt").unwrap();
        let want = if opt.internal == 0.0 {
            "sgd.momentum"
        } else {
            "adam.beta2"
        };
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&want), "{names:?}");
        let v = t.params.iter().find(|p| p.name == want).unwrap().internal;
        assert_eq!(t.value, Some(v));
        seen.insert(want);
    }
    assert_eq!(seen.len(), 2, "both branches ran");
}

/// The NumPy script as the worker of `trials` trials of `epochs` each.
fn numpy_study(name: &str, trials: u64, epochs: u64, extra: &str) -> String {
    worker_study(
        name,
        &studies_dir().join("numpy_mlp.py"),
        &format!("lr = {{ float = [1e-2, 2e-1], log = true }}\nhidden = {{ int = [8, 64] }}\nepochs = {epochs}"),
        extra,
    )
    .replace("trials = 8", &format!("trials = {trials}"))
    .replace("iterations = 6", &format!("iterations = {epochs}"))
}

/// The most steps any requeue of the study kept.
fn most_steps_kept(db: &Path) -> i64 {
    scalar(
        db,
        "SELECT COALESCE(MAX(CAST(json_extract(detail, '$.kept_steps') AS INTEGER)), 0) \
         FROM salus_events WHERE kind = 'trial_requeue'",
    )
}

/// Ctrl-C (SIGTERM) in the middle of external trials: each worker saves its
/// checkpoint as the run stops, the trial keeps the steps that checkpoint
/// covers, and the rerun resumes it there: every trial ends with each of
/// its steps once, none lost (the requeue used to delete all of them, and
/// the resumed worker reported only the later ones).
#[test]
fn a_stop_keeps_an_external_trial_s_curve_up_to_its_checkpoint() {
    if !has_numpy("a_stop_keeps_an_external_trial_s_curve_up_to_its_checkpoint") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let study = numpy_study("stop", 3, 40, "");
    write(dir.path(), "s.toml", &study);
    let db = dir.path().join("stop.db");
    let run = Running::spawn(
        bin()
            .current_dir(dir.path())
            .args(["s.toml", "--no-progress"]),
    );
    wait_until(
        "a trial has reported some steps",
        Duration::from_secs(60),
        || {
            db.exists()
                && migrated(&db)
                && scalar(
                    &db,
                    "SELECT COALESCE(MAX(step), 0) FROM trial_intermediate_values",
                ) >= 5
        },
    );
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let out = run.wait();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let kept = most_steps_kept(&db);
    assert!(kept >= 5, "a requeued trial kept its steps: {kept}");
    let out = run_in(dir.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for t in trials(&db, None) {
        assert_eq!(t.state, TrialState::Complete, "trial {}", t.number);
        let steps: Vec<i64> = t.intermediate.iter().map(|&(s, _)| s).collect();
        assert_eq!(steps, (1..=40).collect::<Vec<_>>(), "trial {}", t.number);
    }
    // No checkpoint outlives its trial.
    let left = std::fs::read_dir(dir.path().join("stop.db.checkpoints")).map_or(0, |d| d.count());
    assert_eq!(left, 0);
}

/// A `kill -9` while external trials are swapped out (their workers'
/// checkpoints on disk): the rerun requeues them keeping the steps those
/// checkpoints cover, and the workers resume there, so every curve runs
/// from step 1 without a gap.
#[test]
fn a_killed_run_s_swapped_external_trials_resume_with_their_curves() {
    if !has_numpy("a_killed_run_s_swapped_external_trials_resume_with_their_curves") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let study = numpy_study("swapkill", 12, 30, "metric = \"val_loss\"")
        + "\n[pruner]\nkind = \"asha\"\nmin_resource = 2\nreduction_factor = 2\n\n\
           [scheduler]\nlanes = 2\nmax_concurrent = 6\nmemory = \"48MiB\"\n";
    write(dir.path(), "s.toml", &study);
    let db = dir.path().join("swapkill.db");
    let run = Running::spawn(
        bin()
            .current_dir(dir.path())
            .args(["s.toml", "--no-progress"]),
    );
    wait_until(
        "a running trial's worker checkpointed",
        Duration::from_secs(60),
        || {
            migrated(&db)
                && scalar(
                    &db,
                    "SELECT COUNT(*) FROM salus_checkpoints k JOIN trials t ON t.trial_id = k.trial_id \
                     WHERE k.step >= 2 AND t.state = 'RUNNING'",
                ) > 0
        },
    );
    run.kill();
    let out = run_in(dir.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&db, None);
    assert_eq!(rows.len(), 12);
    for t in &rows {
        assert!(t.state.is_finished(), "trial {}", t.number);
        let steps: Vec<i64> = t.intermediate.iter().map(|&(s, _)| s).collect();
        assert_eq!(
            steps,
            (1..=steps.len() as i64).collect::<Vec<_>>(),
            "trial {}: {steps:?}",
            t.number
        );
        if t.state == TrialState::Complete {
            assert_eq!(steps.len(), 30, "trial {}", t.number);
        }
    }
    let kept = most_steps_kept(&db);
    assert!(
        kept >= 2,
        "a requeued trial kept its checkpoint's steps: {kept}"
    );
}

#[test]
fn mps_says_what_is_missing_and_refuses_built_in_trials() {
    let dir = tempfile::tempdir().unwrap();
    // On this machine's CPU: no CUDA device for an MPS daemon to serve.
    let study = worker_study(
        "mps",
        &studies_dir().join("objective.py"),
        "x = { float = [-2.0, 2.0] }\ny = { float = [-1.0, 3.0] }",
        "",
    )
    .replace("iterations = 6", "iterations = 1")
        + "\n[scheduler]\nmps = true\n";
    write(dir.path(), "m.toml", &study);
    let out = run_in(dir.path(), &["m.toml", "--no-progress", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("MPS: [scheduler] mps = true needs a CUDA device"),
        "{}",
        text(&out)
    );
    assert_eq!(
        scalar(
            &dir.path().join("mps.db"),
            "SELECT COUNT(*) FROM salus_runs"
        ),
        0,
        "no run was registered"
    );
    // Built-in trials share one process already: MPS is for workers.
    let built_in = StudyFile::digits("mps-builtin", 2)
        .set("scheduler", "mps", "true")
        .build();
    write(dir.path(), "b.toml", &built_in);
    let out = run_in(dir.path(), &["check", "b.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("scheduler.mps: mps = true shares the GPU between worker processes"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_worker_learns_its_device_and_its_grant() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "env.py",
        "import os, salus_worker\n\
         t = salus_worker.connect()\n\
         for k in ('SALUS_TUNE_DEVICE', 'XLA_PYTHON_CLIENT_PREALLOCATE'):\n\
         \x20   t.set_user_attr(k, os.environ.get(k))\n\
         t.set_user_attr('device', t.device)\n\
         t.set_user_attr('memory_limit', t.memory_limit)\n\
         for i in t.iterations(1):\n\
         \x20   t.report(i + 1, 1.0)\n\
         t.done(1.0)\n",
    );
    let study = worker_study("env", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("trials = 8", "trials = 1")
        .replace("iterations = 6", "iterations = 1");
    write(dir.path(), "e.toml", &study);
    let out = run_in(dir.path(), &["e.toml", "--no-progress", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let attr = |k: &str| {
        scalar_text(
            &dir.path().join("env.db"),
            &format!("SELECT value_json FROM trial_user_attributes WHERE key = '{k}'"),
        )
        .unwrap()
    };
    assert_eq!(attr("SALUS_TUNE_DEVICE"), "\"cpu\"");
    assert_eq!(attr("device"), "\"cpu\"");
    assert_eq!(attr("XLA_PYTHON_CLIENT_PREALLOCATE"), "\"false\"");
    // The declared 16 MiB, as its grant.
    assert_eq!(attr("memory_limit"), (16u64 << 20).to_string());
}

/// Two CPU devices in one process: each worker learns where it was
/// placed, the trial's resources say the same device, and both devices
/// take trials.
#[test]
fn workers_are_placed_on_every_device_and_told_which() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "place.py",
        "import os, salus_worker\n\
         t = salus_worker.connect()\n\
         for k in ('SALUS_TUNE_PLACEMENT', 'CUDA_VISIBLE_DEVICES', 'SALUS_TUNE_DEVICE'):\n\
         \x20   t.set_user_attr(k, os.environ.get(k))\n\
         for i in t.iterations(2):\n\
         \x20   t.report(i + 1, 1.0)\n\
         t.done(1.0)\n",
    );
    let study = worker_study("place", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("trials = 8", "trials = 4")
        .replace("iterations = 6", "iterations = 2");
    write(dir.path(), "p.toml", &study);
    let out = run_in(
        dir.path(),
        &["p.toml", "--no-progress", "--device", "cpu:0,cpu:1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("place.db");
    let count = |sql: &str| scalar(&db, sql);
    let placed = "FROM salus_trials st JOIN trial_user_attributes a ON a.trial_id = st.trial_id \
                  WHERE a.key = 'SALUS_TUNE_PLACEMENT'";
    assert_eq!(
        count(&format!(
            "SELECT COUNT(*) {placed} AND a.value_json = '\"' || st.device || '\"'"
        )),
        4,
        "each worker's placement is its trial's device"
    );
    assert_eq!(
        count(&format!("SELECT COUNT(DISTINCT st.device) {placed}")),
        2,
        "both devices ran trials"
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM trial_user_attributes \
             WHERE key = 'CUDA_VISIBLE_DEVICES' AND value_json = 'null'"
        ),
        4,
        "a CPU worker is not pointed at a GPU"
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM trial_user_attributes \
             WHERE key = 'SALUS_TUNE_DEVICE' AND value_json = '\"cpu\"'"
        ),
        4,
        "scripts keep saying the device kind"
    );
    assert!(text(&out).contains("runs on cpu:1"), "{}", text(&out));
}

/// The dashboard's pause and resume of a trial that ASHA holds at a rung
/// undo only each other: the trial waits on at its rung, and once every
/// trial left is held and none can start, the study ends. (A resume that
/// let such a trial run on to its end left the rung's hold in the run's
/// books, and the run waited forever for a trial already finished: found
/// by `bench chaos`, about one run in twenty.)
#[test]
fn a_dashboard_resume_leaves_a_trial_held_at_its_rung() {
    use std::time::Duration;
    if !has_numpy("a_dashboard_resume_leaves_a_trial_held_at_its_rung") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Trial 1 (better) passes rung 0 first, writes `one` and waits for the
    // file `go` inside its second iteration; trial 0 (worse) waits for
    // `one` before its first report, so it reaches rung 0 second and is
    // held there.
    let script = write(
        dir.path(),
        "gated.py",
        "import os, time\n\
         import salus_worker\n\
         t = salus_worker.connect()\n\
         for i in t.iterations(3):\n\
         \x20   if t.number == 0 and i == 0:\n\
         \x20       while not os.path.exists('one'):\n\
         \x20           time.sleep(0.02)\n\
         \x20   if t.number == 1 and i == 1:\n\
         \x20       open('one', 'w').close()\n\
         \x20       while not os.path.exists('go'):\n\
         \x20           time.sleep(0.02)\n\
         \x20   t.report(i + 1, (2.0 if t.number == 0 else 1.0) / (i + 1))\n\
         t.done(1.0)\n",
    );
    let study = worker_study("held", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("trials = 8", "trials = 2")
        .replace("iterations = 6", "iterations = 3")
        + "\n[pruner]\nkind = \"asha\"\nmin_resource = 1\nreduction_factor = 2\n\n\
           [scheduler]\nmax_concurrent = 2\n";
    write(dir.path(), "h.toml", &study);
    let db = dir.path().join("held.db");
    let mut child = Running::spawn(
        bin()
            .current_dir(dir.path())
            .args(["h.toml", "--no-progress"]),
    );
    let count = |sql: &str| scalar(&db, sql);
    let steps_of_0 = || {
        count(
            "SELECT COUNT(*) FROM trial_intermediate_values v JOIN trials t USING (trial_id) \
             WHERE t.number = 0",
        )
    };
    wait_until("trial 0 held at its rung", Duration::from_secs(60), || {
        migrated(&db)
            && count(
                "SELECT COUNT(*) FROM salus_priority p JOIN trials t USING (trial_id) \
                 WHERE t.number = 0 AND p.reason = 'paused'",
            ) == 1
            && count("SELECT COUNT(*) FROM trials WHERE number = 1 AND state = 'RUNNING'") == 1
    });
    for action in ["pause", "resume"] {
        execute(
            &db,
            &format!(
                "INSERT INTO salus_commands (study_id, trial_id, action, created) \
                 SELECT study_id, trial_id, '{action}', datetime('now') FROM trials WHERE number = 0"
            ),
        );
        wait_until(action, Duration::from_secs(20), || {
            count(&format!(
                "SELECT COUNT(*) FROM salus_commands WHERE action = '{action}' AND outcome = 'applied'"
            )) == 1
        });
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        steps_of_0(),
        1,
        "trial 0 stays at its rung after the resume"
    );
    // Trial 1 goes on to its end; with nothing left to start, trial 0
    // ends as PRUNED at its rung, and the study ends.
    std::fs::write(dir.path().join("go"), "").unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let out = child.kill();
            panic!("the study hung. Its log:\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait();
    assert!(status.success(), "{}", text(&out));
    let rows = trials(&db, None);
    assert_eq!(
        rows.iter().map(|t| t.state).collect::<Vec<_>>(),
        [TrialState::Pruned, TrialState::Complete],
        "{}",
        text(&out)
    );
    assert_eq!(rows[0].intermediate.len(), 1);
    assert_eq!(rows[1].intermediate.len(), 3);
}

/// A trial's number and its stored (step, value) pairs.
type Curve = (i64, Vec<(i64, f64)>);

/// PBT with the NumPy script: a population of 4, an exploit point every
/// epoch, the worst member taking the best's state at each. `restart`:
/// the script cannot take it in process, and is started again from the
/// donor's checkpoint instead.
fn pbt_run(dir: &Path, restart: bool) -> (Vec<(i64, i64, i64)>, Vec<Curve>) {
    let study = numpy_study("npbt", 4, 6, "")
        .replace("trials = 4\n", "")
        .replace("hidden = { int = [8, 64] }", "hidden = 16")
        + "\n[pbt]\npopulation = 4\ninterval = 1\n";
    let study = if restart {
        study.replace(
            "env = { PYTHONPATH",
            "env = { SALUS_EXPLOIT = \"restart\", PYTHONPATH",
        )
    } else {
        study
    };
    write(dir, "p.toml", &study);
    let out = run_in(dir, &["p.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.join("npbt.db");
    let rows = trials(&db, None);
    assert!(
        rows.iter().all(|t| t.state == TrialState::Complete),
        "{}",
        text(&out)
    );
    // Through a file (never on the device), each a whole state.
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_pbt_events WHERE NOT on_device AND bytes > 1000"
        ),
        5,
        "{}",
        text(&out)
    );
    let events = block_on(async {
        use sqlx::{Connection, Row};
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query(
            "SELECT step, trial_number, donor_number FROM salus_pbt_lineage ORDER BY generation",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    });
    let curves = rows
        .iter()
        .map(|t| (t.number.0, t.intermediate.clone()))
        .collect();
    (events, curves)
}

/// An external worker's exploit: the receiver goes on from its donor's
/// checkpoint with new parameters. Taken in process (`on_exploit`) or by a
/// restart from that file, every member's curve is the same, value for
/// value, and each reports every step once.
#[test]
fn external_workers_exploit_in_process_or_by_a_restart_alike() {
    if !has_numpy("external_workers_exploit_in_process_or_by_a_restart_alike") {
        return;
    }
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (events, curves) = pbt_run(a.path(), false);
    let (events_restart, curves_restart) = pbt_run(b.path(), true);
    assert_eq!(events.len(), 5, "one exploit a point: {events:?}");
    for (g, e) in events.iter().enumerate() {
        assert_eq!(e.0, g as i64 + 1, "{events:?}");
        assert_ne!(e.1, e.2);
    }
    for (_, curve) in &curves {
        let steps: Vec<i64> = curve.iter().map(|c| c.0).collect();
        assert_eq!(steps, vec![1, 2, 3, 4, 5, 6]);
    }
    assert_eq!(events, events_restart);
    assert_eq!(curves, curves_restart);
}

/// `kill -9` in the middle of a PBT study of the NumPy script, then the
/// same command again: every member ends with each of its steps once (a
/// resumed script says where it is, and a receiver goes on from its
/// donor's file, stored as its checkpoint with the exploit), the stored
/// exploits stay, and no member takes a state twice at one point.
#[test]
fn a_killed_pbt_study_of_external_workers_resumes_to_the_end() {
    if !has_numpy("a_killed_pbt_study_of_external_workers_resumes_to_the_end") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let study = numpy_study("wkill", 4, 60, "")
        .replace("trials = 4\n", "")
        .replace("hidden = { int = [8, 64] }", "hidden = 16")
        + "\n[pbt]\npopulation = 4\ninterval = 1\n";
    write(dir.path(), "p.toml", &study);
    let db = dir.path().join("wkill.db");
    kill_after_exploits(dir.path(), "p.toml", &db, 8);
    let before = pbt_events(&db);
    assert!(before < 59, "the kill landed before the end");
    let out = run_in(dir.path(), &["p.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = trials(&db, None);
    assert_eq!(rows.len(), 4);
    for t in &rows {
        assert_eq!(t.state, TrialState::Complete, "{}", text(&out));
        let steps: Vec<i64> = t.intermediate.iter().map(|c| c.0).collect();
        assert_eq!(steps, (1..=60).collect::<Vec<_>>(), "trial {}", t.number);
    }
    assert!(pbt_events(&db) > before, "the resumed run exploits too");
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM (SELECT trial_id, generation FROM salus_pbt_events \
             GROUP BY trial_id, generation HAVING COUNT(*) > 1)"
        ),
        0,
        "no member exploited twice at one point"
    );
}

/// Two processes share one population of NumPy workers: a receiver may
/// take the other process's member's state, from the file its worker saved
/// at the point (stored under that process's claim), and both decide each
/// generation alike (the body of the built-in trials' test).
#[test]
fn two_processes_share_one_pbt_population_of_external_workers() {
    if !has_numpy("two_processes_share_one_pbt_population_of_external_workers") {
        return;
    }
    let study = numpy_study("shared", 8, 12, "")
        .replace("trials = 8\n", "")
        .replace("hidden = { int = [8, 64] }", "hidden = 16")
        + "\n[pbt]\npopulation = 8\ninterval = 1\n";
    crate::pbt::two_processes_share_one_pbt_population(&study, false);
}

/// An external receiver takes another process's donor only as the file
/// that donor's worker saved: a built-in trial's state is refused, and a
/// file that is gone says which (no Python needed: both fail before the
/// worker is asked anything).
#[test]
fn an_external_receiver_refuses_a_built_in_state_and_names_a_missing_file() {
    use std::sync::Arc;

    use kernels::CpuBackend;
    use salus_tune::external::ExternalTrial;
    use salus_tune::external::worker::MemoryPlan;
    use salus_tune::storage::TrialNumber;
    use salus_tune::study::WorkerConfig;
    use training::data::{split, synthetic_classification};
    use training::{
        DeviceData, Job, Lane, NewValues, Optimizer, SlotHparams, StoredState, TrainTrial,
        TrialConfig,
    };

    let dir = tempfile::tempdir().unwrap();
    let cfg = Arc::new(WorkerConfig {
        command: vec!["python3".into(), "never-started.py".into()],
        cwd: dir.path().to_path_buf(),
        env: Default::default(),
        memory_bytes: None,
        report_every: 1,
        max_concurrency: None,
        iterations: 4,
        heartbeat_timeout: Duration::from_secs(60),
    });
    let mut trial = ExternalTrial::new(
        cfg,
        Arc::new(MemoryPlan::new(None, 1 << 30)),
        TrialNumber(0),
        serde_json::json!({"lr": 0.1}),
        dir.path().join("t.ckpt"),
        None,
    );
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 0, 1).unwrap();
    let data = DeviceData::upload(
        &mut lane,
        &split(&synthetic_classification(100, 4, 2, 2, 1), 0.25, 0).unwrap(),
    )
    .unwrap();
    let config = TrialConfig {
        precision: Default::default(),
        hidden: vec![4],
        activation: kernels::Activation::Relu,
        batch_size: 10,
        epochs: 1,
        hparams: SlotHparams {
            optimizer: Optimizer::adam(),
            lr: 1e-2,
            weight_decay: 0.0,
            dropout: 0.0,
            seed: 1,
        },
        report_every: None,
        conv: None,
    };
    let snapshot = TrainTrial::new(&mut lane, data, config)
        .unwrap()
        .export_state(&mut lane)
        .unwrap();
    let new = NewValues::Params("{\"lr\": 0.2}".into());
    let t = &mut trial as &mut dyn Job<CpuBackend>;
    let err = t
        .exploit_stored(&mut lane, None, StoredState::Snapshot(snapshot), &new)
        .unwrap_err();
    assert!(
        err.to_string().contains("not a built-in trial's state"),
        "{err}"
    );
    let gone = dir.path().join("pbt-7.g1.state");
    let err = t
        .exploit_stored(
            &mut lane,
            None,
            StoredState::File {
                path: gone.clone(),
                iteration: 4,
                step: 1,
            },
            &new,
        )
        .unwrap_err();
    assert!(
        err.to_string().contains(&gone.display().to_string()),
        "{err}"
    );
}

/// A pruned trial's worker is told to stop and reaped by a thread of its
/// own, which may outlive the run (here the last trial is pruned): the run
/// still leaves no socket, and no socket folder, behind.
#[test]
fn pruned_workers_leave_no_sockets_behind() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = private_tmp(dir.path());
    // Each trial reports its number: one after another, every trial after
    // the first is worse than the median before it.
    let script = write(
        dir.path(),
        "worse.py",
        "import salus_worker
\
         t = salus_worker.connect()
\
         for i in t.iterations(6):
\
         \x20   t.report(i + 1, float(t.number))
\
         t.done(float(t.number))
",
    );
    let study = worker_study("worse", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("trials = 8", "trials = 3")
        + "\n[scheduler]\nmax_concurrent = 1\n\n\
           [pruner]\nkind = \"median\"\nstartup_trials = 1\nwarmup_steps = 0\n";
    write(dir.path(), "w.toml", &study);
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .env("TMPDIR", &tmp)
            .args(["w.toml", "--no-progress"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let states: Vec<TrialState> = trials(&dir.path().join("worse.db"), None)
        .iter()
        .map(|t| t.state)
        .collect();
    assert_eq!(
        states,
        [TrialState::Complete, TrialState::Pruned, TrialState::Pruned]
    );
    assert_eq!(left_in(&tmp), Vec::<String>::new());
}

/// A run killed with `kill -9` cannot remove its socket folder; the next
/// run sweeps it once it has been unchanged for an hour (aged here by
/// hand), with a bench folder a gone process left. A gone process's folder
/// changed within the hour, and a live process's, stay.
#[test]
fn a_killed_runs_sockets_are_swept_by_a_later_run() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = private_tmp(dir.path());
    // Slow iterations, so that the kill lands while a worker runs.
    let script = write(
        dir.path(),
        "slow.py",
        "import time, salus_worker\n\
         t = salus_worker.connect()\n\
         for i in t.iterations(6):\n\
         \x20   time.sleep(0.3)\n\
         \x20   t.report(i + 1, 1.0)\n\
         t.done(1.0)\n",
    );
    let study = worker_study("slow", &script, "x = { float = [0.0, 1.0] }", "")
        .replace("trials = 8", "trials = 2");
    write(dir.path(), "s.toml", &study);
    let args = ["s.toml", "--no-progress"];
    let run = Running::spawn(bin().current_dir(dir.path()).env("TMPDIR", &tmp).args(args));
    let killed = tmp.join(format!("salus-tune-{}", run.id()));
    wait_until("a worker's socket", Duration::from_secs(60), || {
        std::fs::read_dir(&killed).is_ok_and(|mut d| d.next().is_some())
    });
    run.kill();
    assert!(killed.is_dir(), "a killed run cannot clean up");

    // A process that has ended, for folders of a gone process.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    ended.wait().unwrap();
    let bench = tmp.join(format!("salus-tune-bench-{}", ended.id()));
    std::fs::create_dir_all(bench.join("ckpt")).unwrap();
    std::fs::write(bench.join("ckpt/t0.s3"), [0u8; 64]).unwrap();
    // This test's own process is alive.
    let live = tmp.join(format!("salus-tune-{}", std::process::id()));
    std::fs::create_dir_all(&live).unwrap();
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    for d in [&killed, &bench, &live] {
        std::fs::File::open(d)
            .and_then(|f| f.set_modified(two_hours_ago))
            .unwrap();
    }
    let recent = tmp.join(format!("salus-tune-{}", ended.id()));
    std::fs::create_dir_all(&recent).unwrap();

    let out = output_of(bin().current_dir(dir.path()).env("TMPDIR", &tmp).args(args));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let name = |p: &Path| format!("{} []", p.file_name().unwrap().to_string_lossy());
    let mut kept = vec![name(&live), name(&recent)];
    kept.sort();
    assert_eq!(left_in(&tmp), kept);
}
