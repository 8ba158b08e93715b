//! `FusedTrials`: trials of one fusion key trained as one K-slot group.
//!
//! Members keep everything that makes them separate trials: their own
//! hyper-parameters (per-slot scalars), seeds, permutations, iteration
//! counters and report points. Only their weights and optimizer state live
//! side by side in one [`MlpGroup`], so each iteration of all K is one
//! batched pass: one strided-batched GEMM per layer step instead of K.
//!
//! Membership changes at iteration boundaries only. A member that finishes,
//! fails or is dropped leaves without disturbing the others: their slots
//! are copied to the host and imported into a group of the new size before
//! the next step (K small copies, rare next to the iterations). Each member's
//! results equal the same trial run alone, within fp32 tolerance (the
//! batched GEMM may block its sums differently).

use std::sync::{Arc, Mutex};

use kernels::Backend;

use crate::device_data::DeviceData;
use crate::error::{Result, WorkerError};
use crate::group::{LossStats, MlpGroup};
use crate::job::{Footprint, FusionKey, Job, MemberOutcome, MemberStep, Report, StepOutcome};
use crate::lane::Lane;
use crate::state::TrialState;
use crate::trial::TrainTrial;

struct Member<B: Backend> {
    tag: u64,
    trial: TrainTrial<B>,
    /// Training statistics taken from the device at another member's report
    /// point, not yet reported by this one.
    pending: LossStats,
}

/// Tags of members to drop at the next boundary; cheap to clone and to
/// hold outside the job (the orchestrator's pruner uses it).
#[derive(Clone, Default)]
pub struct FusedControl(Arc<Mutex<Vec<u64>>>);

impl FusedControl {
    /// Drops member `tag` before the group's next iteration.
    pub fn drop_member(&self, tag: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(tag);
    }

    fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Trials of one fusion key as one job. See the module docs.
pub struct FusedTrials<B: Backend> {
    key: FusionKey,
    data: Arc<DeviceData<B>>,
    members: Vec<Member<B>>,
    group: Option<MlpGroup<B>>,
    control: FusedControl,
    last_report: Option<Report>,
}

impl<B: Backend> FusedTrials<B> {
    /// Fuses `trials` (tag, trial), which must share a fusion key and hold
    /// their state on the host (as `TrainTrial::new_on_host` makes them).
    pub fn new(trials: Vec<(u64, TrainTrial<B>)>) -> Result<Self> {
        let Some((_, first)) = trials.first() else {
            return Err(WorkerError::Config("a fused group needs a member".into()));
        };
        let key = first.fusion_key();
        let data = first.data().clone();
        if let Some((tag, _)) = trials.iter().find(|(_, t)| t.fusion_key() != key) {
            return Err(WorkerError::Config(format!(
                "trial {tag} has another fusion key than the group's"
            )));
        }
        if let Some((tag, _)) = trials.iter().find(|(_, t)| t.is_resident()) {
            return Err(WorkerError::Config(format!(
                "trial {tag} is resident; fuse trials whose state is on the host"
            )));
        }
        Ok(FusedTrials {
            key,
            data,
            members: trials
                .into_iter()
                .map(|(tag, trial)| Member {
                    tag,
                    trial,
                    pending: LossStats::default(),
                })
                .collect(),
            group: None,
            control: FusedControl::default(),
            last_report: None,
        })
    }

    /// The handle through which members are dropped at a boundary.
    pub fn control(&self) -> FusedControl {
        self.control.clone()
    }

