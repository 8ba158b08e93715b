//! `TrainTrial`: one built-in MLP trial as a [`Job`].
//!
//! An epoch is `floor(n_train / batch)` full mini-batches of a fresh seeded
//! permutation, so every iteration has the same shape (what fusion and CUDA
//! graphs need) and the permutation of any epoch can be recomputed from the
//! seed alone. Evaluation runs at report points, once per epoch by default.

use std::sync::Arc;

use kernels::Backend;
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};

use crate::data::Task;
use crate::device_data::DeviceData;
use crate::error::{Result, WorkerError};
use crate::group::{GroupShape, LossStats, ModelGroup, SlotState};
use crate::hparams::SlotHparams;
use crate::job::{
    DeviceSlot, Footprint, FusionKey, Job, NewValues, Report, StepOutcome, StoredState, donor_state,
};
use crate::lane::Lane;
use crate::model::{ConvNetSpec, ImageShape, LossKind, ModelSpec};
use crate::state::{TrialSnapshot, fnv1a};

/// What a trial trains, before it is bound to data.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialConfig {
    /// Hidden layer widths, input to output.
    pub hidden: Vec<usize>,
    pub activation: kernels::Activation,
    pub batch_size: usize,
    pub epochs: u64,
    pub hparams: SlotHparams,
    /// Iterations between report points; `None` reports once per epoch.
    pub report_every: Option<u64>,
    /// A conv net in front of the MLP (`hidden` is then its head). Its
    /// image shape is the data's, set when the trial is bound to data.
    pub conv: Option<ConvNetSpec>,
    /// The arithmetic of its GEMMs (`[train] precision`).
    pub precision: kernels::Precision,
}

impl TrialConfig {
    /// Training FLOPs of one iteration on `data`, without building the
    /// trial (which would fill its initial state).
    pub fn flops_per_iteration<B: Backend>(&self, data: &DeviceData<B>) -> Result<f64> {
        let spec = self.spec(data.features, data.task, data.image)?;
        Ok(spec.flops_per_iteration(self.batch_size))
    }

    /// The model for `task` with `features` inputs, which are images of
    /// `image` when the data has that shape.
    pub fn spec(
        &self,
        features: usize,
        task: Task,
        image: Option<ImageShape>,
    ) -> Result<ModelSpec> {
        let conv = match (&self.conv, image) {
            (None, _) => None,
            (Some(c), Some(image)) => Some(ConvNetSpec { image, ..c.clone() }),
            (Some(_), None) => {
                return Err(WorkerError::Config(
                    "a convolutional model needs image data (npy with a layout, idx, cifar10, or digits as images)".into(),
                ));
            }
        };
        if let Some(c) = &conv
            && (c.stages.is_empty() || c.stages.contains(&0) || c.kernel % 2 == 0)
        {
            return Err(WorkerError::Config(format!(
                "a convolutional model needs at least one stage, no empty stage and an odd kernel (got stages {:?}, kernel {})",
                c.stages, c.kernel
            )));
        }
        let input = conv.as_ref().map_or(features, |c| c.plan().features);
        Ok(ModelSpec {
            input,
            conv,
            hidden: self.hidden.clone(),
            output: task.outputs(),
            activation: self.activation,
            precision: self.precision,
            loss: match task {
                Task::Classification { .. } => LossKind::CrossEntropy,
                Task::Regression { .. } => LossKind::Mse,
            },
        })
    }
}

/// One trial of the built-in MLP. See the module docs.
pub struct TrainTrial<B: Backend> {
    cfg: TrialConfig,
    data: Arc<DeviceData<B>>,
    shape: GroupShape,
    group: Option<ModelGroup<B>>,
    swapped: Option<TrialSnapshot>,
    iteration: u64,
    reports: u64,
    iters_per_epoch: u64,
    report_every: u64,
    perm: Vec<u32>,
    perm_epoch: Option<u64>,
    last_report: Option<Report>,
    /// Time the last validation pass, as inference `latency` (seconds per
    /// batch) in the final report's extras ([`TrainTrial::measuring_latency`]).
    latency: bool,
    /// Values that change as it trains ([`TrainTrial::with_schedule`]).
    schedule: Vec<(u64, SlotHparams)>,
}

impl<B: Backend> TrainTrial<B> {
    /// Times the final validation pass on the device, and reports its
    /// seconds per batch as the metric `latency` (a study's objective or
    /// constraint). Measured on a trial that runs alone (not fused).
    pub fn measuring_latency(mut self, on: bool) -> Self {
        self.latency = on;
        self
    }

