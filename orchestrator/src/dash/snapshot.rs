//! What the dashboard shows, read from the database in one pass.
//!
//! The dashboard never talks to a running orchestrator except through the
//! database: it reads a [`Snapshot`] every refresh on its own read-only
//! connection (SQLite's WAL lets it read while the writer writes, without
//! blocking it), so it works the same for a study another process is
//! running and for one that has finished.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, Row};

use crate::storage::{Dialect, sql};

use crate::error::{Error, Result};
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

/// One event of a trial's timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub time: String,
    pub kind: String,
    pub detail: String,
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
    /// Intermediate values `(step, value)`.
    pub curve: Vec<(i64, f64)>,
    pub rung: Option<i64>,
    pub priority: Option<f64>,
    pub lane: Option<i64>,
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

/// One lane of the latest run.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneInfo {
    pub lane: i64,
    /// Busy percent per second over the last [`SPARK_SECONDS`] seconds.
    pub busy: Vec<u64>,
    pub iterations: i64,
    /// Switches between trials on this lane.
    pub switches: i64,
}

/// Seconds of lane history the sparklines cover.
pub const SPARK_SECONDS: usize = 60;

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
}

impl Snapshot {
    /// The best finished trial: `(number, value)`.
    pub fn best(&self) -> Option<(TrialNumber, f64)> {
        self.trials
            .iter()
            .filter(|t| t.phase == Phase::Complete)
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

    pub fn switches(&self) -> i64 {
        self.lanes.iter().map(|l| l.switches).sum()
    }
}

fn seconds_between(a: &str, b: &str) -> Option<f64> {
    let p = |s: &str| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").ok();
    Some((p(b)? - p(a)?).num_milliseconds() as f64 / 1e3)
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
    study_id: i64,
    name: &str,
    direction: Direction,
) -> Result<Snapshot> {
    let rows = store.trials(study_id).await?;
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
    } = run_status(conn, &url, &store_path, study_id).await?;
    let TrialDetails {
        mut params,
        res,
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
                curve: t.intermediate,
                rung: t.rung,
                priority: t.priority,
                lane: r.0,
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
    })
}

/// The study's latest run, and whether it is going on.
struct RunStatus {
    metric: String,
    /// -1 before any run.
    run_id: i64,
    device: String,
    policy: String,
    budget_bytes: i64,
    budget_trials: Option<i64>,
    running: bool,
    elapsed_s: f64,
}

