//! Many processes on one study: which run holds which trial, whether a run
//! is still alive, and the fence that keeps a run that lost a trial from
//! writing for it.
//!
//! The database is the only coordination point. Every change of hands is
//! one conditional statement inside a writer's transaction (SQLite's
//! `BEGIN IMMEDIATE`; on PostgreSQL, row locks), so that two processes
//! never both win: a trial is created only while the study has fewer
//! trials than its budget, and fewer in flight than a cap the creator
//! may set (its row locked on PostgreSQL), a WAITING trial
//! goes to the first process whose `UPDATE ... WHERE state = 'WAITING'`
//! changes it (after `FOR UPDATE SKIP LOCKED` on PostgreSQL), and an
//! orphan is requeued by the first whose `UPDATE ... WHERE state =
//! 'RUNNING'` does, and only while its holder still looks dead to the
//! database itself.
//!
//! **Claims and attempts.** Each claim of a trial is an *attempt*,
//! numbered from 1 in `salus_claims`; a requeue releases it. Every write
//! for a trial names its [`Claim`] and lands only while that claim is the
//! trial's current, unreleased one ([`holds`], checked in the same
//! transaction as the write, the claim's row share-locked on PostgreSQL so
//! that no requeue can come between). A process that was paused (SIGSTOP,
//! a VM pause, a disk stall) past the liveness limit comes back to find
//! its trials requeued or re-run by a peer: its writes change nothing, and
//! it drops those trials.
//!
//! **Liveness.** A run is alive while it has not ended and its heartbeat is
//! fresh. On the same host *and the same pid namespace and boot*
//! ([`Place`]), a dead pid says at once that it is gone (what a rerun right
//! after a `kill -9` relies on); containers that share a host name but not
//! a pid namespace judge each other by heartbeats alone. Heartbeats are
//! written and aged by one clock per database ([`super::dialect::Clock`]),
//! so machines whose clocks disagree still judge each other alike. No lock
//! file is needed.

use sqlx::{AnyConnection, Row};

use super::dialect::{Dialect, sql};

use super::{Owner, TrialId, TrialState};
use crate::ids::{RunId, StudyId};

/// The default liveness limit, in seconds: a run (or a trial) whose
/// heartbeat is older than this is gone. `[study] liveness` defaults to
/// it; the dashboard, which reads no study file, judges runs by it. Five
/// heartbeats (every 2 s): the longest gap between two heartbeats of one
/// run measured under load on a 2-core machine (8 processes, every core
/// busy) was 2.6 s; see `docs/running-at-scale.md`.
pub const STALE_AFTER_S: f64 = 10.0;

/// One run's hold on one trial: every write for the trial carries it, and
/// lands only while it is the trial's current claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claim {
    pub trial_id: TrialId,
    pub run_id: RunId,
    /// 1 for the trial's first claim, one more for each claim after a requeue.
    pub attempt: i64,
}

/// This machine's name, as runs record it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Where a process runs, finely enough that a pid means one process: its
/// host name, and its boot and pid namespace (Linux), which containers
/// with host networking share the host name across but not these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub host: String,
    /// `<boot id>/<pid namespace>`; `None` where the system does not say.
    pub pid_namespace: Option<String>,
}

impl Place {
    /// This process's place.
    pub fn here() -> Self {
        Place {
            host: host_name(),
            pid_namespace: pid_namespace(),
        }
    }
}

/// `<boot id>/<pid namespace inode>` of this process, from `/proc`.
pub fn pid_namespace() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("{}/{}", boot.trim(), ns.display()))
}

/// Whether process `pid` exists in this pid namespace; `None` where it
/// cannot be told (no `/proc`).
pub fn pid_exists(pid: i64) -> Option<bool> {
    let proc = std::path::Path::new("/proc");
    proc.is_dir().then(|| proc.join(pid.to_string()).exists())
}

/// Whether a heartbeat `age_s` seconds old (by the database's clock) is
/// within `limit_s`.
pub fn fresh(age_s: Option<f64>, limit_s: f64) -> bool {
    age_s.is_some_and(|age| age < limit_s)
}

/// Whether the run `owner` is alive, seen from `here`: not ended, its
/// process present when it runs in the same place, and its heartbeat
/// within `limit_s`. `pid_exists` answers for `here`.
pub fn run_alive(
    owner: &Owner,
    here: &Place,
    limit_s: f64,
    pid_exists: impl Fn(i64) -> Option<bool>,
) -> bool {
    if owner.ended {
        return false;
    }
    if owner_gone_here(owner, here, pid_exists) {
        return false;
    }
    fresh(owner.heartbeat_age_s, limit_s)
}

