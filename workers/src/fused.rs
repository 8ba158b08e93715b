//! `FusedTrials`: trials of one fusion key trained as one K-slot group.
//!
//! Members keep everything that makes them separate trials: their own
//! hyper-parameters (per-slot scalars), seeds, permutations, iteration
//! counters and report points. Only their weights and optimizer state live
//! side by side in one [`ModelGroup`], so each iteration of all K is one
//! batched pass: one strided-batched GEMM per layer step instead of K.
//!
//! Membership changes at iteration boundaries only. A member that finishes,
//! fails, is dropped or leaves (to wait paused, or to make way for a
//! higher-priority trial), and a trial that joins, do so without disturbing
//! the others: their slots are copied to the host and imported into a
//! group of the new size before the next step (K small copies, rare next
//! to the iterations). A group reserves memory for its capacity, so a join
//! never asks the core for more. Each member's
//! results equal the same trial run alone, within fp32 tolerance (the
//! batched GEMM may block its sums differently).
//!
//! Trials that differ in their hidden widths and depths alone can share a
//! group too ([`FusedTrials::mixed`]): each in a layout as deep and wide as
//! the largest, multiplied at its own sizes by grouped GEMMs (see
//! [`ModelGroup::zeroed_mixed`]).

use std::sync::{Arc, Mutex};

use kernels::Backend;

use crate::device_data::DeviceData;
use crate::error::{Result, WorkerError};
use crate::group::{LossStats, ModelGroup};
use crate::hparams::SlotHparams;
use crate::job::{
    DeviceSlot, Footprint, FusionKey, Job, MemberOutcome, MemberStep, NewValues, Report,
    StepOutcome, StoredState, donor_state,
};
use crate::lane::Lane;
use crate::state::TrialSnapshot;
use crate::trial::TrainTrial;

struct Member<B: Backend> {
    tag: u64,
    trial: TrainTrial<B>,
    /// Training statistics taken from the device at another member's report
    /// point, not yet reported by this one.
    pending: LossStats,
}

/// Membership changes asked for between boundaries, and the trials that
/// left at one.
struct Changes<B: Backend> {
    drop: Vec<u64>,
    leave: Vec<u64>,
    join: Vec<(u64, TrainTrial<B>)>,
    left: Vec<(u64, TrainTrial<B>)>,
}

/// How the orchestrator changes a running group's membership: each change
/// takes effect at the group's next iteration boundary. Cheap to clone and
/// to hold outside the job, which a lane thread may hold meanwhile.
pub struct FusedControl<B: Backend>(Arc<Mutex<Changes<B>>>);

impl<B: Backend> Clone for FusedControl<B> {
    fn clone(&self) -> Self {
        FusedControl(self.0.clone())
    }
}

impl<B: Backend> Default for FusedControl<B> {
    fn default() -> Self {
        FusedControl(Arc::new(Mutex::new(Changes {
            drop: Vec::new(),
            leave: Vec::new(),
            join: Vec::new(),
            left: Vec::new(),
        })))
    }
}

impl<B: Backend> FusedControl<B> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Changes<B>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops member `tag` (its state is discarded) before the next iteration.
    pub fn drop_member(&self, tag: u64) {
        self.lock().drop.push(tag);
    }

    /// Member `tag` leaves with its state at the next boundary; the step
    /// lists it as [`MemberOutcome::Left`] and [`take_left`](Self::take_left)
    /// hands it over.
    pub fn leave(&self, tag: u64) {
        self.lock().leave.push(tag);
    }

    /// `trial` joins the group at its next boundary, with its state on the
    /// host. One the group cannot take (another fusion key, a full group)
    /// comes back as [`MemberOutcome::Left`].
    pub fn join(&self, tag: u64, trial: TrainTrial<B>) {
        self.lock().join.push((tag, trial));
    }

    /// The members that left, their state on the host.
    pub fn take_left(&self) -> Vec<(u64, TrainTrial<B>)> {
        std::mem::take(&mut self.lock().left)
    }

    /// Joiners the group never took (it ended first).
    pub fn take_unjoined(&self) -> Vec<(u64, TrainTrial<B>)> {
        std::mem::take(&mut self.lock().join)
    }

    #[allow(clippy::type_complexity)]
    fn take_changes(&self) -> (Vec<u64>, Vec<u64>, Vec<(u64, TrainTrial<B>)>) {
        let mut c = self.lock();
        (
            std::mem::take(&mut c.drop),
            std::mem::take(&mut c.leave),
            std::mem::take(&mut c.join),
        )
    }
}

