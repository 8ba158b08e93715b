//! Reading studies and their trials back.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, Row};

use super::dialect::{Dialect, sql, table_exists};

use super::{Store, TrialId, TrialNumber};
use crate::error::{Error, Result};
use crate::ids::{RunId, StudyId};
use tuning::objective::Direction;

/// Where `p` is a row of `salus_priority`: it holds its trial below a
/// rung's cut (the trial's latest pruner row, one with a rung, pauses it).
/// A sync's read and a new trial's cap both count holds by it.
pub(crate) const HELD_BELOW_CUT: &str = "p.reason = 'paused' AND p.priority_id = \
     (SELECT MAX(q.priority_id) FROM salus_priority q WHERE q.trial_id = p.trial_id AND q.rung IS NOT NULL)";

/// One parameter of a trial as Optuna's `trial_params` stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredParam {
    pub name: String,
    /// Optuna's internal representation: the value, or a choice's index.
    pub internal: f64,
    /// Optuna's `distribution_json`.
    pub distribution_json: String,
}

/// Optuna's trial states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialState {
    Running,
    Complete,
    Pruned,
    Fail,
    Waiting,
}

impl TrialState {
    pub fn as_str(self) -> &'static str {
        match self {
            TrialState::Running => "RUNNING",
            TrialState::Complete => "COMPLETE",
            TrialState::Pruned => "PRUNED",
            TrialState::Fail => "FAIL",
            TrialState::Waiting => "WAITING",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "RUNNING" => TrialState::Running,
            "COMPLETE" => TrialState::Complete,
            "PRUNED" => TrialState::Pruned,
            "FAIL" => TrialState::Fail,
            "WAITING" => TrialState::Waiting,
            _ => return None,
        })
    }
    /// Finished: counts toward the trial budget.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TrialState::Complete | TrialState::Pruned | TrialState::Fail
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StudyInfo {
    pub id: StudyId,
    pub name: String,
    pub direction: Direction,
}

/// PBT's exploits by receiver: `(step, donor)` of each, in order.
pub type PbtLineage = std::collections::BTreeMap<TrialNumber, Vec<(i64, TrialNumber)>>;

/// One trial as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialRow {
    pub trial_id: TrialId,
    pub number: TrialNumber,
    pub state: TrialState,
    pub value: Option<f64>,
    /// The other objectives' values, by objective index from 1, for a
    /// study of several; empty otherwise.
    pub more_values: Vec<f64>,
    /// Its constraints' values (Optuna's `constraints:KEY` system
    /// attributes, or its older `constraints` list); at most 0 holds.
    pub constraints: Vec<f64>,
    pub datetime_start: Option<String>,
    pub datetime_complete: Option<String>,
    pub params: Vec<StoredParam>,
    /// `(step, value)`; NaN where Optuna stored a non-finite value as NULL.
    pub intermediate: Vec<(i64, f64)>,
    pub fail_reason: Option<String>,
    /// The latest early-stopping priority and rung (`salus_priority`).
    pub priority: Option<f64>,
    pub rung: Option<i64>,
    /// The rung at which the pruner holds it paused below the promotion
    /// cut: its latest pruner row (one with a rung) says `paused`. A
    /// dashboard pause or resume has no rung and leaves this as it was.
    pub held_at_rung: Option<i64>,
    /// Seconds since the latest heartbeat of the process running it
    /// (Optuna's `trial_heartbeats`), by the database's clock.
    pub heartbeat_age_s: Option<f64>,
    /// The run that claimed it last (`salus_claims`), where one did.
    pub owner: Option<Owner>,
    /// Optuna's `fixed_params` system attribute: the values an enqueued
    /// trial (`study.enqueue_trial`, `salus-tune enqueue`) must run with.
    pub fixed_params: Option<serde_json::Map<String, serde_json::Value>>,
    /// Its latest checkpoint as recorded (`salus_checkpoints`): the attempt
    /// that wrote it and the step it covers.
    pub checkpoint: Option<(i64, i64)>,
    /// Its heartbeat as stored (text), to tell whether it moves.
    pub heartbeat: Option<String>,
}

impl TrialRow {
    /// Every objective's value it has: the first, then the others.
    pub fn values(&self) -> Vec<f64> {
        self.value
            .iter()
            .chain(&self.more_values)
            .copied()
            .collect()
    }

    /// Whether it holds every constraint it has (Optuna's feasibility:
    /// each value at most 0).
    pub fn feasible(&self) -> bool {
        self.constraints.iter().all(|&c| c <= 0.0)
    }
}

