//! `salus-tune bench workers`: what gating a user's script costs.
//!
//! * **Round trip.** A Python worker runs empty iterations; each is one
//!   `ready` -> `go` exchange over the socket plus the client library's
//!   loop, timed from the orchestrator's side (`ExternalTrial::step`).
//! * **Throughput.** K trials of a small Python objective (a loop of about
//!   `objective_ms` of CPU), run by salus-tune with `concurrency` serving
//!   workers (`salus_worker.serve`: a process takes trial after trial),
//!   against the same objective called directly by a `multiprocessing.Pool`
//!   of the same size. Both are wall times of whole commands, measured in
//!   the same run.

use std::sync::Arc;
use std::time::Instant;

use kernels::CpuBackend;
use serde_json::json;
use training::{Job, Lane, StepOutcome};

use crate::error::{Error, Result};
use crate::external::ExternalTrial;
use crate::external::worker::MemoryPlan;
use crate::storage::TrialNumber;
use crate::study::WorkerConfig;

pub struct Results {
    pub python: String,
    pub round_trips: u64,
    pub round_trip_mean_us: f64,
    pub round_trip_p50_us: f64,
    pub round_trip_p99_us: f64,
    pub trials: usize,
    pub concurrency: usize,
    pub objective_ms: f64,
    pub direct_s: f64,
    pub salus_s: f64,
}

impl Results {
    pub fn ratio(&self) -> f64 {
        self.direct_s / self.salus_s
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "python": self.python,
            "round_trips": self.round_trips,
            "round_trip_mean_us": self.round_trip_mean_us,
            "round_trip_p50_us": self.round_trip_p50_us,
            "round_trip_p99_us": self.round_trip_p99_us,
            "trials": self.trials,
            "concurrency": self.concurrency,
            "objective_ms": self.objective_ms,
            "direct_s": self.direct_s,
            "salus_s": self.salus_s,
            "throughput_ratio": self.ratio(),
        })
    }

    pub fn table(&self) -> String {
        format!(
            "bench workers ({})\n\
             gated iteration round trip ({} iterations): mean {:.1} us, p50 {:.1} us, p99 {:.1} us\n\
             {} trials of a {:.0} ms objective, {} at once:\n\
             \x20 direct (multiprocessing.Pool) {:.2} s\n\
             \x20 salus-tune (serving workers, every trial gated) {:.2} s\n\
             \x20 throughput: {:.1}% of direct\n",
            self.python,
            self.round_trips,
            self.round_trip_mean_us,
            self.round_trip_p50_us,
            self.round_trip_p99_us,
            self.trials,
            self.objective_ms,
            self.concurrency,
            self.direct_s,
            self.salus_s,
            100.0 * self.ratio()
        )
    }
}

/// The folder holding the Python client library, which the binary carries.
fn client_dir() -> Result<String> {
    Ok(super::carried_client()?.display().to_string())
}

const OBJECTIVE: &str = r#"
import time
def objective(p):
    # About N ms of pure-Python CPU work, the same in both modes.
    s, x = 0.0, p["x"]
    for i in range(p["n"]):
        s += (x - i * 1e-7) ** 2
    return s
"#;