/// The key `trial` shares a group of mixed shapes under
/// ([`FusionKey::mixable`]), when it may be in one: a net with hidden
/// layers.
pub fn mixable_key<B: Backend>(trial: &TrainTrial<B>) -> Option<FusionKey> {
    trial.fusion_key().mixable()
}

/// Whether `trial` may take a seat in a group of fusion key `key`; of a
/// group of mixed shapes when `layout` (its hidden widths,
/// [`crate::mixed_hidden`]) is given, which the trial must fit
/// ([`crate::fits_layout`]).
pub fn admits<B: Backend>(
    key: &FusionKey,
    layout: Option<&[usize]>,
    trial: &TrainTrial<B>,
) -> bool {
    match layout {
        None => trial.fusion_key() == *key,
        Some(layout) => {
            mixable_key(trial).as_ref() == Some(key)
                && crate::group::fits_layout(&trial.spec().hidden, layout)
        }
    }
}

/// Trials of one fusion key as one job. See the module docs.
pub struct FusedTrials<B: Backend> {
    /// The members' fusion key; of a group of mixed widths, the key
    /// without widths ([`FusionKey::mixable`]).
    key: FusionKey,
    data: Arc<DeviceData<B>>,
    members: Vec<Member<B>>,
    /// The most members the group takes; its footprint reserves them all,
    /// so that joining never needs more memory than the core admitted.
    capacity: usize,
    group: Option<ModelGroup<B>>,
    control: FusedControl<B>,
    last_report: Option<Report>,
    /// Export finishing members' states (see [`Job::take_final_states`]).
    keep_final: bool,
    finals: Vec<(u64, TrialSnapshot)>,
    /// The layout of a group of mixed shapes ([`Self::mixed`]): members
    /// are laid out in it, and a joiner must fit it.
    layout: Option<crate::model::ModelSpec>,
}

impl<B: Backend> FusedTrials<B> {
    /// Fuses `trials` (tag, trial), which must share a fusion key and hold
    /// their state on the host (as `TrainTrial::new_on_host` makes them).
    pub fn new(trials: Vec<(u64, TrainTrial<B>)>) -> Result<Self> {
        let capacity = trials.len();
        Self::with_capacity(trials, capacity)
    }

    /// Keeps each finishing member's final state for
    /// [`Job::take_final_states`] (an export from the device per member).
    pub fn keeping_final_states(mut self, keep: bool) -> Self {
        self.keep_final = keep;
        self
    }

    /// As [`new`](Self::new), with room for `capacity` members in all, so
    /// that more can join later.
    pub fn with_capacity(trials: Vec<(u64, TrainTrial<B>)>, capacity: usize) -> Result<Self> {
        let Some((_, first)) = trials.first() else {
            return Err(WorkerError::Config("a fused group needs a member".into()));
        };
        let key = first.fusion_key();
        if let Some((tag, _)) = trials.iter().find(|(_, t)| t.fusion_key() != key) {
            return Err(WorkerError::Config(format!(
                "trial {tag} has another fusion key than the group's"
            )));
        }
        Self::with_capacity_unchecked(trials, capacity, key)
    }

    /// As [`Self::with_capacity`], the members' keys already checked.
    fn with_capacity_unchecked(
        trials: Vec<(u64, TrainTrial<B>)>,
        capacity: usize,
        key: FusionKey,
    ) -> Result<Self> {
        let Some((_, first)) = trials.first() else {
            return Err(WorkerError::Config("a fused group needs a member".into()));
        };
        let data = first.data().clone();
        if let Some((tag, _)) = trials.iter().find(|(_, t)| t.is_resident()) {
            return Err(WorkerError::Config(format!(
                "trial {tag} is resident; fuse trials whose state is on the host"
            )));
        }
        if trials.len() > capacity {
            return Err(WorkerError::Config(format!(
                "{} trials do not fit a group of {capacity}",
                trials.len()
            )));
        }
        Ok(FusedTrials {
            key,
            data,
            capacity,
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
            keep_final: false,
            finals: Vec::new(),
            layout: None,
        })
    }

