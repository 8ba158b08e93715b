//! The dashboard's commands (pause, resume, prune rows in `salus_commands`)
//! and the heartbeats that tell other processes this run's trials are alive.

use std::time::Instant;

use kernels::Backend;

use super::{HEARTBEAT, RunState, Runner};
use crate::error::Result;
use crate::storage::TrialId;
use crate::storage::writer::WriteOp;

impl Runner<'_> {
    /// Tells the database every [`HEARTBEAT`] that this process's trials live.
    pub(super) fn heartbeat<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        if st.liveness.last_heartbeat.elapsed() < HEARTBEAT {
            return Ok(());
        }
        st.liveness.last_heartbeat = Instant::now();
        let trial_ids: Vec<TrialId> = st.in_flight.values().map(|f| f.pending.trial_id).collect();
        // The run beats even with no trial, so others see it alive.
        self.writer.send(WriteOp::Heartbeat {
            run_id: st.timeline.run_id,
            trial_ids,
        })?;
        Ok(())
    }

    /// Applies the dashboard's commands (at most every 250 ms): pause,
    /// resume or prune a trial at its next iteration boundary.
    pub(super) fn take_commands<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        if st.liveness.last_commands.elapsed() < std::time::Duration::from_millis(250) {
            return Ok(());
        }
        st.liveness.last_commands = Instant::now();
        for cmd in self.writer.take_commands(self.info.id)? {
            let job = st
                .in_flight
                .iter()
                .find(|(_, f)| f.pending.trial_id == cmd.trial_id)
                .map(|(&j, _)| j);
            let outcome = match (job, cmd.action.as_str()) {
                (None, _) => "ignored: the trial is not running",
                (Some(j), "pause") => {
                    st.pause(j);
                    st.liveness.user_paused.insert(j);
                    self.command_priority(cmd.trial_id, "paused")?;
                    "applied"
                }
                (Some(j), "resume") => {
                    if st.liveness.user_paused.remove(&j) {
                        st.resume(j);
                        self.command_priority(cmd.trial_id, "resumed")?;
                        "applied"
                    } else {
                        "ignored: the trial was not paused from the dashboard"
                    }
                }
                (Some(j), "prune") => {
                    st.closing.insert(j);
                    if st.liveness.user_paused.remove(&j) {
                        st.resume(j);
                    }
                    self.command_priority(cmd.trial_id, "pruned")?;
                    if st.prune(j) {
                        self.on_pruned(st, j, 0, 0.0)?;
                    }
                    "applied"
                }
                (Some(_), _) => "ignored: unknown action",
            };
            self.writer.send(WriteOp::Event {
                study_id: self.info.id,
                trial_id: Some(cmd.trial_id),
                kind: "command",
                detail: serde_json::json!({ "action": cmd.action, "outcome": outcome }).to_string(),
            })?;
        }
        Ok(())
    }

    /// Records a dashboard command's effect in `salus_priority`.
    pub(super) fn command_priority(&self, trial_id: TrialId, reason: &'static str) -> Result<()> {
        self.writer.send(WriteOp::Priority {
            trial_id,
            priority: 0.0,
            rung: None,
            reason,
        })
    }
}
