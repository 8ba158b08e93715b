//! The writes a command makes on its own connection, outside the writer:
//! creating or resuming a study and requeueing its failed trials (before
//! any writer exists), and leaving a command for the process that runs a
//! study.

use std::collections::BTreeMap;

use sqlx::Row;

use super::dialect::{Dialect, begin_write, sql};

use super::statements::{Attrs, event, set_trial_attr};
use super::{Store, StudyInfo, TrialId, now};
use crate::error::{Error, Result};
use crate::ids::StudyId;

const SPACE_KEY: &str = "salus:search_space";
/// The advisory lock under which a study is created on PostgreSQL.
const STUDY_LOCK: i64 = 0x73616c7574;
/// The fixed knobs, typed, in the study's and in each trial's user attributes.
pub const FIXED_KEY: &str = "fixed_params";

/// What the database keeps of a study's definition: what the study file
/// says, in stored form. Resuming compares it with what is stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyRecord {
    pub name: String,
    /// The study file, for messages and the `study_create` event.
    pub file: std::path::PathBuf,
    pub direction: tuning::objective::Direction,
    pub metric: String,
    /// Every objective's metric and direction, the first included (one,
    /// mostly); stored as Optuna stores a study of several.
    pub objectives: Vec<(String, tuning::objective::Direction)>,
    /// The search space in Optuna's `distribution_json` form, by name.
    pub space: BTreeMap<String, String>,
    /// The fixed knobs: each as typed JSON, and as the text that studies
    /// made before fixed values were typed stored.
    pub fixed: BTreeMap<String, (serde_json::Value, String)>,
    pub forked_from: Option<String>,
}