    /// The members' tags, in slot order.
    pub fn tags(&self) -> Vec<u64> {
        self.members.iter().map(|m| m.tag).collect()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Removes member `tag` at this boundary and hands it back, its state
    /// on the host: it can run alone or join another group.
    pub fn leave(&mut self, lane: &mut Lane<B>, tag: u64) -> Result<TrainTrial<B>> {
        let pos = self
            .members
            .iter()
            .position(|m| m.tag == tag)
            .ok_or_else(|| WorkerError::Config(format!("no member {tag} in the group")))?;
        self.unload(lane)?;
        Ok(self.members.remove(pos).trial)
    }

    /// Exports every member's slot to the host and frees the group.
    fn unload(&mut self, lane: &mut Lane<B>) -> Result<usize> {
        let states = self.states(lane)?;
        if self.group.take().is_none() {
            return Ok(0);
        }
        let mut bytes = 0;
        for (m, (_, state)) in self.members.iter_mut().zip(states) {
            m.pending = LossStats::default();
            bytes += state.float_bytes();
            m.trial.put_host_state(state);
        }
        Ok(bytes)
    }

    /// Every member's whole state (as a lone trial's), by tag, leaving the
    /// group as it is.
    fn states(&self, lane: &mut Lane<B>) -> Result<Vec<(u64, TrialState)>> {
        let Some(group) = &self.group else {
            return Ok(self
                .members
                .iter()
                .filter_map(|m| m.trial.host_state().map(|s| (m.tag, s.clone())))
                .collect());
        };
        let mut out = Vec::with_capacity(self.members.len());
        for (s, m) in self.members.iter().enumerate() {
            let mut slot = group.export_slot(lane, s)?;
            // Statistics already taken off the device go with the slot.
            let p = &m.pending;
            for (v, add) in slot
                .train_stats
                .iter_mut()
                .zip([p.loss_sum, p.metric_sum, p.rows])
            {
                *v += add as f32;
            }
            out.push((
                m.tag,
                TrialState {
                    fingerprint: m.trial.state_fingerprint(),
                    iteration: m.trial.iterations_done(),
                    reports: m.trial.reports_done(),
                    slot,
                },
            ));
        }
        Ok(out)
    }

    /// Drops the members the control asked to drop, at this boundary.
    fn apply_drops(&mut self, lane: &mut Lane<B>) -> Result<()> {
        let drops = self.control.take();
        if drops.is_empty() || !self.members.iter().any(|m| drops.contains(&m.tag)) {
            return Ok(());
        }
        self.unload(lane)?;
        self.members.retain(|m| !drops.contains(&m.tag));
        Ok(())
    }
}

impl<B: Backend> Job<B> for FusedTrials<B> {
    fn footprint(&self) -> Footprint {
        let mut key = self.key.shape.clone();
        key.slots = self.members.len().max(1);
        key.dropout = self
            .members
            .iter()
            .any(|m| m.trial.config().hparams.dropout > 0.0);
        Footprint {
            persistent_bytes: key.persistent_bytes(self.key.family),
            ephemeral_bytes: key.ephemeral_bytes(),
            shared_bytes: self.data.bytes(),
        }
    }

    fn fusion_key(&self) -> FusionKey {
        self.key.clone()
    }

    /// The furthest member's progress, so that `remaining` is the group's.
    fn iterations_done(&self) -> u64 {
        let remaining = self
            .members
            .iter()
            .map(|m| m.trial.total_iterations() - m.trial.iterations_done())
            .max()
            .unwrap_or(0);
        self.total_iterations() - remaining
    }

    fn total_iterations(&self) -> u64 {
        self.members
            .iter()
            .map(|m| m.trial.total_iterations())
            .max()
            .unwrap_or(0)
    }

    fn is_resident(&self) -> bool {
        self.group.is_some()
    }

