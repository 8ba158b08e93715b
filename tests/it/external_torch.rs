//! The PyTorch example end to end on the CPU, with torch installed by the
//! test command: it learns scikit-learn's digits, its client's measured
//! memory reaches the ledger and the database, paused trials are swapped
//! to host memory inside their process and resume bit-exactly, an
//! out-of-memory error requeues its trial with a larger grant. (A version
//! 1 client is tested with the NumPy example, in `external`.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use kernels::CpuBackend;
use salus_tune::external::ExternalTrial;
use salus_tune::external::worker::MemoryPlan;
use salus_tune::storage::{TrialNumber, TrialRow, TrialState};
use salus_tune::study::WorkerConfig;
use training::{Job, Lane, StepOutcome, SwapMedium};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether this Python has torch and scikit-learn; prints why not.
fn has_torch(test: &str) -> bool {
    python_imports(test, "torch, sklearn", "SALUS_TUNE_REQUIRE_TORCH")
}

/// `studies/external_torch.toml` as shipped, run from `dir` with this
/// Python and the repository's client, `trials` trials and the `[study]`
/// and other lines of `edit` applied by [`StudyFile`]-style replacements.
fn torch_study(dir: &Path, script: &Path, edits: &[(&str, &str)]) -> PathBuf {
    let mut text = std::fs::read_to_string(root().join("studies/external_torch.toml")).unwrap();
    text = text
        .replace(
            "command = [\"python3\", \"workers/torch_train.py\"]",
            &format!("command = [\"{}\", \"{}\"]", python(), script.display()),
        )
        .replace(
            "PYTHONPATH = \"../clients/python\"",
            &format!(
                "PYTHONPATH = \"{}\"",
                root().join("clients/python").display()
            ),
        );
    for (from, to) in edits {
        assert!(text.contains(from), "the example study has {from:?}");
        text = text.replace(from, to);
    }
    write(dir, "torch.toml", &text)
}

fn example() -> PathBuf {
    root().join("studies/workers/torch_train.py")
}

