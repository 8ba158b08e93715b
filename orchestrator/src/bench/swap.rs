//! `salus-tune bench swap`: what pausing and resuming a PyTorch trial
//! costs, both ways salus-tune can do it, measured in one run.
//!
//! The trial is a real PyTorch worker: an MLP of `megabytes` of float32
//! parameters trained by Adam, so that its state is the parameters, their
//! gradients and Adam's two moments (four times the parameters). Each
//! round pauses it after an iteration and resumes it, timed from the
//! orchestrator's side (`ExternalTrial`), until the worker is ready to run
//! its next iteration:
//!
//! * **In process**: its client tracks the state (`trial.track`), so
//!   `swap_out` copies it to host memory and `swap_in` copies it back; the
//!   process stays.
//! * **Checkpoint and restart**: the same script without `track`, so
//!   `swap_out` asks it to `torch.save` its state and exit, and `swap_in`
//!   starts Python again, which imports torch, loads the checkpoint and
//!   says `ready`.

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

/// The worker: `SWAP_BENCH_TRACK=1` tracks its state, else it
/// checkpoints. One Adam step per iteration on a small random batch.
const SCRIPT: &str = r#"
import os
import torch
import salus_worker

torch.set_num_threads(1)
trial = salus_worker.connect()
width, layers = trial.params["width"], trial.params["layers"]
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(trial.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
start = 0
# Loaded to the host, then copied into the model's own tensors: loaded
# straight to the GPU it would hold the state twice, past its grant.
state = trial.load_checkpoint(lambda p: torch.load(p, map_location="cpu"))
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
if os.environ.get("SWAP_BENCH_TRACK") == "1":
    trial.track(model, opt)
step = start
trial.on_checkpoint(lambda path: torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path))
x = torch.randn(4, width, device=trial.device)
loss = 0.0
for i in trial.iterations(1_000_000, start=start):
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    step = i + 1
    trial.report(step, loss.item())
trial.done(loss.item())
"#;

pub struct Results {
    /// Where the worker keeps its state: `cpu` or `cuda`.
    pub device: &'static str,
    pub python: String,
    pub parameter_bytes: u64,
    /// Parameters, gradients and Adam's moments.
    pub state_bytes: u64,
    pub rounds: usize,
    /// Pause-to-resume times in milliseconds, one per round.
    pub in_process_ms: Vec<f64>,
    pub checkpoint_ms: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Results {
    pub fn ratio(&self) -> f64 {
        median(&self.checkpoint_ms) / median(&self.in_process_ms)
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "device": self.device,
            "python": self.python,
            "parameter_bytes": self.parameter_bytes,
            "state_bytes": self.state_bytes,
            "rounds": self.rounds,
            "in_process_ms": self.in_process_ms,
            "checkpoint_ms": self.checkpoint_ms,
            "in_process_median_ms": median(&self.in_process_ms),
            "checkpoint_median_ms": median(&self.checkpoint_ms),
            "checkpoint_over_in_process": self.ratio(),
        })
    }

    pub fn table(&self) -> String {
        let mb = |b: u64| b as f64 / (1 << 20) as f64;
        format!(
            "pause-to-resume of a PyTorch trial on {} ({:.0} MiB of parameters, {:.0} MiB with gradients and Adam state), median of {} rounds\n\
             in process (host memory)     {:>9.1} ms\n\
             checkpoint, exit, restart    {:>9.1} ms\n\
             in process is {:.1}x faster\n",
            self.device,
            mb(self.parameter_bytes),
            mb(self.state_bytes),
            self.rounds,
            median(&self.in_process_ms),
            median(&self.checkpoint_ms),
            self.ratio()
        )
    }
}

fn bench_err(e: impl std::fmt::Display) -> Error {
    Error::Bench(format!("bench swap: {e}"))
}

/// Pause-to-resume times of `rounds` rounds, one way.
fn rounds(
    python: &str,
    dir: &std::path::Path,
    track: bool,
    params: serde_json::Value,
    rounds: usize,
    device: &'static str,
) -> Result<Vec<f64>> {
    let cfg = Arc::new(WorkerConfig {
        command: vec![
            python.into(),
            dir.join("swap_worker.py").display().to_string(),
        ],
        cwd: dir.to_path_buf(),
        env: [
            ("PYTHONPATH".to_string(), dir.display().to_string()),
            (
                "SWAP_BENCH_TRACK".to_string(),
                if track { "1" } else { "0" }.to_string(),
            ),
        ]
        .into(),
        memory_bytes: None,
        report_every: 1,
        max_concurrency: None,
        iterations: 1_000_000,
        heartbeat_timeout: std::time::Duration::from_secs(300),
    });
    let plan = Arc::new(MemoryPlan::new(None, u64::MAX / 4));
    let mut trial = ExternalTrial::new(
        cfg,
        plan,
        TrialNumber(0),
        params,
        dir.join(format!("swap-{track}.ckpt")),
        None,
    )
    .on_device(device);
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 0, 1)?;
    Job::<CpuBackend>::swap_in(&mut trial, &mut lane)?;
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        // An iteration first, so that gradients and Adam's state exist.
        match Job::<CpuBackend>::step(&mut trial, &mut lane)? {
            StepOutcome::Report(_) | StepOutcome::Continue => {}
            other => return Err(bench_err(format!("unexpected {other:?}"))),
        }
        let start = Instant::now();
        Job::<CpuBackend>::swap_out(&mut trial, &mut lane)?;
        Job::<CpuBackend>::swap_in(&mut trial, &mut lane)?;
        trial.wait_ready()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

/// Runs the benchmark. See the module docs.
pub fn run(
    python: &str,
    megabytes: u64,
    n: usize,
    device: &'static str,
    progress: &mut dyn FnMut(&str),
) -> Result<Results> {
    let ok = std::process::Command::new(python)
        .args(["-c", "import torch"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err(Error::Input(format!(
            "bench swap: {python} cannot import torch (pass --python, or run scripts/test.sh to make .venv)"
        )));
    }
    // The workers run in another folder: a relative path must still name
    // this Python (made absolute, not resolved: a venv's is a link).
    let python = &if python.contains('/') {
        std::path::absolute(python)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| python.to_string())
    } else {
        python.to_string()
    };
    // Its checkpoints, beside the client: hundreds of MB at the default size.
    let _cleanup = super::TempCleanup { own: None };
    let dir = super::carried_client()?;
    std::fs::write(dir.join("swap_worker.py"), SCRIPT).map_err(|source| Error::Io {
        what: "bench swap: writing the worker".into(),
        source,
    })?;
    // Layers of 2048 x 2048 (16 MiB each) up to the size asked for.
    let width = 2048u64;
    let layers = (megabytes << 20)
        .div_ceil(4 * (width * width + width))
        .max(1);
    let parameter_bytes = 4 * layers * (width * width + width);
    let params = json!({"width": width, "layers": layers});
    progress(&format!(
        "{layers} layers of {width} x {width}: {:.0} MiB of parameters; in process...",
        parameter_bytes as f64 / (1 << 20) as f64
    ));
    let in_process_ms = rounds(python, &dir, true, params.clone(), n, device)?;
    progress("checkpoint, exit and restart...");
    let checkpoint_ms = rounds(python, &dir, false, params, n, device)?;
    Ok(Results {
        device,
        python: python.to_string(),
        parameter_bytes,
        state_bytes: 4 * parameter_bytes,
        rounds: n,
        in_process_ms,
        checkpoint_ms,
    })
}