    /// Trials that may differ in their hidden widths and depths (not in
    /// anything else a fusion key holds), trained as one group of mixed
    /// shapes (see [`ModelGroup::zeroed_mixed`]) with room for `capacity`:
    /// each member exactly as alone. A later joiner must fit the layout of
    /// `trials` ([`crate::fits_layout`]); the others are handed back.
    pub fn mixed(trials: Vec<(u64, TrainTrial<B>)>, capacity: usize) -> Result<Self> {
        let specs: Vec<_> = trials.iter().map(|(_, t)| t.spec().clone()).collect();
        let layout = ModelGroup::<B>::mixed_layout(&specs)?;
        let Some(key) = trials.first().and_then(|(_, t)| mixable_key(t)) else {
            return Err(WorkerError::Config("a fused group needs a member".into()));
        };
        let trials = trials
            .into_iter()
            .map(|(tag, t)| {
                if mixable_key(&t).as_ref() == Some(&key) {
                    Ok((tag, t))
                } else {
                    Err(WorkerError::Config(format!(
                        "trial {tag} differs from the group in more than its hidden layers"
                    )))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let mut group = Self::with_capacity_unchecked(trials, capacity, key)?;
        group.layout = Some(layout);
        Ok(group)
    }

    /// Whether `trial` may join this group.
    fn admits(&self, trial: &TrainTrial<B>) -> bool {
        let layout = self.layout.as_ref().map(|l| l.hidden.as_slice());
        admits(&self.key, layout, trial)
    }

    /// The handle through which members join, leave or are dropped.
    pub fn control(&self) -> FusedControl<B> {
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
    fn states(&self, lane: &mut Lane<B>) -> Result<Vec<(u64, TrialSnapshot)>> {
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
                TrialSnapshot {
                    fingerprint: m.trial.state_fingerprint(),
                    iteration: m.trial.iterations_done(),
                    reports: m.trial.reports_done(),
                    slot,
                },
            ));
        }
        Ok(out)
    }

    /// Applies the changes the control asked for, at this boundary: drops,
    /// then leaves, then joins (so that a leaver's seat can go to a joiner).
    /// Returns a `Left` step for each trial handed back.
    fn apply_changes(&mut self, lane: &mut Lane<B>) -> Result<Vec<MemberStep>> {
        let (drops, leaves, joins) = self.control.take_changes();
        // A joiner dropped or asked to leave before it joined never joins:
        // it is discarded, or handed straight back.
        let (mut handed, joins): (Vec<_>, Vec<_>) = joins
            .into_iter()
            .filter(|(tag, _)| !drops.contains(tag))
            .partition(|(tag, _)| leaves.contains(tag));
        let touches = |tags: &[u64]| self.members.iter().any(|m| tags.contains(&m.tag));
        if !touches(&drops) && !touches(&leaves) && joins.is_empty() {
            return Ok(self.hand_back(handed));
        }
        // Every member to the host; the next step imports the new set.
        self.unload(lane)?;
        self.members.retain(|m| !drops.contains(&m.tag));
        for tag in leaves {
            if let Some(pos) = self.members.iter().position(|m| m.tag == tag) {
                handed.push((tag, self.members.remove(pos).trial));
            }
        }
        for (tag, trial) in joins {
            if self.admits(&trial) && !trial.is_resident() && self.members.len() < self.capacity {
                self.members.push(Member {
                    tag,
                    trial,
                    pending: LossStats::default(),
                });
            } else {
                handed.push((tag, trial));
            }
        }
        Ok(self.hand_back(handed))
    }

    /// Member `tag`'s slot and record.
    fn member(&self, tag: u64) -> Result<(usize, &Member<B>)> {
        self.members
            .iter()
            .enumerate()
            .find(|(_, m)| m.tag == tag)
            .ok_or_else(|| WorkerError::Config(format!("no member {tag} in the group")))
    }

    /// A donor's state, from its host copy (or its stored file), into slot
    /// `s`: on the device where the group is resident, else as the
    /// member's host state. Returns the bytes and the place it covers.
    fn take_donor_state(
        &mut self,
        lane: &mut Lane<B>,
        s: usize,
        state: TrialSnapshot,
    ) -> Result<(usize, u64, u64)> {
        self.members[s].trial.check_fingerprint(&state)?;
        let at = (state.float_bytes(), state.iteration, state.reports);
        match self.group.as_mut() {
            Some(g) => g.import_slot(lane, s, &state.slot)?,
            None => self.members[s].trial.put_host_state(state),
        }
        Ok(at)
    }

    /// Slot `s`'s member goes on from a donor's place with `h`: the group
    /// trains it with `h` from its next step.
    fn take_place(&mut self, s: usize, iteration: u64, reports: u64, h: SlotHparams) -> Result<()> {
        if let Some(g) = self.group.as_mut() {
            g.set_slot_hparams(s, h)?;
        }
        let m = &mut self.members[s];
        // The donor's statistics came with its slot.
        m.pending = LossStats::default();
        m.trial.take_place(iteration, reports, h);
        Ok(())
    }

    /// Puts trials in the control's `left` and lists them as `Left`.
    fn hand_back(&self, handed: Vec<(u64, TrainTrial<B>)>) -> Vec<MemberStep> {
        let steps = handed
            .iter()
            .map(|(tag, _)| MemberStep {
                tag: *tag,
                outcome: MemberOutcome::Left,
            })
            .collect();
        self.control.lock().left.extend(handed);
        steps
    }
}

impl<B: Backend> Job<B> for FusedTrials<B> {
    /// Reserves every seat: a joiner may bring dropout too.
    fn footprint(&self) -> Footprint {
        let mut key = self.key.shape.clone();
        if let Some(layout) = &self.layout {
            key.spec = layout.clone();
        }
        key.slots = self.capacity.max(self.members.len()).max(1);
        key.dropout = self.capacity > self.members.len()
            || self
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

    /// A group formed on the host may be placed on any device before its
    /// first swap-in; once resident it stays (`can_move` is false).
    fn rehome(&mut self, data: &Arc<DeviceData<B>>) {
        if self.group.is_none() {
            self.data = data.clone();
            for m in &mut self.members {
                m.trial.rehome(data);
            }
        }
    }

    /// One iteration of every member. The outcome is always
    /// [`StepOutcome::Members`], listing the members that left at this
    /// boundary, then those at a report point or at their end; those that
    /// ended have left the group.
    fn step(&mut self, lane: &mut Lane<B>) -> Result<StepOutcome> {
        let mut steps = self.apply_changes(lane)?;
        if self.members.is_empty() {
            return Ok(StepOutcome::Members(steps));
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
            return Ok(StepOutcome::Members(steps));
        }
        // One evaluation serves every member at a report point now.
        let train = group.take_train_stats(lane)?;
        let val = group.evaluate(lane, &self.data)?;
        for (m, t) in self.members.iter_mut().zip(&train) {
            m.pending.loss_sum += t.loss_sum;
            m.pending.metric_sum += t.metric_sum;
            m.pending.rows += t.rows;
        }
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
        let finished: Vec<u64> = steps
            .iter()
            .filter(|m| matches!(m.outcome, MemberOutcome::Finished(_)))
            .map(|m| m.tag)
            .collect();
        if self.keep_final && !finished.is_empty() {
            // Taken before the group unloads or goes: their last weights.
            let states = self.states(lane)?;
            self.finals
                .extend(states.into_iter().filter(|(t, _)| finished.contains(t)));
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

    fn member_states(&mut self, lane: &mut Lane<B>) -> Result<Vec<(u64, TrialSnapshot)>> {
        self.states(lane)
    }

    fn device_slot(&self, tag: Option<u64>) -> Option<DeviceSlot<'_, B>> {
        let group = self.group.as_ref()?;
        let (slot, m) = self.member(tag?).ok()?;
        Some(DeviceSlot {
            group,
            slot,
            iteration: m.trial.iterations_done(),
            reports: m.trial.reports_done(),
        })
    }

    /// Member `tag` takes `donor`'s state: slot from slot where both are
    /// on the device, else through the donor's host state.
    fn exploit(
        &mut self,
        lane: &mut Lane<B>,
        tag: Option<u64>,
        donor: &mut dyn Job<B>,
        donor_tag: Option<u64>,
        new: &NewValues,
    ) -> Result<usize> {
        let tag = tag.ok_or_else(|| WorkerError::Config("name the member that takes".into()))?;
        let (s, m) = self.member(tag)?;
        let h = m.trial.exploit_hparams(new)?;
        let (bytes, iteration, reports) = match (donor.device_slot(donor_tag), self.group.as_mut())
        {
            (Some(src), Some(dst)) => (
                dst.copy_slot_from(lane, s, src.group, src.slot)?,
                src.iteration,
                src.reports,
            ),
            _ => {
                let state = donor_state(donor, lane, donor_tag)?;
                self.take_donor_state(lane, s, state)?
            }
        };
        self.take_place(s, iteration, reports, h)?;
        Ok(bytes)
    }

    fn exploit_stored(
        &mut self,
        lane: &mut Lane<B>,
        tag: Option<u64>,
        state: StoredState,
        new: &NewValues,
    ) -> Result<usize> {
        let state = state.into_snapshot()?;
        let tag = tag.ok_or_else(|| WorkerError::Config("name the member that takes".into()))?;
        let (s, m) = self.member(tag)?;
        let h = m.trial.exploit_hparams(new)?;
        let (bytes, iteration, reports) = self.take_donor_state(lane, s, state)?;
        self.take_place(s, iteration, reports, h)?;
        Ok(bytes)
    }

    /// Member `tag` takes member `donor_tag`'s state, slot to slot.
    fn exploit_within(
        &mut self,
        lane: &mut Lane<B>,
        tag: u64,
        donor_tag: u64,
        new: &NewValues,
    ) -> Result<usize> {
        let (s, m) = self.member(tag)?;
        let h = m.trial.exploit_hparams(new)?;
        let (d, donor) = self.member(donor_tag)?;
        let (iteration, reports) = (donor.trial.iterations_done(), donor.trial.reports_done());
        let on_host = donor.trial.host_state().cloned();
        let bytes = match self.group.as_mut() {
            Some(g) => g.copy_slot_within(lane, s, d)?,
            None => {
                let state = on_host.ok_or(WorkerError::NotResident)?;
                let bytes = state.float_bytes();
                self.members[s].trial.put_host_state(state);
                bytes
            }
        };
        self.take_place(s, iteration, reports, h)?;
        Ok(bytes)
    }

    fn take_final_states(&mut self) -> Vec<(u64, TrialSnapshot)> {
        std::mem::take(&mut self.finals)
    }

    fn export_state(&mut self, _lane: &mut Lane<B>) -> Result<TrialSnapshot> {
        Err(WorkerError::BadState(
            "a fused group has one state per member; let members leave first".into(),
        ))
    }

    fn import_state(&mut self, _lane: &mut Lane<B>, _state: &TrialSnapshot) -> Result<()> {
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
        let batch = self.members[0].trial.config().batch_size;
        let cols = self.data.target_cols;
        let mut group = match &self.layout {
            None => {
                let spec = self.members[0].trial.spec().clone();
                ModelGroup::zeroed(lane, spec, batch, cols, hparams)?
            }
            Some(reserved) => {
                let specs: Vec<_> = self
                    .members
                    .iter()
                    .map(|m| m.trial.spec().clone())
                    .collect();
                // The members' own layout, unless it outgrows the one the
                // footprint reserved (a shallower group's last layer can).
                let own = ModelGroup::<B>::mixed_layout(&specs)?;
                let layout = match crate::group::fits_layout(&own.hidden, &reserved.hidden) {
                    true => own,
                    false => reserved.clone(),
                };
                ModelGroup::zeroed_laid_out(lane, &specs, layout, batch, cols, hparams)?
            }
        };
        let mut states: Vec<TrialSnapshot> = Vec::with_capacity(self.members.len());
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
