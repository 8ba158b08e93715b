//! Users' own training scripts as trials: external workers gated by the
//! Salus core one iteration at a time.
//!
//! * [`protocol`]: the versioned JSON-lines protocol, pure and tested.
//! * [`worker`]: [`worker::ExternalTrial`], a worker process as a `Job`.
//! * [`mps`]: `[scheduler] mps = true`, the run's own MPS daemon.
//! * [`nvml`]: what worker processes really hold, where NVML loads.
//!
//! The Python client library is the `salus_worker` package in
//! `clients/python/`.

pub mod mps;
pub mod nvml;
pub mod protocol;
pub mod worker;

pub use worker::ExternalTrial;