fn run_ok(dir: &Path) -> (Vec<TrialRow>, PathBuf, String) {
    let out = run_in(dir, &["torch.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.join("torch-digits.db");
    (trials(&db, None), db, text(&out))
}

fn hidden(t: &TrialRow) -> i64 {
    t.params
        .iter()
        .find(|p| p.name == "hidden")
        .map(|p| p.internal as i64)
        .expect("a hidden width")
}

fn swaps(db: &Path, medium: &str) -> i64 {
    scalar(
        db,
        &format!(
            "SELECT COUNT(*) FROM salus_swaps WHERE direction = 'out' AND medium = '{medium}'"
        ),
    )
}

#[test]
fn the_torch_example_learns_digits_with_measured_memory_and_in_process_swaps() {
    if !has_torch("the_torch_example_learns_digits_with_measured_memory_and_in_process_swaps") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    torch_study(dir.path(), &example(), &[("trials = 16", "trials = 10")]);
    let (rows, db, _) = run_ok(dir.path());
    assert_eq!(rows.len(), 10);
    assert!(rows.iter().all(|t| t.state.is_finished()), "{rows:?}");
    // Real learning: the best trial classifies held-out digits well.
    let best_accuracy: f64 = scalar_text(
        &db,
        "SELECT CAST(MAX(CAST(value_json AS REAL)) AS TEXT) FROM trial_user_attributes WHERE key = 'val_accuracy'",
    )
    .unwrap()
    .parse()
    .unwrap();
    assert!(
        best_accuracy > 0.9,
        "best validation accuracy {best_accuracy}"
    );
    // What the client measured is what the ledger planned with: weights,
    // gradients and Adam's two moments of a 64-h-10 MLP, in float32, and
    // Adam's four step counters.
    for t in &rows {
        let h = hidden(t);
        let params = 64 * h + h + h * 10 + 10;
        let stored = scalar(
            &db,
            &format!(
                "SELECT persistent_bytes FROM salus_trials WHERE trial_id = {}",
                t.trial_id
            ),
        );
        assert_eq!(
            stored,
            4 * 4 * params + 4 * 4,
            "trial {} (hidden {h})",
            t.number
        );
    }
    // ASHA's paused trials were swapped to host memory, never through a
    // checkpoint, and the swapped ones that finished came back first.
    assert!(swaps(&db, "memory") > 0, "paused trials were swapped out");
    assert_eq!(swaps(&db, "checkpoint"), 0);
    for t in &rows {
        let steps: Vec<i64> = t.intermediate.iter().map(|&(s, _)| s).collect();
        assert_eq!(steps, (1..=steps.len() as i64).collect::<Vec<_>>());
    }
}

/// The example on two CPU devices of one process: trials are placed on
/// both, each measured as on one device, and every one finishes.
#[test]
fn the_torch_example_runs_on_two_cpu_devices() {
    if !has_torch("the_torch_example_runs_on_two_cpu_devices") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    torch_study(
        dir.path(),
        &example(),
        &[("trials = 16", "trials = 6"), ("lanes = 2", "lanes = 1")],
    );
    let out = run_in(
        dir.path(),
        &["torch.toml", "--no-progress", "--device", "cpu:0,cpu:1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("torch-digits.db");
    let rows = trials(&db, None);
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|t| t.state.is_finished()), "{rows:?}");
    for d in ["cpu:0", "cpu:1"] {
        let n = scalar(
            &db,
            &format!("SELECT COUNT(*) FROM salus_trials WHERE device = '{d}'"),
        );
        assert!(n > 0, "{d} ran trials:\n{}", text(&out));
    }
    for t in &rows {
        let h = hidden(t);
        let stored = scalar(
            &db,
            &format!(
                "SELECT persistent_bytes FROM salus_trials WHERE trial_id = {}",
                t.trial_id
            ),
        );
        assert_eq!(stored, 4 * 4 * (64 * h + h + h * 10 + 10) + 4 * 4);
    }
}

/// The example's trial 3 driven step by step through an `ExternalTrial`
/// on a CPU lane: its reported values, and for each swap-out after an
/// iteration in `swap_after`, where the state went and the bytes moved.
fn drive_example(swap_after: &[u64]) -> (Vec<u64>, Vec<(SwapMedium, usize)>) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Arc::new(WorkerConfig {
        command: vec![python(), example().display().to_string()],
        cwd: dir.path().to_path_buf(),
        env: [(
            "PYTHONPATH".to_string(),
            root().join("clients/python").display().to_string(),
        )]
        .into(),
        memory_bytes: None,
        report_every: 1,
        max_concurrency: None,
        iterations: 6,
        heartbeat_timeout: std::time::Duration::from_secs(60),
    });
    let plan = Arc::new(MemoryPlan::new(None, 1 << 30));
    let mut trial = ExternalTrial::new(
        cfg,
        plan,
        TrialNumber(3),
        serde_json::json!({"lr": 0.003, "hidden": 64, "epochs": 6}),
        dir.path().join("t.ckpt"),
        None,
    );
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 0, 1).unwrap();
    let t = &mut trial as &mut dyn Job<CpuBackend>;
    t.swap_in(&mut lane).unwrap();
    let (mut values, mut swaps) = (Vec::new(), Vec::new());
    for i in 1.. {
        let (report, last) = match t.step(&mut lane).unwrap() {
            StepOutcome::Report(r) => (r, false),
            StepOutcome::Finished(r) => (r, true),
            other => panic!("{other:?}"),
        };
        values.push(report.external.unwrap().to_bits());
        if last {
            break;
        }
        if swap_after.contains(&i) {
            let bytes = t.swap_out(&mut lane).unwrap();
            assert!(!t.is_resident());
            swaps.push((t.swap_medium(), bytes));
            t.swap_in(&mut lane).unwrap();
            assert!(t.is_resident());
        }
    }
    (values, swaps)
}

#[test]
fn an_in_process_swap_resumes_the_curve_float_for_float() {
    if !has_torch("an_in_process_swap_resumes_the_curve_float_for_float") {
        return;
    }
    let (plain, none) = drive_example(&[]);
    let (swapped, swaps) = drive_example(&[2, 4]);
    assert!(none.is_empty());
    assert_eq!(plain.len(), 6);
    assert_eq!(swapped, plain, "swapped and unswapped curves differ");
    // Both swaps kept the process and moved the whole state: a 64-64-10
    // MLP's weights, gradients and Adam moments, and Adam's step counters.
    let state = 4 * 4 * (64 * 64 + 64 + 64 * 10 + 10) + 4 * 4;
    assert_eq!(swaps, vec![(SwapMedium::HostMemory, state); 2]);
}

