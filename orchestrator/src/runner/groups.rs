//! Fused groups as the runner sees them: who is in which group, who waits
//! off the device between groups, and where a waiting trial goes.
//!
//! With fusion on (`[scheduler] fuse` > 1) every built-in trial runs as a
//! member of a group ([`Group`]), even a group of one, so that later trials
//! of its fusion key can join it at a boundary. A member leaves its group
//! with its state on the host when it pauses (at an ASHA or Hyperband rung,
//! or from the dashboard) or when a higher-priority trial takes its seat;
//! it then waits [`Parked`] until it may run again, and is placed like a
//! new trial: into a group of its key with a free seat, or a new group.
//! [`fusion::reseat`] decides who holds the seats.

use std::collections::BTreeSet;

use kernels::Backend;
use training::{FusedControl, FusedTrials, FusionKey, Job, TrainTrial};

use super::{Flight, MemberId, RunState, Runner, TrialHandle};
use crate::error::Result;
use crate::salus::JobId;
use crate::salus::fusion::{self, MixWidths, Seat};
use crate::salus::ledger::MemoryLedger;
use crate::storage::TrialNumber;
use crate::storage::writer::{TrialResources, WriteOp};

/// A fused job: its members, and those whose report awaits a decision.
pub(super) struct Group<B: Backend> {
    pub control: FusedControl<B>,
    pub key: FusionKey,
    /// Seats the group's footprint reserved.
    pub capacity: usize,
    /// Members, joiners on their way in included, leavers until they left.
    pub members: Vec<MemberId>,
    /// Members asked to leave that have not left yet.
    pub leaving: BTreeSet<MemberId>,
    pub held: BTreeSet<MemberId>,
    /// The lane the core admitted the group to.
    pub lane: Option<usize>,
    /// Paused whole at a PBT exploit point until the generation is
    /// decided: no trial joins it meanwhile (a joiner would wait inside a
    /// group that waits for it).
    pub at_point: bool,
    /// A group of mixed shapes: its layout's hidden widths
    /// ([`training::mixed_hidden`]), which a joiner must fit (`key` is
    /// then [`FusionKey::mixable`]'s).
    pub layout: Option<Vec<usize>>,
}

impl<B: Backend> Group<B> {
    /// Whether `trial` may take a seat here.
    fn admits(&self, trial: &TrainTrial<B>) -> bool {
        training::admits(&self.key, self.layout.as_deref(), trial)
    }
}

/// The hidden widths of a group of mixed shapes of `trials`
/// ([`training::mixed_hidden`]); they are mixable MLPs, so have hidden
/// layers.
fn layout_of<B: Backend>(trials: &[(MemberId, TrainTrial<B>)]) -> Vec<usize> {
    let hidden: Vec<&[usize]> = trials
        .iter()
        .map(|(_, t)| t.spec().hidden.as_slice())
        .collect();
    training::mixed_hidden(&hidden).expect("mixable trials have hidden layers")
}

/// A fused member waiting off the device, its state on the host.
pub(super) struct Parked<B: Backend> {
    /// `None` while it is still leaving its group.
    pub trial: Option<TrainTrial<B>>,
    /// May run again: promoted, resumed, or preempted (never paused).
    pub ready: bool,
}

/// The core's per-trial controls, routed to a fused group for its members.
impl<B: Backend> RunState<B> {
    /// Ends `run`'s hold after its report. A group goes on once none of
    /// its members holds it; releasing a member that holds nothing must not
    /// release the group, whose newest report may not be decided yet.
    pub(super) fn release(&mut self, run: TrialHandle) {
        match run {
            TrialHandle::Alone(job) => self.core.release(job),
            TrialHandle::Member(m) => {
                if let Some(&g) = self.fusion.member_group.get(&m)
                    && let Some(group) = self.fusion.groups.get_mut(&g)
                    && group.held.remove(&m)
                    && group.held.is_empty()
                {
                    self.core.release(g);
                }
            }
        }
    }

    /// A group runs at its best member's priority.
    pub(super) fn set_priority(&mut self, run: TrialHandle, p: f64) {
        if let Some(f) = self.in_flight.get_mut(&run) {
            f.priority = p;
        }
        match run {
            TrialHandle::Alone(job) => self.core.set_priority(job, p),
            TrialHandle::Member(m) => {
                if let Some(&g) = self.fusion.member_group.get(&m) {
                    self.refresh_group_priority(g);
                }
            }
        }
    }