/// A run of the core (a process) as another process sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub run_id: RunId,
    pub host: Option<String>,
    pub pid: Option<i64>,
    /// Seconds since its latest heartbeat, by the database's clock.
    pub heartbeat_age_s: Option<f64>,
    /// The run ended cleanly.
    pub ended: bool,
    /// Its boot and pid namespace (`claims::Place`), where it recorded them.
    pub pid_namespace: Option<String>,
    /// The attempt of the trial's claim it holds (0 where not a trial's).
    pub attempt: i64,
}

fn direction_of(s: &str) -> Direction {
    if s == "MAXIMIZE" {
        Direction::Maximize
    } else {
        Direction::Minimize
    }
}

impl Store {
    /// A study's objectives in order: the metric's name where the study
    /// stored one (Optuna's `study:metric_names`, or salus-tune's `metric`
    /// for one), and the direction.
    pub async fn objectives(&mut self, id: StudyId) -> Result<Vec<(Option<String>, Direction)>> {
        let url = self.url.clone();
        let e = |err: sqlx::Error| Error::storage(&url, err);
        let directions: Vec<String> = sqlx::query_scalar(&sql(
            self.conn(),
            "SELECT CAST(direction AS TEXT) FROM study_directions WHERE study_id = ? ORDER BY objective",
        ))
        .bind(id)
        .fetch_all(self.conn())
        .await
        .map_err(e)?;
        let names: Option<String> = sqlx::query_scalar(&sql(
            self.conn(),
            "SELECT value_json FROM study_system_attributes WHERE study_id = ? AND \"key\" = 'study:metric_names'",
        ))
        .bind(id)
        .fetch_optional(self.conn())
        .await
        .map_err(e)?;
        let names: Vec<String> = names
            .and_then(|n| serde_json::from_str(&n).ok())
            .unwrap_or_default();
        Ok(directions
            .iter()
            .enumerate()
            .map(|(i, d)| (names.get(i).cloned(), direction_of(d)))
            .collect())
    }

    pub async fn studies(&mut self) -> Result<Vec<StudyInfo>> {
        let url = self.url.clone();
        // A file that a writer has created but not yet migrated holds no study.
        if !self.has_table("study_directions").await? {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "SELECT s.study_id, s.study_name, COALESCE(CAST(d.direction AS TEXT), 'MINIMIZE') FROM studies s \
             LEFT JOIN study_directions d ON d.study_id = s.study_id AND d.objective = 0 ORDER BY s.study_id",
        )
        .fetch_all(self.conn())
        .await
        .map_err(|e| Error::storage(&url, e))?;
        Ok(rows
            .iter()
            .map(|r| StudyInfo {
                id: r.get(0),
                name: r.get(1),
                direction: direction_of(r.get::<String, _>(2).as_str()),
            })
            .collect())
    }