    /// Values that change as the trial trains: from report step `s` on
    /// (after its `s`-th report), `h` (its own seed kept). The optimizer
    /// family and whether dropout is on stay as they are.
    pub fn with_schedule(mut self, schedule: Vec<(u64, SlotHparams)>) -> Self {
        self.schedule = schedule;
        self
    }

    /// Puts the schedule's values for the reports made so far in place.
    fn follow_schedule(&mut self) -> Result<()> {
        let Some(&(_, h)) = self.schedule.iter().rev().find(|(s, _)| *s <= self.reports) else {
            return Ok(());
        };
        let h = SlotHparams {
            seed: self.cfg.hparams.seed,
            ..h
        };
        if h != self.cfg.hparams {
            if let Some(g) = self.group.as_mut() {
                g.set_slot_hparams(0, h)?;
            }
            self.cfg.hparams = h;
        }
        Ok(())
    }

    /// A trial with fresh weights, resident on `lane`'s device.
    pub fn new(lane: &mut Lane<B>, data: Arc<DeviceData<B>>, cfg: TrialConfig) -> Result<Self> {
        let mut trial = Self::new_on_host(data, cfg)?;
        trial.swap_in(lane)?;
        Ok(trial)
    }

    /// A trial with fresh weights held on the host: nothing is on the device
    /// until `swap_in` (which is how the Salus core admits it). Its
    /// footprint is known already.
    pub fn new_on_host(data: Arc<DeviceData<B>>, cfg: TrialConfig) -> Result<Self> {
        if cfg.batch_size == 0 || cfg.batch_size > data.n_train {
            return Err(WorkerError::Config(format!(
                "batch_size {} must be between 1 and the {} training rows",
                cfg.batch_size, data.n_train
            )));
        }
        if cfg.epochs == 0 || cfg.hidden.contains(&0) {
            return Err(WorkerError::Config(
                "epochs and hidden widths must be at least 1".into(),
            ));
        }
        if !(0.0..1.0).contains(&cfg.hparams.dropout) {
            return Err(WorkerError::Config(format!(
                "dropout must be in [0, 1), got {}",
                cfg.hparams.dropout
            )));
        }
        let spec = cfg.spec(data.features, data.task, data.image)?;
        let (shape, family) =
            ModelGroup::<B>::shape_of(spec, cfg.batch_size, data.target_cols, &[cfg.hparams])?;
        let n = shape.spec.n_params();
        let iters_per_epoch = (data.n_train / cfg.batch_size) as u64;
        let report_every = cfg.report_every.unwrap_or(iters_per_epoch).max(1);
        let mut trial = TrainTrial {
            shape,
            group: None,
            swapped: None,
            iteration: 0,
            reports: 0,
            iters_per_epoch,
            report_every,
            perm: Vec::new(),
            perm_epoch: None,
            last_report: None,
            latency: false,
            schedule: Vec::new(),
            data,
            cfg,
        };
        let slot = SlotState {
            params: trial.shape.spec.init_params(trial.cfg.hparams.seed),
            opt_state: vec![vec![0.0; n]; family.state_vectors()],
            train_stats: vec![0.0; kernels::STATS_LEN],
            running: trial.shape.spec.init_running(),
        };
        trial.swapped = Some(TrialSnapshot {
            fingerprint: trial.fingerprint(),
            iteration: 0,
            reports: 0,
            slot,
        });
        Ok(trial)
    }

    /// A trial that continues from `state` (a checkpoint), held on the
    /// host like [`TrainTrial::new_on_host`]. A state taken from another
    /// model or optimizer, or past the trial's end, is refused.
    pub fn resume_on_host(
        data: Arc<DeviceData<B>>,
        cfg: TrialConfig,
        state: TrialSnapshot,
    ) -> Result<Self> {
        let mut trial = Self::new_on_host(data, cfg)?;
        if state.fingerprint != trial.fingerprint() {
            return Err(WorkerError::BadState(
                "the checkpoint was taken from a different model or optimizer".into(),
            ));
        }
        if state.iteration > trial.total_iterations() {
            return Err(WorkerError::BadState(format!(
                "the checkpoint is at iteration {} of a {}-iteration trial",
                state.iteration,
                trial.total_iterations()
            )));
        }
        trial.put_host_state(state);
        Ok(trial)
    }

    pub fn config(&self) -> &TrialConfig {
        &self.cfg
    }

    pub fn iterations_per_epoch(&self) -> u64 {
        self.iters_per_epoch
    }

