//! Population-based training in the run: members meet at exploit points,
//! and the worst take the best's state in memory.
//!
//! A member that reports at an exploit point (every `[pbt] interval`
//! iterations, or every report point) is paused there; it keeps its
//! memory until the ledger needs it, when the core swaps it out as any
//! paused trial. Once every member this run holds has reached the point
//! (and no other can start), [`tuning::pbt::generation`] decides the
//! exploits from the members' latest values, the core copies each donor
//! into its receiver ([`crate::salus::core::SalusCore::exploit`]), and
//! when all copies are done every member goes on. Decisions wait for the
//! whole population, so a study's schedule is a function of its seed.
//!
//! Each exploit is stored for its receiver in one transaction: its new
//! parameters (a member's stored parameters are those it ends with), a row
//! of `salus_pbt_events`, and its schedule (`pbt:schedule`: the donor's
//! stored schedule, then the new values) as a user attribute; each member
//! stores its own as it starts, and storage builds the rest, so that a
//! resumed run keeps every member's lineage. The receiver's checkpoint of
//! its new state is put in place in the same transaction, so that a
//! resumed run continues from what was stored.
//!
//! Members are paused by this module, not by a pruner: they do not count
//! as running against `max_concurrent`, so a population larger than it
//! still meets at every point.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kernels::Backend;
use training::{NewValues, StoredState};

use super::pbt_shared::{Others, PointState, Remote, SharedPoints, read_point_state};
use super::{MemberId, RunState, Runner, TrialHandle};
use crate::error::Result;
use crate::pbt::{Exploit, PbtConfig, Standing};
use crate::salus::JobId;
use crate::salus::core::TrialRef;
use crate::space::Params;
use crate::storage::writer::{PbtExploit, WriteOp};
use crate::storage::{TrialId, TrialNumber};
use crate::study::Study;

/// The run's side of a population.
pub(super) struct Population {
    cfg: PbtConfig,
    /// Members paused at an exploit point, with its generation and
    /// iteration.
    at_point: BTreeMap<TrialHandle, (u64, u64)>,
    /// The generation (and its iteration) whose copies are under way.
    underway: Option<(u64, u64, Underway)>,
    /// What other processes that share the study need of this run's
    /// members (see `pbt_shared`).
    pub(super) shared: SharedPoints,
}

impl Population {
    pub(super) fn new(cfg: PbtConfig) -> Self {
        Population {
            cfg,
            at_point: BTreeMap::new(),
            underway: None,
            shared: SharedPoints::default(),
        }
    }

    /// Members waiting at an exploit point: each with its generation and
    /// iteration.
    pub(super) fn at_point(&self) -> impl Iterator<Item = (TrialHandle, u64, u64)> + '_ {
        self.at_point.iter().map(|(&h, &(g, i))| (h, g, i))
    }

    /// A member's state after a report, kept while it waits at that
    /// report's exploit point when other processes share the study (a
    /// donor's state for them); alone, nothing is kept.
    pub(super) fn keep_point_state(
        &mut self,
        run: TrialHandle,
        state: training::TrialSnapshot,
        shared: bool,
    ) {
        if self
            .at_point
            .get(&run)
            .is_some_and(|&(_, i)| i == state.iteration)
        {
            self.shared.keep(run, PointState::Snapshot(state), shared);
        }
    }

    /// An external member's state at its point, saved to `file` by its
    /// worker for other processes (`error`: it could not be; its row goes
    /// without). A member that has moved on since discards it.
    pub(super) fn keep_saved_state(
        &mut self,
        run: TrialHandle,
        file: PathBuf,
        error: Option<String>,
    ) -> Option<String> {
        match (self.at_point.get(&run), error) {
            (Some(&(_, iteration)), None) => {
                self.shared
                    .keep(run, PointState::Saved { iteration, file }, true);
                None
            }
            (at, error) => {
                let _ = std::fs::remove_file(&file);
                if at.is_some() {
                    self.shared.mark_unkept(run);
                }
                error
            }
        }
    }

    /// Members waiting at an exploit point: they hold no slot.
    pub(super) fn waiting(&self) -> usize {
        self.at_point.len()
    }

    /// The generation a report at `iteration` (report `step`) ends, if it
    /// is an exploit point.
    fn point(&self, step: u64, iteration: u64) -> Option<u64> {
        match self.cfg.interval {
            Some(i) => iteration.is_multiple_of(i).then_some(iteration / i),
            None => Some(step),
        }
    }
}

