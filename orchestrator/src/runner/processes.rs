//! Other processes on the same study (one per GPU, one per machine).
//!
//! The runner rereads the study's trials through its writer, at the
//! pace [`SyncPace`] sets, and takes in what others did:
//! * trials they created go into the sampler's history, RUNNING ones as
//!   pending (TPE judges them as its own running trials),
//!   finished ones with their values;
//! * a RUNNING trial whose run is gone is requeued (once, by whichever
//!   process is first, and only while the database still says its run is
//!   gone: see `storage::claims`) and joins this run's waiting list with
//!   its checkpoint; so does any WAITING trial (an enqueued one, or one
//!   another process requeued);
//! * a RUNNING trial that no salus-tune run claims (an Optuna process's)
//!   is left alone while its heartbeat moves, and when it has none.
//!
//! The pace: while other processes are active, as often as every 0.1 s,
//! so that their results reach this run's sampler and pruner as Optuna's
//! reach each `ask` (a study of short trials is over in a few 2 s syncs);
//! slower where a reread costs more than a small share of the runner's
//! time; and every 2 s while the study shows no other process at work,
//! which is as long as a process that joins waits to be seen.
//!
//! Taking a WAITING trial is a claim in the database, so two processes
//! that both list it never both run it, and a new trial is created only
//! while the study has fewer trials than its budget and, in the start of
//! TPE or GP, fewer in flight than the start's cap allows, both counted
//! as the study is when the trial is created, not as the last reread
//! showed it ([`Runner::next_pending`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernels::Backend;

use super::{Pending, RunState, Runner, decode_params, encode_params};
use crate::error::Result;
use crate::pruner::Curve;
use crate::sampler::TrialRecord;
use crate::storage::{
    InFlightCap, NewTrial, Owner, Place, Requeuer, TrialId, TrialRow, TrialState, owner_gone_here,
    pid_exists, run_alive,
};

/// What [`Runner::next_pending`] found.
pub(super) enum Next {
    Run(Box<Pending>),
    /// That one is gone (another process took it, or it failed): look again.
    Skip,
    /// Nothing more to start.
    Stop,
}