fn python_ok(python: &str) -> Result<()> {
    let ok = std::process::Command::new(python)
        .args(["-c", "import json, socket"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(Error::Input(format!("--python {python}: cannot run it")))
    }
}

/// Runs the benchmark. See the module docs.
pub fn run(
    python: &str,
    trials: usize,
    concurrency: usize,
    objective_ms: f64,
    progress: &mut dyn FnMut(&str),
) -> Result<Results> {
    python_ok(python)?;
    let dir = tempfile_dir()?;
    let _cleanup = super::TempCleanup {
        own: Some(dir.clone()),
    };
    let io = |source: std::io::Error| Error::Io {
        what: "bench workers".into(),
        source,
    };
    // Round trip: empty iterations.
    let rounds = 3000u64;
    std::fs::write(
        dir.join("empty.py"),
        format!("import salus_worker\nt = salus_worker.connect()\nfor i in t.iterations({rounds}):\n    pass\nt.done(0.0)\n"),
    )
    .map_err(io)?;
    let cfg = Arc::new(WorkerConfig {
        command: vec![python.into(), dir.join("empty.py").display().to_string()],
        cwd: dir.clone(),
        env: [("PYTHONPATH".to_string(), client_dir()?)].into(),
        memory_bytes: Some(1 << 20),
        report_every: 1,
        max_concurrency: None,
        iterations: rounds,
        heartbeat_timeout: std::time::Duration::from_secs(30),
    });
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 0, 1)?;
    let plan = Arc::new(MemoryPlan::new(cfg.memory_bytes, u64::MAX));
    let mut trial = ExternalTrial::new(
        cfg,
        plan,
        TrialNumber(0),
        json!({}),
        dir.join("rt.ckpt"),
        None,
    );
    Job::<CpuBackend>::swap_in(&mut trial, &mut lane)?;
    let mut times = Vec::with_capacity(rounds as usize);
    loop {
        let t = Instant::now();
        let out = Job::<CpuBackend>::step(&mut trial, &mut lane)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        if matches!(out, StepOutcome::Finished(_)) {
            break;
        }
    }
    // The last step waits for `done` and the exit: not a round trip.
    times.pop();
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    times.sort_by(f64::total_cmp);
    let pct = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    progress(&format!(
        "round trip: mean {mean:.1} us, p50 {:.1} us",
        pct(0.5)
    ));

    // Calibrate the objective's loop to about objective_ms.
    std::fs::write(dir.join("objective_lib.py"), OBJECTIVE).map_err(io)?;
    let calib = std::process::Command::new(python)
        .current_dir(&dir)
        .args([
            "-c",
            "import time, objective_lib as o\nt=time.perf_counter(); o.objective({'x': 0.5, 'n': 200000}); print(time.perf_counter()-t)",
        ])
        .output()
        .map_err(io)?;
    let per: f64 = String::from_utf8_lossy(&calib.stdout)
        .trim()
        .parse()
        .map_err(|_| {
            Error::Bench(format!(
                "bench workers: calibration failed: {}",
                String::from_utf8_lossy(&calib.stderr)
            ))
        })?;
    let n = ((objective_ms / 1e3) / per * 200000.0).max(1.0) as u64;

    // Direct: the same objective in a pool of `concurrency` processes.
    let direct_src = format!(
        "import multiprocessing as mp, objective_lib as o\n\
         if __name__ == '__main__':\n\
         \x20   ps = [{{'x': i / {trials}, 'n': {n}}} for i in range({trials})]\n\
         \x20   with mp.Pool({concurrency}) as pool:\n\
         \x20       print(min(pool.map(o.objective, ps)))\n"
    );
    std::fs::write(dir.join("direct.py"), direct_src).map_err(io)?;
    let t = Instant::now();
    let st = std::process::Command::new(python)
        .current_dir(&dir)
        .arg("direct.py")
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(io)?;
    let direct_s = t.elapsed().as_secs_f64();
    if !st.success() {
        return Err(Error::Bench("bench workers: the direct run failed".into()));
    }
    progress(&format!("direct: {direct_s:.2} s"));

    // salus-tune: the same objective as a study of one-iteration trials.
    std::fs::write(
        dir.join("worker.py"),
        format!("import salus_worker, objective_lib as o\nsalus_worker.serve(lambda p: o.objective(dict(p, n={n})))\n"),
    )
    .map_err(io)?;
    std::fs::write(
        dir.join("study.toml"),
        format!(
            "[study]\nname = \"bench\"\ntrials = {trials}\n\n[worker]\nkind = \"command\"\n\
             command = [\"{python}\", \"worker.py\"]\nenv = {{ PYTHONPATH = \"{}\" }}\nmemory = \"1MiB\"\n\
             iterations = 1\nmax_concurrency = {concurrency}\n\n[params]\nx = {{ float = [0.0, 1.0] }}\n\n\
             [scheduler]\nlanes = {concurrency}\n",
            client_dir()?
        ),
    )
    .map_err(io)?;
    let exe = std::env::current_exe().map_err(io)?;
    let t = Instant::now();
    let st = std::process::Command::new(exe)
        .current_dir(&dir)
        .args(["study.toml", "--no-progress", "--device", "cpu"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(io)?;
    let salus_s = t.elapsed().as_secs_f64();
    if !st.success() {
        return Err(Error::Bench(
            "bench workers: the salus-tune run failed".into(),
        ));
    }
    progress(&format!("salus-tune: {salus_s:.2} s"));
    Ok(Results {
        python: python.into(),
        round_trips: times.len() as u64,
        round_trip_mean_us: mean,
        round_trip_p50_us: pct(0.5),
        round_trip_p99_us: pct(0.99),
        trials,
        concurrency,
        objective_ms,
        direct_s,
        salus_s,
    })
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("salus-bench-workers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        what: format!("bench workers: {}", dir.display()),
        source,
    })?;
    Ok(dir)
}