    /// Training FLOPs of one iteration (see [`ModelSpec::flops_per_iteration`]).
    pub fn flops_per_iteration(&self) -> f64 {
        self.shape.spec.flops_per_iteration(self.cfg.batch_size)
    }

    fn fingerprint(&self) -> u64 {
        fnv1a(format!("{:?}|{:?}", self.shape, self.cfg.hparams.optimizer.family()).as_bytes())
    }

    /// The seeded permutation of `epoch`'s training rows.
    fn permutation(&self, epoch: u64) -> Vec<u32> {
        let mut perm: Vec<u32> = (0..self.data.n_train as u32).collect();
        let seed = kernels::rng::mix64(self.cfg.hparams.seed ^ 0x5bff_1e00_0000_0000 ^ epoch);
        perm.shuffle(&mut StdRng::seed_from_u64(seed));
        perm
    }

    /// This iteration's mini-batch: rows of the current epoch's permutation.
    pub(crate) fn batch_indices(&mut self) -> &[u32] {
        let epoch = self.iteration / self.iters_per_epoch;
        if self.perm_epoch != Some(epoch) {
            self.perm = self.permutation(epoch);
            self.perm_epoch = Some(epoch);
        }
        let pos = (self.iteration % self.iters_per_epoch) as usize * self.cfg.batch_size;
        &self.perm[pos..pos + self.cfg.batch_size]
    }

    /// Counts one iteration done. `None` when it is no report point, else
    /// whether it was the last one.
    pub(crate) fn advance(&mut self) -> Option<bool> {
        self.iteration += 1;
        let finished = self.iteration == self.total_iterations();
        (finished || self.iteration.is_multiple_of(self.report_every)).then_some(finished)
    }

    /// The report of a report point from its statistics; a non-finite loss
    /// is divergence.
    pub(crate) fn finish_report(
        &mut self,
        train: LossStats,
        val: LossStats,
        finished: bool,
    ) -> Result<StepOutcome> {
        let report = report_from(&self.data, self.reports + 1, self.iteration, train, val);
        if !report.train_loss.is_finite() || !report.val_loss.is_finite() {
            let loss = if report.train_loss.is_finite() {
                report.val_loss
            } else {
                report.train_loss
            };
            return Err(WorkerError::Diverged {
                iteration: self.iteration,
                loss,
            });
        }
        self.reports += 1;
        self.last_report = Some(report.clone());
        Ok(if finished {
            StepOutcome::Finished(report)
        } else {
            StepOutcome::Report(report)
        })
    }

    /// The host-side state of a trial that is not resident, for a fused
    /// group to import; the trial keeps nothing on the device meanwhile.
    pub(crate) fn take_host_state(&mut self) -> Option<TrialSnapshot> {
        self.swapped.take()
    }

    /// The state held on the host, if the trial is not resident: what a
    /// checkpoint of a trial waiting off the device holds.
    pub fn host_state(&self) -> Option<&TrialSnapshot> {
        self.swapped.as_ref()
    }

    /// Gives a trial back its state after it leaves a fused group.
    pub(crate) fn put_host_state(&mut self, state: TrialSnapshot) {
        self.iteration = state.iteration;
        self.reports = state.reports;
        self.swapped = Some(state);
    }

    pub(crate) fn data(&self) -> &Arc<DeviceData<B>> {
        &self.data
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.shape.spec
    }

    pub(crate) fn state_fingerprint(&self) -> u64 {
        self.fingerprint()
    }

    pub(crate) fn reports_done(&self) -> u64 {
        self.reports
    }

    /// The hyper-parameters an exploit gives this trial: `new`, with its
    /// own seed (its stream of shuffles and dropout masks). The optimizer
    /// family and whether dropout is on must not change.
    /// A donor's state, from its host copy (or its stored file), as this
    /// trial's: into its slot where it is resident, else as its host state.
    /// Returns the bytes taken.
    fn take_donor_state(&mut self, lane: &mut Lane<B>, state: TrialSnapshot) -> Result<usize> {
        self.check_fingerprint(&state)?;
        let bytes = state.float_bytes();
        match self.group.as_mut() {
            Some(g) => {
                g.import_slot(lane, 0, &state.slot)?;
                self.iteration = state.iteration;
                self.reports = state.reports;
            }
            None => self.put_host_state(state),
        }
        Ok(bytes)
    }

