//! The fencing invariants, checked against what a study's database holds:
//! each trial ended once, by its final claim; each dashboard command taken
//! by the run that held its trial; each step written under a claim whose
//! requeues kept it. The chaos bench runs it after every study; a test
//! can run it after any.

use std::collections::BTreeMap;

use sqlx::Row;

use crate::Store;
use crate::dialect::{Dialect, sql};
use crate::error::{Error, Result};
use crate::ids::StudyId;

/// What [`fencing`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Audit {
    /// One line per broken invariant; empty when all hold.
    pub violations: Vec<String>,
    /// Requeues recorded.
    pub requeues: i64,
    /// The longest gap between two heartbeats of any run, in seconds.
    pub max_beat_gap_s: f64,
}

/// Checks study `study_id`'s history (see the module docs).
pub async fn fencing(store: &mut Store, study_id: StudyId) -> Result<Audit> {
    let mut audit = Audit::default();
    let url_shown = store.url.clone();
    let err = |e: sqlx::Error| Error::storage(&url_shown, e);
    let conn = store.conn();
    // Ended once, by its final claim.
    let ends = sqlx::query(&sql(
        conn,
        "SELECT t.number, c.run_id, c.attempt, w.run_id, w.attempt, \
         (SELECT COUNT(*) FROM salus_events e WHERE e.trial_id = t.trial_id \
          AND e.kind IN ('trial_complete', 'trial_pruned', 'trial_fail')) \
         FROM trials t JOIN salus_claims c ON c.trial_id = t.trial_id \
         LEFT JOIN salus_writes w ON w.trial_id = t.trial_id AND w.kind = 'end' \
         WHERE t.study_id = ? ORDER BY t.number",
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(err)?;
    for r in &ends {
        let (number, run, attempt): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
        let writer: (Option<i64>, Option<i64>) = (r.get(3), r.get(4));
        if writer != (Some(run), Some(attempt)) {
            audit.violations.push(format!(
                "trial {number}: ended by {writer:?}, its final claim is run {run} attempt {attempt}"
            ));
        }
        let n: i64 = r.get(5);
        if n != 1 {
            audit
                .violations
                .push(format!("trial {number}: {n} end events"));
        }
    }
    // Claims, requeues and command takes, in the database's order.
    let events = sqlx::query(&sql(
        conn,
        "SELECT trial_id, kind, detail FROM salus_events WHERE study_id = ? AND trial_id IS NOT NULL \
         AND kind IN ('trial_start', 'trial_requeue', 'trial_complete', 'trial_pruned', 'trial_fail', 'command_taken') \
         ORDER BY event_id",
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(err)?;
    // Per trial: the run holding it now (None: nobody, or ended), and for
    // each released attempt the steps that every later requeue kept.
    let mut holder: BTreeMap<i64, Option<i64>> = BTreeMap::new();
    let mut kept: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for e in &events {
        let trial: i64 = e.get(0);
        let what: String = e.get(1);
        let detail: serde_json::Value =
            serde_json::from_str(&e.get::<String, _>(2)).unwrap_or_default();
        match what.as_str() {
            "trial_start" => {
                holder.insert(trial, detail["run_id"].as_i64());
            }
            "trial_requeue" => {
                audit.requeues += 1;
                holder.insert(trial, None);
                if let (Some(a), Some(k)) = (
                    detail["released_attempt"].as_i64(),
                    detail["kept_steps"].as_i64(),
                ) {
                    kept.entry(trial).or_default().push((a, k));
                }
            }
            "command_taken" => {
                let by = detail["run_id"].as_i64();
                let now = holder.get(&trial).copied().flatten();
                let finished = holder.contains_key(&trial) && now.is_none();
                if now != by && !finished {
                    audit.violations.push(format!(
                        "command {} for trial id {trial} taken by run {by:?}, held by {now:?}",
                        detail["command_id"]
                    ));
                }
            }
            _ => {
                holder.insert(trial, None);
            }
        }
    }
    let writes = sqlx::query(&sql(
        conn,
        "SELECT w.trial_id, w.step, w.attempt, c.attempt FROM salus_writes w \
         JOIN salus_claims c ON c.trial_id = w.trial_id JOIN trials t ON t.trial_id = w.trial_id \
         WHERE t.study_id = ? AND w.kind = 'step'",
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(err)?;
    for w in &writes {
        let (trial, step, attempt, last): (i64, i64, i64, i64) =
            (w.get(0), w.get(1), w.get(2), w.get(3));
        if attempt > last {
            audit.violations.push(format!(
                "trial id {trial} step {step}: by attempt {attempt}, after its last {last}"
            ));
        }
        if attempt < last {
            // Every requeue from this attempt on kept this step.
            let bound = kept
                .get(&trial)
                .into_iter()
                .flatten()
                .filter(|&&(a, _)| a >= attempt)
                .map(|&(_, k)| k)
                .min()
                .unwrap_or(0);
            if step > bound {
                audit.violations.push(format!(
                    "trial id {trial} step {step}: written by attempt {attempt}, \
                     which a requeue cut at step {bound}"
                ));
            }
        }
    }
    let gap = crate::Dialect::of(conn).json_member("detail", "heartbeat_max_gap_s");
    let gaps: Vec<Option<String>> = sqlx::query_scalar(&sql(
        conn,
        &format!(
            "SELECT CAST({gap} AS TEXT) FROM salus_events WHERE study_id = ? AND kind = 'study_stop'"
        ),
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(err)?;
    audit.max_beat_gap_s = gaps
        .iter()
        .flatten()
        .filter_map(|g| g.parse::<f64>().ok())
        .fold(0.0, f64::max);
    Ok(audit)
}

/// How many of study `study_id`'s trials finished (COMPLETE, PRUNED or
/// FAIL), and the milliseconds its runs' writers spent, summed from their
/// `study_stop` events (what the storage bench divides by).
pub async fn finished_and_writer_ms(store: &mut Store, study_id: StudyId) -> Result<(u64, f64)> {
    let url = store.url.clone();
    let err = |e: sqlx::Error| Error::storage(&url, e);
    let conn = store.conn();
    let stored: i64 = sqlx::query_scalar(&crate::sql(
        conn,
        "SELECT COUNT(*) FROM trials WHERE study_id = ? \
         AND CAST(state AS TEXT) IN ('COMPLETE', 'PRUNED', 'FAIL')",
    ))
    .bind(study_id)
    .fetch_one(&mut *conn)
    .await
    .map_err(err)?;
    let total = Dialect::of(conn).json_member("detail", "writer_total_ms");
    let ms: Option<f64> = if crate::table_exists(conn, "salus_events")
        .await
        .map_err(err)?
    {
        sqlx::query_scalar(&crate::sql(
            conn,
            &format!(
                "SELECT CAST(SUM(CAST({total} AS DOUBLE PRECISION)) AS DOUBLE PRECISION) \
                 FROM salus_events WHERE kind = 'study_stop' AND study_id = ?"
            ),
        ))
        .bind(study_id)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?
    } else {
        None
    };
    Ok((stored as u64, ms.unwrap_or(0.0)))
}
