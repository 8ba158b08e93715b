//! Benchmark: one digits trial, 64-256-256-10, ReLU, Adam lr 1e-3, batch
//! 128, 30 epochs, seed 0, on the CPU. The last line is
//! `val_accuracy=<x> seconds=<y>`; `seconds` covers training and
//! per-epoch evaluation, not data loading.
//!
//! `cargo run --release -p training --example train_digits [-- --threads N]`

use std::sync::Arc;
use std::time::Instant;

use kernels::{Activation, CpuBackend};
use training::data::{digits, split};
use training::{
    DeviceData, Job, Lane, Optimizer, SlotHparams, StepOutcome, TrainTrial, TrialConfig,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let threads = match args.iter().position(|a| a == "--threads") {
        Some(i) => args.get(i + 1).ok_or("--threads needs a number")?.parse()?,
        // At these sizes a GEMM takes ~0.1 ms: splitting it gains nothing measurable.
        None => 1,
    };
    let data = split(&digits(), 0.2, 0)?;
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 0, threads)?;
    let device_data = DeviceData::upload(&mut lane, &data)?;
    let cfg = TrialConfig {
        precision: Default::default(),
        hidden: vec![256, 256],
        activation: Activation::Relu,
        batch_size: 128,
        epochs: 30,
        hparams: SlotHparams {
            optimizer: Optimizer::adam(),
            lr: 1e-3,
            weight_decay: 0.0,
            dropout: 0.0,
            seed: 0,
        },
        report_every: None,
        conv: None,
    };
    let mut trial = TrainTrial::new(&mut lane, device_data, cfg)?;
    println!(
        "digits: {} train / {} validation rows, {} threads, {} iterations",
        data.n_train,
        data.n_val,
        threads,
        trial.total_iterations()
    );
    let start = Instant::now();
    let last = lane.run(|lane| {
        loop {
            match trial.step(lane)? {
                StepOutcome::Continue => {}
                StepOutcome::Report(r) => {
                    if r.step % 5 == 0 {
                        println!(
                            "epoch {:>2}  train_loss={:.4}  val_loss={:.4}  val_accuracy={:.4}",
                            r.step,
                            r.train_loss,
                            r.val_loss,
                            r.val_accuracy.unwrap_or(f64::NAN)
                        );
                    }
                }
                StepOutcome::Finished(r) => break Ok::<_, training::WorkerError>(r),
                StepOutcome::Members(_) => unreachable!("a lone trial"),
            }
        }
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let gflops = trial.flops_per_iteration() * trial.total_iterations() as f64 / seconds / 1e9;
    println!("training rate: {gflops:.1} GFLOP/s");
    println!(
        "val_accuracy={:.4} seconds={:.3}",
        last.val_accuracy.unwrap_or(f64::NAN),
        seconds
    );
    Ok(())
}