    pub(crate) fn exploit_hparams(&self, new: &NewValues) -> Result<SlotHparams> {
        let NewValues::Hparams(hparams) = new else {
            return Err(WorkerError::Config(
                "a built-in trial takes hyper-parameters, not a worker's parameters".into(),
            ));
        };
        let h = SlotHparams {
            seed: self.cfg.hparams.seed,
            ..*hparams
        };
        if h.optimizer.family() != self.cfg.hparams.optimizer.family()
            || (h.dropout > 0.0) != self.shape.dropout
        {
            return Err(WorkerError::Config(
                "an exploit may not change the optimizer family or turn dropout on or off".into(),
            ));
        }
        Ok(h)
    }

    /// Refuses a donor's state taken from another model or optimizer.
    pub(crate) fn check_fingerprint(&self, state: &TrialSnapshot) -> Result<()> {
        if state.fingerprint != self.fingerprint() {
            return Err(WorkerError::BadState(
                "the donor's state was taken from a different model or optimizer".into(),
            ));
        }
        Ok(())
    }

    /// A fused member's side of an exploit: the donor's place in training
    /// and the new values (the group holds the weights).
    pub(crate) fn take_place(&mut self, iteration: u64, reports: u64, h: SlotHparams) {
        self.iteration = iteration;
        self.reports = reports;
        self.cfg.hparams = h;
    }
}

fn report_from<B: Backend>(
    data: &DeviceData<B>,
    step: u64,
    iteration: u64,
    train: LossStats,
    val: LossStats,
) -> Report {
    let mut r = Report {
        step,
        iteration,
        train_loss: train.mean_loss(),
        val_loss: val.mean_loss(),
        val_accuracy: None,
        val_rmse: None,
        val_r2: None,
        external: None,
        extras: Default::default(),
    };
    match data.task {
        Task::Classification { .. } => r.val_accuracy = Some(val.metric_sum / val.rows.max(1.0)),
        Task::Regression { targets } => {
            let mse = val.metric_sum / (val.rows * targets as f64).max(1.0);
            let scale = if targets == 1 {
                data.target_std.first().copied().unwrap_or(1.0) as f64
            } else {
                1.0
            };
            r.val_rmse = Some(mse.sqrt() * scale);
            r.val_r2 = Some(1.0 - val.metric_sum / data.val_sst.max(f64::MIN_POSITIVE));
        }
    }
    r
}

impl<B: Backend> Job<B> for TrainTrial<B> {
    fn footprint(&self) -> Footprint {
        Footprint {
            persistent_bytes: self
                .shape
                .persistent_bytes(self.cfg.hparams.optimizer.family()),
            ephemeral_bytes: self.shape.ephemeral_bytes(),
            shared_bytes: self.data.bytes(),
        }
    }

    fn fusion_key(&self) -> FusionKey {
        // Dropout p is a per-slot scalar: trials with and without dropout fuse.
        FusionKey {
            shape: GroupShape {
                dropout: false,
                ..self.shape.clone()
            },
            family: self.cfg.hparams.optimizer.family(),
            data: self.data.name.clone(),
        }
    }

    fn iterations_done(&self) -> u64 {
        self.iteration
    }

    fn total_iterations(&self) -> u64 {
        self.iters_per_epoch * self.cfg.epochs
    }

    fn is_resident(&self) -> bool {
        self.group.is_some()
    }

    /// Off the device its whole state is a host snapshot.
    fn can_move(&self) -> bool {
        !self.is_resident()
    }

    fn rehome(&mut self, data: &Arc<DeviceData<B>>) {
        debug_assert_eq!(data.name, self.data.name, "the same data on another device");
        if !self.is_resident() {
            self.data = data.clone();
        }
    }

    fn step(&mut self, lane: &mut Lane<B>) -> Result<StepOutcome> {
        if self.iteration >= self.total_iterations() {
            return Err(WorkerError::Config("the trial has already finished".into()));
        }
        self.follow_schedule()?;
        let idx = self.batch_indices().to_vec();
        let group = self.group.as_mut().ok_or(WorkerError::NotResident)?;
        group.train_step(lane, &self.data, &idx, &[self.iteration])?;
        let Some(finished) = self.advance() else {
            return Ok(StepOutcome::Continue);
        };
        let group = self.group.as_mut().ok_or(WorkerError::NotResident)?;
        // Reading the statistics back waits for the device: the clock
        // then times the validation pass alone (its results read back too).
        let train = group.take_train_stats(lane)?[0];
        let t0 = std::time::Instant::now();
        let val = group.evaluate(lane, &self.data)?[0];
        let seconds = t0.elapsed().as_secs_f64();
        let outcome = self.finish_report(train, val, finished)?;
        if !(finished && self.latency) {
            return Ok(outcome);
        }
        let batches = self.data.n_val.div_ceil(self.cfg.batch_size.max(1)).max(1);
        let latency = ("latency".to_string(), seconds / batches as f64);
        Ok(match outcome {
            StepOutcome::Finished(mut r) => {
                r.extras.metrics.push(latency);
                self.last_report = Some(r.clone());
                StepOutcome::Finished(r)
            }
            other => other,
        })
    }

