//! salus-tune: hyper-parameter tuning that packs many training trials onto
//! one device through an embedded re-implementation of Salus (MLSys 2020).
//!
//! # Design
//!
//! Dependencies point one way: `orchestrator -> workers -> kernels`.
//!
//! * `kernels` computes: one `Backend` trait, a CPU and a CUDA
//!   implementation, every op batched over K same-shape trials.
//! * `workers` trains: data sets, the MLP template, and trials as `Job`s
//!   that advance one iteration per step and can be swapped out and back.
//! * This crate orchestrates: the CLI, study files,
//!   samplers and pruners, the Salus core that schedules jobs onto lanes
//!   under a memory ledger, and Optuna-compatible storage. See
//!   `ARCHITECTURE.md` at the repository root for the map of the code.
//!
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod credentials;
pub mod dash;
pub mod device;
pub mod error;
pub mod external;
pub mod ids;
pub mod kept_model;
pub mod numbers;
pub mod objective;
pub mod output;
pub mod progress;
pub mod pruner;
pub mod run_lock;
pub mod runner;
pub mod salus;
pub mod sampler;
pub mod space;
pub mod storage;
pub mod study;
