//! `salus-tune bench pbt`: what one exploit of population-based training
//! costs, in memory against checkpoint and restore, measured in one run.
//!
//! Two resident MLP trials of one shape (Adam, so each holds its
//! parameters and two moment vectors) are trained an iteration each; then,
//! `rounds` times each way, the receiver takes the donor's whole state:
//!
//! * **In memory**: `Job::exploit`, a device-to-device copy between two
//!   resident trials (what a PBT study does at a boundary).
//! * **Within a fused group**: `Job::exploit_within`, slot to slot, the
//!   same two trials as the members of one resident group.
//! * **Checkpoint and restore**: what a disk-based PBT (Ray Tune's) does:
//!   the donor's state exported and written to a synced file (as
//!   salus-tune writes checkpoints), read back, and loaded into the
//!   receiver built anew with the new hyper-parameters and brought onto
//!   the device.
//!
//! Each time runs until the receiver could take its next iteration (the
//! device synced).

use std::sync::Arc;
use std::time::Instant;

use kernels::{Activation, Backend};
use serde_json::json;
use training::{
    FusedTrials, Job, Lane, Optimizer, SlotHparams, TrainTrial, TrialConfig, TrialSnapshot,
};

use crate::error::{Error, Result};

/// One trial size's times, in milliseconds per exploit.
#[derive(Debug, Clone)]
pub struct Row {
    pub params: usize,
    pub width: usize,
    pub state_bytes: usize,
    pub in_memory_ms: Vec<f64>,
    /// Slot to slot within one fused group of the two.
    pub fused_ms: Vec<f64>,
    pub checkpoint_ms: Vec<f64>,
}

impl Row {
    pub fn ratio(&self) -> f64 {
        median(&self.checkpoint_ms) / median(&self.in_memory_ms)
    }
}

pub struct Results {
    pub device: String,
    pub rounds: usize,
    pub rows: Vec<Row>,
}

fn median(v: &[f64]) -> f64 {
    super::samplers::median(v.to_vec())
}

impl Results {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "device": self.device,
            "rounds": self.rounds,
            "rows": self.rows.iter().map(|r| json!({
                "params": r.params,
                "width": r.width,
                "state_bytes": r.state_bytes,
                "in_memory_ms": r.in_memory_ms,
                "fused_ms": r.fused_ms,
                "checkpoint_ms": r.checkpoint_ms,
                "in_memory_median_ms": median(&r.in_memory_ms),
                "fused_median_ms": median(&r.fused_ms),
                "checkpoint_median_ms": median(&r.checkpoint_ms),
                "ratio": r.ratio(),
            })).collect::<Vec<_>>(),
        })
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "PBT exploit on {} (an MLP with Adam: its parameters and two moments), median of {} rounds\n\
             {:>11} {:>10} {:>14} {:>10} {:>16} {:>8}\n",
            self.device,
            self.rounds,
            "parameters",
            "state MiB",
            "in memory ms",
            "fused ms",
            "checkpoint ms",
            "ratio"
        );
        for r in &self.rows {
            out += &format!(
                "{:>11} {:>10.1} {:>14.3} {:>10.3} {:>16.3} {:>7.1}x\n",
                r.params,
                r.state_bytes as f64 / (1 << 20) as f64,
                median(&r.in_memory_ms),
                median(&r.fused_ms),
                median(&r.checkpoint_ms),
                r.ratio()
            );
        }
        out
    }
}

/// The width of a 2-hidden-layer MLP on 64 features and 10 classes with
/// about `params` parameters.
pub fn width_for(params: usize) -> usize {
    // (64 + 1) w + (w + 1) w + (w + 1) 10 = w^2 + 76 w + 10
    let (b, c) = (76.0, 10.0 - params as f64);
    ((-b + (b * b - 4.0 * c).sqrt()) / 2.0).round().max(1.0) as usize
}

fn config(width: usize, seed: u64, lr: f32) -> TrialConfig {
    TrialConfig {
        precision: Default::default(),
        hidden: vec![width, width],
        activation: Activation::Relu,
        batch_size: 32,
        epochs: 1,
        hparams: SlotHparams {
            optimizer: Optimizer::adam(),
            lr,
            weight_decay: 0.0,
            dropout: 0.0,
            seed,
        },
        report_every: None,
        conv: None,
    }
}