impl Runner<'_> {
    /// The next trial to start: a waiting one this run manages to claim,
    /// else a new proposal, created only while the study's budget allows.
    /// A new trial keeps `cap` on the study's trials in flight.
    pub(super) fn next_pending<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        cap: Option<InFlightCap>,
    ) -> Result<Next> {
        let study = self.study;
        if let Some(mut p) = st.waiting.pop_front() {
            let store = match &p.enqueued {
                Some(Ok(params)) => params.clone(),
                _ => Vec::new(),
            };
            // Another process may have taken it first.
            match self
                .writer
                .claim_waiting(p.claim.trial_id, st.timeline.run_id, store)?
            {
                Some(claimed) => {
                    self.settle_resume(&st.data[0], &mut p, &claimed);
                    // Held below a cut where it ran before, it runs here
                    // again: pending until this run's pruner says otherwise.
                    st.stopped(p.number, None);
                    // Its curve as a sync read it may reach past what the
                    // requeue kept; it reports those steps again here.
                    if let Some(c) = st.curves.get_mut(&p.number) {
                        c.values.retain(|&s, _| s as i64 <= claimed.last_step);
                        c.finished = false;
                    }
                }
                None => return Ok(Next::Skip),
            }
            if let Some(Err(why)) = &p.enqueued {
                // Its values are not in the space: it fails, the study goes on.
                st.finished += 1;
                let reason = format!("enqueued parameters refused: {why}");
                self.fail(st, &p, 0, 0.0, reason)?;
                return Ok(Next::Skip);
            }
            return Ok(Next::Run(Box::new(p)));
        }
        if st.liveness.target_met {
            return Ok(Next::Stop);
        }
        let Some(params) = propose_unseen(st.sampler.as_mut(), &study.space, &st.history) else {
            self.reporter.note("the grid is exhausted");
            st.exhausted = true;
            return Ok(Next::Stop);
        };
        let (claim, number) = match self.writer.create_trial(
            self.info.id,
            encode_params(study, &params),
            study.fixed_json().to_string(),
            st.timeline.run_id,
            st.budget,
            cap,
        )? {
            NewTrial::Created(claim, number) => (claim, number),
            NewTrial::BudgetMet => {
                // Other processes filled the study's budget.
                st.liveness.target_met = true;
                return Ok(Next::Skip);
            }
            NewTrial::AtCap { .. } => {
                // Others made or started trials since the last reread: the
                // proposal, which saw fewer of them, is dropped, and new
                // ones wait for the next reread, due now.
                st.liveness.at_cap = true;
                st.liveness.sync.due_now();
                return Ok(Next::Skip);
            }
        };
        st.record(number, params.clone());
        Ok(Next::Run(Box::new(Pending {
            claim,
            number,
            params,
            resume: None,
            enqueued: None,
            external_resume: None,
        })))
    }

    /// See the module docs.
    pub(super) fn sync<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        if !st.liveness.sync.is_due() {
            return Ok(());
        }
        self.sync_now(st)
    }

    /// [`sync`](Self::sync) at once: before this process decides that it
    /// has nothing left to do.
    pub(super) fn sync_now<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        let began = Instant::now();
        let known = st.history.len();
        let mine: Vec<_> = st
            .in_flight
            .values()
            .map(|f| f.pending.claim.trial_id)
            .collect();
        let listed: Vec<_> = st.waiting.iter().map(|p| p.claim.trial_id).collect();
        let data = Arc::clone(&st.data[0]);
        // Judging others dead by age waits while this process's own
        // heartbeats were held up (see `storage::heartbeat`); a dead pid
        // on this host is judged at once. Asked once the rows are read: a
        // read queued behind a write that waited on a lock shows the others'
        // heartbeats as old as that wait made them.
        let beat = self.writer.beat();
        let mut unclaimed = BTreeMap::new();
        let liveness = &st.liveness;
        let mut judge = None;
        let (rows, orphans) = judge_then_read(
            || self.writer.read_trials(self.info.id),
            |row| {
                let judge = *judge.get_or_insert_with(|| beat.may_judge_others());
                if row.state != TrialState::Running
                    || mine.contains(&row.trial_id)
                    || listed.contains(&row.trial_id)
                {
                    return None;
                }
                match &row.owner {
                    Some(owner) => dead_holder(
                        row.trial_id,
                        owner,
                        &liveness.place,
                        liveness.limit_s,
                        judge,
                    ),
                    // Only Optuna (or an older salus-tune) holds it: requeued
                    // once its heartbeat has stood still for the limit, as this
                    // run watched it; never when it has none.
                    None => {
                        let seen = liveness
                            .unclaimed
                            .get(&row.trial_id)
                            .filter(|(beat, _)| *beat == row.heartbeat)
                            .map_or_else(|| (row.heartbeat.clone(), Instant::now()), Clone::clone);
                        let still = seen.1.elapsed().as_secs_f64() >= liveness.limit_s;
                        let stale = match (&seen.0, still && judge) {
                            (Some(beat), true) => Some(Requeuer::Unclaimed {
                                trial_id: row.trial_id,
                                beat: beat.clone(),
                            }),
                            _ => None,
                        };
                        unclaimed.insert(row.trial_id, seen);
                        stale
                    }
                }
            },
        )?;
        st.liveness.at_cap = false;
        st.liveness.elsewhere = 0;
        st.liveness.elsewhere_held = 0;
        st.liveness.elsewhere_ids.clear();
        let mut learned = false;
        for row in &rows {
            // An enqueued trial's parameters are settled when it is taken.
            let unsettled = row.params.is_empty() && row.fixed_params.is_some();
            if !unsettled && !st.history_at.contains_key(&row.number) {
                st.record(row.number, decode_params(self.study, row));
            }
            // How another process's trial ended without a value, or that
            // its pruner holds it below a cut (this run knows its own).
            let elsewhere = !mine.contains(&row.trial_id) && !listed.contains(&row.trial_id);
            let how = super::stopped_of(
                row.state,
                &row.intermediate,
                elsewhere && row.held_at_rung.is_some(),
            );
            if let Some(&i) = st.history_at.get(&row.number)
                && (how.is_some() || (elsewhere && !row.state.is_finished()))
            {
                // A promotion elsewhere makes it pending again.
                st.history[i].stopped = how;
            }
            if elsewhere && row.state != TrialState::Waiting {
                learned |= merge_curve(st.curves.entry(row.number).or_default(), row);
            }
            // A value another process found.
            if let (TrialState::Complete, Some(&i)) = (row.state, st.history_at.get(&row.number)) {
                st.history[i].value = st.history[i].value.or(row.value);
                if st.history[i].values.is_empty() {
                    st.history[i].values =
                        super::all_values(self.study, row.value, &row.more_values);
                    st.history[i].violation = super::violation(row.constraints.iter().copied());
                }
            }
            if !elsewhere {
                continue;
            }
            if row.state == TrialState::Waiting {
                let params = decode_params(self.study, row);
                let (pending, _) = self.pending_of(&data, row, params, None)?;
                st.waiting.push_back(pending);
                continue;
            }
            if row.state != TrialState::Running {
                continue;
            }
            match orphans.get(&row.trial_id) {
                Some(by) => {
                    let params = decode_params(self.study, row);
                    let (pending, _) = self.pending_of(&data, row, params, Some(by.clone()))?;
                    st.waiting.push_back(pending);
                }
                None => {
                    st.liveness.elsewhere += 1;
                    st.liveness.elsewhere_held += u64::from(row.held_at_rung.is_some());
                    st.liveness.elsewhere_ids.insert(row.trial_id);
                }
            }
        }
        st.liveness.unclaimed = unclaimed;
        // New trials this run did not make were made elsewhere (its own
        // are in its history before they are stored).
        let others_active = learned
            || st.history.len() > known
            || st.liveness.elsewhere > 0
            || !st.waiting.is_empty();
        if learned {
            // Reports made elsewhere may lift trials paused here over a cut.
            self.promote(st)?;
        }
        st.liveness.sync.synced(began, others_active);
        Ok(())
    }
}

