//! What the dashboard shows, read from the database in one pass.
//!
//! The dashboard never talks to a running orchestrator except through the
//! database: it reads a [`Snapshot`] every refresh on its own read-only
//! connection (SQLite's WAL lets it read while the writer writes, without
//! blocking it), so it works the same for a study another process is
//! running and for one that has finished.

use std::collections::BTreeMap;

use crate::error::Result;
pub use crate::storage::dashboard::{Event, LaneInfo, SPARK_SECONDS};
use crate::storage::dashboard::{
    RunStatus, TrialDetails, lane_activity, run_status, trial_details,
};
use crate::storage::{Store, TrialId, TrialNumber, TrialState};
use crate::study::Direction;

/// A trial's phase, finer than Optuna's state: a RUNNING trial may be
/// paused (by the pruner or the dashboard) or swapped out to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Running,
    Paused,
    Swapped,
    Waiting,
    Complete,
    Pruned,
    Failed,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Running => "RUNNING",
            Phase::Paused => "PAUSED",
            Phase::Swapped => "SWAPPED",
            Phase::Waiting => "WAITING",
            Phase::Complete => "COMPLETE",
            Phase::Pruned => "PRUNED",
            Phase::Failed => "FAIL",
        }
    }

    /// Still in the study's hands (can be paused, resumed, pruned).
    pub fn is_live(self) -> bool {
        matches!(self, Phase::Running | Phase::Paused | Phase::Swapped)
    }
}

/// One trial, as the table and the detail pane show it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialInfo {
    pub trial_id: TrialId,
    pub number: TrialNumber,
    pub phase: Phase,
    /// `(name, value as the user wrote it)`, in the study's order.
    pub params: Vec<(String, String)>,
    pub value: Option<f64>,
    /// The other objectives' values, for a study of several.
    pub more_values: Vec<f64>,
    /// Whether it holds every constraint of the study (true without any).
    pub feasible: bool,
    /// Intermediate values `(step, value)`.
    pub curve: Vec<(i64, f64)>,
    pub rung: Option<i64>,
    pub priority: Option<f64>,
    pub lane: Option<i64>,
    /// The device it was last placed on (`cuda:1` where a run has several).
    pub device: Option<String>,
    pub iterations: i64,
    pub total_iterations: i64,
    /// Iterations per second of lane time in the latest run.
    pub its_per_s: Option<f64>,
    pub persistent_bytes: i64,
    pub ephemeral_bytes: i64,
    pub shared_bytes: i64,
    /// Numbers of the trials it was fused with (itself included).
    pub fused_with: Vec<TrialNumber>,
    pub fail_reason: Option<String>,
    /// User attributes `(key, JSON text)` but the fixed values: what an
    /// external worker set, and its auxiliary metrics' latest values.
    pub user_attrs: Vec<(String, String)>,
    pub events: Vec<Event>,
}

impl TrialInfo {
    /// The latest intermediate value, else the final one.
    pub fn last_metric(&self) -> Option<f64> {
        self.curve.last().map(|&(_, v)| v).or(self.value)
    }
}

/// One device's share of a run on several ([`Snapshot::devices`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceUse {
    pub name: String,
    pub trials: usize,
    pub persistent_bytes: i64,
    pub lanes: std::collections::BTreeSet<i64>,
}

/// Everything the dashboard draws. See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub study: String,
    pub direction: Direction,
    pub metric: String,
    pub device: String,
    pub policy: String,
    pub budget_bytes: i64,
    /// The trial budget of the latest run, if one ran.
    pub budget_trials: Option<i64>,
    /// A run is going on now (it started and has not stopped).
    pub running: bool,
    /// Seconds since the latest run started (to its stop when it stopped).
    pub elapsed_s: f64,
    pub trials: Vec<TrialInfo>,
    pub lanes: Vec<LaneInfo>,
    pub swaps: i64,
    /// Every objective's name and direction; more than one for a study of
    /// several, whose charts show the Pareto front.
    pub objectives: Vec<(String, Direction)>,
}

