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
//! that both list it never both run it.

use std::sync::Arc;
use std::time::Instant;

use kernels::Backend;

use super::resume::held_elsewhere;
use super::{RunState, Runner, SYNC, decode_params};
use crate::error::Result;
use crate::sampler::TrialRecord;
use crate::storage::TrialState;

impl Runner<'_> {
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
        let now = chrono::Local::now().naive_local();
        let mine: Vec<_> = st.in_flight.values().map(|f| f.pending.trial_id).collect();
        let listed: Vec<_> = st.waiting.iter().map(|p| p.trial_id).collect();
        let data = Arc::clone(&st.data);
        st.liveness.elsewhere = 0;
        for row in &rows {
            // An enqueued trial's parameters are settled when it is taken.
            let unsettled = row.params.is_empty() && row.fixed_params.is_some();
            if !unsettled && st.known.insert(row.number) {
                st.history.push(TrialRecord {
                    params: decode_params(self.study, row),
                    value: None,
                });
            }
            if mine.contains(&row.trial_id) || listed.contains(&row.trial_id) {
                continue;
            }
            let running_elsewhere = row.state == TrialState::Running
                && (row.owner.as_ref()).is_none_or(|o| o.run_id != st.timeline.run_id);
            let alive = running_elsewhere && held_elsewhere(row, &st.liveness.host, now);
            st.liveness.elsewhere += u64::from(alive);
            if (running_elsewhere && !alive) || row.state == TrialState::Waiting {
                let params = decode_params(self.study, row);
                let (pending, _) = self.pending_of(&data, row, params)?;
                st.waiting.push_back(pending);
            }
        }
        // Values of trials that other processes finished.
        for row in rows.iter().filter(|r| r.state == TrialState::Complete) {
            let params = decode_params(self.study, row);
            if let Some(h) = st
                .history
                .iter_mut()
                .find(|h| h.value.is_none() && h.params == params)
            {
                h.value = row.value;
            }
        }
        Ok(())
    }
}
