//! The benchmark commands run and print what the issues ask for (small
//! configurations; the speed goals are measured by the commands themselves).

use crate::common::*;

#[test]
fn bench_packing_json_has_the_documented_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &["bench", "packing", "--quick", "--json", "--device", "cpu"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    let modes: Vec<_> = rows.iter().filter(|r| r.get("mode").is_some()).collect();
    let names: Vec<(u64, &str)> = modes
        .iter()
        .map(|r| (r["k"].as_u64().unwrap(), r["mode"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            (1, "seq"),
            (1, "lanes"),
            (4, "seq"),
            (4, "lanes"),
            (4, "fused")
        ],
        "K in {{1, 4}} x {{seq, lanes}}, and fused where K > 1"
    );
    for r in &modes {
        for key in ["h", "k", "mode", "tflops", "ratio_vs_seq", "pct_of_gemm"] {
            assert!(r.get(key).is_some(), "{key} in {r}");
        }
        assert!(r["tflops"].as_f64().unwrap() > 0.0);
        assert_eq!(r["precision"], "fp32", "{r}");
        if r["mode"] == "seq" {
            assert_eq!(r["ratio_vs_seq"].as_f64().unwrap(), 1.0);
        }
    }
    assert!(
        rows.iter()
            .any(|r| r.get("overhead_pct").is_some_and(|v| v.is_f64()))
    );
    assert!(rows.iter().any(|r| {
        r.get("cpu_gemm_gflops")
            .and_then(|v| v.as_f64())
            .is_some_and(|g| g > 1.0)
    }));
    // The CPU's default order: one optimizer step after the backward pass.
    let order = |rows: &[serde_json::Value]| {
        rows.iter()
            .find_map(|r| r.get("optimizer_order").cloned())
            .unwrap()
    };
    assert_eq!(order(rows), "after-backward");
    let per_layer = run_in(
        dir.path(),
        &[
            "bench",
            "packing",
            "--quick",
            "--json",
            "--device",
            "cpu",
            "--modes",
            "seq",
            "--no-overhead",
            "--k",
            "1",
            "--optimizer-order",
            "per-layer",
        ],
    );
    assert_eq!(per_layer.status.code(), Some(0), "{}", text(&per_layer));
    let v: serde_json::Value = serde_json::from_slice(&per_layer.stdout).unwrap();
    assert_eq!(order(v.as_array().unwrap()), "per-layer");
}

/// `--precision bf16` runs the cells with rounded GEMM inputs on the CPU and
/// says so in each row; tf32, CUDA's alone, is refused up front (exit 2).
#[test]
fn bench_packing_runs_bf16_cells_and_refuses_tf32_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "packing",
            "--quick",
            "--json",
            "--device",
            "cpu",
            "--precision",
            "bf16",
            "--no-overhead",
            "--k",
            "4",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cells: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("mode").is_some())
        .collect();
    assert_eq!(cells.len(), 3, "{v}");
    for r in cells {
        assert_eq!(r["precision"], "bf16", "{r}");
        assert!(r["tflops"].as_f64().unwrap() > 0.0, "{r}");
    }
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "packing",
            "--quick",
            "--device",
            "cpu",
            "--precision",
            "tf32",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--precision tf32 needs a CUDA device"),
        "{}",
        text(&out)
    );
}

#[test]
fn bench_packing_measures_mixed_widths_and_depths() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "packing",
            "--json",
            "--device",
            "cpu",
            "--h",
            "mixed,mixed-depths",
            "--k",
            "3",
            "--gflop",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let choice = v
        .as_array()
        .unwrap()
        .iter()
        .find_map(|r| r.get("mixed_group_pays"))
        .expect("the cost model's choice");
    for h in ["mixed", "mixed-depths"] {
        let modes: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["h"] == h)
            .map(|r| r["mode"].as_str().unwrap())
            .collect();
        // Mixed shapes fuse as groups of mixed shapes; on the CPU the cost
        // model would keep them on lanes, which the JSON says per cell.
        assert_eq!(modes, ["seq", "lanes", "fused"], "{h}");
        let bands = choice[h]["3"]["bands"].as_u64().unwrap();
        assert!((1..=3).contains(&bands), "{h}: {choice}");
        assert_eq!(choice[h]["3"]["mixed"], 0, "never on the CPU: {choice}");
    }
    let bad = run_in(dir.path(), &["bench", "packing", "--h", "wide"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad).contains("expected a positive width, `mixed`, `mixed-depths`, `cnn-digits`"),
        "{}",
        text(&bad)
    );
}