    fn report(&self) -> Option<&Report> {
        self.last_report.as_ref()
    }

    fn export_state(&mut self, lane: &mut Lane<B>) -> Result<TrialSnapshot> {
        if let Some(st) = &self.swapped {
            return Ok(st.clone());
        }
        let group = self.group.as_ref().ok_or(WorkerError::NotResident)?;
        Ok(TrialSnapshot {
            fingerprint: self.fingerprint(),
            iteration: self.iteration,
            reports: self.reports,
            slot: group.export_slot(lane, 0)?,
        })
    }

    fn import_state(&mut self, lane: &mut Lane<B>, state: &TrialSnapshot) -> Result<()> {
        if state.fingerprint != self.fingerprint() {
            return Err(WorkerError::BadState(
                "the state was taken from a different model or optimizer".into(),
            ));
        }
        if state.iteration > self.total_iterations() {
            return Err(WorkerError::BadState(format!(
                "the state is at iteration {} of a {}-iteration trial",
                state.iteration,
                self.total_iterations()
            )));
        }
        if self.group.is_none() {
            let spec = self.shape.spec.clone();
            self.group = Some(ModelGroup::zeroed(
                lane,
                spec,
                self.cfg.batch_size,
                self.data.target_cols,
                vec![self.cfg.hparams],
            )?);
        }
        self.group
            .as_mut()
            .expect("resident")
            .import_slot(lane, 0, &state.slot)?;
        self.swapped = None;
        self.iteration = state.iteration;
        self.reports = state.reports;
        Ok(())
    }

    fn device_slot(&self, _tag: Option<u64>) -> Option<DeviceSlot<'_, B>> {
        self.group.as_ref().map(|group| DeviceSlot {
            group,
            slot: 0,
            iteration: self.iteration,
            reports: self.reports,
        })
    }

    fn exploit(
        &mut self,
        lane: &mut Lane<B>,
        _tag: Option<u64>,
        donor: &mut dyn Job<B>,
        donor_tag: Option<u64>,
        new: &NewValues,
    ) -> Result<usize> {
        let h = self.exploit_hparams(new)?;
        let bytes = match (donor.device_slot(donor_tag), self.group.as_mut()) {
            // Both on the device: a device-to-device copy.
            (Some(src), Some(dst)) => {
                let bytes = dst.copy_slot_from(lane, 0, src.group, src.slot)?;
                self.iteration = src.iteration;
                self.reports = src.reports;
                bytes
            }
            // Either is off the device: through the donor's host state.
            _ => {
                let state = donor_state(donor, lane, donor_tag)?;
                self.take_donor_state(lane, state)?
            }
        };
        if let Some(g) = self.group.as_mut() {
            g.set_slot_hparams(0, h)?;
        }
        self.cfg.hparams = h;
        self.last_report = donor.report().cloned();
        Ok(bytes)
    }

    fn exploit_stored(
        &mut self,
        lane: &mut Lane<B>,
        _tag: Option<u64>,
        state: StoredState,
        new: &NewValues,
    ) -> Result<usize> {
        let state = state.into_snapshot()?;
        let h = self.exploit_hparams(new)?;
        let bytes = self.take_donor_state(lane, state)?;
        if let Some(g) = self.group.as_mut() {
            g.set_slot_hparams(0, h)?;
        }
        self.cfg.hparams = h;
        Ok(bytes)
    }

    fn swap_out(&mut self, lane: &mut Lane<B>) -> Result<usize> {
        if self.group.is_none() {
            return Ok(0);
        }
        let state = self.export_state(lane)?;
        let bytes = state.float_bytes();
        self.swapped = Some(state);
        self.group = None;
        Ok(bytes)
    }

    fn swap_in(&mut self, lane: &mut Lane<B>) -> Result<usize> {
        match self.swapped.take() {
            None => Ok(0),
            Some(state) => {
                let bytes = state.float_bytes();
                if let Err(e) = self.import_state(lane, &state) {
                    self.swapped = Some(state);
                    return Err(e);
                }
                Ok(bytes)
            }
        }
    }
}
