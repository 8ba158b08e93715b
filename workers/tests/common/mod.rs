//! Helpers shared by the workers tests.
#![allow(dead_code)]

use std::sync::Arc;

use kernels::{Activation, Backend, CpuBackend};
use training::data::{SplitData, split, synthetic_classification, synthetic_regression};
use training::{
    DeviceData, Job, Lane, Optimizer, Report, SlotHparams, StepOutcome, TrainTrial, TrialConfig,
};

/// Lane 0 of `backend`, with `threads` threads (the CPU's pool size).
pub fn lane_on<B: Backend>(backend: B, threads: usize) -> Lane<B> {
    Lane::new(Arc::new(backend), 0, threads).unwrap()
}

pub fn cpu_lane(threads: usize) -> Lane<CpuBackend> {
    lane_on(CpuBackend::new(), threads)
}

/// A CUDA lane for a test, or `None` after printing why it is skipped.
pub fn cuda_lane(test: &str) -> Option<Lane<kernels::cuda::CudaBackend>> {
    Some(lane_on(kernels::cuda::device_for_test(test)?, 1))
}

pub fn small_classification() -> SplitData {
    split(&synthetic_classification(120, 6, 3, 4, 7), 0.25, 1).unwrap()
}

pub fn small_regression() -> SplitData {
    split(&synthetic_regression(120, 5, 3, 0.1, 8), 0.25, 1).unwrap()
}

pub fn upload<B: Backend>(lane: &mut Lane<B>, d: &SplitData) -> Arc<DeviceData<B>> {
    DeviceData::upload(lane, d).unwrap()
}

pub fn hparams(optimizer: Optimizer, lr: f32, dropout: f32, seed: u64) -> SlotHparams {
    SlotHparams {
        optimizer,
        lr,
        weight_decay: 1e-4,
        dropout,
        seed,
    }
}

pub fn config(
    hidden: Vec<usize>,
    activation: Activation,
    batch: usize,
    epochs: u64,
    hp: SlotHparams,
) -> TrialConfig {
    TrialConfig {
        precision: Default::default(),
        hidden,
        activation,
        batch_size: batch,
        epochs,
        hparams: hp,
        report_every: None,
        conv: None,
    }
}

/// Steps a lone trial `n` iterations, collecting the reports it makes.
pub fn run_iterations<B: Backend>(
    trial: &mut TrainTrial<B>,
    lane: &mut Lane<B>,
    n: u64,
) -> Vec<Report> {
    (0..n)
        .filter_map(|_| match trial.step(lane).unwrap() {
            StepOutcome::Report(r) | StepOutcome::Finished(r) => Some(r),
            StepOutcome::Continue => None,
            StepOutcome::Members(_) => unreachable!("a lone trial"),
        })
        .collect()
}

/// A conv net with every part the device tests compare: batch norm,
/// residual blocks, max pooling, and augmentation.
pub fn residual_net(
    image: training::data::ImageShape,
    stages: Vec<usize>,
) -> training::model::ConvNetSpec {
    training::model::ConvNetSpec {
        image,
        stages,
        blocks_per_stage: 2,
        kernel: 3,
        residual: true,
        batch_norm: true,
        pool: kernels::PoolKind::Max,
        global_pool: false,
        augment: Some(training::model::Augment {
            crop: 1,
            flip: true,
        }),
    }
}

/// Steps a lone trial to its end, collecting its reports.
pub fn run_to_end<B: Backend>(trial: &mut TrainTrial<B>, lane: &mut Lane<B>) -> Vec<Report> {
    let mut reports = Vec::new();
    loop {
        match trial.step(lane).unwrap() {
            StepOutcome::Continue => {}
            StepOutcome::Report(r) => reports.push(r),
            StepOutcome::Finished(r) => {
                reports.push(r);
                return reports;
            }
            StepOutcome::Members(_) => unreachable!("a lone trial"),
        }
    }
}
