//! Population-based training on a study that several processes share: the
//! population is every process's members, and each process decides a
//! generation alike.
//!
//! While other live runs hold members (as the latest sync saw), a member at
//! an exploit point is written to `salus_pbt_points`: its value there, its
//! parameters, and the file its state there was saved to
//! (`pbt-<trial>.g<generation>.state` in the checkpoint folder, put in
//! place in the row's transaction, under the member's claim). A process
//! whose own members are all at point `g` waits until every member that
//! another live run holds has a row at `g` or later. A run that dies stops
//! counting once the sync requeues its members; they join a live process's
//! population, behind, and catch up as resumed members do.
//!
//! Then each process ranks every member with a row at `g`, values and
//! parameters as stored, so that all of them compute the same generation
//! from the study seed, and carries out the exploits whose receivers it
//! holds: from a donor of its own in memory, as a lone process does; from
//! another process's by reading the donor's file
//! (`Job::exploit_stored`), bit for bit what a resume from it would give.
//!
//! A point's file is needed until the receivers that read it have moved
//! on. A member removes its file of point `g - 2` as it writes `g`'s: a
//! receiver at `g` reads its donor's file before it can reach `g + 1`, and
//! no member passes `g + 1` before every receiver has reached it. Files of
//! finished members go when the last process of the study ends, or when a
//! run next starts.
//!
//! An external worker's state is its own script's file: at a point, the
//! core asks the worker to save it (`Job::save_for_exploit`, to a
//! `.saving` file of this run's), and the writer renames that file into
//! place with the row (`FileContent::Written`), as it puts a built-in
//! member's snapshot there. A receiver of another process
//! restarts (or reloads in place) from that file, as from a donor of its
//! own (`StoredState::File`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kernels::Backend;
use training::TrialSnapshot;

use super::{RunState, Runner, TrialHandle};
use crate::checkpoint::Checkpoints;
use crate::error::Result;
use crate::pbt::Standing;
use crate::storage::TrialId;
use crate::storage::writer::{FileContent, PbtPoint, WriteOp};

/// How often a process that waits for others' members rereads their rows.
const POLL: Duration = Duration::from_millis(200);

/// How long a member's row waits for its state at the point (its
/// checkpoint, which follows its report) before it is written without one:
/// it is ranked, but cannot give its state to another process.
const STATE_GRACE: Duration = Duration::from_secs(5);

/// As [`STATE_GRACE`], for an external worker asked to save its state: the
/// answer always comes back (saved, or failed), but a large model on a
/// slow disk can take far longer than a built-in trial's checkpoint. The
/// bound only guards against a worker that never answers.
const SAVE_GRACE: Duration = Duration::from_secs(600);

/// Whether a member's row still waits for its state at the point: it has
/// none yet, none is known to be lost, and its grace has not run out (the
/// longer one while its worker is saving).
fn waits_for_state(has_state: bool, unkept: bool, saving: bool, waited: Duration) -> bool {
    let grace = if saving { SAVE_GRACE } else { STATE_GRACE };
    !has_state && !unkept && waited < grace
}

/// This run's side of the points it shares.
#[derive(Default)]
pub(super) struct SharedPoints {
    /// Each member's state at the point it waits at, from the checkpoint
    /// that follows its report (an external worker's, from the file it
    /// saved); members that reached it while nobody shared the study have
    /// none, and nobody waits for it.
    states: BTreeMap<TrialHandle, PointState>,
    unkept: BTreeSet<TrialHandle>,
    /// External members asked to save their state at the point, whose
    /// answer has not come yet.
    saving: BTreeSet<TrialHandle>,
    /// The generation this run last synced for (who shares the study is
    /// read once a generation).
    synced: Option<u64>,
    /// That generation's sync saw members that other runs hold. Later
    /// syncs (the runner's, while it waits) may find them finished, but
    /// their rows at the point still count.
    shared: bool,
    /// The generation whose row each member has written, and since when
    /// one waits for its state.
    written: BTreeMap<TrialHandle, u64>,
    waiting_state: BTreeMap<TrialHandle, Instant>,
    polled: Option<Instant>,
    said_why_not: bool,
}

/// A member's state at its point, as the row will carry it.
pub(super) enum PointState {
    /// A built-in trial's.
    Snapshot(TrialSnapshot),
    /// An external worker's, in the file it saved (its own format).
    Saved { iteration: u64, file: PathBuf },
}

impl PointState {
    fn iteration(&self) -> u64 {
        match self {
            PointState::Snapshot(s) => s.iteration,
            PointState::Saved { iteration, .. } => *iteration,
        }
    }

    /// What the row's file holds: a snapshot's bytes, or the saved file
    /// itself, which the writer renames into place.
    fn into_content(self) -> FileContent {
        match self {
            PointState::Snapshot(s) => FileContent::Bytes(s.to_bytes()),
            PointState::Saved { file, .. } => FileContent::Written(file),
        }
    }