    /// The study named `name`, or the only one when `name` is `None`.
    pub async fn pick_study(&mut self, name: Option<&str>) -> Result<StudyInfo> {
        let all = self.studies().await?;
        let names = || {
            all.iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match name {
            Some(n) => all.iter().find(|s| s.name == n).cloned().ok_or_else(|| {
                Error::Input(format!(
                    "no study named '{n}' in {}; it holds: {}",
                    self.url,
                    names()
                ))
            }),
            None if all.len() == 1 => Ok(all[0].clone()),
            None if all.is_empty() => Err(Error::Input(format!("{} holds no study yet", self.url))),
            None => Err(Error::Input(format!(
                "{} holds several studies; choose one with --study: {}",
                self.url,
                names()
            ))),
        }
    }

    /// Every trial of a study, by number, with parameters and intermediate values.
    pub async fn trials(&mut self, study_id: StudyId) -> Result<Vec<TrialRow>> {
        let url = self.url.clone();
        read_trials(self.conn(), study_id)
            .await
            .map_err(|e| Error::storage(&url, e))
    }
}

/// See [`WriteOp::ReadPbtPoints`](super::writer::WriteOp::ReadPbtPoints);
/// empty for a database from before it.
pub(super) async fn read_pbt_points(
    conn: &mut AnyConnection,
    study_id: StudyId,
    generation: i64,
) -> sqlx::Result<Vec<super::writer::PbtPointRow>> {
    if !table_exists(&mut *conn, "salus_pbt_points").await? {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(&sql(
        &*conn,
        "SELECT p.trial_id, t.number, p.generation, p.step, p.iteration, p.value, p.params, \
         p.state_file FROM salus_pbt_points p JOIN trials t ON t.trial_id = p.trial_id \
         WHERE p.study_id = ? AND p.generation >= ? ORDER BY t.number, p.generation",
    ))
    .bind(study_id)
    .bind(generation)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .iter()
        .map(|r| super::writer::PbtPointRow {
            trial_id: TrialId(r.get(0)),
            number: TrialNumber(r.get(1)),
            generation: r.get(2),
            step: r.get(3),
            iteration: r.get(4),
            value: r.get(5),
            params: r.get(6),
            state_file: r.get::<Option<String>, _>(7).map(std::path::PathBuf::from),
        })
        .collect())
}

/// Every trial of the study, with parameters, curves, priorities and the
/// run that holds it; on any connection (the writer reads through its own).
pub(super) async fn read_trials(
    conn: &mut AnyConnection,
    study_id: StudyId,
) -> sqlx::Result<Vec<TrialRow>> {
    // The reason is in salus_trials once the trial held memory, and
    // always in Optuna's `fail_reason` attribute (a JSON string).
    let reason = match Dialect::of(conn) {
        Dialect::Sqlite => "json_extract(a.value_json, '$')",
        Dialect::Postgres => "(CAST(a.value_json AS json) #>> '{}')",
    };
    let trial_beat = Dialect::of(conn).age_s("h.heartbeat");
    let query = format!(
        "SELECT t.trial_id, t.number, CAST(t.state AS TEXT), v.value, CAST(t.datetime_start AS TEXT), \
             CAST(t.datetime_complete AS TEXT), COALESCE(st.fail_reason, {reason}), {trial_beat}, \
             CAST(h.heartbeat AS TEXT) \
             FROM trials t LEFT JOIN trial_values v ON v.trial_id = t.trial_id AND v.objective = 0 \
             LEFT JOIN salus_trials st ON st.trial_id = t.trial_id \
             LEFT JOIN trial_system_attributes a ON a.trial_id = t.trial_id AND a.\"key\" = 'fail_reason' \
             LEFT JOIN trial_heartbeats h ON h.trial_id = t.trial_id WHERE t.study_id = ? ORDER BY t.number",
    );
    let rows = sqlx::query(&sql(conn, &query))
        .bind(study_id)
        .fetch_all(&mut *conn)
        .await?;
    let mut trials: Vec<TrialRow> = rows
        .iter()
        .map(|r| TrialRow {
            trial_id: r.get(0),
            number: TrialNumber(r.get(1)),
            state: TrialState::parse(r.get::<String, _>(2).as_str()).unwrap_or(TrialState::Fail),
            value: r.get(3),
            more_values: Vec::new(),
            constraints: Vec::new(),
            datetime_start: r.get(4),
            datetime_complete: r.get(5),
            params: Vec::new(),
            intermediate: Vec::new(),
            fail_reason: r.get(6),
            priority: None,
            rung: None,
            held_at_rung: None,
            heartbeat_age_s: r.get(7),
            owner: None,
            fixed_params: None,
            checkpoint: None,
            heartbeat: r.get(8),
        })
        .collect();
    let index: BTreeMap<TrialId, usize> = trials
        .iter()
        .enumerate()
        .map(|(i, t)| (t.trial_id, i))
        .collect();
    let params = sqlx::query(&sql(
        &*conn,
        "SELECT p.trial_id, p.param_name, p.param_value, p.distribution_json FROM trial_params p \
             JOIN trials t ON t.trial_id = p.trial_id WHERE t.study_id = ? ORDER BY p.param_id",
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await?;
    for r in &params {
        if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
            trials[i].params.push(StoredParam {
                name: r.get(1),
                internal: r.get(2),
                distribution_json: r.get(3),
            });
        }
    }
    // A study of several objectives: the values after the first.
    let more = sqlx::query(&sql(
        &*conn,
        "SELECT v.trial_id, v.value FROM trial_values v JOIN trials t ON t.trial_id = v.trial_id \
             WHERE t.study_id = ? AND v.objective > 0 ORDER BY v.trial_id, v.objective",
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await?;
    for r in &more {
        if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
            let v: Option<f64> = r.get(1);
            trials[i].more_values.push(v.unwrap_or(f64::NAN));
        }
    }
    let constraints = sqlx::query(&sql(
        &*conn,
        "SELECT a.trial_id, a.\"key\", a.value_json FROM trial_system_attributes a JOIN trials t ON t.trial_id = a.trial_id \
             WHERE t.study_id = ? AND (a.\"key\" = 'constraints' OR a.\"key\" LIKE 'constraints:%') ORDER BY a.trial_id, a.\"key\"",
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await?;
    for r in &constraints {
        if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
            let json: serde_json::Value =
                serde_json::from_str(r.get::<&str, _>(2)).unwrap_or_default();
            match json {
                serde_json::Value::Array(list) => trials[i]
                    .constraints
                    .extend(list.iter().map(|v| v.as_f64().unwrap_or(f64::NAN))),
                v => trials[i].constraints.push(v.as_f64().unwrap_or(f64::NAN)),
            }
        }
    }
    let values = sqlx::query(&sql(&*conn, "SELECT iv.trial_id, iv.step, iv.intermediate_value FROM trial_intermediate_values iv \
             JOIN trials t ON t.trial_id = iv.trial_id WHERE t.study_id = ? ORDER BY iv.trial_id, iv.step",))
        .bind(study_id)
        .fetch_all(&mut *conn)
        .await
        ?;
    for r in &values {
        if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
            trials[i]
                .intermediate
                .push((r.get(1), r.get::<Option<f64>, _>(2).unwrap_or(f64::NAN)));
        }
    }
    if table_exists(conn, "salus_priority").await? {
        let latest = sqlx::query(&sql(&*conn, "SELECT p.trial_id, p.priority, p.rung FROM salus_priority p JOIN trials t ON t.trial_id = p.trial_id \
                 WHERE t.study_id = ? AND p.priority_id = (SELECT MAX(q.priority_id) FROM salus_priority q WHERE q.trial_id = p.trial_id)",))
            .bind(study_id)
            .fetch_all(&mut *conn)
            .await
            ?;
        for r in &latest {
            if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
                trials[i].priority = r.get(1);
                trials[i].rung = r.get(2);
            }
        }
        let pruner = sqlx::query(&sql(
            &*conn,
            &format!(
                "SELECT p.trial_id, p.rung FROM salus_priority p JOIN trials t ON t.trial_id = p.trial_id \
                 WHERE t.study_id = ? AND {HELD_BELOW_CUT}"
            ),
        ))
            .bind(study_id)
            .fetch_all(&mut *conn)
            .await?;
        for r in &pruner {
            if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
                trials[i].held_at_rung = r.get(1);
            }
        }
    }
    let enqueued = sqlx::query(&sql(&*conn, "SELECT a.trial_id, a.value_json FROM trial_system_attributes a \
         JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = ? AND a.\"key\" = 'fixed_params'",))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await?;
    for r in &enqueued {
        if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
            trials[i].fixed_params = serde_json::from_str(r.get::<&str, _>(1)).ok();
        }
    }
    if table_exists(conn, "salus_claims").await? {
        let run_beat = Dialect::of(conn).age_s("r.heartbeat");
        let fenced = table_exists(conn, "salus_writes").await?;
        // Before the fencing migration claims had no attempt, and a
        // requeue deleted them.
        let (namespace, attempt, current) = if fenced {
            ("r.pid_namespace", "c.attempt", "AND c.released IS NULL")
        } else {
            ("NULL", "1", "")
        };
        let owners = sqlx::query(&sql(
            &*conn,
            &format!(
                "SELECT c.trial_id, r.run_id, r.host, r.pid, {run_beat}, \
                 CASE WHEN r.ended IS NULL THEN 0 ELSE 1 END, {namespace}, CAST({attempt} AS BIGINT) \
                 FROM salus_claims c JOIN salus_runs r ON r.run_id = c.run_id \
                 JOIN trials t ON t.trial_id = c.trial_id WHERE t.study_id = ? {current}"
            ),
        ))
        .bind(study_id)
        .fetch_all(&mut *conn)
        .await?;
        for r in &owners {
            if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
                trials[i].owner = Some(Owner {
                    run_id: r.get(1),
                    host: r.get(2),
                    pid: r.get(3),
                    heartbeat_age_s: r.get(4),
                    ended: r.get::<i64, _>(5) != 0,
                    pid_namespace: r.get(6),
                    attempt: r.get(7),
                });
            }
        }
        if fenced {
            let checkpoints = sqlx::query(&sql(
                &*conn,
                "SELECT k.trial_id, k.attempt, k.step FROM salus_checkpoints k \
                 JOIN trials t ON t.trial_id = k.trial_id WHERE t.study_id = ?",
            ))
            .bind(study_id)
            .fetch_all(&mut *conn)
            .await?;
            for r in &checkpoints {
                if let Some(&i) = index.get(&r.get::<TrialId, _>(0)) {
                    trials[i].checkpoint = Some((r.get(1), r.get(2)));
                }
            }
        }
    }
    Ok(trials)
}

