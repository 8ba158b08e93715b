//! Many processes on one study: which run holds which trial, and whether
//! a run is still alive.
//!
//! The database is the only coordination point. Every change of hands is
//! one conditional statement inside the writer's transaction (SQLite's
//! `BEGIN IMMEDIATE`; on PostgreSQL, row locks), so that two processes
//! never both win: a trial is created only while the study has fewer
//! trials than its budget (its row locked on PostgreSQL), a WAITING trial
//! goes to the first process whose `UPDATE ... WHERE state = 'WAITING'`
//! changes it (after `FOR UPDATE SKIP LOCKED` on PostgreSQL), and an
//! orphan is requeued by the first whose `UPDATE ... WHERE state =
//! 'RUNNING'` does.
//!
//! A run is alive while it has not ended and its heartbeat is fresh; on
//! the same host, a dead pid says at once that it is gone (what a rerun
//! right after a `kill -9` relies on). Heartbeats are written and aged by
//! the database's clock ([`super::dialect::clock`]), so machines whose
//! clocks disagree still judge each other alike. No lock file is needed.

use sqlx::{AnyConnection, Row};

use super::dialect::{Dialect, sql};

use super::{Owner, TrialId};

/// A run (or a trial) whose heartbeat is older than this is gone.
pub const STALE_AFTER_S: f64 = 10.0;

/// This machine's name, as runs record it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Whether process `pid` exists on this machine; `None` where it cannot be
/// told (no `/proc`).
pub fn pid_exists(pid: i64) -> Option<bool> {
    let proc = std::path::Path::new("/proc");
    proc.is_dir().then(|| proc.join(pid.to_string()).exists())
}

/// Whether a heartbeat `age_s` seconds old (by the database's clock) is
/// within [`STALE_AFTER_S`].
pub fn fresh(age_s: Option<f64>) -> bool {
    age_s.is_some_and(|age| age < STALE_AFTER_S)
}

/// Whether the run `owner` is alive, seen from host `here`: not ended, its
/// process present when it runs here, and its heartbeat fresh.
/// `pid_exists` answers for this host.
pub fn run_alive(owner: &Owner, here: &str, pid_exists: impl Fn(i64) -> Option<bool>) -> bool {
    if owner.ended {
        return false;
    }
    if let (Some(host), Some(pid)) = (&owner.host, owner.pid)
        && host == here
        && pid_exists(pid) == Some(false)
    {
        return false;
    }
    fresh(owner.heartbeat_age_s)
}

