//! Other processes on the same study (one per GPU, one per machine).
//!
//! Every [`SYNC`](super::SYNC) the runner rereads the study's trials
//! through its writer and takes in what others did:
//! * trials they created go into the sampler's history, RUNNING ones as
//!   pending (TPE's constant liar treats them as its own running trials),
//!   finished ones with their values;
//! * a RUNNING trial whose run is gone is requeued (once, by whichever
//!   process is first: see `storage::claims`) and joins this run's
//!   waiting list with its checkpoint; so does any WAITING trial (an
//!   enqueued one, or one another process requeued).
//!
//! Taking a WAITING trial is a claim in the database, so two processes
//! that both list it never both run it, and a new trial is created only
//! while the study has fewer trials than its budget ([`Runner::next_pending`]).

use std::sync::Arc;
use std::time::Instant;

use kernels::Backend;

use super::resume::held_elsewhere;
use super::{Pending, RunState, Runner, SYNC, decode_params, encode_params};
use crate::error::Result;
use crate::storage::TrialState;

/// What [`Runner::next_pending`] found.
pub(super) enum Next {
    Run(Pending),
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
        if let Some(p) = st.waiting.pop_front() {
            let store = match &p.enqueued {
                Some(Ok(params)) => params.clone(),
                _ => Vec::new(),
            };
            // Another process may have taken it first.
            if !self
                .writer
                .claim_waiting(p.trial_id, st.timeline.run_id, store)?
            {
                return Ok(Next::Skip);
            }
            if let Some(Err(why)) = &p.enqueued {
                // Its values are not in the space: it fails, the study goes on.
                st.finished += 1;
                let reason = format!("enqueued parameters refused: {why}");
                self.fail(st, &p, 0, 0.0, reason)?;
                return Ok(Next::Skip);
            }
            return Ok(Next::Run(p));
        }
        if st.liveness.target_met {
            return Ok(Next::Stop);
        }
        let Some(params) = st.sampler.propose(&study.space, &st.history) else {
            self.reporter.note("the grid is exhausted");
            st.exhausted = true;
            return Ok(Next::Stop);
        };
        let Some((trial_id, number)) = self.writer.create_trial(
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
        Ok(Next::Run(Pending {
            trial_id,
            number,
            params,
            resume: None,
            enqueued: None,
        }))
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
        let mine: Vec<_> = st.in_flight.values().map(|f| f.pending.trial_id).collect();
        let listed: Vec<_> = st.waiting.iter().map(|p| p.trial_id).collect();
        let data = Arc::clone(&st.data);
        st.liveness.elsewhere = 0;
        for row in &rows {
            // An enqueued trial's parameters are settled when it is taken.
            let unsettled = row.params.is_empty() && row.fixed_params.is_some();
            if !unsettled && !st.history_at.contains_key(&row.number) {
                st.record(row.number, decode_params(self.study, row));
            }
            // A value another process found.
            if let (TrialState::Complete, Some(&i)) = (row.state, st.history_at.get(&row.number)) {
                st.history[i].value = st.history[i].value.or(row.value);
            }
            if mine.contains(&row.trial_id) || listed.contains(&row.trial_id) {
                continue;
            }
            let running_elsewhere = row.state == TrialState::Running
                && (row.owner.as_ref()).is_none_or(|o| o.run_id != st.timeline.run_id);
            let alive = running_elsewhere && held_elsewhere(row, &st.liveness.host);
            st.liveness.elsewhere += u64::from(alive);
            if (running_elsewhere && !alive) || row.state == TrialState::Waiting {
                let params = decode_params(self.study, row);
                let (pending, _) = self.pending_of(&data, row, params)?;
                st.waiting.push_back(pending);
            }
        }
        Ok(())
    }
}