/// A trial's kept model (`salus_models`), as `export` writes it out.
pub struct KeptModel {
    pub number: TrialNumber,
    /// JSON: the network, the standardisation and the trial.
    pub architecture: String,
    /// A safetensors file's bytes.
    pub weights: Vec<u8>,
}

impl Store {
    /// Whether the database has table `name` (readers do not migrate).
    async fn has_table(&mut self, name: &str) -> Result<bool> {
        let url = self.url.clone();
        table_exists(self.conn(), name)
            .await
            .map_err(|e| Error::storage(&url, e))
    }

    /// PBT's exploits of the study, by receiver: the step and the donor of
    /// each, in order (empty for a study without, or a database from
    /// before PBT).
    pub async fn pbt_lineage(&mut self, study_id: StudyId) -> Result<PbtLineage> {
        let url = self.url.clone();
        if !self.has_table("salus_pbt_events").await? {
            return Ok(PbtLineage::new());
        }
        let rows = sqlx::query(&sql(
            self.conn(),
            "SELECT r.number, e.step, d.number FROM salus_pbt_events e \
             JOIN trials r ON r.trial_id = e.trial_id JOIN trials d ON d.trial_id = e.donor_trial_id \
             WHERE e.study_id = ? ORDER BY e.pbt_event_id",
        ))
        .bind(study_id)
        .fetch_all(self.conn())
        .await
        .map_err(|e| Error::storage(&url, e))?;
        let mut lineage = PbtLineage::new();
        for r in rows {
            let (receiver, step, donor): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
            lineage
                .entry(TrialNumber(receiver))
                .or_default()
                .push((step, TrialNumber(donor)));
        }
        Ok(lineage)
    }