/// Records that `run_id` holds `trial_id`, with a first heartbeat, so that
/// no other process takes a trial that just started for an orphan.
pub(super) async fn claim(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    run_id: i64,
    time: &str,
) -> sqlx::Result<()> {
    sqlx::query(&sql(
        &*conn,
        "INSERT INTO salus_claims (trial_id, run_id, claimed) VALUES (?, ?, ?::timestamp) \
         ON CONFLICT (trial_id) DO UPDATE SET run_id = excluded.run_id, claimed = excluded.claimed",
    ))
    .bind(trial_id)
    .bind(run_id)
    .bind(time)
    .execute(&mut *conn)
    .await?;
    sqlx::query(&sql(
        &*conn,
        "INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, ?::timestamp) \
         ON CONFLICT (trial_id) DO UPDATE SET heartbeat = excluded.heartbeat",
    ))
    .bind(trial_id)
    .bind(time)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Takes a WAITING trial for `run_id`; false when another process took it.
pub(super) async fn claim_waiting(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    run_id: i64,
    time: &str,
) -> sqlx::Result<bool> {
    // PostgreSQL: a trial another process is claiming at this moment is
    // skipped at once, not waited for (that process gets it).
    if Dialect::of(conn) == Dialect::Postgres {
        let free = sqlx::query(
            "SELECT trial_id FROM trials WHERE trial_id = $1 AND state = 'WAITING' FOR UPDATE SKIP LOCKED",
        )
        .bind(trial_id)
        .fetch_optional(&mut *conn)
        .await?;
        if free.is_none() {
            return Ok(false);
        }
    }
    let changed = sqlx::query(&sql(&*conn, "UPDATE trials SET state = 'RUNNING', datetime_start = ?::timestamp, datetime_complete = NULL \
         WHERE trial_id = ? AND state = 'WAITING'",))
    .bind(time)
    .bind(trial_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(false);
    }
    claim(conn, trial_id, run_id, time).await?;
    super::writer::study_event(conn, trial_id, "trial_start", "{}", time).await?;
    Ok(true)
}

/// A run that ends cleanly.
pub(super) async fn end_run(conn: &mut AnyConnection, run_id: i64, time: &str) -> sqlx::Result<()> {
    sqlx::query(&sql(
        &*conn,
        "UPDATE salus_runs SET ended = ?::timestamp WHERE run_id = ?",
    ))
    .bind(time)
    .bind(run_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The study's runs that are alive now ([`run_alive`]), with their
/// process index (none for runs recorded before processes had one).
pub async fn live_runs(
    conn: &mut AnyConnection,
    study_id: i64,
) -> sqlx::Result<Vec<(Owner, Option<i64>)>> {
    let beat = Dialect::of(conn).age_s("heartbeat");
    let rows = sqlx::query(&sql(
        conn,
        &format!(
            "SELECT run_id, host, pid, {beat}, process_index FROM salus_runs \
             WHERE study_id = ? AND ended IS NULL"
        ),
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await?;
    let here = host_name();
    Ok(rows
        .iter()
        .map(|r| {
            let owner = Owner {
                run_id: r.get(0),
                host: r.get(1),
                pid: r.get(2),
                heartbeat_age_s: r.get(3),
                ended: false,
            };
            (owner, r.get(4))
        })
        .filter(|(owner, _)| run_alive(owner, &here, pid_exists))
        .collect())
}

/// The lowest process index that no live run of the study has: 0 for a
/// process alone, so that one process samples as it always did.
pub(super) async fn free_process_index(
    conn: &mut AnyConnection,
    study_id: i64,
) -> sqlx::Result<i64> {
    let taken: Vec<i64> = live_runs(conn, study_id)
        .await?
        .into_iter()
        .filter_map(|(_, index)| index)
        .collect();
    Ok((0..).find(|i| !taken.contains(i)).expect("a free index"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(host: &str, pid: i64, age_s: f64, ended: bool) -> Owner {
        Owner {
            run_id: 1,
            host: Some(host.into()),
            pid: Some(pid),
            heartbeat_age_s: Some(age_s),
            ended,
        }
    }

    #[test]
    fn a_run_is_alive_while_it_beats_and_its_process_exists() {
        let here = "gpu1";
        let exists = |pid: i64| Some(pid == 7);
        // Fresh, its process here: alive.
        assert!(run_alive(&owner("gpu1", 7, 5.0, false), here, exists));
        // Its process is gone (kill -9): dead at once, however fresh.
        assert!(!run_alive(&owner("gpu1", 8, 1.0, false), here, exists));
        // Another host: only the heartbeat can tell.
        assert!(run_alive(&owner("gpu2", 8, 9.0, false), here, exists));
        assert!(!run_alive(&owner("gpu2", 8, 11.0, false), here, exists));
        // A stale heartbeat here too (a hung process, or a reused pid).
        assert!(!run_alive(&owner("gpu1", 7, 15.0, false), here, exists));
        // Ended cleanly, or never beat.
        assert!(!run_alive(&owner("gpu1", 7, 1.0, true), here, exists));
        let mut silent = owner("gpu2", 8, 0.0, false);
        silent.heartbeat_age_s = None;
        assert!(!run_alive(&silent, here, exists));
        // Without /proc, a fresh heartbeat here is trusted.
        assert!(run_alive(&owner("gpu1", 8, 1.0, false), here, |_| None));
    }
}