impl Snapshot {
    /// The best finished trial: `(number, value)`.
    pub fn best(&self) -> Option<(TrialNumber, f64)> {
        self.trials
            .iter()
            .filter(|t| t.phase == Phase::Complete && t.feasible)
            .filter_map(|t| t.value.map(|v| (t.number, v)))
            .filter(|(_, v)| v.is_finite())
            .reduce(|a, b| {
                if self.direction.better(b.1, a.1) {
                    b
                } else {
                    a
                }
            })
    }

    pub fn count(&self, phase: Phase) -> usize {
        self.trials.iter().filter(|t| t.phase == phase).count()
    }

    pub fn finished(&self) -> usize {
        self.count(Phase::Complete) + self.count(Phase::Pruned) + self.count(Phase::Failed)
    }

    /// Seconds left at this run's pace, when it can be told.
    pub fn eta_s(&self) -> Option<f64> {
        let budget = self.budget_trials? as f64;
        let done = self.finished() as f64;
        let finished_here = self.trials.iter().filter(|t| !t.phase.is_live()).count() as f64;
        if !self.running || finished_here == 0.0 || done >= budget {
            return None;
        }
        Some(self.elapsed_s / finished_here.min(done).max(1.0) * (budget - done))
    }

    /// Device memory of the latest run: `(persistent, ephemeral)` bytes of
    /// the resident trials (ephemeral: one arena per lane and shape).
    pub fn memory(&self) -> (i64, i64) {
        let resident = self
            .trials
            .iter()
            .filter(|t| matches!(t.phase, Phase::Running | Phase::Paused));
        let persistent = resident.clone().map(|t| t.persistent_bytes).sum();
        let mut arenas: BTreeMap<(i64, i64, i64), i64> = BTreeMap::new();
        for t in resident {
            if let Some(l) = t.lane {
                arenas.insert(
                    (l, t.ephemeral_bytes, t.persistent_bytes),
                    t.ephemeral_bytes,
                );
            }
        }
        let mut per_lane: BTreeMap<i64, i64> = BTreeMap::new();
        for ((l, _, _), e) in arenas {
            *per_lane.entry(l).or_default() += e;
        }
        (persistent, per_lane.values().sum())
    }

    /// Per device, where live trials sit on more than one: its name, its
    /// live trials, their persistent bytes, and its lanes. Empty on one
    /// device.
    pub fn devices(&self) -> Vec<DeviceUse> {
        let mut by: BTreeMap<&str, DeviceUse> = BTreeMap::new();
        for t in self.trials.iter().filter(|t| t.phase.is_live()) {
            let Some(d) = t.device.as_deref() else {
                continue;
            };
            let u = by.entry(d).or_insert_with(|| DeviceUse {
                name: d.to_string(),
                ..DeviceUse::default()
            });
            u.trials += 1;
            u.persistent_bytes += t.persistent_bytes;
            u.lanes.extend(t.lane);
        }
        if by.len() < 2 {
            return Vec::new();
        }
        by.into_values().collect()
    }

    /// Sizes of the fused groups that are still running.
    pub fn fused_groups(&self) -> Vec<usize> {
        let mut groups: BTreeMap<Vec<TrialNumber>, usize> = BTreeMap::new();
        // A paused member waits outside its group.
        for t in self
            .trials
            .iter()
            .filter(|t| t.phase.is_live() && t.phase != Phase::Paused)
        {
            if !t.fused_with.is_empty() {
                *groups.entry(t.fused_with.clone()).or_default() += 1;
            }
        }
        groups.into_values().collect()
    }

    /// Every objective's value of a COMPLETE, feasible trial with all of them.
    pub fn values(&self, t: &TrialInfo) -> Option<Vec<f64>> {
        let v: Vec<f64> = t.value.iter().chain(&t.more_values).copied().collect();
        (t.phase == Phase::Complete
            && t.feasible
            && v.len() == self.objectives.len()
            && v.iter().all(|x| x.is_finite()))
        .then_some(v)
    }

