//! Training for salus-tune: the built-in trials (the `training` crate,
//! in the `workers/` folder; an *external* worker is a process, see the
//! orchestrator's `external` module).
//!
//! # Design
//!
//! This crate turns a hyper-parameter set into a schedulable [`Job`]: a
//! state machine that runs one mini-batch iteration per `step`, on a
//! [`Lane`] the Salus core hands it.
//!
//! * [`data`] loads data sets (built-in digits, synthetic, CSV, `.npy`)
//!   and splits and standardises them; [`DeviceData`] puts a split on the
//!   device once for every trial that uses it.
//! * [`model`] describes the MLP template and its parameter layout.
//! * [`group::ModelGroup`] trains K same-shape trials as one, through the
//!   batched ops of `kernels`. A lone trial is a group of one, so fusion
//!   needs no second code path.
//! * [`trial::TrainTrial`] is one trial as a [`Job`]: it knows its
//!   footprint exactly from the shapes, reports at report points, and
//!   exports its whole state to bytes ([`TrialSnapshot`]) for swapping and
//!   checkpoints, bit-exactly.
//!
//! * [`FusedTrials`] is a *fused group* as a [`Job`]: trials of one fusion
//!   key that the core schedules as one, each a member that can leave and
//!   join at a boundary. Its buffers are one [`group::ModelGroup`] of K slots.
//!   "Fused group" is the one word for this idea across the crates; the
//!   runner's bookkeeping of one is `runner::groups::Group`.
//!
//! Everything is generic over [`kernels::Backend`], so the CPU and CUDA run
//! the same code.

mod convnet;
pub mod data;
pub mod device_data;
pub mod error;
pub mod fused;
pub mod group;
pub mod hparams;
pub mod job;
pub mod lane;
pub mod model;
pub mod state;
pub mod trial;

pub use device_data::DeviceData;
pub use error::{Result, WorkerError};
pub use fused::{FusedControl, FusedTrials, admits, mixable_key};
pub use group::{OptimizerOrder, fits_layout, mixed_hidden};
pub use hparams::{Optimizer, OptimizerFamily, SlotHparams};
pub use job::{
    DeviceSlot, Footprint, FusionKey, Job, MemberOutcome, MemberStep, NewValues, Report,
    ReportExtras, StepOutcome, StoredState, SwapMedium,
};
pub use lane::Lane;
pub use model::{LossKind, ModelSpec};
pub use state::TrialSnapshot;
pub use trial::{TrainTrial, TrialConfig};
