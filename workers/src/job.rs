//! The `Job` trait: how the Salus core sees a trial.
//!
//! The core never learns what a model is. It sees a footprint (to admit
//! the job), a fusion key (to group it with others), and a state machine
//! that advances one iteration per `step`, reports at report points, and
//! moves its persistent state off and back onto the device on request.

use std::sync::Arc;

use kernels::Backend;

use crate::device_data::DeviceData;
use crate::error::Result;
use crate::group::{GroupShape, ModelGroup};
use crate::hparams::{OptimizerFamily, SlotHparams};
use crate::lane::Lane;
use crate::state::TrialSnapshot;

/// The device memory a job needs, known before it touches the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    /// Lives as long as the job is resident: weights, optimizer state.
    pub persistent_bytes: usize,
    /// Needed only inside an iteration: activations and gradients.
    pub ephemeral_bytes: usize,
    /// Shared with every job on the same data (the data set itself).
    pub shared_bytes: usize,
}

/// Jobs with equal keys can run as one fused group: same model shape,
/// batch size, optimizer state layout and data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FusionKey {
    pub shape: GroupShape,
    pub family: OptimizerFamily,
    pub data: String,
}

impl FusionKey {
    /// The key with the hidden layers left out (their widths and their
    /// number): trials whose keys agree here can share a group of mixed
    /// shapes ([`crate::group::ModelGroup::zeroed_mixed`]); conv nets' keys keep
    /// their conv net, so only their heads may differ. `None` for a net
    /// without hidden layers (nothing to mix).
    pub fn mixable(&self) -> Option<FusionKey> {
        if self.shape.spec.hidden.is_empty() {
            return None;
        }
        let mut key = self.clone();
        key.shape.spec.hidden = Vec::new();
        Some(key)
    }
}

/// Where a swapped-out job's state went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapMedium {
    /// Host memory of a live process (the built-in trials, and workers
    /// whose client tracks their state).
    HostMemory,
    /// A checkpoint file; the worker process exited.
    Checkpoint,
}

impl SwapMedium {
    /// As `salus_swaps.medium` stores it.
    pub fn name(self) -> &'static str {
        match self {
            SwapMedium::HostMemory => "memory",
            SwapMedium::Checkpoint => "checkpoint",
        }
    }
}

/// What a report point measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// 1-based report index: the step of Optuna's intermediate values.
    pub step: u64,
    /// Iterations done when the report was made.
    pub iteration: u64,
    /// Mean training loss since the previous report.
    pub train_loss: f64,
    /// Validation log-loss (classification) or MSE in standardised units.
    pub val_loss: f64,
    pub val_accuracy: Option<f64>,
    /// RMSE in the target's original units.
    pub val_rmse: Option<f64>,
    pub val_r2: Option<f64>,
    /// What an external worker reported: the study's metric, whatever its name.
    pub external: Option<f64>,
    /// What an external worker said besides its metric; empty otherwise.
    pub extras: ReportExtras,
}

/// An external worker's auxiliary metrics at this report's step, and the
/// user attributes it set since its previous report.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReportExtras {
    /// `report(step, value, **metrics)`: name and value.
    pub metrics: Vec<(String, f64)>,
    /// `set_user_attr(key, value)`: the key and the value as JSON text.
    pub attrs: Vec<(String, String)>,
    /// `done([a, b, ...])`: the final values after the first, one per
    /// further objective of a study of several.
    pub more_values: Vec<f64>,
}

impl ReportExtras {
    pub fn is_empty(&self) -> bool {
        self.metrics.is_empty() && self.attrs.is_empty() && self.more_values.is_empty()
    }
}

impl Report {
    /// The value of a metric by name: `val_accuracy`, `val_loss`,
    /// `val_rmse`, `val_r2`, `train_loss`, or one measured beside them
    /// (`latency`); an external worker's value under any name.
    pub fn metric(&self, name: &str) -> Option<f64> {
        if self.external.is_some() {
            return self.external;
        }
        match name {
            "val_accuracy" => self.val_accuracy,
            "val_loss" => Some(self.val_loss),
            "val_rmse" => self.val_rmse,
            "val_r2" => self.val_r2,
            "train_loss" => Some(self.train_loss),
            // Measured beside the metrics (a built-in trial's `latency`).
            name => self
                .extras
                .metrics
                .iter()
                .find(|(n, _)| n == name)
                .map(|&(_, v)| v),
        }
    }
}