    fn refresh_group_priority(&mut self, g: JobId) {
        if let Some(group) = self.fusion.groups.get(&g) {
            let best = group
                .members
                .iter()
                .filter(|m| !group.leaving.contains(m))
                .filter_map(|&m| {
                    self.in_flight
                        .get(&TrialHandle::Member(m))
                        .map(|f| f.priority)
                })
                .fold(f64::NEG_INFINITY, f64::max);
            if best.is_finite() {
                self.core.set_priority(g, best);
            }
        }
    }

    /// Prunes at the next boundary. A fused member leaves its group there,
    /// and a parked one is simply forgotten; `true` says the caller must
    /// record its end now, as no core event will.
    pub(super) fn prune(&mut self, run: TrialHandle) -> bool {
        let m = match run {
            TrialHandle::Alone(job) => {
                self.core.prune(job);
                return false;
            }
            TrialHandle::Member(m) => m,
        };
        let parked = self.fusion.parked.remove(&m).is_some();
        match self.fusion.member_group.remove(&m) {
            Some(g) => {
                if let Some(group) = self.fusion.groups.get_mut(&g) {
                    group.control.drop_member(m.0);
                    group.members.retain(|&x| x != m);
                    group.leaving.remove(&m);
                    if group.held.remove(&m) && group.held.is_empty() {
                        self.core.release(g);
                    }
                    if group.members.is_empty() {
                        // A group paused at a PBT point takes no step, so
                        // it would never see the drop: end it (at once if
                        // paused) and free its memory.
                        self.core.prune(g);
                    }
                }
                true
            }
            None => parked,
        }
    }

    /// Asks member `m` to leave its group at the next boundary and wait
    /// parked; `ready` when it may run again at once (preempted).
    pub(super) fn park(&mut self, m: MemberId, ready: bool) {
        if let Some(&g) = self.fusion.member_group.get(&m)
            && let Some(group) = self.fusion.groups.get_mut(&g)
        {
            group.control.leave(m.0);
            group.leaving.insert(m);
            self.fusion.parked.insert(m, Parked { trial: None, ready });
            self.release(TrialHandle::Member(m));
        } else if let Some(p) = self.fusion.parked.get_mut(&m) {
            p.ready = ready;
        }
    }

    /// Stops `run` at its next boundary: a lone trial stays in the core
    /// (resident until memory is needed), a member leaves its group and
    /// waits parked.
    pub(super) fn pause(&mut self, run: TrialHandle) {
        match run {
            TrialHandle::Alone(job) => self.core.pause(job),
            TrialHandle::Member(m) => self.park(m, false),
        }
    }

    /// Lets a paused trial run again.
    pub(super) fn resume(&mut self, run: TrialHandle) {
        match run {
            TrialHandle::Alone(job) => self.core.resume(job),
            TrialHandle::Member(m) => {
                if let Some(p) = self.fusion.parked.get_mut(&m) {
                    p.ready = true;
                }
            }
        }
    }

    /// Ends the runner's record of group `g` (it ended or failed): the
    /// trials it handed back or never took wait parked; returns the
    /// members still in it.
    pub(super) fn end_group(&mut self, g: JobId) -> Vec<MemberId> {
        let Some(control) = self
            .fusion
            .groups
            .get(&g)
            .map(|group| group.control.clone())
        else {
            return Vec::new();
        };
        self.take_back(&control);
        let group = self.fusion.groups.remove(&g).expect("group");
        for m in &group.members {
            self.fusion.member_group.remove(m);
        }
        group.members
    }

    /// Forgets a member that left, or ended inside, its group.
    pub(super) fn leave_group(&mut self, group: JobId, member: MemberId) {
        self.fusion.member_group.remove(&member);
        if let Some(g) = self.fusion.groups.get_mut(&group) {
            g.members.retain(|&m| m != member);
            g.held.remove(&member);
            g.leaving.remove(&member);
        }
    }