    /// User attribute `key` of trial `number` of the study, as JSON text.
    pub async fn trial_user_attr(
        &mut self,
        study_id: StudyId,
        number: TrialNumber,
        key: &str,
    ) -> Result<Option<String>> {
        let url = self.url.clone();
        sqlx::query_scalar(&sql(
            self.conn(),
            "SELECT a.value_json FROM trial_user_attributes a JOIN trials t ON t.trial_id = a.trial_id \
             WHERE t.study_id = ? AND t.number = ? AND a.\"key\" = ?",
        ))
        .bind(study_id)
        .bind(number.0)
        .bind(key)
        .fetch_optional(self.conn())
        .await
        .map_err(|e| Error::storage(&url, e))
    }

    /// The numbers of the study's trials that have a kept model.
    pub async fn kept_models(&mut self, study_id: StudyId) -> Result<Vec<TrialNumber>> {
        let url = self.url.clone();
        // A database from before `keep` has no models.
        if !self.has_table("salus_models").await? {
            return Ok(Vec::new());
        }
        let numbers: Vec<i64> = sqlx::query_scalar(&sql(
            self.conn(),
            "SELECT t.number FROM salus_models m JOIN trials t ON t.trial_id = m.trial_id \
             WHERE t.study_id = ? ORDER BY t.number",
        ))
        .bind(study_id)
        .fetch_all(self.conn())
        .await
        .map_err(|e| Error::storage(&url, e))?;
        Ok(numbers.into_iter().map(TrialNumber).collect())
    }

    /// The kept model of trial `number` of the study, if it has one.
    pub async fn kept_model(
        &mut self,
        study_id: StudyId,
        number: TrialNumber,
    ) -> Result<Option<KeptModel>> {
        if !self.kept_models(study_id).await?.contains(&number) {
            return Ok(None);
        }
        let url = self.url.clone();
        let row = sqlx::query(&sql(self.conn(), "SELECT m.architecture, m.weights FROM salus_models m JOIN trials t ON t.trial_id = m.trial_id \
             WHERE t.study_id = ? AND t.number = ?",))
        .bind(study_id)
        .bind(number.0)
        .fetch_one(self.conn())
        .await
        .map_err(|e| Error::storage(&url, e))?;
        Ok(Some(KeptModel {
            number,
            architecture: row.get(0),
            weights: row.get(1),
        }))
    }
}
