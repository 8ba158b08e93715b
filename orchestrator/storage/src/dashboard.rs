//! The dashboard's reads: the latest run's status, each trial's details
//! and the lanes' activity, in a few queries per refresh. The dashboard
//! (in the CLI) shapes them into what it draws; it never writes.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, Row};

use crate::dialect::{Dialect, sql};
use crate::error::{Error, Result};
use crate::ids::{RunId, StudyId};
use crate::{TrialId, TrialNumber};

/// What the dashboard asks of a running trial. Stored in
/// `salus_commands.action` as its word ([`as_str`](Self::as_str)); the
/// run holding the trial takes it at the trial's next iteration boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DashCommand {
    Pause,
    Resume,
    Prune,
}

impl DashCommand {
    pub fn as_str(self) -> &'static str {
        match self {
            DashCommand::Pause => "pause",
            DashCommand::Resume => "resume",
            DashCommand::Prune => "prune",
        }
    }

    /// The stored word; `None` for one this salus-tune does not know.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pause" => DashCommand::Pause,
            "resume" => DashCommand::Resume,
            "prune" => DashCommand::Prune,
            _ => return None,
        })
    }
}

impl std::fmt::Display for DashCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a trial's timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub time: String,
    pub kind: String,
    pub detail: String,
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

fn seconds_between(a: &str, b: &str) -> Option<f64> {
    let p = |s: &str| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").ok();
    Some((p(b)? - p(a)?).num_milliseconds() as f64 / 1e3)
}

/// The study's latest run, and whether it is going on.
pub struct RunStatus {
    pub metric: String,
    /// -1 before any run.
    pub run_id: RunId,
    pub device: String,
    pub policy: String,
    pub budget_bytes: i64,
    pub budget_trials: Option<i64>,
    pub running: bool,
    pub elapsed_s: f64,
}

pub async fn run_status(
    conn: &mut AnyConnection,
    url: &str,
    lock_held: bool,
    study_id: StudyId,
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
    let running = match crate::live_runs(conn, study_id, crate::STALE_AFTER_S).await {
        Ok(runs) => !runs.is_empty(),
        Err(_) => {
            last.as_ref()
                .is_some_and(|r| r.get::<String, _>(0) == "study_start")
                && lock_held
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
        _ => crate::now(),
    };
    let elapsed_s = seconds_between(&started, &end).unwrap_or(0.0).max(0.0);
    Ok(RunStatus {
        metric,
        run_id: RunId(run_id),
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
pub struct TrialDetails {
    pub params: BTreeMap<TrialId, Vec<(String, String)>>,
    pub res: BTreeMap<TrialId, Resources>,
    /// The device each trial was last placed on (`salus_trials.device`).
    pub devices: BTreeMap<TrialId, String>,
    pub reasons: BTreeMap<TrialId, String>,
    pub swapped: BTreeMap<TrialId, String>,
    pub fused: BTreeMap<TrialId, Vec<TrialNumber>>,
    pub speed: BTreeMap<TrialId, f64>,
    pub events: BTreeMap<TrialId, Vec<Event>>,
    pub user_attrs: BTreeMap<TrialId, Vec<(String, String)>>,
}

pub async fn trial_details(
    conn: &mut AnyConnection,
    url: &str,
    study_id: StudyId,
    run_id: RunId,
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
    let mut devices: BTreeMap<TrialId, String> = BTreeMap::new();
    for r in sqlx::query(&sql(&*conn, "SELECT st.trial_id, st.lane, st.persistent_bytes, st.ephemeral_bytes, st.shared_bytes, \
         st.iterations, st.total_iterations, st.device FROM salus_trials st JOIN trials t ON t.trial_id = st.trial_id \
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
        if let Some(d) = r.get::<Option<String>, _>(7) {
            devices.insert(r.get(0), d);
        }
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
    .bind(crate::FIXED_KEY)
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
        devices,
        reasons,
        swapped,
        fused,
        speed,
        events,
    })
}

/// Each lane's busy fraction per second over the run's last minute, with
/// its totals, and the run's swap count.
pub async fn lane_activity(
    conn: &mut AnyConnection,
    url: &str,
    run_id: RunId,
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