/// What one `step` did.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// An iteration ran; no report point.
    Continue,
    /// An iteration ran and ended at a report point.
    Report(Report),
    /// The last iteration ran; this is the final report.
    Finished(Report),
    /// A fused group's iteration ran: what its members at a report point or
    /// at their end said. Members not listed continue.
    Members(Vec<MemberStep>),
}

/// One member of a fused group at a report point or at its end.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberStep {
    /// The tag the member was fused under.
    pub tag: u64,
    pub outcome: MemberOutcome,
}

/// What a fused member's iteration ended in. `Finished`, `Failed` and
/// `Left` members have left the group.
#[derive(Debug, Clone, PartialEq)]
pub enum MemberOutcome {
    Report(Report),
    Finished(Report),
    /// The trial diverged or broke; the reason, for the database.
    Failed(String),
    /// The member left at this boundary, its state on the host, as its
    /// group's control asked (or a joiner the group could not take). The
    /// trial itself waits in the control: `FusedControl::take_left`.
    Left,
}

/// A resident trial's state on the device ([`Job::device_slot`]).
pub struct DeviceSlot<'a, B: Backend> {
    pub group: &'a ModelGroup<B>,
    pub slot: usize,
    /// Iterations done.
    pub iteration: u64,
    /// Reports made.
    pub reports: u64,
}

/// What a PBT receiver goes on with after an exploit.
#[derive(Debug, Clone, PartialEq)]
pub enum NewValues {
    /// A built-in trial's hyper-parameters.
    Hparams(SlotHparams),
    /// An external worker's parameters: a JSON object, as its `start`
    /// message carries them.
    Params(String),
}

/// A PBT donor's state as another process stored it at an exploit point
/// (see [`Job::exploit_stored`]).
#[derive(Debug)]
pub enum StoredState {
    /// A built-in trial's, read from its point file.
    Snapshot(TrialSnapshot),
    /// An external worker's: the file its script saved, in the script's
    /// own checkpoint format, and where in training the donor was.
    File {
        path: std::path::PathBuf,
        iteration: u64,
        step: u64,
    },
}

impl StoredState {
    /// A built-in trial's state; an external worker's file is refused.
    pub fn into_snapshot(self) -> Result<TrialSnapshot> {
        match self {
            StoredState::Snapshot(s) => Ok(s),
            StoredState::File { path, .. } => Err(crate::WorkerError::Config(format!(
                "a built-in trial cannot take an external worker's saved state ({})",
                path.display()
            ))),
        }
    }
}

/// A donor's whole state on the host: a lone trial's, or its member
/// `tag`'s.
pub fn donor_state<B: Backend>(
    donor: &mut dyn Job<B>,
    lane: &mut Lane<B>,
    tag: Option<u64>,
) -> Result<TrialSnapshot> {
    match tag {
        None => donor.export_state(lane),
        Some(t) => donor
            .member_states(lane)?
            .into_iter()
            .find_map(|(m, s)| (m == t).then_some(s))
            .ok_or_else(|| {
                crate::WorkerError::Config(format!("no member {t} in the donor's group"))
            }),
    }
}

