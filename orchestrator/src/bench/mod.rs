//! `salus-tune bench`: the measurements of the project's anchors and
//! issues, taken in one run so that ratios hold on a shared machine.
//!
//! * [`packing`]: aggregate training throughput of K same-shape trials run
//!   one after another (`seq`) and through the Salus core's lanes (`lanes`),
//!   the core's overhead against a bare training loop, switch latency, and
//!   the CPU's GEMM rate.
//! * [`external_workers`]: the cost of gating users' scripts: the round trip of one
//!   gated iteration, and a study of a small Python objective against
//!   calling it directly at the same concurrency.
//! * [`policies`]: a seeded trace of really-trained trials with heavy-tailed
//!   lengths and staggered arrivals, replayed under each policy.

pub mod chaos;
pub mod external_workers;
pub mod fronts;
pub mod packing;
pub mod pbt;
pub mod policies;
pub mod samplers;
pub mod storage;
pub mod swap;
pub mod tables;

use std::sync::Arc;

use kernels::Activation;
use kernels::Backend;
use training::data::{SplitData, split, synthetic_classification};
use training::{DeviceData, Lane, Optimizer, SlotHparams, TrialConfig};

use crate::error::{Error, Result};

/// Writes a file the binary carries (a Python client or script) into this
/// process's own temporary folder and returns its path: an installed
/// binary has no source tree to find it in.
pub fn carried_file(name: &str, contents: &str) -> Result<std::path::PathBuf> {
    let dir = crate::temp_folders::bench_dir();
    let path = dir.join(name);
    std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&path, contents))
        .map_err(|source| Error::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
    Ok(path)
}

/// The Python client package the binary carries: `salus_worker`, with
/// `salus_worker.torch`, as (path, text).
const CLIENT: [(&str, &str); 2] = [
    (
        "salus_worker/__init__.py",
        include_str!("../../../clients/python/salus_worker/__init__.py"),
    ),
    (
        "salus_worker/torch.py",
        include_str!("../../../clients/python/salus_worker/torch.py"),
    ),
];

/// Writes the client package into `dir` (which then goes on `PYTHONPATH`).
pub fn write_client(dir: &std::path::Path) -> Result<()> {
    for (name, text) in CLIENT {
        let path = dir.join(name);
        std::fs::create_dir_all(dir.join("salus_worker"))
            .and_then(|_| std::fs::write(&path, text))
            .map_err(|source| Error::Io {
                what: format!("writing {}", path.display()),
                source,
            })?;
    }
    Ok(())
}

/// The client package in this process's temporary folder (see
/// [`carried_file`]): the folder to put on `PYTHONPATH`.
pub fn carried_client() -> Result<std::path::PathBuf> {
    let dir = crate::temp_folders::bench_dir();
    write_client(&dir)?;
    Ok(dir)
}

/// The Python the anchor scripts run with: `SALUS_TUNE_PYTHON`, else
/// `.venv/bin/python` (what `scripts/test.sh` makes).
pub fn anchor_python() -> std::path::PathBuf {
    std::env::var_os("SALUS_TUNE_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| ".venv/bin/python".into())
}

/// The Python a bench's `--python` flag picks: the flag, else
/// `SALUS_TUNE_PYTHON`, else `python3` on the PATH.
pub fn flag_python(given: Option<std::path::PathBuf>) -> std::path::PathBuf {
    given
        .or_else(|| std::env::var_os("SALUS_TUNE_PYTHON").map(std::path::PathBuf::from))
        .unwrap_or_else(|| "python3".into())
}

/// Whether `py` runs `import {modules}` (for example `"torch, scipy"`).
pub fn python_imports(py: &std::path::Path, modules: &str) -> bool {
    std::process::Command::new(py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs an anchor script the binary carries (`name`, `contents`) with
/// `py` and `args`, its errors shown as they come, and parses the JSON it
/// prints.
pub fn run_anchor_script(
    py: &std::path::Path,
    name: &str,
    contents: &str,
    args: &[String],
) -> Result<serde_json::Value> {
    let script = carried_file(name, contents)?;
    let out = std::process::Command::new(py)
        .arg(script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|source| Error::Io {
            what: "python".into(),
            source,
        });
    remove_carried_files();
    let out = out?;
    if !out.status.success() {
        return Err(Error::Bench(format!("{name} failed (its error is above)")));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| Error::Bench(format!("{name} output: {e}")))
}

/// Removes what [`carried_file`] wrote.
pub fn remove_carried_files() {
    let dir = crate::temp_folders::bench_dir();
    let _ = std::fs::remove_dir_all(dir);
}

/// Removes, when dropped, what a bench that runs external workers in
/// process leaves in the temporary folder, however it ends: the workers'
/// sockets, what [`carried_file`] wrote, and the bench's own folder.
/// Declared before the bench's trials, it is dropped after them.
pub struct TempCleanup {
    pub own: Option<std::path::PathBuf>,
}

impl Drop for TempCleanup {
    fn drop(&mut self) {
        crate::external::worker::shut_down_workers();
        remove_carried_files();
        if let Some(dir) = &self.own {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Synthetic classification data with `features` inputs, about 1.5 batches
/// of training rows (so that an epoch is exactly one iteration, whatever the
/// stratified split's rounding) and a small validation part.
pub fn bench_data<B: Backend>(
    backend: &Arc<B>,
    features: usize,
    classes: usize,
    batch: usize,
    seed: u64,
) -> Result<(SplitData, Arc<DeviceData<B>>)> {
    let val = 64;
    let total = batch + batch / 2 + val;
    let ds = synthetic_classification(total, features, classes, features.min(16), seed);
    let data = split(&ds, val as f64 / total as f64, seed)?;
    let mut lane = Lane::new(backend.clone(), 0, 1)?;
    let dev = DeviceData::upload(&mut lane, &data).map_err(Error::from)?;
    Ok((data, dev))
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A ReLU MLP trained with Adam for exactly `iterations` iterations (the
/// bench data make an epoch one iteration), reporting only at its end:
/// evaluation is not what the benchmarks measure.
pub fn trial_config(hidden: Vec<usize>, batch: usize, iterations: u64, seed: u64) -> TrialConfig {
    TrialConfig {
        precision: Default::default(),
        hidden,
        activation: Activation::Relu,
        batch_size: batch,
        epochs: iterations,
        hparams: SlotHparams {
            optimizer: Optimizer::adam(),
            lr: 1e-3,
            weight_decay: 0.0,
            dropout: 0.0,
            seed,
        },
        report_every: Some(u64::MAX / 2),
        conv: None,
    }
}