/// Whether `owner`'s process is known dead from here: same host, same
/// pid namespace and boot, and its pid missing. A run that recorded no
/// namespace (an older salus-tune) is never judged by its pid.
pub fn owner_gone_here(
    owner: &Owner,
    here: &Place,
    pid_exists: impl Fn(i64) -> Option<bool>,
) -> bool {
    match (&owner.host, &owner.pid_namespace, owner.pid) {
        (Some(host), Some(ns), Some(pid)) => {
            *host == here.host
                && here.pid_namespace.as_ref() == Some(ns)
                && pid_exists(pid) == Some(false)
        }
        _ => false,
    }
}

/// Records that `run_id` holds `trial_id` (a new attempt), with a first
/// heartbeat, so that no other process takes a trial that just started for
/// an orphan. Returns the claim.
pub(super) async fn claim(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    run_id: RunId,
    clock: &super::dialect::Clock,
) -> sqlx::Result<Claim> {
    let attempt: i64 = sqlx::query_scalar(&sql(
        &*conn,
        "INSERT INTO salus_claims (trial_id, run_id, claimed, attempt, released) \
         VALUES (?, ?, ?::timestamp, 1, NULL) \
         ON CONFLICT (trial_id) DO UPDATE SET run_id = excluded.run_id, claimed = excluded.claimed, \
         attempt = salus_claims.attempt + 1, released = NULL RETURNING attempt",
    ))
    .bind(trial_id)
    .bind(run_id)
    .bind(&clock.local)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(&sql(
        &*conn,
        "INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, ?::timestamp) \
         ON CONFLICT (trial_id) DO UPDATE SET heartbeat = excluded.heartbeat",
    ))
    .bind(trial_id)
    .bind(&clock.beat)
    .execute(&mut *conn)
    .await?;
    Ok(Claim {
        trial_id,
        run_id,
        attempt,
    })
}

/// Whether `claim` is its trial's current claim. On PostgreSQL the claim's
/// row stays share-locked until the transaction ends, so no requeue (which
/// updates that row) can come between this answer and the writes it guards;
/// on SQLite the writer's `BEGIN IMMEDIATE` excludes every other writer.
pub(super) async fn holds(conn: &mut AnyConnection, claim: &Claim) -> sqlx::Result<bool> {
    let lock = match Dialect::of(conn) {
        Dialect::Postgres => " FOR SHARE",
        Dialect::Sqlite => "",
    };
    let row = sqlx::query(&sql(
        &*conn,
        &format!(
            "SELECT 1 FROM salus_claims WHERE trial_id = ? AND run_id = ? AND attempt = ? \
             AND released IS NULL{lock}"
        ),
    ))
    .bind(claim.trial_id)
    .bind(claim.run_id)
    .bind(claim.attempt)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.is_some())
}

/// A WAITING trial as a run took it: its claim, and what it resumes from
/// as the database has it at that moment (no other run writes for it
/// now). A resume point read earlier, before another process's requeue
/// cut the curve elsewhere, is checked against these.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claimed {
    pub claim: Claim,
    /// The last stored step (0 for none).
    pub last_step: i64,
    /// Its latest recorded external checkpoint: attempt and step.
    pub checkpoint: Option<(i64, i64)>,
}

/// Takes a WAITING trial for `run_id`; `None` when another process took it.
pub(super) async fn claim_waiting(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    run_id: RunId,
    clock: &super::dialect::Clock,
) -> sqlx::Result<Option<Claimed>> {
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
            return Ok(None);
        }
    }
    let changed = sqlx::query(&sql(&*conn, "UPDATE trials SET state = 'RUNNING', datetime_start = ?::timestamp, datetime_complete = NULL \
         WHERE trial_id = ? AND state = 'WAITING'",))
    .bind(&clock.local)
    .bind(trial_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(None);
    }
    let claim = claim(conn, trial_id, run_id, clock).await?;
    let detail = serde_json::json!({ "run_id": run_id, "attempt": claim.attempt }).to_string();
    super::statements::study_event(conn, trial_id, "trial_start", &detail, &clock.local).await?;
    let last_step: i64 = sqlx::query_scalar(&sql(
        &*conn,
        "SELECT CAST(COALESCE(MAX(step), 0) AS BIGINT) FROM trial_intermediate_values WHERE trial_id = ?",
    ))
    .bind(trial_id)
    .fetch_one(&mut *conn)
    .await?;
    let checkpoint = sqlx::query(&sql(
        &*conn,
        "SELECT attempt, step FROM salus_checkpoints WHERE trial_id = ?",
    ))
    .bind(trial_id)
    .fetch_optional(&mut *conn)
    .await?
    .map(|r| (r.get::<i64, _>(0), r.get::<i64, _>(1)));
    Ok(Some(Claimed {
        claim,
        last_step,
        checkpoint,
    }))
}

