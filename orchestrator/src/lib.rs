//! salus-tune: hyper-parameter tuning that packs many training trials onto
//! one device through an embedded re-implementation of Salus (MLSys 2020).
//!
//! # Design
//!
//! Dependencies point one way (see `ARCHITECTURE.md` at the repository
//! root for the map of the code):
//!
//! * `kernels` computes: one `Backend` trait, a CPU and a CUDA
//!   implementation, every op batched over K same-shape trials.
//! * `training` (the `workers/` folder) trains: data sets, the model templates, and trials as `Job`s
//!   that advance one iteration per step and can be swapped out and back.
//! * `salus-core` schedules jobs onto lanes under a memory ledger;
//!   `tuning` holds the search space, samplers and pruners; `storage` is
//!   the Optuna-compatible database. Each is re-exported here under the
//!   name the code uses.
//! * This crate is the CLI: study files, the runner that joins the layers
//!   below, the dashboard, the benchmarks.

// The layers below, under the names the code and tests use.
pub use ::storage;
pub use salus_core as salus;
pub use storage::{credentials, ids};
pub use tuning::{objective, pareto, pbt, pruner, sampler, space};

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod dash;
pub mod device;
pub mod error;
pub mod external;
pub mod kept_model;
pub mod numbers;
pub mod output;
pub mod progress;
pub mod run_lock;
pub mod runner;
pub mod study;
pub mod temp_folders;