/// A schedulable trial. See the module docs.
pub trait Job<B: Backend>: Send {
    fn footprint(&self) -> Footprint;
    /// Whether `footprint` may change while the job lives (an external
    /// worker measures its own): the core then reads it again after each
    /// step and before admission. Built-in trials know theirs up front.
    fn footprint_changes(&self) -> bool {
        false
    }
    fn fusion_key(&self) -> FusionKey;
    fn iterations_done(&self) -> u64;
    fn total_iterations(&self) -> u64;
    /// Whether the persistent state is on the device.
    fn is_resident(&self) -> bool;
    /// Runs exactly one iteration on `lane`.
    fn step(&mut self, lane: &mut Lane<B>) -> Result<StepOutcome>;
    /// The most recent report.
    fn report(&self) -> Option<&Report>;
    /// The full state, as host bytes can carry it.
    fn export_state(&mut self, lane: &mut Lane<B>) -> Result<TrialSnapshot>;
    /// Replaces the full state; the job continues exactly where `state` was taken.
    fn import_state(&mut self, lane: &mut Lane<B>, state: &TrialSnapshot) -> Result<()>;
    /// Moves the persistent state to host memory and frees the device's.
    /// Returns the bytes moved.
    fn swap_out(&mut self, lane: &mut Lane<B>) -> Result<usize>;
    /// Brings a swapped-out state back. Returns the bytes moved.
    fn swap_in(&mut self, lane: &mut Lane<B>) -> Result<usize>;
    /// Where the last `swap_out` put the state.
    fn swap_medium(&self) -> SwapMedium {
        SwapMedium::HostMemory
    }
    /// Device bytes the job holds between iterations that it could give
    /// back without moving its state (an external worker's allocator
    /// cache); part of its footprint's persistent bytes.
    fn releasable_bytes(&self) -> usize {
        0
    }
    /// Gives those bytes back; returns how many. The footprint shrinks.
    fn release_cache(&mut self, _lane: &mut Lane<B>) -> Result<usize> {
        Ok(0)
    }
    /// Whether the job, now off the device, could continue on another
    /// device of the same kind: its state is on the host, not held by a
    /// device (a worker process's). A fused group stays where it formed.
    fn can_move(&self) -> bool {
        false
    }
    /// Points a job that [`Job::can_move`] at another device's copy of the
    /// study's data before that device's core adopts it.
    fn rehome(&mut self, _data: &Arc<DeviceData<B>>) {}
    /// Trials still inside the job: 1 for a lone trial, the members of a
    /// fused group. A fused job with none left has ended.
    fn live_members(&self) -> usize {
        1
    }
    /// Where a trial's state lives on the device while it is resident: its
    /// group and slot, with the iterations and reports it covers (PBT's
    /// exploit copies from there without leaving the device). `tag` names
    /// a fused group's member; a lone trial has none.
    fn device_slot(&self, _tag: Option<u64>) -> Option<DeviceSlot<'_, B>> {
        None
    }
    /// PBT's exploit: the trial (a fused group's member `tag`) takes
    /// `donor`'s (its member `donor_tag`'s) whole state (parameters,
    /// optimizer state, batch norm's statistics, and its place in
    /// training) and continues from it with `new` values, keeping its own
    /// seed (data order and dropout). Both jobs are off the lanes, at a
    /// boundary. On the device where both are resident; through the host
    /// otherwise; an external worker through a file the donor saves
    /// ([`Job::save_for_exploit`]). Returns the bytes copied.
    fn exploit(
        &mut self,
        _lane: &mut Lane<B>,
        _tag: Option<u64>,
        _donor: &mut dyn Job<B>,
        _donor_tag: Option<u64>,
        _new: &NewValues,
    ) -> Result<usize> {
        Err(crate::WorkerError::Config(
            "this kind of trial cannot take another trial's state".into(),
        ))
    }
    /// PBT's exploit from a donor this process does not hold (another
    /// process's, on a study they share): the trial (member `tag`) takes
    /// `state`, the donor's state as stored at the exploit point, as
    /// [`Job::exploit`] takes a resident donor's. Returns the bytes taken.
    fn exploit_stored(
        &mut self,
        _lane: &mut Lane<B>,
        _tag: Option<u64>,
        _state: StoredState,
        _new: &NewValues,
    ) -> Result<usize> {
        Err(crate::WorkerError::Config(
            "this kind of trial cannot take a stored state; its donor must be in this process"
                .into(),
        ))
    }
    /// PBT's exploit between two members of one fused group: slot to slot.
    fn exploit_within(
        &mut self,
        _lane: &mut Lane<B>,
        _tag: u64,
        _donor_tag: u64,
        _new: &NewValues,
    ) -> Result<usize> {
        Err(crate::WorkerError::Config(
            "only a fused group's members take one another's state".into(),
        ))
    }
    /// A donor's side of an exploit between external workers: its whole
    /// state saved to `path`, in the format its own checkpoints have,
    /// without stopping it. Built-in trials are copied on the device or
    /// through the host instead.
    fn save_for_exploit(&mut self, _lane: &mut Lane<B>, _path: &std::path::Path) -> Result<()> {
        Err(crate::WorkerError::Config(
            "this kind of trial cannot save its state for another trial to take".into(),
        ))
    }
    /// A fused job's members' states, by tag, for their checkpoints; a lone
    /// trial has none (it checkpoints through `export_state`).
    fn member_states(&mut self, _lane: &mut Lane<B>) -> Result<Vec<(u64, TrialSnapshot)>> {
        Ok(Vec::new())
    }
    /// A fused job's members that finished in the last step, with their
    /// final states, by tag (taken: a second call is empty). A lone trial
    /// has none (its final state is `export_state` after it finishes).
    fn take_final_states(&mut self) -> Vec<(u64, TrialSnapshot)> {
        Vec::new()
    }
}