/// Who may send a RUNNING trial back to WAITING.
#[derive(Debug, Clone, PartialEq)]
pub enum Requeuer {
    /// The run that holds it (a Ctrl-C stop): only while its claim is current.
    Holder(Claim),
    /// Another process that found its run dead: only while the claim it
    /// saw (`seen`: run and attempt) is still the current one, and that
    /// run still looks dead to the database at that moment: ended, or its
    /// heartbeat older than `limit_s`; or at once where the finder saw its
    /// process gone on this host (`pid_gone`).
    Finder {
        trial_id: TrialId,
        seen: (RunId, i64),
        pid_gone: bool,
        limit_s: f64,
    },
    /// Another process that found it held by no salus-tune run (Optuna's)
    /// with a heartbeat that stood still at `beat` for the liveness limit:
    /// only while no run claims it and its heartbeat is still `beat`.
    Unclaimed { trial_id: TrialId, beat: String },
}

impl Requeuer {
    pub fn trial_id(&self) -> TrialId {
        match self {
            Requeuer::Holder(c) => c.trial_id,
            Requeuer::Finder { trial_id, .. } | Requeuer::Unclaimed { trial_id, .. } => *trial_id,
        }
    }

    /// Whether `row`, as read, is still the trial it judged: RUNNING and
    /// held by the claim it saw (or, for `Unclaimed`, by none, with the
    /// heartbeat it saw). `requeue`'s statement checks the same inside
    /// its transaction; this is for a caller that read the rows again.
    pub fn applies_to(&self, row: &super::TrialRow) -> bool {
        let held = row.owner.as_ref().map(|o| (o.run_id, o.attempt));
        row.trial_id == self.trial_id()
            && row.state == TrialState::Running
            && match self {
                Requeuer::Holder(c) => held == Some((c.run_id, c.attempt)),
                Requeuer::Finder { seen, .. } => held == Some(*seen),
                Requeuer::Unclaimed { beat, .. } => {
                    held.is_none() && row.heartbeat.as_deref() == Some(beat.as_str())
                }
            }
    }
}