    /// Removes what it holds on disk, unused.
    fn discard(self) {
        if let PointState::Saved { file, .. } = self {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl SharedPoints {
    /// `run`'s state at the point it waits at, kept only where the study
    /// is `shared` (a state is as large as the model and its optimizer's).
    pub(super) fn keep(&mut self, run: TrialHandle, state: PointState, shared: bool) {
        self.saving.remove(&run);
        if shared {
            if let Some(old) = self.states.insert(run, state) {
                old.discard();
            }
        } else {
            state.discard();
            self.unkept.insert(run);
        }
    }

    /// `run`'s state at its point could not be saved: its row goes
    /// without one, at once.
    pub(super) fn mark_unkept(&mut self, run: TrialHandle) {
        self.saving.remove(&run);
        self.unkept.insert(run);
    }

    /// `run`'s worker was asked to save its state at the point: its row
    /// waits for the answer ([`SAVE_GRACE`]).
    pub(super) fn mark_saving(&mut self, run: TrialHandle) {
        self.saving.insert(run);
    }

    /// Members left their point: their states there are spent.
    pub(super) fn clear(&mut self) {
        std::mem::take(&mut self.states)
            .into_values()
            .for_each(PointState::discard);
        self.unkept.clear();
        self.saving.clear();
        self.waiting_state.clear();
    }
}

/// Another process's member at the point.
pub(super) struct Remote {
    pub standing: Standing,
    pub trial_id: TrialId,
    pub state_file: Option<PathBuf>,
    /// Where in training it is at the point: iterations, and reports.
    pub iteration: u64,
    pub step: u64,
}

/// What [`Runner::pbt_others`] found.
pub(super) enum Others {
    /// Members held elsewhere have not all reached the point yet.
    Wait,
    /// Every one has: those at the point (none where nobody shares).
    Ready(Vec<Remote>),
}

impl Runner<'_> {
    /// Other processes' members at generation `g`, once every member that
    /// another live run holds has reached it; this run's members' rows are
    /// written first. See the module docs.
    pub(super) fn pbt_others<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        g: u64,
    ) -> Result<Others> {
        if st.pbt.as_ref().and_then(|p| p.shared.synced) != Some(g) {
            self.sync_now(st)?;
            if let Some(pop) = st.pbt.as_mut() {
                pop.shared.synced = Some(g);
                pop.shared.shared = !st.liveness.elsewhere_ids.is_empty();
                pop.shared.polled = None;
            }
        }
        if !st.pbt.as_ref().is_some_and(|p| p.shared.shared) {
            return Ok(Others::Ready(Vec::new()));
        }
        let Some(checkpoints) = self.checkpoints.clone() else {
            if let Some(pop) = st.pbt.as_mut()
                && !std::mem::replace(&mut pop.shared.said_why_not, true)
            {
                self.reporter.note(
                    "pbt: other processes share this study, but each exploits within its own \
                     members (checkpoints are off)",
                );
            }
            return Ok(Others::Ready(Vec::new()));
        };
        if !self.write_points(st, g, &checkpoints)? {
            return Ok(Others::Wait);
        }
        let Some(pop) = st.pbt.as_mut() else {
            return Ok(Others::Ready(Vec::new()));
        };
        if pop.shared.polled.is_some_and(|t| t.elapsed() < POLL) {
            return Ok(Others::Wait);
        }
        pop.shared.polled = Some(Instant::now());
        let rows = self.writer.read_pbt_points(self.info.id, g as i64)?;
        let reached: BTreeSet<TrialId> = rows.iter().map(|r| r.trial_id).collect();
        if !st.liveness.elsewhere_ids.is_subset(&reached) {
            return Ok(Others::Wait);
        }
        let mine: BTreeSet<TrialId> = st
            .in_flight
            .values()
            .map(|f| f.pending.claim.trial_id)
            .collect();
        let study = self.study;
        Ok(Others::Ready(
            rows.into_iter()
                .filter(|r| r.generation == g as i64 && !mine.contains(&r.trial_id))
                .map(|r| Remote {
                    standing: Standing {
                        number: r.number,
                        value: r.value.unwrap_or(f64::NAN),
                        params: decode_point_params(study, &r.params),
                    },
                    trial_id: r.trial_id,
                    state_file: r.state_file,
                    iteration: r.iteration.max(0) as u64,
                    step: r.step.max(0) as u64,
                })
                .collect(),
        ))
    }

    /// Writes each of this run's members at point `g` to
    /// `salus_pbt_points` once, with its state there; `false` while one
    /// still waits for its state (within [`STATE_GRACE`]).
    fn write_points<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        g: u64,
        checkpoints: &Checkpoints,
    ) -> Result<bool> {
        let Some(pop) = st.pbt.as_mut() else {
            return Ok(true);
        };
        let todo: Vec<(TrialHandle, u64)> = pop
            .at_point()
            .filter(|&(h, gen_, _)| gen_ == g && pop.shared.written.get(&h) != Some(&g))
            .map(|(h, _, iteration)| (h, iteration))
            .collect();
        let mut all = true;
        for (h, iteration) in todo {
            let Some(f) = st.in_flight.get(&h) else {
                continue;
            };
            let state = match pop.shared.states.remove(&h) {
                Some(s) if s.iteration() == iteration => Some(s),
                Some(stale) => {
                    stale.discard();
                    None
                }
                None => None,
            };
            let since = *pop
                .shared
                .waiting_state
                .entry(h)
                .or_insert_with(Instant::now);
            let (unkept, saving) = (
                pop.shared.unkept.contains(&h),
                pop.shared.saving.contains(&h),
            );
            if waits_for_state(state.is_some(), unkept, saving, since.elapsed()) {
                all = false;
                continue;
            }
            let curve = st.curves.get(&f.pending.number);
            let trial_id = f.pending.claim.trial_id;
            let params: serde_json::Map<String, serde_json::Value> = f
                .pending
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.internal().into()))
                .collect();
            self.writer.send(WriteOp::PbtPoint {
                claim: f.pending.claim,
                point: Box::new(PbtPoint {
                    study_id: self.info.id,
                    generation: g as i64,
                    step: curve
                        .and_then(|c| c.values.keys().next_back().copied())
                        .unwrap_or(0) as i64,
                    iteration: iteration as i64,
                    value: curve.and_then(|c| c.values.values().next_back().copied()),
                    params: serde_json::Value::Object(params).to_string(),
                    state: state.map(|s| (checkpoints.point_path(trial_id, g), s.into_content())),
                    superseded: g
                        .checked_sub(2)
                        .map(|old| checkpoints.point_path(trial_id, old)),
                }),
            })?;
            pop.shared.written.insert(h, g);
            pop.shared.waiting_state.remove(&h);
        }
        Ok(all)
    }

    /// Point files of finished members, once no other run holds a trial
    /// of the study (nobody can read them any more). `run_id` is this
    /// run, which has just ended.
    pub(super) fn sweep_points_if_last(&mut self, run_id: crate::storage::RunId) -> Result<()> {
        let (Some(c), Some(_)) = (&self.checkpoints, &self.study.pbt) else {
            return Ok(());
        };
        let rows = self.writer.read_trials(self.info.id)?;
        let others = rows.iter().any(|r| {
            r.state == crate::storage::TrialState::Running
                && r.owner.as_ref().is_none_or(|o| o.run_id != run_id)
        });
        if !others {
            let finished: Vec<TrialId> = rows
                .iter()
                .filter(|r| r.state.is_finished())
                .map(|r| r.trial_id)
                .collect();
            c.sweep_points(&finished);
        }
        Ok(())
    }
}