/// Each receiver whose copy is under way: its exploit, its donor's trial
/// id, and the seconds spent reading the donor's file (another process's
/// donor), which count in the exploit's time.
type Underway = BTreeMap<TrialHandle, (Exploit, TrialId, f64)>;

/// What the core said of a copy it made ([`CoreEvent::Exploited`]).
///
/// [`CoreEvent::Exploited`]: crate::salus::core::CoreEvent::Exploited
pub(super) struct Copied {
    pub bytes: usize,
    pub seconds: f64,
    pub on_device: bool,
    /// The receiver's new state, for its checkpoint.
    pub state: Option<training::TrialSnapshot>,
}

/// A trial's parameters as a typed JSON object, fixed knobs left out.
fn params_json(study: &Study, params: &Params) -> serde_json::Value {
    params
        .keys()
        .map(|name| (name.clone(), study.value(params, name).to_json()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// `members` leave their exploit point: a lone one or a parked one is
/// resumed, and each fused group paused whole at the point goes on. Those
/// paused from the dashboard as well run once resumed there.
fn go_on<B: Backend>(st: &mut RunState<B>, members: Vec<TrialHandle>) {
    let mut groups = std::collections::BTreeSet::new();
    for h in members {
        if st.liveness.user_paused.contains(&h) {
            continue;
        }
        match h {
            TrialHandle::Member(m) if !st.fusion.parked.contains_key(&m) => {
                groups.extend(st.fusion.member_group.get(&m).copied());
            }
            h => st.resume(h),
        }
    }
    for g in groups {
        if let Some(group) = st.fusion.groups.get_mut(&g) {
            group.at_point = false;
        }
        st.core.resume(g);
    }
}

impl Runner<'_> {
    /// A PBT member's report (already stored): it pauses at an exploit
    /// point, else goes on.
    pub(super) fn pbt_report<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        run: TrialHandle,
        step: u64,
        iteration: u64,
    ) -> Result<()> {
        let Some(pop) = st.pbt.as_mut() else {
            return Ok(());
        };
        match (pop.point(step, iteration), run) {
            // A fused member holds its group until the group's step is
            // settled ([`Runner::pbt_group_at_point`]).
            (Some(g), TrialHandle::Member(_)) => {
                pop.at_point.insert(run, (g, iteration));
                Ok(())
            }
            (Some(g), TrialHandle::Alone(job)) => {
                pop.at_point.insert(run, (g, iteration));
                st.pause(run);
                st.release(run);
                self.pbt_save_for_peers(st, run, job, g);
                self.pbt_meet(st, false)
            }
            (None, _) => {
                st.release(run);
                Ok(())
            }
        }
    }

    /// An external member at point `g` of a study other processes share:
    /// its worker saves its state there, for their receivers (see
    /// `pbt_shared`). Built-in members' states come with their checkpoints.
    fn pbt_save_for_peers<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        run: TrialHandle,
        job: JobId,
        g: u64,
    ) {
        let (Some(_), Some(c), Some(f), Some(pop)) = (
            &self.study.worker,
            &self.checkpoints,
            st.in_flight.get(&run),
            st.pbt.as_mut(),
        ) else {
            return;
        };
        if st.liveness.elsewhere == 0 {
            pop.shared.mark_unkept(run);
            return;
        }
        let claim = f.pending.claim;
        let path = c.point_saving_path(claim.trial_id, g, claim.run_id);
        pop.shared.mark_saving(run);
        st.core.save_state(TrialRef::alone(job), path);
    }

    /// After fused group `g`'s step: when every member it trains is at the
    /// exploit point, the group pauses there as one job (it stays whole,
    /// so that exploits between its members copy slot to slot, and the
    /// core may swap it out meanwhile); when only some are (members that
    /// joined at another iteration), those leave it to wait parked.
    pub(super) fn pbt_group_at_point<B: Backend>(&mut self, st: &mut RunState<B>, g: JobId) {
        let (Some(pop), Some(group)) = (st.pbt.as_ref(), st.fusion.groups.get(&g)) else {
            return;
        };
        let live: Vec<MemberId> = group
            .members
            .iter()
            .filter(|m| !group.leaving.contains(m))
            .filter(|m| st.in_flight.contains_key(&TrialHandle::Member(**m)))
            .copied()
            .collect();
        let (at, away): (Vec<MemberId>, Vec<MemberId>) = live
            .into_iter()
            .partition(|m| pop.at_point.contains_key(&TrialHandle::Member(*m)));
        let held: Vec<MemberId> = at
            .iter()
            .filter(|m| group.held.contains(m))
            .copied()
            .collect();
        if held.is_empty() {
            return;
        }
        if away.is_empty() {
            if let Some(group) = st.fusion.groups.get_mut(&g) {
                group.at_point = true;
            }
            st.core.pause(g);
            for m in held {
                st.release(TrialHandle::Member(m));
            }
        } else {
            for m in held {
                st.park(m, false);
            }
        }
    }

    /// Decides a generation once every member this run holds is at its
    /// exploit point and no other member can still start (`stopped`: the
    /// run starts none any more).
    pub(super) fn pbt_meet<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        stopped: bool,
    ) -> Result<()> {
        let more_to_start = !stopped && !st.nothing_to_start() && st.budget_has_room(0);
        let Some(pop) = st.pbt.as_mut() else {
            return Ok(());
        };
        // Members that ended (or left the run) meet nobody.
        pop.at_point.retain(|h, _| st.in_flight.contains_key(h));
        if pop.underway.is_some()
            || pop.at_point.is_empty()
            || pop.at_point.len() < st.in_flight.len()
            || more_to_start
        {
            return Ok(());
        }
        let (first, iteration) = *pop.at_point.values().min().expect("members");
        if pop.at_point.values().any(|&(g, _)| g != first) {
            // Members resumed from checkpoints of different points: the
            // ones behind catch up first.
            let behind: Vec<TrialHandle> = pop
                .at_point
                .iter()
                .filter(|&(_, &(g, _))| g == first)
                .map(|(&h, _)| h)
                .collect();
            for h in &behind {
                pop.at_point.remove(h);
            }
            let waiting: Vec<TrialHandle> = pop.at_point.keys().copied().collect();
            // A member ahead in the group of one behind leaves it to wait
            // parked: the group goes on for the one behind.
            let group_of = |st: &RunState<B>, h: &TrialHandle| match h {
                TrialHandle::Member(m) if !st.fusion.parked.contains_key(m) => {
                    st.fusion.member_group.get(m).copied()
                }
                _ => None,
            };
            let behind_groups: std::collections::BTreeSet<JobId> =
                behind.iter().filter_map(|h| group_of(st, h)).collect();
            let ahead: Vec<MemberId> = waiting
                .iter()
                .filter(|h| group_of(st, h).is_some_and(|g| behind_groups.contains(&g)))
                .filter_map(|h| match h {
                    TrialHandle::Member(m) => Some(*m),
                    TrialHandle::Alone(_) => None,
                })
                .collect();
            for m in ahead {
                st.park(m, false);
            }
            go_on(st, behind);
            return Ok(());
        }
        // Other processes' members at this point, once all have reached it.
        let remote: Vec<Remote> = match self.pbt_others(st, first)? {
            Others::Wait => return Ok(()),
            Others::Ready(r) => r,
        };
        let Some(pop) = st.pbt.as_mut() else {
            return Ok(());
        };
        let mut standings: Vec<Standing> = pop
            .at_point
            .keys()
            .filter_map(|h| st.in_flight.get(h))
            .map(|f| Standing {
                number: f.pending.number,
                value: st
                    .curves
                    .get(&f.pending.number)
                    .and_then(|c| c.values.values().next_back().copied())
                    .unwrap_or(f64::NAN),
                params: f.pending.params.clone(),
            })
            .collect();
        standings.extend(remote.iter().map(|r| r.standing.clone()));
        let exploits = crate::pbt::generation(
            &pop.cfg,
            &self.study.space,
            self.study.direction,
            &standings,
            st.seed,
            first,
        );
        // Standing is priority, as an ASHA rung's rank is: the point is the
        // rung, the rank within the population the fraction; a receiver
        // takes its donor's standing with its state. The core serves (and
        // keeps resident) the best first.
        let ranked: Vec<TrialNumber> = crate::pbt::rank(&standings, self.study.direction)
            .iter()
            .map(|s| s.number)
            .collect();
        let rank_of = |n: TrialNumber| {
            let n = exploits
                .iter()
                .find(|e| e.receiver == n)
                .map_or(n, |e| e.donor);
            ranked.iter().position(|&m| m == n).unwrap_or(ranked.len())
        };
        let members: Vec<(TrialHandle, TrialNumber, crate::storage::Claim)> = pop
            .at_point
            .keys()
            .filter_map(|h| {
                st.in_flight
                    .get(h)
                    .map(|f| (*h, f.pending.number, f.pending.claim))
            })
            .collect();
        for (h, number, claim) in members {
            let p = crate::pruner::priority(first as usize, rank_of(number), ranked.len());
            st.set_priority(h, p);
            self.writer.send(WriteOp::Priority {
                claim,
                priority: p,
                rung: Some(first as i64),
                reason: "pbt",
            })?;
        }
        // Where the core holds a member: a lone job, or a fused group's
        // (not one parked off its group).
        let held_at = |number: TrialNumber| {
            let (h, _) = st
                .in_flight
                .iter()
                .find(|(_, f)| f.pending.number == number)?;
            match *h {
                TrialHandle::Alone(j) => Some((*h, TrialRef::alone(j))),
                TrialHandle::Member(m) if !st.fusion.parked.contains_key(&m) => {
                    let g = *st.fusion.member_group.get(&m)?;
                    Some((
                        *h,
                        TrialRef {
                            job: g,
                            member: Some(m.0),
                        },
                    ))
                }
                TrialHandle::Member(_) => None,
            }
        };
        let id_of = |number: TrialNumber| {
            st.in_flight
                .values()
                .find(|f| f.pending.number == number)
                .map(|f| f.pending.claim.trial_id)
        };
        let mut underway = BTreeMap::new();
        for e in exploits {
            // Another process's receiver: that process carries it out.
            if remote.iter().any(|r| r.standing.number == e.receiver) {
                continue;
            }
            let stored = remote.iter().find(|r| r.standing.number == e.donor);
            let (held, donor) = match stored {
                Some(_) => (held_at(e.receiver), None),
                None => match (held_at(e.receiver), held_at(e.donor)) {
                    (Some(h), Some((_, d))) => (Some(h), Some(d)),
                    _ => (None, None),
                },
            };
            let Some((run, receiver)) = held else {
                self.reporter.note(&format!(
                    "pbt: trial {} cannot take trial {}'s state at this point: one of them waits \
                     off its fused group (its group's members were at different points)",
                    e.receiver, e.donor
                ));
                continue;
            };
            let new = match self.study.worker {
                Some(_) => {
                    NewValues::Params(super::external_params(self.study, &e.new).to_string())
                }
                None => {
                    let seed = super::trial_seed(st.seed, e.receiver);
                    NewValues::Hparams(self.study.trial_config(&e.new, seed).hparams)
                }
            };
            if let Some(r) = stored {
                let read = std::time::Instant::now();
                // An external worker reads its donor's file itself.
                let external = self.study.worker.is_some();
                let state = r.state_file.as_ref().map(|path| match external {
                    true => Ok(StoredState::File {
                        path: path.clone(),
                        iteration: r.iteration,
                        step: r.step,
                    }),
                    false => read_point_state(path).map(StoredState::Snapshot),
                });
                match state {
                    Some(Ok(state)) => {
                        st.core.exploit_stored(receiver, state, new);
                        let read_s = read.elapsed().as_secs_f64();
                        underway.insert(run, (e, r.trial_id, read_s));
                    }
                    why => self.reporter.note(&format!(
                        "pbt: trial {} cannot take trial {}'s state (another process's): {}",
                        e.receiver,
                        e.donor,
                        match why {
                            Some(Err(why)) => why,
                            _ => "it was stored without its state".to_string(),
                        }
                    )),
                }
                continue;
            }
            let (Some(donor), Some(donor_id)) = (donor, id_of(e.donor)) else {
                continue;
            };
            if st.core.exploit(receiver, donor, new) {
                underway.insert(run, (e, donor_id, 0.0));
            } else {
                self.reporter.note(&format!(
                    "pbt: trial {} cannot take trial {}'s state: they train on two devices \
                     (copies between devices are not supported yet)",
                    e.receiver, e.donor
                ));
            }
        }
        if underway.is_empty() {
            self.pbt_go_on(st);
        } else if let Some(pop) = st.pbt.as_mut() {
            pop.underway = Some((first, iteration, underway));
        }
        Ok(())
    }

    /// Every member at the point goes on: a lone one, a parked one, and
    /// each fused group paused whole at the point.
    fn pbt_go_on<B: Backend>(&mut self, st: &mut RunState<B>) {
        let Some(pop) = st.pbt.as_mut() else { return };
        pop.underway = None;
        pop.shared.clear();
        let members: Vec<TrialHandle> = std::mem::take(&mut pop.at_point).into_keys().collect();
        go_on(st, members);
    }

    /// A member's schedule as it starts (`pbt:schedule`: its own values
    /// from step 0), so that every member has one; storage keeps a resumed
    /// member's own.
    pub(super) fn pbt_schedule_start(
        &self,
        claim: crate::storage::Claim,
        params: &Params,
    ) -> Result<()> {
        if self.study.pbt.is_none() {
            return Ok(());
        }
        let start = serde_json::json!([{ "step": 0, "params": params_json(self.study, params) }]);
        self.writer.send(WriteOp::ScheduleStart {
            claim,
            schedule_json: start.to_string(),
        })?;
        Ok(())
    }

    /// A copy the core made (or could not make): stored for its receiver;
    /// the last of a generation lets every member go on.
    pub(super) fn pbt_exploited<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        run: TrialHandle,
        copied: Copied,
        error: Option<String>,
    ) -> Result<()> {
        let Copied {
            bytes,
            seconds,
            on_device,
            state,
        } = copied;
        let study = self.study;
        let Some((generation, iteration, (e, donor, read_s))) = st.pbt.as_mut().and_then(|pop| {
            let (g, i, map) = pop.underway.as_mut()?;
            Some((*g, *i, map.remove(&run)?))
        }) else {
            return Ok(());
        };
        match (error, st.in_flight.get(&run)) {
            (Some(why), _) => {
                self.reporter.note(&format!(
                    "pbt: trial {} could not take trial {}'s state: {why}",
                    e.receiver, e.donor
                ));
            }
            (None, Some(f)) => {
                let (claim, history_index) = (f.pending.claim, f.history_index);
                let step = st
                    .curves
                    .get(&e.receiver)
                    .and_then(|c| c.values.keys().next_back().copied())
                    .unwrap_or(0);
                let schedule_entry = serde_json::json!({
                    "step": step,
                    "from": e.donor.0,
                    "params": params_json(study, &e.new),
                })
                .to_string();
                // A worker's is the file its donor saved (it restarts from
                // there); it becomes the trial's checkpoint, covering the
                // donor's steps.
                let (checkpoint, external_step) = match (&self.checkpoints, study.worker.is_some())
                {
                    (None, _) => (None, None),
                    (Some(_), true) => {
                        let base = self.worker_checkpoint(claim);
                        let staged = crate::external::worker::exploit_path(&base);
                        let path = crate::external::worker::checkpoint_at(&base, step);
                        match std::fs::read(&staged) {
                            Ok(bytes) => (Some((path, bytes)), Some(step as i64)),
                            Err(_) => (None, None),
                        }
                    }
                    (Some(c), false) => (
                        state.map(|s| (c.path_of(claim.trial_id), s.to_bytes())),
                        None,
                    ),
                };
                let f = st.in_flight.get_mut(&run).expect("in flight");
                if let Some(step) = external_step {
                    f.pending.external_resume = Some((claim.attempt, step));
                }
                f.pending.params = e.new.clone();
                st.history[history_index].params = e.new.clone();
                self.writer.send(WriteOp::Exploit {
                    claim,
                    exploit: Box::new(PbtExploit {
                        study_id: self.info.id,
                        donor,
                        generation: generation as i64,
                        step: step as i64,
                        iteration: iteration as i64,
                        old_params: params_json(study, &e.old).to_string(),
                        new_params: params_json(study, &e.new).to_string(),
                        resampled: serde_json::json!(e.resampled).to_string(),
                        params: super::encode_params(study, &e.new),
                        schedule_entry,
                        bytes: bytes as i64,
                        seconds: seconds + read_s,
                        on_device,
                        // Stored with the exploit: a crash keeps both or
                        // neither.
                        checkpoint,
                        superseded: match external_step {
                            Some(s) => self.superseded_by(claim, s),
                            None => Vec::new(),
                        },
                        external_step,
                    }),
                })?;
                let changed: Vec<String> = e
                    .new
                    .keys()
                    .filter(|k| e.old.get(*k) != e.new.get(*k))
                    .map(|k| {
                        format!(
                            "{k} {} -> {}",
                            study.value(&e.old, k),
                            study.value(&e.new, k)
                        )
                    })
                    .collect();
                self.reporter.note(&format!(
                    "pbt: trial {} takes trial {}'s state at step {step}; {}",
                    e.receiver,
                    e.donor,
                    if changed.is_empty() {
                        "same values".to_string()
                    } else {
                        changed.join(", ")
                    }
                ));
            }
            // The receiver ended meanwhile: nothing to store.
            (None, None) => {}
        }
        if st
            .pbt
            .as_ref()
            .and_then(|p| p.underway.as_ref())
            .is_some_and(|(_, _, left)| left.is_empty())
        {
            self.pbt_go_on(st);
        }
        Ok(())
    }
}