/// When a run rereads the study (see the module docs).
#[derive(Debug)]
pub(super) struct SyncPace {
    next: Instant,
    interval: Duration,
}

impl SyncPace {
    /// The fastest pace, the one a build measured to sharpen proposals on
    /// studies of seconds (`docs/benchmarks/asha.md`).
    const FASTEST: Duration = Duration::from_millis(100);
    /// The slowest, and the pace with no other process at work.
    const SLOWEST: Duration = Duration::from_secs(2);
    /// A reread may take one part in this many of the runner's time: its
    /// thread shares the CPU with the trials.
    const TIME_SHARE: u32 = 50;

    /// Due at once: the first reread sets the pace from what it finds.
    pub(super) fn new() -> Self {
        Self {
            next: Instant::now(),
            interval: Self::SLOWEST,
        }
    }

    /// Due at once, whatever the pace.
    pub(super) fn due_now(&mut self) {
        self.next = Instant::now();
    }

    pub(super) fn is_due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// The time between rereads now.
    pub(super) fn interval(&self) -> Duration {
        self.interval
    }

    /// A reread began at `began` and has ended.
    pub(super) fn synced(&mut self, began: Instant, others_active: bool) {
        self.interval = Self::interval_after(began.elapsed(), others_active);
        self.next = Instant::now() + self.interval;
    }

    /// The pace after a reread that took `took`.
    fn interval_after(took: Duration, others_active: bool) -> Duration {
        if !others_active {
            return Self::SLOWEST;
        }
        (took * Self::TIME_SHARE).clamp(Self::FASTEST, Self::SLOWEST)
    }
}

/// Adds what another process stored of a trial's curve to this run's
/// copy (the pruners share the study's curves, as Optuna's read them all
/// from the storage); returns whether anything was new. What this run
/// already has stays: the stored rows may lag behind it.
fn merge_curve(curve: &mut Curve, row: &TrialRow) -> bool {
    let mut new = false;
    for &(step, value) in &row.intermediate {
        if let std::collections::btree_map::Entry::Vacant(e) = curve.values.entry(step as u64) {
            e.insert(value);
            new = true;
        }
    }
    if row.state.is_finished() && !curve.finished {
        curve.finished = true;
        new = true;
    }
    new
}

/// The requeuer of trial `trial_id` where the run of `owner`, its holder,
/// is dead: its pid gone on this host, or (where `by_age`) its heartbeat
/// older than `limit_s` (see `storage::run_alive`).
pub(super) fn dead_holder(
    trial_id: TrialId,
    owner: &Owner,
    place: &Place,
    limit_s: f64,
    by_age: bool,
) -> Option<Requeuer> {
    let pid_gone = owner_gone_here(owner, place, pid_exists);
    let dead = pid_gone || (by_age && !run_alive(owner, place, limit_s, pid_exists));
    dead.then_some(Requeuer::Finder {
        trial_id,
        seen: (owner.run_id, owner.attempt),
        pid_gone,
        limit_s,
    })
}

