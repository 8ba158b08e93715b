//! The dashboard's commands (pause, resume, prune rows in `salus_commands`),
//! the claims the heartbeat task beats for, and the trials this run lost.

use std::time::Instant;

use kernels::Backend;

use super::{RunState, Runner, TrialHandle};
use crate::error::Result;
use crate::storage::Claim;
use crate::storage::dashboard::DashCommand;
use crate::storage::writer::WriteOp;

impl Runner<'_> {
    /// Tells the heartbeat task which trials this run holds now.
    pub(super) fn beat_claims<B: Backend>(&mut self, st: &mut RunState<B>) {
        let claims: Vec<Claim> = st.in_flight.values().map(|f| f.pending.claim).collect();
        self.writer.beat().set_claims(claims);
    }

    /// Drops the trials whose claim this run lost: it was paused (or cut
    /// off from the database) past the liveness limit, and another process
    /// requeued them, and may run them now. Nothing more is written for
    /// them (the writer's fence refuses it anyway), their workers are
    /// stopped, and the run says so in one line each.
    pub(super) fn drop_lost<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        for trial_id in self.writer.take_lost() {
            let Some(run) = st
                .in_flight
                .iter()
                .find(|(_, f)| f.pending.claim.trial_id == trial_id)
                .map(|(&r, _)| r)
            else {
                continue;
            };
            // Out of the runner's books first: the core's last events for
            // it (a report, a prune) then find nothing to record.
            let f = st.in_flight.remove(&run).expect("in flight");
            st.forget_pauses(run);
            st.closing.remove(&run);
            st.kept.finals.remove(&run);
            st.prune(run);
            self.reporter.note(&format!(
                "trial {}: lost to another process (this process did not beat for longer than the \
                 liveness limit of {} s, so a peer requeued it); dropped here, nothing more is \
                 written for it",
                f.pending.number, st.liveness.limit_s
            ));
        }
        Ok(())
    }

    /// Applies the dashboard's commands (at most every 250 ms) for the
    /// trials this run holds: pause, resume or prune a trial at its next
    /// iteration boundary. Commands for other processes' trials stay for
    /// them.
    pub(super) fn take_commands<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        if st.liveness.last_commands.elapsed() < std::time::Duration::from_millis(250) {
            return Ok(());
        }
        st.liveness.last_commands = Instant::now();
        for cmd in self
            .writer
            .take_commands(self.info.id, st.timeline.run_id)?
        {
            let held = st
                .in_flight
                .iter()
                .find(|(_, f)| f.pending.claim.trial_id == cmd.trial_id)
                .map(|(&j, f)| (j, f.pending.claim));
            let outcome = match (held, cmd.action) {
                (None, _) => "ignored: the trial is not running",
                (Some(_), None) => "ignored: unknown action",
                (Some((j, claim)), Some(DashCommand::Pause)) => {
                    st.pause(j);
                    st.liveness.user_paused.insert(j);
                    self.command_priority(claim, "paused")?;
                    "applied"
                }
                (Some((j, claim)), Some(DashCommand::Resume)) => {
                    if st.liveness.user_paused.remove(&j) {
                        // A trial the pruner also holds at a rung waits on
                        // for its promotion: the dashboard undoes only its
                        // own pause.
                        if !st.paused.contains_key(&j) {
                            st.resume(j);
                        }
                        self.command_priority(claim, "resumed")?;
                        "applied"
                    } else {
                        "ignored: the trial was not paused from the dashboard"
                    }
                }
                (Some((j, claim)), Some(DashCommand::Prune)) => {
                    self.prune_command(st, j, claim)?;
                    "applied"
                }
            };
            self.writer.send(WriteOp::CommandOutcome {
                command_id: cmd.command_id,
                outcome: outcome.to_string(),
            })?;
            self.writer.send(WriteOp::Event {
                study_id: self.info.id,
                trial_id: Some(cmd.trial_id),
                kind: "command",
                detail: serde_json::json!({
                    "action": cmd.word,
                    "outcome": outcome,
                    "run_id": st.timeline.run_id,
                })
                .to_string(),
            })?;
        }
        Ok(())
    }

    fn prune_command<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        j: TrialHandle,
        claim: Claim,
    ) -> Result<()> {
        st.closing.insert(j);
        if st.liveness.user_paused.remove(&j) {
            st.resume(j);
        }
        self.command_priority(claim, "pruned")?;
        if st.prune(j) {
            self.on_pruned(st, j, 0, 0.0)?;
        }
        Ok(())
    }

    /// Records a dashboard command's effect in `salus_priority`.
    pub(super) fn command_priority(&self, claim: Claim, reason: &'static str) -> Result<()> {
        Ok(self.writer.send(WriteOp::Priority {
            claim,
            priority: 0.0,
            rung: None,
            reason,
        })?)
    }
}
