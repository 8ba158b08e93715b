//! Other processes on the same study (one per GPU, one per machine).
//!
//! Every [`SYNC`](super::SYNC) the runner rereads the study's trials
//! through its writer and takes in what others did:
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
//! Taking a WAITING trial is a claim in the database, so two processes
//! that both list it never both run it, and a new trial is created only
//! while the study has fewer trials than its budget ([`Runner::next_pending`]).

use std::sync::Arc;
use std::time::Instant;

use kernels::Backend;

use super::{Pending, RunState, Runner, SYNC, decode_params, encode_params};
use crate::error::Result;
use crate::sampler::TrialRecord;
use crate::storage::{Requeuer, TrialState, owner_gone_here, pid_exists, run_alive};

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
    pub(super) fn next_pending<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<Next> {
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
                Some(claimed) => self.settle_resume(&st.data[0], &mut p, &claimed),
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
        let Some((claim, number)) = self.writer.create_trial(
            self.info.id,
            encode_params(study, &params),
            study.fixed_json().to_string(),
            st.timeline.run_id,
            st.budget,
        )?
        else {
            // Other processes filled the study's budget.
            st.liveness.target_met = true;
            return Ok(Next::Skip);
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
        if st.liveness.last_sync.elapsed() < SYNC {
            return Ok(());
        }
        self.sync_now(st)
    }

    /// [`sync`](Self::sync) at once: before this process decides that it
    /// has nothing left to do.
    pub(super) fn sync_now<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        st.liveness.last_sync = Instant::now();
        let rows = self.writer.read_trials(self.info.id)?;
        let mine: Vec<_> = st
            .in_flight
            .values()
            .map(|f| f.pending.claim.trial_id)
            .collect();
        let listed: Vec<_> = st.waiting.iter().map(|p| p.claim.trial_id).collect();
        let data = Arc::clone(&st.data[0]);
        // Judging others dead by age waits while this process's own
        // heartbeats were held up (see `storage::heartbeat`); a dead pid
        // on this host is judged at once.
        let judge = self.writer.beat().may_judge_others();
        st.liveness.elsewhere = 0;
        st.liveness.elsewhere_ids.clear();
        let mut unclaimed = std::collections::BTreeMap::new();
        for row in &rows {
            // An enqueued trial's parameters are settled when it is taken.
            let unsettled = row.params.is_empty() && row.fixed_params.is_some();
            if !unsettled && !st.history_at.contains_key(&row.number) {
                st.record(row.number, decode_params(self.study, row));
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
            if mine.contains(&row.trial_id) || listed.contains(&row.trial_id) {
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
            let requeue = match &row.owner {
                Some(owner) => {
                    let pid_gone = owner_gone_here(owner, &st.liveness.place, pid_exists);
                    let dead = pid_gone
                        || (judge
                            && !run_alive(
                                owner,
                                &st.liveness.place,
                                st.liveness.limit_s,
                                pid_exists,
                            ));
                    dead.then_some(Requeuer::Finder {
                        trial_id: row.trial_id,
                        seen: (owner.run_id, owner.attempt),
                        pid_gone,
                        limit_s: st.liveness.limit_s,
                    })
                }
                // Only Optuna (or an older salus-tune) holds it: requeued
                // once its heartbeat has stood still for the limit, as this
                // run watched it; never when it has none.
                None => {
                    let seen = st
                        .liveness
                        .unclaimed
                        .get(&row.trial_id)
                        .filter(|(beat, _)| *beat == row.heartbeat)
                        .map_or_else(|| (row.heartbeat.clone(), Instant::now()), Clone::clone);
                    let still = seen.1.elapsed().as_secs_f64() >= st.liveness.limit_s;
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
            };
            match requeue {
                Some(by) => {
                    let params = decode_params(self.study, row);
                    let (pending, _) = self.pending_of(&data, row, params, Some(by))?;
                    st.waiting.push_back(pending);
                }
                None => {
                    st.liveness.elsewhere += 1;
                    st.liveness.elsewhere_ids.insert(row.trial_id);
                }
            }
        }
        st.liveness.unclaimed = unclaimed;
        Ok(())
    }
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
}