    /// Takes the trials a group handed back (leavers, joiners it could not
    /// take, and all its joiners once it ended) and parks them.
    pub(super) fn take_back(&mut self, control: &FusedControl<B>) {
        for (tag, trial) in control
            .take_left()
            .into_iter()
            .chain(control.take_unjoined())
        {
            let m = MemberId(tag);
            if let Some(&g) = self.fusion.member_group.get(&m) {
                self.leave_group(g, m);
            }
            if !self.in_flight.contains_key(&TrialHandle::Member(m)) {
                continue; // pruned meanwhile
            }
            let p = self.fusion.parked.entry(m).or_insert(Parked {
                trial: None,
                ready: true,
            });
            p.trial = Some(trial);
        }
    }
}

impl Runner<'_> {
    /// Places trials that may run: `new` ones and parked ones now ready.
    /// With fusion off each new trial runs alone. Otherwise they take seats
    /// in running groups of their key ([`fusion::reseat`]), and the rest
    /// form new groups as large as [`fusion::group_cap`] allows.
    pub(super) fn place<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        new: Vec<(TrainTrial<B>, Flight)>,
    ) -> Result<()> {
        if st.fusion.fuse <= 1 {
            for (mut trial, flight) in new {
                let device = st.core.choose(MemoryLedger::alone_cost(&flight.footprint));
                trial.rehome(&st.data[device]);
                let key = st.data[device].name.clone();
                let id = st.core.submit_on(device, Box::new(trial), 0.0, &key);
                st.timeline
                    .trial_ids
                    .insert(id, flight.pending.claim.trial_id);
                st.in_flight.insert(TrialHandle::Alone(id), flight);
            }
            return Ok(());
        }
        let mut waiting: Vec<(MemberId, TrainTrial<B>)> = Vec::new();
        for (trial, flight) in new {
            let m = st.fusion.next_member;
            st.fusion.next_member.0 += 1;
            st.in_flight.insert(TrialHandle::Member(m), flight);
            waiting.push((m, trial));
        }
        let ready: Vec<MemberId> = st
            .fusion
            .parked
            .iter()
            .filter(|(_, p)| p.ready && p.trial.is_some())
            .map(|(&j, _)| j)
            .collect();
        for j in ready {
            if let Some(trial) = st.fusion.parked.remove(&j).and_then(|p| p.trial) {
                waiting.push((j, trial));
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        let seat = |st: &RunState<B>, m: MemberId| {
            let flight = st.in_flight.get(&TrialHandle::Member(m));
            Seat {
                id: m.0,
                priority: flight.map_or(0.0, |f| f.priority),
                arrival: flight.map_or(0, |f| f.pending.number.0),
            }
        };
        // Seats in running groups first.
        let group_ids: Vec<JobId> = st.fusion.groups.keys().copied().collect();
        for g in group_ids {
            let group = &st.fusion.groups[&g];
            if group.at_point {
                continue;
            }
            let of_key: Vec<Seat> = waiting
                .iter()
                .filter(|(_, t)| group.admits(t))
                .map(|(id, _)| seat(st, *id))
                .collect();
            if of_key.is_empty() {
                continue;
            }
            let members: Vec<Seat> = group
                .members
                .iter()
                .filter(|m| !group.leaving.contains(m))
                .map(|&m| seat(st, m))
                .collect();
            let r = fusion::reseat(st.fusion.policy, group.capacity, &members, &of_key);
            let join: Vec<MemberId> = r.join.iter().map(|&j| MemberId(j)).collect();
            if !r.evict.is_empty() {
                let joining: Vec<TrialNumber> = join
                    .iter()
                    .filter_map(|&j| {
                        st.in_flight
                            .get(&TrialHandle::Member(j))
                            .map(|f| f.pending.number)
                    })
                    .collect();
                for m in r.evict.iter().map(|&m| MemberId(m)) {
                    st.park(m, true);
                    if let Some(f) = st.in_flight.get(&TrialHandle::Member(m)) {
                        self.writer.send(WriteOp::Event {
                            study_id: self.info.id,
                            trial_id: Some(f.pending.claim.trial_id),
                            kind: "preempted",
                            detail: serde_json::json!({ "for": joining }).to_string(),
                        })?;
                    }
                }
            }
            if join.is_empty() {
                continue;
            }
            let device = st.core.device_of(g);
            for id in &join {
                let pos = waiting.iter().position(|(w, _)| w == id).expect("waiting");
                let (m, mut trial) = waiting.swap_remove(pos);
                trial.rehome(&st.data[device]);
                let group = st.fusion.groups.get_mut(&g).expect("group");
                group.control.join(m.0, trial);
                group.members.push(m);
                st.fusion.member_group.insert(m, g);
            }
            self.record_group(st, g, &join)?;
            st.refresh_group_priority(g);
        }
        // Trials of one key but their widths, in groups of mixed widths
        // where that pays (or `mix_widths = "on"`).
        if st.fusion.mix != MixWidths::Off {
            waiting = self.place_mixed(st, waiting)?;
        }
        // New groups for the rest, by key, best first under `priority`.
        while let Some((_, first)) = waiting.first() {
            let key = first.fusion_key();
            let (mut of_key, rest): (Vec<_>, Vec<_>) = waiting
                .into_iter()
                .partition(|(_, t)| t.fusion_key() == key);
            waiting = rest;
            of_key.sort_by(|a, b| {
                let (a, b) = (seat(st, a.0), seat(st, b.0));
                b.priority
                    .total_cmp(&a.priority)
                    .then(a.arrival.cmp(&b.arrival))
            });
            let cap = st.group_cap(&st.in_flight[&TrialHandle::Member(of_key[0].0)].footprint);
            for members in fusion::groups_of(of_key, cap) {
                self.submit_group(st, members, cap, None)?;
            }
        }
        Ok(())
    }

    /// Forms groups of mixed widths from `waiting` trials whose keys differ
    /// in their widths alone, where [`fusion::mixed_group_pays`] (or
    /// always, with `mix_widths = "on"`); returns the trials left to place
    /// by their own keys. Each group takes neighbours in size, within
    /// [`fusion::width_bands`], so that its layout (the widest's) pads
    /// little.
    fn place_mixed<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        waiting: Vec<(MemberId, TrainTrial<B>)>,
    ) -> Result<Vec<(MemberId, TrainTrial<B>)>> {
        let (mut candidates, mut rest): (Vec<_>, Vec<_>) = waiting
            .into_iter()
            .partition(|(_, t)| training::mixable_key(t).is_some());
        while let Some((_, first)) = candidates.first() {
            let class = training::mixable_key(first);
            let (mut of_class, others): (Vec<_>, Vec<_>) = candidates
                .into_iter()
                .partition(|(_, t)| training::mixable_key(t) == class);
            candidates = others;
            let keys: BTreeSet<Vec<usize>> = of_class
                .iter()
                .map(|(_, t)| t.spec().hidden.clone())
                .collect();
            if keys.len() < 2 {
                rest.extend(of_class);
                continue;
            }
            of_class.sort_by_key(|(_, t)| t.spec().n_params());
            let sizes: Vec<usize> = of_class.iter().map(|(_, t)| t.spec().n_params()).collect();
            let mut bands = Vec::new();
            for n in fusion::width_bands(&sizes) {
                let rest = of_class.split_off(n);
                bands.push(std::mem::replace(&mut of_class, rest));
            }
            for band in bands {
                let cap = st.group_cap(&band.last().expect("a band").1.footprint());
                self.submit_mixed(st, band, cap, &mut rest)?;
            }
        }
        Ok(rest)
    }

    /// Submits `band` (trials of one key but their widths, within
    /// [`fusion::MIX_SPAN`]) as groups of mixed widths of at most `cap`
    /// where that pays; the others go to `rest`.
    fn submit_mixed<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        band: Vec<(MemberId, TrainTrial<B>)>,
        cap: usize,
        rest: &mut Vec<(MemberId, TrainTrial<B>)>,
    ) -> Result<()> {
        for members in fusion::groups_of(band, cap) {
            let layout = layout_of(&members);
            let pays = match st.fusion.mix {
                MixWidths::On => true,
                _ => {
                    let trials: Vec<_> = members.iter().map(|(_, t)| t).collect();
                    fusion::mixing_pays(st.fusion.core_kind, &trials, &layout)
                }
            };
            let widths: BTreeSet<&Vec<usize>> =
                members.iter().map(|(_, t)| &t.spec().hidden).collect();
            if pays && widths.len() > 1 {
                self.submit_group(st, members, cap, Some(layout))?;
            } else {
                rest.extend(members);
            }
        }
        Ok(())
    }

    /// Submits `members` as a new group with `capacity` seats; of mixed
    /// widths when `layout` (the widest width of each layer) is given.
    fn submit_group<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        members: Vec<(MemberId, TrainTrial<B>)>,
        capacity: usize,
        layout: Option<Vec<usize>>,
    ) -> Result<()> {
        let tags: Vec<MemberId> = members.iter().map(|(m, _)| *m).collect();
        let members = members.into_iter().map(|(m, t)| (m.0, t)).collect();
        let fused = match layout {
            Some(_) => FusedTrials::mixed(members, capacity)?,
            None => FusedTrials::with_capacity(members, capacity)?,
        }
        .keeping_final_states(self.study.keep != crate::study::Keep::None);
        let control = fused.control();
        let key = fused.fusion_key();
        let mut fused: Box<dyn Job<B>> = Box::new(fused);
        let device = st.core.choose(MemoryLedger::alone_cost(&fused.footprint()));
        fused.rehome(&st.data[device]);
        let id = st.core.submit_on(device, fused, 0.0, &key.data);
        // The group's timeline is filed under its first member.
        let first = st.in_flight[&TrialHandle::Member(tags[0])]
            .pending
            .claim
            .trial_id;
        st.timeline.trial_ids.insert(id, first);
        for &m in &tags {
            st.fusion.member_group.insert(m, id);
        }
        st.fusion.groups.insert(
            id,
            Group {
                control,
                key,
                capacity,
                members: tags.clone(),
                leaving: BTreeSet::new(),
                held: BTreeSet::new(),
                lane: None,
                at_point: false,
                layout,
            },
        );
        self.record_group(st, id, &[])?;
        st.refresh_group_priority(id);
        Ok(())
    }

    /// Stores each member's `salus:fused_with` (the group's trial numbers)
    /// and, for `joined` members of a group already on a lane, its resources.
    pub(super) fn record_group<B: Backend>(
        &mut self,
        st: &RunState<B>,
        g: JobId,
        joined: &[MemberId],
    ) -> Result<()> {
        let group = &st.fusion.groups[&g];
        let seated: Vec<MemberId> = group
            .members
            .iter()
            .filter(|m| !group.leaving.contains(m))
            .copied()
            .collect();
        let numbers: Vec<TrialNumber> = seated
            .iter()
            .filter_map(|&m| {
                st.in_flight
                    .get(&TrialHandle::Member(m))
                    .map(|f| f.pending.number)
            })
            .collect();
        for m in &seated {
            let Some(f) = st.in_flight.get(&TrialHandle::Member(*m)) else {
                continue;
            };
            if numbers.len() > 1 {
                self.writer.send(WriteOp::TrialAttr {
                    claim: f.pending.claim,
                    key: "salus:fused_with",
                    value_json: serde_json::json!(numbers).to_string(),
                })?;
            }
            if let (true, Some(lane)) = (joined.contains(m), group.lane) {
                self.writer.send(WriteOp::Resources {
                    claim: f.pending.claim,
                    resources: st.resources(f, lane),
                })?;
            }
        }
        Ok(())
    }
}

impl<B: Backend> RunState<B> {
    /// The most members a new group of trials of `footprint` may have
    /// ([`fusion::group_cap`] on this run's device, lanes and limits).
    fn group_cap(&self, footprint: &training::Footprint) -> usize {
        fusion::group_cap(
            self.fusion.core_kind,
            self.fusion.fuse,
            self.fusion.lane_budget,
            footprint,
            self.max_concurrent.div_ceil(self.fusion.lanes_n),
        )
    }

    /// What `salus_trials` stores of a trial's resources on `lane` (as
    /// events number lanes: the device follows from it).
    pub(super) fn resources(&self, f: &Flight, lane: usize) -> TrialResources {
        let fp = f.footprint;
        TrialResources {
            device: self.device_names[self.core.device_of_lane(lane)].clone(),
            lane: Some(lane as i64),
            persistent_bytes: fp.persistent_bytes as i64,
            ephemeral_bytes: fp.ephemeral_bytes as i64,
            shared_bytes: fp.shared_bytes as i64,
            total_iterations: f.total_iterations as i64,
        }
    }
}