/// The conv-net workloads in every mode, with images per second, and
/// PyTorch beside them when the test's Python has torch (CI installs it
/// into the venv; otherwise the note says why it is missing).
#[test]
fn bench_packing_measures_conv_nets_beside_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "packing",
            "--json",
            "--device",
            "cpu",
            "--h",
            "cnn-digits",
            "--k",
            "1,2",
            "--gflop",
            "1",
            "--repeats",
            "1",
            "--no-overhead",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<&serde_json::Value> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["h"] == "cnn-digits")
        .collect();
    let modes: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| (r["k"].as_u64().unwrap(), r["mode"].as_str().unwrap()))
        .filter(|(_, m)| *m != "torch")
        .collect();
    assert_eq!(
        modes,
        [
            (1, "seq"),
            (1, "lanes"),
            (2, "seq"),
            (2, "lanes"),
            (2, "fused")
        ]
    );
    for r in &rows {
        assert!(r["images_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    let torch = rows.iter().filter(|r| r["mode"] == "torch").count();
    let note = text(&out).contains("no PyTorch anchor");
    assert!(
        torch == 2 || note,
        "PyTorch beside each K, or a note: {}",
        text(&out)
    );
    if torch == 2 {
        let seq = rows.iter().find(|r| r["mode"] == "seq").unwrap();
        assert!(seq["ratio_vs_torch"].as_f64().unwrap() > 0.0, "{seq}");
    }
}

#[test]
fn bench_policies_replays_a_trace_under_each_policy() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &["bench", "policies", "--jobs", "8", "--seeds", "2", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    let label = |r: &serde_json::Value| {
        format!(
            "{}/{}",
            r["trace"].as_str().unwrap(),
            r["policy"].as_str().unwrap()
        )
    };
    // Medians over the seeded traces first, then FIFO's worst case, labelled.
    let want: Vec<String> = ["seeded", "longest-first"]
        .iter()
        .flat_map(|t| ["fifo", "pack", "fair", "srtf"].map(|p| format!("{t}/{p}")))
        .collect();
    assert_eq!(rows.iter().map(label).collect::<Vec<_>>(), want);
    for r in rows {
        for key in ["avg_jct_s", "makespan_s", "jct_ratio_vs_fifo"] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{key} in {r}");
        }
        assert!(
            r["longest_iterations"].as_u64().unwrap()
                >= 100 * r["shortest_iterations"].as_u64().unwrap()
        );
    }
    assert_eq!(rows[0]["seeds"], 2);
    assert_eq!(rows[4]["seeds"], 1);
    assert_eq!(rows[0]["jct_ratio_vs_fifo"].as_f64().unwrap(), 1.0);
    assert_eq!(rows[4]["jct_ratio_vs_fifo"].as_f64().unwrap(), 1.0);
    // Shortest-remaining-first beats first-come-first-served when the
    // longest job arrives first.
    assert!(rows[7]["jct_ratio_vs_fifo"].as_f64().unwrap() > 1.0);
}

#[test]
fn bench_pbt_times_an_exploit_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "pbt",
            "--device",
            "cpu",
            "--params",
            "20000,200000",
            "--rounds",
            "3",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (r, asked) in rows.iter().zip([20_000.0, 200_000.0]) {
        let params = r["params"].as_f64().unwrap();
        assert!((params / asked - 1.0).abs() < 0.05, "{r}");
        // Parameters and Adam's two moments, plus the statistics block.
        let bytes = r["state_bytes"].as_f64().unwrap();
        assert!(
            bytes >= 12.0 * params && bytes < 12.0 * params + 4096.0,
            "{r}"
        );
        assert_eq!(r["in_memory_ms"].as_array().unwrap().len(), 3);
        assert_eq!(r["fused_ms"].as_array().unwrap().len(), 3);
        assert_eq!(r["checkpoint_ms"].as_array().unwrap().len(), 3);
        assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(rows[1]["state_bytes"].as_f64() > rows[0]["state_bytes"].as_f64());
}

/// `--device cuda:0` without a usable CUDA device is bad input (exit 2)
/// naming why. With one, the benchmark is `gpu-check.sh`'s business, not a
/// test's: this one is recorded as skipped there.
#[test]
fn bench_packing_on_cuda_without_a_device_is_an_input_error() {
    if kernels::cuda::probe().is_ok() && kernels::cuda::CudaBackend::new(0).is_ok() {
        kernels::device_tests::skipped_because_present(
            "bench_packing_on_cuda_without_a_device_is_an_input_error",
            "no-cuda",
            "a CUDA device is present; gpu-check.sh runs the benchmark on it",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let err = run_in(dir.path(), &["bench", "packing", "--device", "cuda:0"]);
    assert_eq!(err.status.code(), Some(2), "{}", text(&err));
    assert!(text(&err).contains("cuda:0"), "{}", text(&err));
}

#[test]
fn bench_workers_measures_the_round_trip_and_the_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = private_tmp(dir.path());
    let out = output_of(bin().current_dir(dir.path()).env("TMPDIR", &tmp).args([
        "bench",
        "workers",
        "--json",
        "--trials",
        "4",
        "--objective-ms",
        "20",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Its study, client and sockets are gone.
    assert_eq!(left_in(&tmp), Vec::<String>::new());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "round_trip_mean_us",
        "round_trip_p99_us",
        "direct_s",
        "salus_s",
        "throughput_ratio",
    ] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key} in {v}");
    }
    assert!(v["round_trips"].as_u64().unwrap() > 1000);
}

fn storage_rows(extra: &[&str]) -> Vec<serde_json::Value> {
    let out = output_of(
        bin()
            .args([
                "bench",
                "storage",
                "--json",
                "--processes",
                "1,3",
                "--trials",
                "9",
            ])
            .args(extra),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["rows"].as_array().unwrap().clone()
}

#[test]
fn bench_storage_runs_processes_on_one_study_without_errors() {
    let rows = storage_rows(&[]);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r["system"], "salus_sqlite", "{r}");
        assert_eq!(r["stored"], 9, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["trials_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["storage_ms_per_trial"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// With `--postgres`: salus-tune's processes and Optuna's on the same
/// PostgreSQL database, each configuration a study of its own.
#[test]
fn bench_storage_measures_postgres_and_optuna_beside_it() {
    let Some(cluster) = postgres::Cluster::start("bench_storage") else {
        return;
    };
    let python = std::env::var("SALUS_TUNE_PYTHON")
        .unwrap_or_else(|_| format!("{}/.venv/bin/python", env!("CARGO_MANIFEST_DIR")));
    let has_optuna = std::process::Command::new(&python)
        .args(["-c", "import optuna, psycopg2"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_optuna {
        let msg = format!("{python} lacks optuna or psycopg2 (run scripts/test.sh)");
        if std::env::var("SALUS_TUNE_REQUIRE_OPTUNA").is_ok_and(|v| v == "1") {
            panic!("{msg}");
        }
        eprintln!("skipped: {msg}");
        return;
    }
    let url = cluster.database("bench");
    let rows = storage_rows(&["--postgres", &url, "--python", &python]);
    assert_eq!(rows.len(), 6, "{rows:?}");
    for r in &rows {
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["stored"].as_u64().unwrap() >= 9, "{r}");
        assert!(r["trials_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    for system in ["salus_sqlite", "salus_postgres", "optuna_postgres"] {
        assert_eq!(
            rows.iter().filter(|r| r["system"] == system).count(),
            2,
            "{system}"
        );
    }
    let ours = rows
        .iter()
        .find(|r| r["system"] == "salus_postgres")
        .unwrap();
    assert_eq!(
        ours["stored"], 9,
        "salus-tune stops at the target exactly: {ours}"
    );
    assert!(ours["storage_ms_per_trial"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_samplers_runs_the_chosen_samplers_and_problems() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "samplers",
            "--seeds",
            "1",
            "--samplers",
            "gp,random",
            "--problems",
            "branin",
            "--no-optuna",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["sampler"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["random", "gp"]);
    for r in rows {
        assert_eq!(r["problem"], "branin");
        let (b50, b100) = (
            r["median_best_50"].as_f64().unwrap(),
            r["median_best_100"].as_f64().unwrap(),
        );
        // Best-so-far never worsens, and never beats the known optimum.
        assert!(b100 <= b50 && b100 >= 0.397887 - 1e-6, "{r}");
        assert!(r["ms_per_proposal_at_100"].as_f64().unwrap() >= 0.0);
        // No Optuna ran: no verdict.
        assert!(r.get("against_optuna").is_some_and(|v| v.is_null()), "{r}");
        // One seed: its own best values are the medians.
        assert_eq!(r["best_50_per_seed"], serde_json::json!([b50]), "{r}");
        assert_eq!(r["best_100_per_seed"], serde_json::json!([b100]), "{r}");
    }
    // The GP gets Branin to within 1% of its optimum in 50 trials.
    assert!(
        rows[1]["median_best_50"].as_f64().unwrap() < 0.402,
        "{}",
        rows[1]
    );
    // `--first-seed` runs a later stretch of the same seeds: seeds 3 and 4
    // alone give what seeds 3 and 4 of a five-seed run give.
    let random_per_seed = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "samplers",
            "--samplers",
            "random",
            "--problems",
            "branin",
            "--no-optuna",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = run_in(dir.path(), &args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0]["best_50_per_seed"].as_array().unwrap().clone()
    };
    let five = random_per_seed(&["--seeds", "5"]);
    let later = random_per_seed(&["--seeds", "2", "--first-seed", "3"]);
    assert_eq!(later, five[3..], "seeds 3-4 against seeds 0-4");
    let out = run_in(dir.path(), &["bench", "samplers", "--samplers", "smac"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("unknown sampler 'smac'"),
        "{}",
        text(&out)
    );
}

/// `bench chaos`, short: three processes on each study, stopped past the
/// liveness limit, killed and restarted, and sent commands, with no
/// violation of what fenced writes promise.
fn chaos(extra: &[&str]) -> Vec<serde_json::Value> {
    let out = output_of(
        bin()
            .args(["bench", "chaos", "--json", "--processes", "3"])
            .args(["--seconds", "12", "--trials", "12", "--seed", "7"])
            .args(extra),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let acted: u64 = rows
        .iter()
        .map(|r| {
            ["stops", "kills", "commands"]
                .iter()
                .map(|k| r[k].as_u64().unwrap())
                .sum::<u64>()
        })
        .sum();
    assert!(acted > 0, "the driver did something: {rows:?}");
    for r in &rows {
        assert_eq!(r["violations"], serde_json::json!([]), "{r}");
        assert_eq!(r["trials"], 12, "{r}");
    }
    rows
}

#[test]
fn bench_chaos_finds_no_violation_on_sqlite() {
    let rows = chaos(&[]);
    let studies: Vec<&str> = rows.iter().map(|r| r["study"].as_str().unwrap()).collect();
    assert_eq!(studies, ["builtin", "external"]);
}

#[test]
fn bench_chaos_finds_no_violation_on_postgres() {
    let Some(cluster) = postgres::Cluster::start("bench_chaos") else {
        return;
    };
    let url = cluster.database("chaos");
    let rows = chaos(&["--postgres", &url, "--no-sqlite"]);
    assert!(rows.iter().all(|r| r["storage"] == "postgres"), "{rows:?}");
    assert_eq!(rows.len(), 2);
    // The same database holds both studies now: a second run is refused.
    let out = output_of(bin().args([
        "bench",
        "chaos",
        "--postgres",
        &url,
        "--no-sqlite",
        "--seconds",
        "1",
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("already holds a study"),
        "{}",
        text(&out)
    );
}

#[test]
fn bench_swap_measures_both_ways_to_pause_a_torch_trial() {
    // Only the run and its figures: which way is faster is the bench's
    // to say, not a test's.
    if !python_imports(
        "bench_swap_measures_both_ways_to_pause_a_torch_trial",
        "torch",
        "SALUS_TUNE_REQUIRE_TORCH",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = private_tmp(dir.path());
    let out = output_of(bin().current_dir(dir.path()).env("TMPDIR", &tmp).args([
        "bench",
        "swap",
        "--json",
        "--megabytes",
        "8",
        "--rounds",
        "2",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Its worker, checkpoints and sockets are gone.
    assert_eq!(left_in(&tmp), Vec::<String>::new());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 8 MiB of 2048-wide layers is one layer: 2048 x 2048 + 2048 floats.
    assert_eq!(v["parameter_bytes"], 4 * (2048 * 2048 + 2048));
    assert_eq!(v["state_bytes"], 16 * (2048 * 2048 + 2048));
    for key in ["in_process_ms", "checkpoint_ms"] {
        let times = v[key].as_array().unwrap();
        assert_eq!(times.len(), 2, "{key} in {v}");
        assert!(
            times.iter().all(|t| t.as_f64().unwrap() > 0.0),
            "{key} in {v}"
        );
    }
}

/// The PyTorch anchor for `bench packing --precision` (phase 23 of the GPU
/// check) runs its fused K trials in fp32 and in bf16 autocast on the CPU:
/// one JSON row per cell, the trials learning (the loss falls below a
/// random guess's ln 10), and tf32 refused off CUDA.
#[test]
fn the_precision_anchor_trains_fused_trials_in_fp32_and_bf16() {
    if !python_imports(
        "the_precision_anchor_trains_fused_trials_in_fp32_and_bf16",
        "torch",
        "SALUS_TUNE_REQUIRE_TORCH",
    ) {
        return;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/anchors/torch_mlp_precision.py");
    for precision in ["fp32", "bf16"] {
        let out = output_of(std::process::Command::new(python()).args([
            script.to_str().unwrap(),
            "--precision",
            precision,
            "--h",
            "32",
            "--k",
            "1,3",
            "--seconds",
            "0.5",
            "--device",
            "cpu",
        ]));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 2, "{rows:?}");
        for r in &rows {
            assert_eq!(r["precision"], precision, "{r}");
            assert!(r["tflops"].as_f64().unwrap() > 0.0, "{r}");
            let loss = r["loss"].as_f64().unwrap();
            assert!(
                loss < 10f64.ln(),
                "{precision}: loss {loss} after {} iterations",
                r["iterations"]
            );
        }
    }
    let out = output_of(std::process::Command::new(python()).args([
        script.to_str().unwrap(),
        "--precision",
        "tf32",
        "--device",
        "cpu",
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("tf32 needs a CUDA device"),
        "{}",
        text(&out)
    );
}

#[test]
fn bench_samplers_scores_fronts_by_hypervolume() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "samplers",
            "--seeds",
            "2",
            "--samplers",
            "random,nsga2,tpe",
            "--problems",
            "zdt1,dtlz2",
            "--no-optuna",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let (h100, h300) = (
                r["median_hypervolume_100"].as_f64().unwrap(),
                r["median_hypervolume_300"].as_f64().unwrap(),
            );
            // More trials never shrink the dominated volume.
            assert!(h100 > 0.0 && h300 >= h100, "{r}");
            assert_eq!(r["hypervolume_300_per_seed"].as_array().unwrap().len(), 2);
            assert!(r.get("against_optuna").is_some_and(|v| v.is_null()), "{r}");
            (
                r["problem"].as_str().unwrap().to_string(),
                r["sampler"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("zdt1", "random"),
        ("zdt1", "nsga2"),
        ("zdt1", "tpe"),
        ("dtlz2", "random"),
        ("dtlz2", "nsga2"),
        ("dtlz2", "tpe"),
    ]
    .iter()
    .map(|(p, s)| (p.to_string(), s.to_string()))
    .collect();
    assert_eq!(rows, want);
    // The table names both parts' columns.
    let out = run_in(
        dir.path(),
        &[
            "bench",
            "samplers",
            "--seeds",
            "1",
            "--samplers",
            "nsga2",
            "--problems",
            "zdt2",
            "--no-optuna",
        ],
    );
    assert!(
        text(&out).contains("median hypervolume") && text(&out).contains("zdt2"),
        "{}",
        text(&out)
    );
}

#[test]
fn bench_samplers_keeps_trials_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let run = |in_flight: &str, more: &[&str]| {
        let mut args = vec![
            "bench",
            "samplers",
            "--seeds",
            "3",
            "--samplers",
            "tpe",
            "--problems",
            "branin",
            "--no-optuna",
            "--json",
            "--in-flight",
            in_flight,
        ];
        args.extend(more);
        let out = run_in(dir.path(), &args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v[0]["in_flight"].as_u64(), Some(in_flight.parse().unwrap()));
        v[0].clone()
    };
    let best_at_50 = |in_flight: &str| run(in_flight, &[])["best_50_per_seed"].clone();
    // With trials pending, the proposals see fewer values: another run.
    assert_ne!(best_at_50("1"), best_at_50("8"));
    // The runner's start on 4 lanes: all 8 for the random start's 10
    // trials, then 2 until 30 and 4 until 60 (the unit test
    // `a_ramp_keeps_fewer_trials_in_flight_for_the_first_proposals` sees
    // each step).
    let ramped = run("8", &["--ramp"]);
    assert_eq!(
        ramped["ramp"],
        serde_json::json!({ "random_start": 10, "first_cap": 2, "first_until": 30, "cap": 4, "until_trials": 60 })
    );
    assert_ne!(ramped["best_50_per_seed"], best_at_50("4"));
    assert_ne!(ramped["best_50_per_seed"], best_at_50("8"));
    // Two GPUs' 8 lanes keep the same counts until 60 trials and 8 until
    // 120: their first 100 trials are those of one GPU's start.
    let two_gpus = run("16", &["--ramp"]);
    assert_eq!(two_gpus["ramp"], ramped["ramp"]);
    assert_eq!(two_gpus["best_50_per_seed"], ramped["best_50_per_seed"]);
    assert_eq!(two_gpus["best_100_per_seed"], ramped["best_100_per_seed"]);
    assert_ne!(
        two_gpus["best_100_per_seed"],
        run("16", &[])["best_100_per_seed"]
    );
    // On 2 lanes, 2 in flight from the first modelled proposal to 60
    // trials: running the random start all at once changes no proposal,
    // so the first 50 are those of 2 in flight.
    assert_eq!(run("4", &["--ramp"])["best_50_per_seed"], best_at_50("2"));
    assert_eq!(run("8", &[])["ramp"], serde_json::Value::Null);
    // A CPU's one per lane: 8 lanes keep one GPU's counts, 4 lanes those
    // of 2 lanes keeping two each (2 until 60 trials), and 2 lanes have no
    // start.
    let cpu_8 = run("8", &["--ramp", "--lanes", "8"]);
    assert_eq!(cpu_8["ramp"], ramped["ramp"]);
    assert_eq!(cpu_8["best_100_per_seed"], ramped["best_100_per_seed"]);
    let (cpu_4, two_lanes) = (run("4", &["--ramp", "--lanes", "4"]), run("4", &["--ramp"]));
    assert_eq!(cpu_4["ramp"]["cap"], 2);
    assert_eq!(cpu_4["ramp"], two_lanes["ramp"]);
    assert_eq!(cpu_4["best_100_per_seed"], two_lanes["best_100_per_seed"]);
    assert_eq!(
        run("2", &["--ramp", "--lanes", "2"])["ramp"],
        serde_json::Value::Null
    );
    let out = run_in(dir.path(), &["bench", "samplers", "--lanes", "4"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = run_in(dir.path(), &["bench", "samplers", "--in-flight", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
