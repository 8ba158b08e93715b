//! Heartbeats on their own timer, connection and short transaction.
//!
//! A run's heartbeat says to other processes that it and the trials it
//! holds are alive (`salus_runs.heartbeat`, Optuna's `trial_heartbeats`).
//! It must not wait behind the runner (a long proposal, a core that is
//! stopping) or behind the writer's queue (a batch waiting for a lock), so
//! it is a task of its own: every [`HEARTBEAT`] it writes one short
//! transaction, on a connection whose lock waits are short, and on failure
//! simply beats again at the next tick. A graceful stop keeps it beating
//! until the run has ended. Every writer transaction also beats for the
//! run (one `UPDATE` in a transaction that has the lock already): on
//! SQLite, where every process contends for one write lock, the task's own
//! transaction may wait its turn for seconds under load.
//!
//! Each trial's heartbeat is written only under its current claim; a claim
//! found lost is reported to the writer's lost set, so that a process back
//! from a pause learns within one tick which trials are no longer its.
//!
//! The gaps between its own heartbeats also tell a process when it was
//! itself held up (paused, or waiting on a database another process held):
//! then the others' heartbeats may have been held up by the same cause,
//! and it does not judge them dead by age until a whole liveness limit has
//! passed with its own heartbeats flowing ([`Beat::may_judge_others`]).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::AnyConnection;

use super::TrialId;
use super::claims::Claim;
use super::dialect::{begin_write, sql};
use crate::ids::RunId;

/// How often a run beats.
pub const HEARTBEAT: Duration = Duration::from_secs(2);

/// A gap between two of a run's own heartbeats longer than this says the
/// run was held up: two heartbeat periods, or half the liveness limit when
/// that is longer.
fn hiccup(limit_s: f64) -> Duration {
    (2 * HEARTBEAT).max(Duration::from_secs_f64(limit_s / 2.0))
}

/// The heartbeat task's record, for the run's `study_stop` event and the
/// chaos bench.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BeatStats {
    /// Heartbeats written.
    pub beats: u64,
    /// Ticks whose heartbeat could not be written (a lock held elsewhere).
    pub failures: u64,
    /// The longest time between two written heartbeats, in seconds.
    pub max_gap_s: f64,
}

#[derive(Default)]
struct BeatState {
    run_id: Option<RunId>,
    limit_s: f64,
    claims: Vec<Claim>,
    stop: bool,
    stats: BeatStats,
    last_ok: Option<Instant>,
    /// After a gap of its own: no judging others by age until then.
    quiet_until: Option<Instant>,
}

/// The handle of a run's heartbeat task. See the module docs.
#[derive(Clone)]
pub struct Beat {
    state: Arc<Mutex<BeatState>>,
}