async fn run_status(
    conn: &mut AnyConnection,
    url: &str,
    store_path: &Option<std::path::PathBuf>,
    study_id: i64,
) -> Result<RunStatus> {
    let e = |err: sqlx::Error| Error::storage(url, err);
    let metric: String = sqlx::query_scalar(&sql(
        &*conn,
        "SELECT value_json FROM study_user_attributes WHERE study_id = ? AND key = 'metric'",
    ))
    .bind(study_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(e)?
    .and_then(|j: String| serde_json::from_str(&j).ok())
    .unwrap_or_else(|| "value".into());
    let run = sqlx::query(&sql(
        &*conn,
        "SELECT run_id, CAST(started_at AS TEXT), device, policy, budget_bytes FROM salus_runs \
         WHERE study_id = ? ORDER BY run_id DESC LIMIT 1",
    ))
    .bind(study_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(e)?;
    let (run_id, started, device, policy, budget_bytes) = match &run {
        Some(r) => (
            r.get::<i64, _>(0),
            r.get::<String, _>(1),
            r.get::<String, _>(2),
            r.get::<String, _>(3),
            r.get::<i64, _>(4),
        ),
        None => (-1, String::new(), "-".into(), "-".into(), 0),
    };
    // The latest start or stop says whether a run is going on.
    let last = sqlx::query(&sql(
        &*conn,
        "SELECT kind, CAST(time AS TEXT), detail FROM salus_events WHERE study_id = ? \
         AND kind IN ('study_start', 'study_stop') ORDER BY event_id DESC LIMIT 1",
    ))
    .bind(study_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(e)?;
    // Some process runs the study: one of its runs has not ended and is
    // alive (`storage::run_alive`: its pid here, its heartbeat anywhere),
    // so a study that several processes share shows as running while any
    // of them does. A database from before runs beat: a run that started
    // and has not stopped, whose process holds the database's lock.
    let running =
        match crate::storage::live_runs(conn, study_id, crate::storage::STALE_AFTER_S).await {
            Ok(runs) => !runs.is_empty(),
            Err(_) => {
                last.as_ref()
                    .is_some_and(|r| r.get::<String, _>(0) == "study_start")
                    && run_alive(store_path)
            }
        };
    let budget = Dialect::of(conn).json_member("detail", "budget");
    let budget_trials: Option<i64> = sqlx::query_scalar(&sql(
        conn,
        &format!(
            "SELECT CAST({budget} AS BIGINT) FROM salus_events WHERE study_id = ? \
             AND kind = 'study_start' ORDER BY event_id DESC LIMIT 1"
        ),
    ))
    .bind(study_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(e)?
    .flatten();
    let end = match (&last, running) {
        (Some(r), false) => r.get::<String, _>(1),
        _ => crate::storage::now(),
    };
    let elapsed_s = seconds_between(&started, &end).unwrap_or(0.0).max(0.0);
    Ok(RunStatus {
        metric,
        run_id,
        device,
        policy,
        budget_bytes,
        budget_trials,
        running,
        elapsed_s,
    })
}

/// A trial's lane, persistent, ephemeral and shared bytes, iterations and
/// total iterations (`salus_trials`).
type Resources = (Option<i64>, i64, i64, i64, i64, i64);

/// Per trial: display values, resources, the latest priority reason and
/// swap, fusion, speed and events.
struct TrialDetails {
    params: BTreeMap<TrialId, Vec<(String, String)>>,
    res: BTreeMap<TrialId, Resources>,
    reasons: BTreeMap<TrialId, String>,
    swapped: BTreeMap<TrialId, String>,
    fused: BTreeMap<TrialId, Vec<TrialNumber>>,
    speed: BTreeMap<TrialId, f64>,
    events: BTreeMap<TrialId, Vec<Event>>,
    user_attrs: BTreeMap<TrialId, Vec<(String, String)>>,
}

async fn trial_details(
    conn: &mut AnyConnection,
    url: &str,
    study_id: i64,
    run_id: i64,
) -> Result<TrialDetails> {
    let e = |err: sqlx::Error| Error::storage(url, err);
    // Display values, resources, phases, fusion, speed and events per trial.
    let mut params: BTreeMap<TrialId, Vec<(String, String)>> = BTreeMap::new();
    for r in sqlx::query(&sql(&*conn, "SELECT trial_id, param_name, CAST(value AS TEXT) FROM salus_params WHERE study_id = ? ORDER BY trial_id",))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    {
        let v: Option<String> = r.get(2);
        params
            .entry(r.get(0))
            .or_default()
            .push((r.get(1), v.unwrap_or_default()));
    }
    let mut res: BTreeMap<TrialId, Resources> = BTreeMap::new();
    for r in sqlx::query(&sql(&*conn, "SELECT st.trial_id, st.lane, st.persistent_bytes, st.ephemeral_bytes, st.shared_bytes, \
         st.iterations, st.total_iterations FROM salus_trials st JOIN trials t ON t.trial_id = st.trial_id \
         WHERE t.study_id = ?",))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    {
        res.insert(
            r.get(0),
            (r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)),
        );
    }
    let reasons: BTreeMap<TrialId, String> = sqlx::query(&sql(&*conn, "SELECT p.trial_id, p.reason FROM salus_priority p JOIN trials t ON t.trial_id = p.trial_id \
         WHERE t.study_id = ? AND p.priority_id = (SELECT MAX(priority_id) FROM salus_priority q WHERE q.trial_id = p.trial_id)",))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let swapped: BTreeMap<TrialId, String> = sqlx::query(&sql(&*conn, "SELECT s.trial_id, s.direction FROM salus_swaps s WHERE s.run_id = ? \
         AND s.swap_id = (SELECT MAX(swap_id) FROM salus_swaps q WHERE q.trial_id = s.trial_id AND q.run_id = s.run_id)",))
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let fused: BTreeMap<TrialId, Vec<TrialNumber>> = sqlx::query(&sql(&*conn, "SELECT a.trial_id, a.value_json FROM trial_system_attributes a JOIN trials t ON t.trial_id = a.trial_id \
         WHERE t.study_id = ? AND a.key = 'salus:fused_with'",))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    .iter()
    .map(|r| {
        let j: String = r.get(1);
        (r.get(0), serde_json::from_str(&j).unwrap_or_default())
    })
    .collect();
    let speed: BTreeMap<TrialId, f64> = sqlx::query(&sql(&*conn, "SELECT trial_id, CAST(SUM(iterations) AS BIGINT), SUM(end_s - start_s) FROM salus_lane_segments \
         WHERE run_id = ? AND trial_id IS NOT NULL GROUP BY trial_id",))
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    .iter()
    .filter_map(|r| {
        let (it, s): (i64, f64) = (r.get(1), r.get(2));
        (s > 0.0).then(|| (r.get(0), it as f64 / s))
    })
    .collect();
    let mut events: BTreeMap<TrialId, Vec<Event>> = BTreeMap::new();
    for r in sqlx::query(&sql(
        &*conn,
        "SELECT trial_id, CAST(time AS TEXT), kind, COALESCE(detail, '') FROM salus_events \
         WHERE study_id = ? AND trial_id IS NOT NULL ORDER BY event_id DESC LIMIT 5000",
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    {
        events.entry(r.get(0)).or_default().push(Event {
            time: r.get(1),
            kind: r.get(2),
            detail: r.get(3),
        });
    }
    events.values_mut().for_each(|v| v.reverse());
    let mut user_attrs: BTreeMap<TrialId, Vec<(String, String)>> = BTreeMap::new();
    for r in sqlx::query(&sql(
        &*conn,
        "SELECT a.trial_id, a.\"key\", a.value_json FROM trial_user_attributes a \
         JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = ? AND a.\"key\" <> ? \
         ORDER BY a.trial_id, a.\"key\"",
    ))
    .bind(study_id)
    .bind(crate::storage::FIXED_KEY)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    {
        user_attrs
            .entry(r.get(0))
            .or_default()
            .push((r.get(1), r.get(2)));
    }
    Ok(TrialDetails {
        user_attrs,
        params,
        res,
        reasons,
        swapped,
        fused,
        speed,
        events,
    })
}

/// Each lane's busy fraction per second over the run's last minute, with
/// its totals, and the run's swap count.
async fn lane_activity(
    conn: &mut AnyConnection,
    url: &str,
    run_id: i64,
) -> Result<(Vec<LaneInfo>, i64)> {
    let e = |err: sqlx::Error| Error::storage(url, err);
    // Lanes: busy fraction per second over the run's last minute.
    let latest: f64 = sqlx::query_scalar(&sql(
        &*conn,
        "SELECT COALESCE(MAX(end_s), 0.0) FROM salus_lane_segments WHERE run_id = ?",
    ))
    .bind(run_id)
    .fetch_one(&mut *conn)
    .await
    .map_err(e)?;
    // The last bucket ends at the latest segment's end.
    let from = latest - SPARK_SECONDS as f64;
    let mut lanes: BTreeMap<i64, LaneInfo> = BTreeMap::new();
    for r in sqlx::query(&sql(&*conn, "SELECT lane, COUNT(*), CAST(SUM(iterations) AS BIGINT) FROM salus_lane_segments WHERE run_id = ? GROUP BY lane",))
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    {
        let lane: i64 = r.get(0);
        lanes.insert(
            lane,
            LaneInfo {
                lane,
                busy: vec![0; SPARK_SECONDS],
                iterations: r.get(2),
                switches: (r.get::<i64, _>(1) - 1).max(0),
            },
        );
    }
    for r in sqlx::query(&sql(
        &*conn,
        "SELECT lane, start_s, end_s FROM salus_lane_segments WHERE run_id = ? AND end_s > ?",
    ))
    .bind(run_id)
    .bind(from)
    .fetch_all(&mut *conn)
    .await
    .map_err(e)?
    {
        let (lane, s, t): (i64, f64, f64) = (r.get(0), r.get(1), r.get(2));
        let Some(info) = lanes.get_mut(&lane) else {
            continue;
        };
        // Segments written since `latest` was read end past the window.
        let t = t.min(latest);
        let mut x = s.max(from);
        while x < t {
            let bucket = ((x - from).max(0.0) as usize).min(SPARK_SECONDS - 1);
            let next = (from + bucket as f64 + 1.0).min(t).max(x + 1e-9);
            info.busy[bucket] += ((next - x) * 100.0).round() as u64;
            x = next;
        }
    }
    for l in lanes.values_mut() {
        l.busy.iter_mut().for_each(|b| *b = (*b).min(100));
    }
    let swaps: i64 = sqlx::query_scalar(&sql(
        &*conn,
        "SELECT COUNT(*) FROM salus_swaps WHERE run_id = ?",
    ))
    .bind(run_id)
    .fetch_one(&mut *conn)
    .await
    .map_err(e)?;
    Ok((lanes.into_values().collect(), swaps))
}
