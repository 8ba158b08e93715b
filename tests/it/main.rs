//! The end-to-end tests of the `salus-tune` binary, its database, its docs
//! and its core, as one test binary: a change links it once, not once per
//! file. Each module is one subject; `common` holds the helpers they share.

mod common;

mod bad_input;
mod bench;
mod cnn;
mod dashboard;
mod devices;
mod docs;
mod enqueue;
mod external;
mod external_torch;
mod fusion;
mod keep_export;
mod layers;
mod objectives;
mod optuna_interop;
mod pbt;
mod postgres;
mod processes;
mod reliability;
mod run;
mod salus_core;
mod study_errors;
mod study_file;
mod wheel;