/// The study's trials, and the orphans among them to requeue (by trial
/// id): `judge` names a RUNNING trial's requeuer where its holder is
/// gone. The rows a requeue keeps steps by are read after the judgement.
/// A holder alive at a read may commit a step, with the checkpoint that
/// replaces the one the read's curve covers, and die before its pid is
/// looked at: a requeue from that read would keep no step. A dead holder
/// writes nothing more, so the rows are read again once some holder is
/// judged dead, and an orphan stands where that read still shows the
/// claim it was judged by.
pub(super) fn judge_then_read<E>(
    mut read: impl FnMut() -> std::result::Result<Vec<TrialRow>, E>,
    mut judge: impl FnMut(&TrialRow) -> Option<Requeuer>,
) -> std::result::Result<(Vec<TrialRow>, BTreeMap<TrialId, Requeuer>), E> {
    let rows = read()?;
    let judged: Vec<Requeuer> = rows.iter().filter_map(&mut judge).collect();
    if judged.is_empty() {
        return Ok((rows, BTreeMap::new()));
    }
    let rows = read()?;
    let orphans = judged
        .into_iter()
        .filter(|by| rows.iter().any(|r| by.applies_to(r)))
        .map(|by| (by.trial_id(), by))
        .collect();
    Ok((rows, orphans))
}

/// How many times a proposal that some trial already has is drawn again.
const REDRAWS: usize = 16;

