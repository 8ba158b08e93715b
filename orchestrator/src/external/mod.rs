//! Users' own training scripts as trials: external workers gated by the
//! Salus core one iteration at a time.
//!
//! * [`protocol`]: the versioned JSON-lines protocol, pure and tested.
//! * [`worker`]: [`worker::ExternalTrial`], a worker process as a `Job`.
//!
//! The Python client library lives in `clients/python/salus_worker.py`.

pub mod protocol;
pub mod worker;

pub use worker::ExternalTrial;