/// Sends a RUNNING trial back to WAITING under [`Requeuer`]'s rules, its
/// intermediate values after `keep_steps` cleared and its claim released;
/// false when the rules say no (another process requeued, re-took or
/// finished it, or its holder beat meanwhile).
pub(super) async fn requeue(
    conn: &mut AnyConnection,
    by: &Requeuer,
    keep_steps: i64,
    clock: &super::dialect::Clock,
) -> sqlx::Result<bool> {
    let dialect = Dialect::of(conn);
    let trial_id = by.trial_id();
    // PostgreSQL: the claim's row, then the trial's, are locked first (the
    // order a holder's fenced writes take them in), so that the update's
    // own snapshot sees the latest claim and heartbeat.
    if dialect == Dialect::Postgres {
        sqlx::query("SELECT trial_id FROM salus_claims WHERE trial_id = $1 FOR UPDATE")
            .bind(trial_id)
            .execute(&mut *conn)
            .await?;
        sqlx::query("SELECT trial_id FROM trials WHERE trial_id = $1 FOR NO KEY UPDATE")
            .bind(trial_id)
            .execute(&mut *conn)
            .await?;
    }
    let current = "(SELECT c.run_id FROM salus_claims c WHERE c.trial_id = trials.trial_id AND c.released IS NULL)";
    let attempt = "(SELECT c.attempt FROM salus_claims c WHERE c.trial_id = trials.trial_id AND c.released IS NULL)";
    let run_age = dialect.age_s("r.heartbeat");
    let condition = match by {
        Requeuer::Holder(_) | Requeuer::Finder { pid_gone: true, .. } => {
            format!("{current} = ? AND {attempt} = ?")
        }
        Requeuer::Finder { .. } => format!(
            "{current} = ? AND {attempt} = ? AND EXISTS (SELECT 1 FROM salus_runs r \
             WHERE r.run_id = {current} AND (r.ended IS NOT NULL OR r.heartbeat IS NULL OR {run_age} >= ?))"
        ),
        Requeuer::Unclaimed { .. } => format!(
            "{current} IS NULL AND EXISTS (SELECT 1 FROM trial_heartbeats h \
             WHERE h.trial_id = trials.trial_id AND CAST(h.heartbeat AS TEXT) = ?)"
        ),
    };
    let text = format!(
        "UPDATE trials SET state = 'WAITING', datetime_start = NULL, datetime_complete = NULL \
         WHERE trial_id = ? AND state = 'RUNNING' AND {condition}"
    );
    let text = sql(&*conn, &text).into_owned();
    let query = sqlx::query(&text).bind(trial_id);
    let query = match by {
        Requeuer::Holder(c) => query.bind(c.run_id).bind(c.attempt),
        Requeuer::Finder {
            seen: (run_id, attempt),
            pid_gone: true,
            ..
        } => query.bind(*run_id).bind(*attempt),
        Requeuer::Finder {
            seen: (run_id, attempt),
            limit_s,
            ..
        } => query.bind(*run_id).bind(*attempt).bind(*limit_s),
        Requeuer::Unclaimed { beat, .. } => query.bind(beat.as_str()),
    };
    if query.execute(&mut *conn).await?.rows_affected() == 0 {
        return Ok(false);
    }
    // The steps cut go, and so does the record of who wrote them.
    for table in [
        "DELETE FROM trial_intermediate_values WHERE trial_id = ? AND step > ?",
        "DELETE FROM salus_writes WHERE trial_id = ? AND kind = 'step' AND step > ?",
    ] {
        sqlx::query(&sql(&*conn, table))
            .bind(trial_id)
            .bind(keep_steps)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query(&sql(
        &*conn,
        "UPDATE salus_claims SET released = ?::timestamp WHERE trial_id = ? AND released IS NULL",
    ))
    .bind(&clock.local)
    .bind(trial_id)
    .execute(&mut *conn)
    .await?;
    let released = match by {
        Requeuer::Holder(c) => Some((c.run_id, c.attempt)),
        Requeuer::Finder { seen, .. } => Some(*seen),
        Requeuer::Unclaimed { .. } => None,
    };
    let detail = serde_json::json!({
        "kept_steps": keep_steps,
        "released_run": released.map(|r| r.0),
        "released_attempt": released.map(|r| r.1),
        "by": match by {
            Requeuer::Holder(_) => "holder",
            Requeuer::Finder { .. } => "finder",
            Requeuer::Unclaimed { .. } => "unclaimed",
        },
    })
    .to_string();
    super::statements::study_event(conn, trial_id, "trial_requeue", &detail, &clock.local).await?;
    Ok(true)
}

/// A run that ends cleanly.
pub(super) async fn end_run(
    conn: &mut AnyConnection,
    run_id: RunId,
    time: &str,
) -> sqlx::Result<()> {
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
    study_id: StudyId,
    limit_s: f64,
) -> sqlx::Result<Vec<(Owner, Option<i64>)>> {
    let beat = Dialect::of(conn).age_s("heartbeat");
    let rows = sqlx::query(&sql(
        conn,
        &format!(
            "SELECT run_id, host, pid, {beat}, process_index, pid_namespace FROM salus_runs \
             WHERE study_id = ? AND ended IS NULL"
        ),
    ))
    .bind(study_id)
    .fetch_all(&mut *conn)
    .await?;
    let here = Place::here();
    Ok(rows
        .iter()
        .map(|r| {
            let owner = Owner {
                run_id: r.get(0),
                host: r.get(1),
                pid: r.get(2),
                heartbeat_age_s: r.get(3),
                ended: false,
                pid_namespace: r.get(5),
                attempt: 0,
            };
            (owner, r.get(4))
        })
        .filter(|(owner, _)| run_alive(owner, &here, limit_s, pid_exists))
        .collect())
}

/// The lowest process index that no live run of the study has: 0 for a
/// process alone, so that one process samples as it always did.
pub(super) async fn free_process_index(
    conn: &mut AnyConnection,
    study_id: StudyId,
    limit_s: f64,
) -> sqlx::Result<i64> {
    let taken: Vec<i64> = live_runs(conn, study_id, limit_s)
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
            run_id: RunId(1),
            host: Some(host.into()),
            pid: Some(pid),
            heartbeat_age_s: Some(age_s),
            ended,
            pid_namespace: Some("boot/pid:[1]".into()),
            attempt: 1,
        }
    }

    fn place(host: &str, ns: &str) -> Place {
        Place {
            host: host.into(),
            pid_namespace: Some(ns.into()),
        }
    }

    #[test]
    fn a_run_is_alive_while_it_beats_and_its_process_exists() {
        let here = place("gpu1", "boot/pid:[1]");
        let exists = |pid: i64| Some(pid == 7);
        let limit = STALE_AFTER_S;
        // Fresh, its process here: alive.
        assert!(run_alive(
            &owner("gpu1", 7, 5.0, false),
            &here,
            limit,
            exists
        ));
        // Its process is gone (kill -9): dead at once, however fresh.
        assert!(!run_alive(
            &owner("gpu1", 8, 1.0, false),
            &here,
            limit,
            exists
        ));
        // Another host: only the heartbeat can tell.
        assert!(run_alive(
            &owner("gpu2", 8, 9.0, false),
            &here,
            limit,
            exists
        ));
        assert!(!run_alive(
            &owner("gpu2", 8, 11.0, false),
            &here,
            limit,
            exists
        ));
        // A stale heartbeat here too (a hung process, or a reused pid).
        assert!(!run_alive(
            &owner("gpu1", 7, 15.0, false),
            &here,
            limit,
            exists
        ));
        // Another limit judges the same heartbeat otherwise.
        assert!(run_alive(
            &owner("gpu1", 7, 15.0, false),
            &here,
            20.0,
            exists
        ));
        // Ended cleanly, or never beat.
        assert!(!run_alive(
            &owner("gpu1", 7, 1.0, true),
            &here,
            limit,
            exists
        ));
        let mut silent = owner("gpu2", 8, 0.0, false);
        silent.heartbeat_age_s = None;
        assert!(!run_alive(&silent, &here, limit, exists));
        // Without /proc, a fresh heartbeat here is trusted.
        assert!(run_alive(
            &owner("gpu1", 8, 1.0, false),
            &here,
            limit,
            |_| None
        ));
    }

    #[test]
    fn a_pid_speaks_only_within_its_own_pid_namespace_and_boot() {
        let exists = |pid: i64| Some(pid == 7);
        let limit = STALE_AFTER_S;
        // Two containers with host networking: one host name, two pid
        // namespaces. Pid 8 is missing here, but it is the other's pid.
        let other_container = place("node1", "boot/pid:[2]");
        assert!(run_alive(
            &owner("node1", 8, 1.0, false),
            &other_container,
            limit,
            exists
        ));
        assert!(!owner_gone_here(
            &owner("node1", 8, 1.0, false),
            &other_container,
            exists
        ));
        // The same namespace after a reboot (another boot id): not judged by pid.
        let rebooted = place("node1", "boot2/pid:[1]");
        assert!(run_alive(
            &owner("node1", 8, 1.0, false),
            &rebooted,
            limit,
            exists
        ));
        // The same namespace and boot: the pid is trusted.
        let same = place("node1", "boot/pid:[1]");
        assert!(owner_gone_here(
            &owner("node1", 8, 1.0, false),
            &same,
            exists
        ));
        // A run that recorded no namespace (an older salus-tune) is judged by
        // its heartbeat alone, and so is any run when this place has none.
        let mut old = owner("node1", 8, 1.0, false);
        old.pid_namespace = None;
        assert!(!owner_gone_here(&old, &same, exists));
        let unknown = Place {
            host: "node1".into(),
            pid_namespace: None,
        };
        assert!(!owner_gone_here(
            &owner("node1", 8, 1.0, false),
            &unknown,
            exists
        ));
    }

    #[test]
    fn this_process_has_a_place_with_a_namespace_on_linux() {
        let here = Place::here();
        assert!(!here.host.is_empty());
        if std::path::Path::new("/proc/self/ns/pid").exists() {
            let ns = here.pid_namespace.expect("a pid namespace on Linux");
            assert!(ns.contains("pid:["), "{ns}");
        }
    }
}