fn bench_err(e: impl std::fmt::Display) -> Error {
    Error::Bench(format!("bench pbt: {e}"))
}

pub fn run<B: Backend>(
    backend: &Arc<B>,
    sizes: &[usize],
    rounds: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Results> {
    let (_, data) = super::bench_data(backend, 64, 10, 32, 3)?;
    let mut lane = Lane::new(backend.clone(), 0, super::cores())?;
    let dir = tempfile::tempdir().map_err(bench_err)?;
    let mut rows = Vec::new();
    for &target in sizes {
        let width = width_for(target);
        let (donor_cfg, receiver_cfg) = (config(width, 1, 1e-3), config(width, 2, 3e-3));
        let mut donor = TrainTrial::new(&mut lane, data.clone(), donor_cfg.clone())?;
        let mut receiver = TrainTrial::new(&mut lane, data.clone(), receiver_cfg.clone())?;
        donor.step(&mut lane)?;
        receiver.step(&mut lane)?;
        lane.sync()?;
        let params = donor
            .device_slot(None)
            .map_or(0, |s| s.group.shape().spec.n_params());
        progress(&format!("bench pbt: {params} parameters (width {width})"));
        let new = SlotHparams {
            lr: 2e-3,
            ..receiver_cfg.hparams
        };
        let (mut in_memory_ms, mut checkpoint_ms) = (Vec::new(), Vec::new());
        let mut state_bytes = 0;
        for round in 0..rounds {
            let t = Instant::now();
            state_bytes = receiver.exploit(
                &mut lane,
                None,
                &mut donor,
                None,
                &training::NewValues::Hparams(new),
            )?;
            lane.sync()?;
            in_memory_ms.push(1e3 * t.elapsed().as_secs_f64());

            let path = dir.path().join(format!("donor-{round}.ckpt"));
            let t = Instant::now();
            let bytes = donor.export_state(&mut lane)?.to_bytes();
            crate::storage::files::write_synced(&path, &bytes).map_err(bench_err)?;
            drop(bytes);
            let read = std::fs::read(&path).map_err(bench_err)?;
            let state = TrialSnapshot::from_bytes(&read)?;
            let cfg = TrialConfig {
                hparams: new,
                ..receiver_cfg.clone()
            };
            let mut restored = TrainTrial::resume_on_host(data.clone(), cfg, state)?;
            restored.swap_in(&mut lane)?;
            lane.sync()?;
            checkpoint_ms.push(1e3 * t.elapsed().as_secs_f64());
            drop(restored);
            let _ = std::fs::remove_file(&path);
        }
        drop((donor, receiver));
        // The same two as the members of one resident group (which must
        // not end at its first step).
        let longer = |c: &TrialConfig| TrialConfig {
            epochs: 100,
            ..c.clone()
        };
        let mut group = FusedTrials::new(vec![
            (
                0,
                TrainTrial::new_on_host(data.clone(), longer(&donor_cfg))?,
            ),
            (
                1,
                TrainTrial::new_on_host(data.clone(), longer(&receiver_cfg))?,
            ),
        ])?;
        group.step(&mut lane)?;
        lane.sync()?;
        let mut fused_ms = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            group.exploit_within(&mut lane, 1, 0, &training::NewValues::Hparams(new))?;
            lane.sync()?;
            fused_ms.push(1e3 * t.elapsed().as_secs_f64());
        }
        rows.push(Row {
            params,
            width,
            state_bytes,
            in_memory_ms,
            fused_ms,
            checkpoint_ms,
        });
    }
    Ok(Results {
        device: backend.name(),
        rounds,
        rows,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn widths_give_the_asked_parameter_counts() {
        for target in [1_000_000usize, 10_000_000] {
            let w = super::width_for(target);
            let n = 65 * w + (w + 1) * w + (w + 1) * 10;
            assert!((n as f64 / target as f64 - 1.0).abs() < 0.01, "{w}: {n}");
        }
    }
}