#[test]
fn an_out_of_memory_error_requeues_the_trial_with_a_larger_grant() {
    if !has_torch("an_out_of_memory_error_requeues_the_trial_with_a_larger_grant") {
        return;
    }
    // No GPU here, so the allocator's cap is played by the script: its
    // first iteration needs four times its state, and it raises PyTorch's
    // own OutOfMemoryError (as the caching allocator does under
    // set_per_process_memory_fraction) when its grant is smaller.
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "greedy.py",
        "import torch\nimport salus_worker\n\
         t = salus_worker.connect()\n\
         model = torch.nn.Linear(256, 256)\n\
         t.track(model)\n\
         need = 4 * t.memory()['persistent']\n\
         for i in t.iterations(3):\n\
         \x20   if t.memory_limit is not None and t.memory_limit < need:\n\
         \x20       raise torch.OutOfMemoryError(f'CUDA out of memory. Tried to allocate {need / 2**20:.2f} MiB')\n\
         \x20   t.report(i + 1, float(model.weight.sum()))\n\
         t.done(float(model.weight.sum()))\n",
    );
    torch_study(
        dir.path(),
        &script,
        &[
            ("trials = 16", "trials = 3"),
            ("memory = \"auto\"", "memory = \"64KiB\""),
            ("iterations = 10", "iterations = 3"),
            ("max_concurrency = 8", "max_concurrency = 3"),
            (
                "kind = \"asha\"\nmin_resource = 1\nreduction_factor = 2",
                "kind = \"none\"",
            ),
            ("memory = \"512KiB\"", "memory = \"64MiB\""),
        ],
    );
    let (rows, db, out) = run_ok(dir.path());
    assert!(
        rows.iter().all(|t| t.state == TrialState::Complete),
        "{rows:?}\n{out}"
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_events WHERE kind = 'trial_out_of_memory'"
        ),
        3,
        "each trial ran out of memory once"
    );
    assert!(out.contains("ran out of device memory"), "{out}");
    assert!(out.contains("at most 1 trials at once now"), "{out}");
    // The grant it finished with covers what it asked for.
    let state = 4 * (256 * 256 + 256);
    for t in &rows {
        let granted = scalar(
            &db,
            &format!(
                "SELECT persistent_bytes + ephemeral_bytes FROM salus_trials WHERE trial_id = {}",
                t.trial_id
            ),
        );
        assert!(granted >= 4 * state, "trial {}: {granted} bytes", t.number);
        assert_eq!(t.intermediate.len(), 3);
    }
}

#[test]
fn the_gpu_check_s_torch_study_phase_runs_in_its_cpu_form() {
    if !has_torch("the_gpu_check_s_torch_study_phase_runs_in_its_cpu_form") {
        return;
    }
    // scripts/gpu-check.sh's phase 20, small and on the CPU: every mode
    // runs and reports; how they compare is for the device run to say.
    let dir = tempfile::tempdir().unwrap();
    let out = output_of(
        std::process::Command::new("bash")
            .arg(root().join("scripts/torch-study-bench.sh"))
            .args([
                "--device", "cpu", "--trials", "2", "--epochs", "1", "--images", "128",
            ])
            .args([
                "--jobs",
                "2",
                "--lanes",
                "2",
                "--bin",
                env!("CARGO_BIN_EXE_salus-tune"),
            ])
            .args(["--python", &python(), "--out"])
            .arg(dir.path())
            .env("SWAP_MB", "8"),
    );
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(dir.path().join("torch-study.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let modes: Vec<&str> = lines.iter().map(|l| l["mode"].as_str().unwrap()).collect();
    assert_eq!(
        modes,
        [
            "optuna-jobs1",
            "optuna-jobs2",
            "salus-lanes",
            "salus-mps",
            "pause-to-resume"
        ]
    );
    for l in &lines[..3] {
        assert_eq!(l["trials"], 2);
        assert!(l["trials_per_hour"].as_f64().unwrap() > 0.0, "{l}");
    }
    assert_eq!(lines[3]["skipped"], "MPS needs a CUDA device");
    assert!(lines[4]["in_process_ms"].as_f64().unwrap() > 0.0);
    assert!(lines[4]["checkpoint_ms"].as_f64().unwrap() > 0.0);
}

/// The example as a PBT population of 4 (one width, no pruner): at each
/// epoch the worst takes the best's model and Adam state through its
/// checkpoint, in process or by a restart of the script, with the same
/// curves either way, value for value.
#[test]
fn the_torch_example_exploits_in_process_or_by_a_restart_alike() {
    if !has_torch("the_torch_example_exploits_in_process_or_by_a_restart_alike") {
        return;
    }
    let run = |restart: bool| {
        let dir = tempfile::tempdir().unwrap();
        let env = if restart {
            "env = { SALUS_EXPLOIT = \"restart\", PYTHONPATH"
        } else {
            "env = { PYTHONPATH"
        };
        torch_study(
            dir.path(),
            &example(),
            &[
                ("trials = 16\n", ""),
                ("iterations = 10", "iterations = 4"),
                ("epochs = 10", "epochs = 4"),
                ("hidden = { int = [32, 256], log = true }", "hidden = 64"),
                (
                    "[pruner]\nkind = \"asha\"\nmin_resource = 1\nreduction_factor = 2\n",
                    "[pbt]\npopulation = 4\ninterval = 1\n",
                ),
                ("env = { PYTHONPATH", env),
            ],
        );
        let (rows, db, log) = run_ok(dir.path());
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|t| t.state.is_finished()), "{log}");
        assert_eq!(
            scalar(
                &db,
                "SELECT COUNT(*) FROM salus_pbt_events WHERE NOT on_device AND bytes > 10000"
            ),
            3,
            "one exploit at each of 3 points: {log}"
        );
        rows.iter()
            .map(|t| (t.number.0, t.intermediate.clone()))
            .collect::<Vec<_>>()
    };
    let in_process = run(false);
    for (_, curve) in &in_process {
        assert_eq!(
            curve.iter().map(|c| c.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
    }
    assert_eq!(in_process, run(true));
}