/// The sampler's proposal, drawn again while some trial already has
/// exactly those values. A process that took a dead process's index
/// replays its stream, which is keyed on the history's length; where the
/// lengths meet, it would propose a trial that process already ran. Each
/// redraw sees the duplicate as pending, which moves the stream on (and
/// pushes TPE away from it). In a small discrete space a duplicate may be
/// all there is: after [`REDRAWS`] it stands.
pub(super) fn propose_unseen(
    sampler: &mut dyn crate::sampler::Sampler,
    space: &crate::space::SearchSpace,
    history: &[TrialRecord],
) -> Option<crate::space::Params> {
    let first = sampler.propose(space, history)?;
    if !history.iter().any(|t| t.params == first) {
        return Some(first);
    }
    let mut seen = history.to_vec();
    let mut params = first;
    for _ in 0..REDRAWS {
        seen.push(TrialRecord {
            params: params.clone(),
            value: None,
            values: Vec::new(),
            violation: 0.0,
            stopped: None,
        });
        let next = sampler.propose(space, &seen)?;
        if !seen.iter().any(|t| t.params == next) {
            return Some(next);
        }
        params = next;
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{RandomSampler, Sampler};
    use crate::space::{Distribution, Param, SearchSpace};

    #[test]
    fn rereads_are_fast_while_others_work_and_cost_a_small_share_of_the_time() {
        let ms = Duration::from_millis;
        // Alone on the study: a joiner is seen within the slowest pace.
        assert_eq!(SyncPace::interval_after(ms(1), false), ms(2000));
        // Others at work and a cheap reread: the fastest pace.
        assert_eq!(SyncPace::interval_after(ms(1), true), ms(100));
        // A dearer one keeps to its share of the time...
        assert_eq!(SyncPace::interval_after(ms(10), true), ms(500));
        // ...up to the slowest pace.
        assert_eq!(SyncPace::interval_after(ms(90), true), ms(2000));
        let mut pace = SyncPace::new();
        assert!(pace.is_due(), "the first reread sets the pace");
        pace.synced(Instant::now() - ms(1), true);
        assert_eq!(pace.interval(), ms(100));
        assert!(!pace.is_due());
        pace.synced(Instant::now(), false);
        assert_eq!(pace.interval(), ms(2000));
    }

    #[test]
    fn another_process_s_curve_adds_to_this_run_s_and_never_replaces_it() {
        let mut row = running(4, Some(2), 3, "t");
        row.intermediate = vec![(1, 0.9), (2, 0.8), (3, 0.7)];
        // This run read steps 1 and 2 before, step 2 as it was then.
        let mut curve = Curve {
            values: [(1, 0.9), (2, 0.85)].into_iter().collect(),
            finished: false,
        };
        assert!(merge_curve(&mut curve, &row));
        assert_eq!(
            curve.values.into_iter().collect::<Vec<_>>(),
            [(1, 0.9), (2, 0.85), (3, 0.7)]
        );
        assert!(!curve.finished);
        let mut curve = Curve::default();
        assert!(merge_curve(&mut curve, &row));
        assert!(
            !merge_curve(&mut curve, &row),
            "nothing new the second time"
        );
        row.state = TrialState::Pruned;
        assert!(merge_curve(&mut curve, &row));
        assert!(curve.finished);
    }

    #[test]
    fn a_replayed_stream_does_not_propose_a_trial_that_exists() {
        let space = SearchSpace::new(vec![Param {
            name: "x".into(),
            dist: Distribution::Float {
                low: 0.0,
                high: 1.0,
                log: false,
                step: None,
            },
            condition: None,
        }])
        .unwrap();
        // A dead process with this seed proposed `p` after 3 trials; a
        // process that took its index now sees 3 trials, one of them `p`.
        let mut sampler = RandomSampler::new(7);
        let mut history: Vec<TrialRecord> = Vec::new();
        for _ in 0..3 {
            let q = sampler.propose(&space, &history).unwrap();
            history.push(TrialRecord {
                params: q,
                value: Some(1.0),
                values: Vec::new(),
                violation: 0.0,
                stopped: None,
            });
        }
        let p = sampler.propose(&space, &history).unwrap();
        history[0].params = p.clone();
        assert_eq!(
            sampler.propose(&space, &history).unwrap(),
            p,
            "the stream replays"
        );
        let got = propose_unseen(&mut sampler, &space, &history).unwrap();
        assert_ne!(got, p);
        assert!(history.iter().all(|t| t.params != got));
        // Where nothing repeats, the proposal is the sampler's own.
        history[0].params = sampler.propose(&space, &[]).unwrap();
        assert_eq!(propose_unseen(&mut sampler, &space, &history).unwrap(), p);
    }

    /// A RUNNING trial as read: held by run `run` (none: Optuna's, with
    /// heartbeat `beat`), its curve up to `last` step.
    fn running(id: i64, run: Option<i64>, last: i64, beat: &str) -> TrialRow {
        TrialRow {
            trial_id: TrialId(id),
            number: crate::storage::TrialNumber(id),
            state: TrialState::Running,
            value: None,
            more_values: Vec::new(),
            constraints: Vec::new(),
            datetime_start: None,
            datetime_complete: None,
            params: Vec::new(),
            intermediate: (1..=last).map(|s| (s, 0.5)).collect(),
            fail_reason: None,
            priority: None,
            rung: None,
            held_at_rung: None,
            heartbeat_age_s: None,
            owner: run.map(|r| crate::storage::Owner {
                run_id: crate::storage::RunId(r),
                host: Some("here".into()),
                pid: Some(r),
                heartbeat_age_s: Some(0.0),
                ended: false,
                pid_namespace: None,
                attempt: 1,
            }),
            fixed_params: None,
            checkpoint: None,
            heartbeat: Some(beat.into()),
        }
    }

    #[test]
    fn orphans_keep_steps_by_the_rows_read_after_their_holders_were_judged_dead() {
        // Runs 7 and 9 and Optuna's trial 4 are judged dead. Between the
        // first read and that judgement, run 7 committed step 4 and died,
        // another process requeued trial 3 and took it (run 10), and
        // trial 4's heartbeat moved.
        let first = vec![
            running(1, Some(7), 3, "a"),
            running(2, Some(8), 2, "a"),
            running(3, Some(9), 5, "a"),
            running(4, None, 0, "a"),
        ];
        let second = vec![
            running(1, Some(7), 4, "a"),
            running(2, Some(8), 3, "a"),
            running(3, Some(10), 0, "a"),
            running(4, None, 0, "b"),
        ];
        let mut reads = vec![first, second.clone()].into_iter();
        let judge = |row: &TrialRow| match &row.owner {
            Some(o) if [7, 9].contains(&o.run_id.0) => Some(Requeuer::Finder {
                trial_id: row.trial_id,
                seen: (o.run_id, o.attempt),
                pid_gone: true,
                limit_s: 10.0,
            }),
            Some(_) => None,
            None => Some(Requeuer::Unclaimed {
                trial_id: row.trial_id,
                beat: row.heartbeat.clone().unwrap(),
            }),
        };
        let (rows, orphans) =
            judge_then_read(|| Ok::<_, ()>(reads.next().unwrap()), judge).unwrap();
        assert_eq!(rows, second, "the curves as they are after the judgement");
        assert_eq!(orphans.keys().copied().collect::<Vec<_>>(), [TrialId(1)]);
        assert_eq!(
            orphans[&TrialId(1)],
            Requeuer::Finder {
                trial_id: TrialId(1),
                seen: (crate::storage::RunId(7), 1),
                pid_gone: true,
                limit_s: 10.0,
            }
        );
        // With nobody dead, the rows are read once.
        let mut reads = 0;
        let (rows, orphans) = judge_then_read(
            || {
                reads += 1;
                Ok::<_, ()>(vec![running(2, Some(8), 2, "a")])
            },
            |_| None,
        )
        .unwrap();
        assert_eq!((reads, rows.len(), orphans.len()), (1, 1, 0));
    }
}