impl Beat {
    /// Starts the task; it beats once [`start`](Self::start) names the run.
    pub(super) fn spawn(conn: AnyConnection, lost: Arc<Mutex<BTreeSet<TrialId>>>) -> Self {
        let beat = Beat {
            state: Arc::default(),
        };
        tokio::spawn(beat.clone().run(conn, lost));
        beat
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BeatState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Beats for run `run_id` from now on (its registration was its first
    /// heartbeat), with `limit_s` as the liveness limit.
    pub fn start(&self, run_id: RunId, limit_s: f64) {
        let mut s = self.lock();
        s.run_id = Some(run_id);
        s.limit_s = limit_s;
        s.last_ok = Some(Instant::now());
    }

    /// The trials the run holds now.
    pub fn set_claims(&self, mut claims: Vec<Claim>) {
        claims.sort();
        let mut s = self.lock();
        if s.claims != claims {
            s.claims = claims;
        }
    }

    /// Stops beating (the run has ended).
    pub fn stop(&self) {
        self.lock().stop = true;
    }

    pub fn stats(&self) -> BeatStats {
        self.lock().stats
    }

    /// The run to beat for in a writer's transaction: once
    /// [`start`](Self::start) named it, and only where the last heartbeat
    /// is half a period old (a busy writer commits far more often).
    pub(super) fn due(&self) -> Option<RunId> {
        let s = self.lock();
        let due = s.last_ok.is_none_or(|t| t.elapsed() >= HEARTBEAT / 2);
        s.run_id.filter(|_| !s.stop && due)
    }

    /// A heartbeat was written (by this task, or inside a writer's
    /// transaction): the gaps between them are what [`BeatStats`] and
    /// [`may_judge_others`](Self::may_judge_others) measure.
    pub(super) fn beaten(&self) {
        let now = Instant::now();
        let mut s = self.lock();
        s.stats.beats += 1;
        if let Some(last) = s.last_ok {
            let gap = now.duration_since(last).as_secs_f64();
            s.stats.max_gap_s = s.stats.max_gap_s.max(gap);
            if gap > hiccup(s.limit_s).as_secs_f64() {
                s.quiet_until = Some(now + Duration::from_secs_f64(s.limit_s));
            }
        }
        s.last_ok = Some(now);
    }

    /// Whether this process may judge other runs dead by the age of their
    /// heartbeats now: its own heartbeats flow (none is overdue by a
    /// `hiccup`), and a whole limit has passed since its own last gap
    /// longer than that.
    pub fn may_judge_others(&self) -> bool {
        let s = self.lock();
        s.last_ok.is_some_and(|t| t.elapsed() < hiccup(s.limit_s))
            && s.quiet_until.is_none_or(|q| Instant::now() >= q)
    }

    async fn run(self, mut conn: AnyConnection, lost: Arc<Mutex<BTreeSet<TrialId>>>) {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            let (run_id, claims) = {
                let s = self.lock();
                if s.stop {
                    break;
                }
                match s.run_id {
                    Some(id) => (id, s.claims.clone()),
                    None => continue,
                }
            };
            match beat(&mut conn, run_id, &claims).await {
                Ok(gone) => {
                    if failing {
                        eprintln!("heartbeats are written again");
                        failing = false;
                    }
                    if !gone.is_empty() {
                        lost.lock().unwrap_or_else(|e| e.into_inner()).extend(gone);
                    }
                    self.beaten();
                }
                Err(e) => {
                    self.lock().stats.failures += 1;
                    if !failing {
                        eprintln!(
                            "warning: heartbeat not written (retrying every {HEARTBEAT:?}): {e}"
                        );
                        failing = true;
                    }
                }
            }
        }
    }
}

/// The run's heartbeat, at `now` (by [`super::dialect::Clock::beat`]).
pub(super) async fn beat_run(
    conn: &mut AnyConnection,
    run_id: RunId,
    now: &str,
) -> sqlx::Result<()> {
    sqlx::query(&sql(
        conn,
        "UPDATE salus_runs SET heartbeat = ?::timestamp WHERE run_id = ?",
    ))
    .bind(now)
    .bind(run_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// One heartbeat: the run's, and each claimed trial's while its claim
/// holds. Returns the trials whose claim did not.
async fn beat(
    conn: &mut AnyConnection,
    run_id: RunId,
    claims: &[Claim],
) -> sqlx::Result<Vec<TrialId>> {
    let mut tx = begin_write(conn).await?;
    let now = super::dialect::clock(&mut tx).await?.beat;
    beat_run(&mut tx, run_id, &now).await?;
    let mut gone = Vec::new();
    for c in claims {
        let written = sqlx::query(&sql(
            &tx,
            "INSERT INTO trial_heartbeats (trial_id, heartbeat) SELECT ?, ?::timestamp \
             WHERE EXISTS (SELECT 1 FROM salus_claims WHERE trial_id = ? AND run_id = ? \
             AND attempt = ? AND released IS NULL) \
             ON CONFLICT (trial_id) DO UPDATE SET heartbeat = excluded.heartbeat",
        ))
        .bind(c.trial_id)
        .bind(&now)
        .bind(c.trial_id)
        .bind(c.run_id)
        .bind(c.attempt)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if written == 0 {
            gone.push(c.trial_id);
        }
    }
    tx.commit().await?;
    Ok(gone)
}