    /// One iteration of every member. The outcome is always
    /// [`StepOutcome::Members`], listing the members at a report point or
    /// at their end; those that ended have left the group.
    fn step(&mut self, lane: &mut Lane<B>) -> Result<StepOutcome> {
        self.apply_drops(lane)?;
        if self.members.is_empty() {
            return Ok(StepOutcome::Members(Vec::new()));
        }
        self.swap_in(lane)?;
        let mut idx = Vec::new();
        let mut iterations = Vec::with_capacity(self.members.len());
        for m in &mut self.members {
            idx.extend_from_slice(m.trial.batch_indices());
            iterations.push(m.trial.iterations_done());
        }
        let group = self.group.as_mut().ok_or(WorkerError::NotResident)?;
        group.train_step(lane, &self.data, &idx, &iterations)?;
        let due: Vec<(usize, bool)> = self
            .members
            .iter_mut()
            .enumerate()
            .filter_map(|(s, m)| m.trial.advance().map(|finished| (s, finished)))
            .collect();
        if due.is_empty() {
            return Ok(StepOutcome::Members(Vec::new()));
        }
        // One evaluation serves every member at a report point now.
        let train = group.take_train_stats(lane)?;
        let val = group.evaluate(lane, &self.data)?;
        for (m, t) in self.members.iter_mut().zip(&train) {
            m.pending.loss_sum += t.loss_sum;
            m.pending.metric_sum += t.metric_sum;
            m.pending.rows += t.rows;
        }
        let mut steps = Vec::with_capacity(due.len());
        let mut ended = Vec::new();
        for (s, finished) in due {
            let m = &mut self.members[s];
            let stats = std::mem::take(&mut m.pending);
            let outcome = match m.trial.finish_report(stats, val[s], finished) {
                Ok(StepOutcome::Finished(r)) => {
                    ended.push(m.tag);
                    self.last_report = Some(r.clone());
                    MemberOutcome::Finished(r)
                }
                Ok(StepOutcome::Report(r)) => MemberOutcome::Report(r),
                Ok(other) => unreachable!("finish_report gave {other:?}"),
                Err(e) => {
                    ended.push(m.tag);
                    MemberOutcome::Failed(e.to_string())
                }
            };
            steps.push(MemberStep {
                tag: m.tag,
                outcome,
            });
        }
        if !ended.is_empty() {
            if ended.len() < self.members.len() {
                self.unload(lane)?;
            } else {
                self.group = None;
            }
            self.members.retain(|m| !ended.contains(&m.tag));
        }
        Ok(StepOutcome::Members(steps))
    }

    fn report(&self) -> Option<&Report> {
        self.last_report.as_ref()
    }

    fn live_members(&self) -> usize {
        self.members.len()
    }

    fn member_states(&mut self, lane: &mut Lane<B>) -> Result<Vec<(u64, TrialState)>> {
        self.states(lane)
    }

    fn export_state(&mut self, _lane: &mut Lane<B>) -> Result<TrialState> {
        Err(WorkerError::BadState(
            "a fused group has one state per member; let members leave first".into(),
        ))
    }

    fn import_state(&mut self, _lane: &mut Lane<B>, _state: &TrialState) -> Result<()> {
        Err(WorkerError::BadState(
            "a fused group has one state per member".into(),
        ))
    }

    fn swap_out(&mut self, lane: &mut Lane<B>) -> Result<usize> {
        self.unload(lane)
    }

    fn swap_in(&mut self, lane: &mut Lane<B>) -> Result<usize> {
        if self.group.is_some() || self.members.is_empty() {
            return Ok(0);
        }
        let hparams = self
            .members
            .iter()
            .map(|m| m.trial.config().hparams)
            .collect();
        let spec = self.members[0].trial.spec().clone();
        let batch = self.members[0].trial.config().batch_size;
        let mut group = MlpGroup::zeroed(lane, spec, batch, self.data.target_cols, hparams)?;
        let mut states: Vec<TrialState> = Vec::with_capacity(self.members.len());
        for m in &mut self.members {
            states.push(m.trial.take_host_state().ok_or(WorkerError::NotResident)?);
        }
        let mut result = Ok(0);
        for (s, st) in states.iter().enumerate() {
            match group.import_slot(lane, s, &st.slot) {
                Ok(()) => result = result.map(|b| b + st.float_bytes()),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        match result {
            Ok(bytes) => {
                self.group = Some(group);
                Ok(bytes)
            }
            Err(e) => {
                for (m, st) in self.members.iter_mut().zip(states) {
                    m.trial.put_host_state(st);
                }
                Err(e)
            }
        }
    }
}