    /// The trials on the Pareto front of a study of several objectives
    /// (its feasible trials', where it has constraints), ordered by the
    /// first objective; empty for a study of one.
    pub fn front(&self) -> Vec<TrialNumber> {
        if self.objectives.len() < 2 {
            return Vec::new();
        }
        let directions: Vec<Direction> = self.objectives.iter().map(|(_, d)| *d).collect();
        let done: Vec<(TrialNumber, Vec<f64>)> = self
            .trials
            .iter()
            .filter_map(|t| self.values(t).map(|v| (t.number, v)))
            .collect();
        let points: Vec<Vec<f64>> = done
            .iter()
            .map(|(_, v)| crate::pareto::minimised(v, &directions))
            .collect();
        let mut front: Vec<(TrialNumber, f64)> = crate::pareto::front(&points)
            .into_iter()
            .map(|i| (done[i].0, done[i].1[0]))
            .collect();
        front.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        front.into_iter().map(|(n, _)| n).collect()
    }

    pub fn switches(&self) -> i64 {
        self.lanes.iter().map(|l| l.switches).sum()
    }
}

/// Whether a run holds the lock of the database at `db` (see `run_lock`).
/// Unknown counts as alive.
fn run_alive(db: &Option<std::path::PathBuf>) -> bool {
    db.as_deref()
        .is_none_or(crate::run_lock::RunLock::held_elsewhere)
}

/// Reads the study `study_id` (named `name`) as it is now.
pub async fn load(
    store: &mut Store,
    study_id: crate::storage::StudyId,
    name: &str,
    direction: Direction,
) -> Result<Snapshot> {
    let rows = store.trials(study_id).await?;
    let objectives: Vec<(String, Direction)> = store
        .objectives(study_id)
        .await?
        .into_iter()
        .enumerate()
        .map(|(i, (name, d))| (name.unwrap_or(format!("value{i}")), d))
        .collect();
    let url = store.url.clone();
    let store_path = match store.location() {
        crate::storage::Location::Sqlite(path) => Some(path.clone()),
        crate::storage::Location::Postgres(_) => None,
    };
    let conn = store.conn();
    let RunStatus {
        metric,
        run_id,
        device,
        policy,
        budget_bytes,
        budget_trials,
        running,
        elapsed_s,
    } = run_status(conn, &url, run_alive(&store_path), study_id).await?;
    let TrialDetails {
        mut params,
        res,
        mut devices,
        reasons,
        swapped,
        fused,
        speed,
        mut events,
        mut user_attrs,
    } = trial_details(conn, &url, study_id, run_id).await?;
    let (lanes, swaps) = lane_activity(conn, &url, run_id).await?;
    let trials = rows
        .into_iter()
        .map(|t| {
            let r = res
                .get(&t.trial_id)
                .copied()
                .unwrap_or((None, 0, 0, 0, 0, 0));
            let phase = match t.state {
                TrialState::Complete => Phase::Complete,
                TrialState::Pruned => Phase::Pruned,
                TrialState::Fail => Phase::Failed,
                TrialState::Waiting => Phase::Waiting,
                TrialState::Running if !running => Phase::Waiting,
                TrialState::Running => {
                    if swapped.get(&t.trial_id).is_some_and(|d| d == "out") {
                        Phase::Swapped
                    } else if reasons.get(&t.trial_id).is_some_and(|r| r == "paused") {
                        Phase::Paused
                    } else {
                        Phase::Running
                    }
                }
            };
            TrialInfo {
                trial_id: t.trial_id,
                number: t.number,
                phase,
                params: params.remove(&t.trial_id).unwrap_or_default(),
                value: t.value,
                feasible: t.feasible(),
                more_values: t.more_values,
                curve: t.intermediate,
                rung: t.rung,
                priority: t.priority,
                lane: r.0,
                device: devices.remove(&t.trial_id),
                iterations: r.4,
                total_iterations: r.5,
                its_per_s: speed.get(&t.trial_id).copied(),
                persistent_bytes: r.1,
                ephemeral_bytes: r.2,
                shared_bytes: r.3,
                fused_with: fused.get(&t.trial_id).cloned().unwrap_or_default(),
                fail_reason: t.fail_reason,
                user_attrs: user_attrs.remove(&t.trial_id).unwrap_or_default(),
                events: events.remove(&t.trial_id).unwrap_or_default(),
            }
        })
        .collect();
    Ok(Snapshot {
        study: name.to_string(),
        direction,
        metric,
        device,
        policy,
        budget_bytes,
        budget_trials,
        running,
        elapsed_s,
        trials,
        lanes,
        swaps,
        objectives,
    })
}