/// A point row's parameters (their internal values by name).
fn decode_point_params(study: &crate::study::Study, json: &str) -> crate::space::Params {
    let map: BTreeMap<String, f64> = serde_json::from_str(json).unwrap_or_default();
    super::decode_internal(study, map.iter().map(|(k, v)| (k.as_str(), *v)))
}

/// A stored donor's state, read from its point file.
pub(super) fn read_point_state(
    path: &std::path::Path,
) -> std::result::Result<TrialSnapshot, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    TrialSnapshot::from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_waits_for_a_saving_worker_longer_than_for_a_checkpoint() {
        let s = Duration::from_secs;
        // A built-in member's checkpoint: a few seconds.
        assert!(waits_for_state(false, false, false, s(4)));
        assert!(!waits_for_state(false, false, false, s(6)));
        // An external worker still saving a large model: minutes.
        assert!(waits_for_state(false, false, true, s(6)));
        assert!(waits_for_state(false, false, true, s(590)));
        assert!(!waits_for_state(false, false, true, s(601)));
        // A state that came, or one known lost, is waited for no more.
        assert!(!waits_for_state(true, false, true, s(0)));
        assert!(!waits_for_state(false, true, true, s(0)));
    }

    #[test]
    fn a_save_s_answer_ends_the_wait_for_it() {
        let run = TrialHandle::Alone(crate::salus::JobId(7));
        let mut points = SharedPoints::default();
        points.mark_saving(run);
        assert!(points.saving.contains(&run));
        points.mark_unkept(run);
        assert!(!points.saving.contains(&run) && points.unkept.contains(&run));
        points.mark_saving(run);
        points.clear();
        assert!(points.saving.is_empty() && points.unkept.is_empty());
    }
}