impl StudyRecord {
    /// The fixed knobs as a typed JSON object (integers stay integers).
    pub fn fixed_json(&self) -> serde_json::Value {
        self.fixed
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

impl Store {
    /// Leaves a command (`pause`, `resume`, `prune`) for the orchestrator
    /// running the study; it acts at the trial's next iteration boundary.
    pub async fn push_command(
        &mut self,
        study_id: StudyId,
        trial_id: TrialId,
        action: crate::dashboard::DashCommand,
    ) -> Result<()> {
        let url = self.url.clone();
        sqlx::query(&sql(self.conn(), "INSERT INTO salus_commands (study_id, trial_id, action, created) VALUES (?, ?, ?, ?::timestamp)",))
        .bind(study_id)
        .bind(trial_id)
        .bind(action.as_str())
        .bind(now())
        .execute(self.conn())
        .await
        .map_err(|e| Error::storage(&url, e))?;
        Ok(())
    }

    /// Puts the study's FAIL trials back to WAITING with their parameters,
    /// to run first (Optuna's `RetryFailedCallback` runs them again too).
    /// Each keeps its old reason as `salus:previous_fail_reason` and starts
    /// from scratch. Returns how many were requeued.
    pub async fn retry_failed(&mut self, study_id: StudyId) -> Result<u64> {
        let url = self.url.clone();
        let err = |e: sqlx::Error| Error::storage(&url, e);
        let time = now();
        let mut tx = begin_write(self.conn()).await.map_err(err)?;
        let failed: Vec<TrialId> = sqlx::query_scalar(&sql(
            &tx,
            "SELECT trial_id FROM trials WHERE study_id = ? AND state = 'FAIL'",
        ))
        .bind(study_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        for id in &failed {
            for statement in [
                "DELETE FROM trial_system_attributes \
                 WHERE trial_id = ? AND \"key\" = 'salus:previous_fail_reason'",
                "UPDATE trial_system_attributes SET \"key\" = 'salus:previous_fail_reason' \
                 WHERE trial_id = ? AND \"key\" = 'fail_reason'",
                "DELETE FROM trial_intermediate_values WHERE trial_id = ?",
                "DELETE FROM salus_writes WHERE trial_id = ? AND kind IN ('step', 'end')",
                "UPDATE salus_trials SET fail_reason = NULL, iterations = 0 WHERE trial_id = ?",
                "UPDATE trials SET state = 'WAITING', datetime_start = NULL, datetime_complete = NULL \
                 WHERE trial_id = ?",
            ] {
                sqlx::query(&sql(&tx, statement))
                    .bind(*id)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
            event(&mut tx, study_id, Some(*id), "trial_retry", "{}", &time)
                .await
                .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(failed.len() as u64)
    }

    /// Adds a WAITING trial that must run with `fixed` (its parameters as
    /// Optuna's `enqueue_trial` writes them: the `fixed_params` system
    /// attribute, no `trial_params` yet). Returns its number.
    pub async fn enqueue(
        &mut self,
        study_id: StudyId,
        fixed: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<super::TrialNumber> {
        let url = self.url.clone();
        let err = |e: sqlx::Error| Error::storage(&url, e);
        let mut tx = begin_write(self.conn()).await.map_err(err)?;
        let number = super::statements::next_number(&mut tx, study_id)
            .await
            .map_err(err)?;
        let trial_id: TrialId = sqlx::query_scalar(&sql(&tx, "INSERT INTO trials (number, study_id, state) VALUES (?, ?, 'WAITING') RETURNING trial_id",))
        .bind(number.0)
        .bind(study_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        let value = serde_json::Value::Object(fixed.clone()).to_string();
        // Optuna's key for an enqueued trial's values (a system attribute;
        // FIXED_KEY names the study's fixed knobs among user attributes).
        set_trial_attr(&mut tx, Attrs::System, trial_id, "fixed_params", &value)
            .await
            .map_err(err)?;
        event(
            &mut tx,
            study_id,
            Some(trial_id),
            "trial_enqueue",
            &value,
            &now(),
        )
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(number)
    }

    /// Creates the study, or resumes it after checking that its direction
    /// and search space are unchanged (a study with no trial yet takes the
    /// file's definition instead). Says which it did.
    pub async fn create_or_resume(
        &mut self,
        study: &StudyRecord,
    ) -> Result<(StudyInfo, StudyOpened)> {
        let url = self.url.clone();
        let err = |e: sqlx::Error| Error::storage(&url, e);
        let mut tx = begin_write(self.conn()).await.map_err(err)?;
        if Dialect::of(&tx) == Dialect::Postgres {
            // Processes that start the same new study at once: the first
            // creates it, the others find it (SQLite's write lock does this).
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(STUDY_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        let existing = sqlx::query(&sql(&tx, "SELECT s.study_id, CAST(d.direction AS TEXT), a.value_json, f.value_json FROM studies s \
             LEFT JOIN study_directions d ON d.study_id = s.study_id AND d.objective = 0 \
             LEFT JOIN study_system_attributes a ON a.study_id = s.study_id AND a.\"key\" = ? \
             LEFT JOIN study_user_attributes f ON f.study_id = s.study_id AND f.\"key\" = ? \
             WHERE s.study_name = ?",))
        .bind(SPACE_KEY)
        .bind(FIXED_KEY)
        .bind(&study.name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        if let Some(row) = existing {
            let id: StudyId = row.get(0);
            let direction: Option<String> = row.get(1);
            let stored: Option<String> = row.get(2);
            let fixed: Option<String> = row.get(3);
            let directions: Vec<String> = sqlx::query_scalar(&sql(
                &tx,
                "SELECT CAST(direction AS TEXT) FROM study_directions WHERE study_id = ? ORDER BY objective",
            ))
            .bind(id)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
            let wanted: Vec<&str> = study.objectives.iter().map(|(_, d)| d.optuna()).collect();
            let changed = if directions.len() > 1 || wanted.len() > 1 {
                (directions != wanted).then(|| {
                    format!(
                        "study '{}' in {url} is stored with directions [{}], but {} asks for [{}]",
                        study.name,
                        directions.join(", "),
                        study.file.display(),
                        wanted.join(", ")
                    )
                })
            } else if direction.as_deref() != Some(study.direction.optuna()) {
                Some(format!(
                    "study '{}' in {url} is stored with direction {}, but {} asks for {}",
                    study.name,
                    direction.unwrap_or_else(|| "none".into()),
                    study.file.display(),
                    study.direction.optuna()
                ))
            } else {
                stored.and_then(|stored| {
                    let stored: BTreeMap<String, String> =
                        serde_json::from_str(&stored).unwrap_or_default();
                    space_diff(&stored, &study.space).map(|diff| {
                        format!(
                            "study '{}' in {url} was created with a different search space ({diff})",
                            study.name
                        )
                    })
                })
                .or_else(|| {
                    fixed_diff(fixed.as_deref(), study).map(|diff| {
                        format!(
                            "study '{}' in {url} ran its trials with other fixed values ({diff})",
                            study.name
                        )
                    })
                })
            };
            if let Some(why) = &changed {
                let trials: i64 =
                    sqlx::query_scalar(&sql(&tx, "SELECT COUNT(*) FROM trials WHERE study_id = ?"))
                        .bind(id)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(err)?;
                if trials > 0 {
                    return Err(Error::Input(format!(
                        "{why}; start a new study from this file with --fork NEW_NAME \
                         (the old one stays as it is), or rename the study in {}",
                        study.file.display()
                    )));
                }
                // Nothing ran under the old definition (a first run that
                // failed before any trial): the file's definition replaces it.
                define(&mut tx, id, study, "study_redefine")
                    .await
                    .map_err(err)?;
            }
            tx.commit().await.map_err(err)?;
            let info = StudyInfo {
                id,
                name: study.name.clone(),
                direction: study.direction,
            };
            return Ok((
                info,
                changed.map_or(StudyOpened::Resumed, StudyOpened::Redefined),
            ));
        }
        let id: StudyId = sqlx::query_scalar(&sql(
            &tx,
            "INSERT INTO studies (study_name) VALUES (?) RETURNING study_id",
        ))
        .bind(&study.name)
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        define(&mut tx, id, study, "study_create")
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok((
            StudyInfo {
                id,
                name: study.name.clone(),
                direction: study.direction,
            },
            StudyOpened::Created,
        ))
    }
}

/// What [`Store::create_or_resume`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum StudyOpened {
    Created,
    Resumed,
    /// The study had no trial, and its stored definition differed from the
    /// file's (the reason); the file's replaced it.
    Redefined(String),
}

/// Writes a study's definition (direction, search space, metric, fixed
/// values), replacing an earlier one, and records an event of `kind`.
async fn define(
    conn: &mut sqlx::AnyConnection,
    id: StudyId,
    study: &StudyRecord,
    kind: &str,
) -> std::result::Result<(), sqlx::Error> {
    for (i, (_, direction)) in study.objectives.iter().enumerate() {
        sqlx::query(&sql(&*conn, "INSERT INTO study_directions (direction, study_id, objective) VALUES (?::studydirection, ?, ?) \
             ON CONFLICT (study_id, objective) DO UPDATE SET direction = excluded.direction",))
        .bind(direction.optuna())
        .bind(id)
        .bind(i as i64)
        .execute(&mut *conn)
        .await?;
    }
    let space = serde_json::to_string(&study.space).expect("a map of strings serialises");
    let mut attrs = vec![
        ("study_system_attributes", SPACE_KEY, space),
        (
            "study_user_attributes",
            "metric",
            serde_json::to_string(&study.metric).unwrap(),
        ),
        (
            "study_user_attributes",
            FIXED_KEY,
            study.fixed_json().to_string(),
        ),
        (
            "study_user_attributes",
            "created_by",
            serde_json::to_string(&format!("salus-tune {}", env!("CARGO_PKG_VERSION"))).unwrap(),
        ),
    ];
    if study.objectives.len() > 1 {
        // Optuna's `study.metric_names` (`set_metric_names`).
        let names: Vec<&str> = study.objectives.iter().map(|(m, _)| m.as_str()).collect();
        attrs.push((
            "study_system_attributes",
            "study:metric_names",
            serde_json::to_string(&names).unwrap(),
        ));
    }
    if let Some(parent) = &study.forked_from {
        attrs.push((
            "study_user_attributes",
            "forked_from",
            serde_json::to_string(parent).unwrap(),
        ));
    }
    for (table, key, value) in attrs {
        sqlx::query(&sql(
            &*conn,
            &format!(
                "INSERT INTO {table} (study_id, \"key\", value_json) VALUES (?, ?, ?) \
             ON CONFLICT (study_id, \"key\") DO UPDATE SET value_json = excluded.value_json"
            ),
        ))
        .bind(id)
        .bind(key)
        .bind(value)
        .execute(&mut *conn)
        .await?;
    }
    let detail = serde_json::json!({ "file": study.file.display().to_string() }).to_string();
    event(conn, id, None, kind, &detail, &now()).await
}

/// What changed between the stored fixed values and the file's, if anything.
/// Studies made before fixed values were typed stored them as text; those
/// compare as the text they were written as.
fn fixed_diff(stored: Option<&str>, study: &StudyRecord) -> Option<String> {
    let stored: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(stored?).unwrap_or_default();
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut parts = Vec::new();
    for (k, (new, as_text)) in &study.fixed {
        match stored.get(k) {
            None => parts.push(format!("'{k}' is now fixed at {new}")),
            Some(serde_json::Value::String(old)) if !new.is_string() && old == as_text => {}
            Some(old) if old != new => {
                parts.push(format!("'{k}' changed from {} to {}", text(old), text(new)))
            }
            _ => {}
        }
    }
    parts.extend(
        stored
            .keys()
            .filter(|k| !study.fixed.contains_key(*k))
            .map(|k| format!("'{k}' is no longer fixed")),
    );
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// What changed between two search spaces, if anything.
fn space_diff(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Option<String> {
    let mut parts = Vec::new();
    for (k, v) in new {
        match old.get(k) {
            None => parts.push(format!("'{k}' is new")),
            Some(o) if o != v => parts.push(format!("'{k}' changed from {o} to {v}")),
            _ => {}
        }
    }
    parts.extend(
        old.keys()
            .filter(|k| !new.contains_key(*k))
            .map(|k| format!("'{k}' was removed")),
    );
    (!parts.is_empty()).then(|| parts.join("; "))
}
