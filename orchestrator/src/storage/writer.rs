//! The one writer: a task that owns a connection and applies writes in
//! short `BEGIN IMMEDIATE` transactions.
//!
//! Callers (the runner's thread) send [`WriteOp`]s over a channel. The task
//! takes whatever has queued up (up to [`MAX_BATCH`]) into one transaction,
//! so a burst of intermediate values costs one commit, and a transaction
//! never holds the write lock for long: readers on WAL never wait, and other
//! writers wait at most one short batch. Operations that need an answer
//! (a new trial's id, a flush) get it after their transaction commits.

use sqlx::{AnyConnection, Row};

use super::dialect::{Dialect, begin_write, sql};
use tokio::sync::{mpsc, oneshot};

use super::{StoredParam, TrialId, TrialNumber, TrialState};
use crate::error::{Error, Result, StorageFailure};

/// Most operations one transaction takes.
pub const MAX_BATCH: usize = 256;

/// A new trial's row in `salus_trials`.
#[derive(Debug, Clone, Default)]
pub struct TrialResources {
    pub device: String,
    pub lane: Option<i64>,
    pub persistent_bytes: i64,
    pub ephemeral_bytes: i64,
    pub shared_bytes: i64,
    pub total_iterations: i64,
}

/// A run of the Salus core.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    /// Where the process runs: its host name and pid.
    pub host: String,
    pub pid: i64,
    pub device: String,
    pub policy: String,
    pub lanes: i64,
    pub threads_per_lane: i64,
    pub budget_bytes: i64,
}

/// One lane's totals over a run.
#[derive(Debug, Clone, Default)]
pub struct LaneStats {
    pub lane: i64,
    pub iterations: i64,
    pub busy_s: f64,
    pub wall_s: f64,
    pub switches: i64,
    pub switch_mean_us: Option<f64>,
    pub switch_max_us: Option<f64>,
}

/// A trial ends in `state`, with its objective value when COMPLETE, its
/// totals, and the reason when it failed.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialEnd {
    pub trial_id: TrialId,
    pub state: TrialState,
    pub value: Option<f64>,
    pub iterations: i64,
    pub device_seconds: f64,
    pub fail_reason: Option<String>,
}

/// One write. See the module docs.
#[derive(Debug)]
pub enum WriteOp {
    /// A new RUNNING trial with its parameters, held by run `run_id`;
    /// answers `None` when the study already has `budget` trials (every
    /// trial holds a slot: finished, running or waiting), so that processes
    /// together never start more than the target.
    CreateTrial {
        study_id: i64,
        params: Vec<StoredParam>,
        /// The fixed knobs it runs with, a typed JSON object.
        fixed: String,
        run_id: i64,
        budget: u64,
        reply: oneshot::Sender<std::result::Result<Option<(TrialId, TrialNumber)>, StorageFailure>>,
    },
    /// Takes a WAITING trial for run `run_id`: answers whether this run got
    /// it (another process may have taken it first).
    ClaimWaiting {
        trial_id: TrialId,
        run_id: i64,
        /// Parameters to store with it, for an enqueued trial that has none.
        params: Vec<StoredParam>,
        reply: oneshot::Sender<std::result::Result<bool, StorageFailure>>,
    },
    /// Every trial of the study as it is now (other processes' included).
    ReadTrials {
        study_id: i64,
        reply: oneshot::Sender<std::result::Result<Vec<super::TrialRow>, StorageFailure>>,
    },
    /// The run ends cleanly: its trials are no longer its.
    EndRun {
        run_id: i64,
    },
    /// Takes the dashboard's unapplied commands for the study.
    TakeCommands {
        study_id: i64,
        reply: oneshot::Sender<std::result::Result<Vec<Command>, StorageFailure>>,
    },
    /// What the trial needs and where it runs.
    Resources {
        trial_id: TrialId,
        resources: TrialResources,
    },
    /// An intermediate value; a repeated step replaces the earlier value.
    Intermediate {
        trial_id: TrialId,
        step: i64,
        value: f64,
    },
    /// The trial ends (see [`TrialEnd`]).
    Finish(TrialEnd),
    /// A RUNNING trial goes back to WAITING (interrupted or orphaned), its
    /// intermediate values cleared so that its rerun starts clean.
    Requeue {
        trial_id: TrialId,
        /// Intermediate values up to this step stay (the checkpoint's).
        keep_steps: i64,
        /// The run seen holding it (`None`: none claimed it). Another
        /// process may have requeued and taken it since: then the trial is
        /// that process's, and nothing changes.
        held_by: Option<i64>,
    },
    /// Writes `bytes` to `path` (atomically: a temporary file and a rename)
    /// after the transaction holding the ops sent before it has committed.
    SaveFile {
        path: std::path::PathBuf,
        bytes: Vec<u8>,
    },
    /// Deletes `path` (if it is there) after the commit, in order with `SaveFile`.
    RemoveFile {
        path: std::path::PathBuf,
    },
    /// The run and the trials this process runs are alive (Optuna's
    /// `trial_heartbeats`, and `salus_runs.heartbeat`).
    Heartbeat {
        run_id: i64,
        trial_ids: Vec<TrialId>,
    },
    Event {
        study_id: i64,
        trial_id: Option<TrialId>,
        kind: &'static str,
        detail: String,
    },
    /// A run of the core starts; answers its `run_id` and its process
    /// index (the lowest no live run of the study has).
    StartRun {
        study_id: i64,
        run: RunInfo,
        reply: oneshot::Sender<std::result::Result<(i64, i64), StorageFailure>>,
    },
    /// Consecutive iterations of a trial on a lane.
    Segment {
        run_id: i64,
        lane: i64,
        trial_id: Option<TrialId>,
        start_s: f64,
        end_s: f64,
        iterations: i64,
    },
    Swap {
        run_id: i64,
        trial_id: Option<TrialId>,
        lane: i64,
        out: bool,
        bytes: i64,
        seconds: f64,
        time_s: f64,
    },
    LaneStats {
        run_id: i64,
        stats: LaneStats,
    },
    /// A trial's scheduling priority changed.
    Priority {
        trial_id: TrialId,
        priority: f64,
        rung: Option<i64>,
        reason: &'static str,
    },
    /// An external worker's auxiliary metrics at `step` and the user
    /// attributes it set.
    Extras {
        trial_id: TrialId,
        step: i64,
        extras: workers::ReportExtras,
    },
    /// A COMPLETE trial's model (`[study] keep`). With `best_of`, it is
    /// kept only if no other COMPLETE trial of the study is as good (by
    /// that direction, `true` maximising), and it replaces the one kept.
    KeepModel {
        trial_id: TrialId,
        architecture: String,
        weights: Vec<u8>,
        best_of: Option<bool>,
    },
    /// A trial system attribute (JSON value), replacing an earlier one.
    TrialAttr {
        trial_id: TrialId,
        key: &'static str,
        value_json: String,
    },
    /// Answers once everything sent before it is committed.
    Flush {
        reply: oneshot::Sender<std::result::Result<(), StorageFailure>>,
    },
}

/// The sending side, cheap to clone. Its methods block: call them from a
/// plain thread, not from async code.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::UnboundedSender<WriteOp>,
    url: String,
    stats: std::sync::Arc<std::sync::Mutex<WriterStats>>,
}

/// How long the writer's transactions took: a stall of the writer is a
/// transaction that waited on a lock or the disk.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WriterStats {
    pub batches: u64,
    pub max_ms: f64,
    /// Time in transactions, waiting for the write lock included.
    pub total_ms: f64,
    /// Transactions that took longer than 100 ms.
    pub over_100ms: u64,
}

impl Writer {
    /// Starts the writer task on the current tokio runtime.
    pub fn spawn(conn: AnyConnection, url: &str) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = std::sync::Arc::new(std::sync::Mutex::new(WriterStats::default()));
        let handle = tokio::spawn(run(conn, rx, stats.clone()));
        (
            Writer {
                tx,
                url: url.to_string(),
                stats,
            },
            handle,
        )
    }

    /// Transaction times so far.
    pub fn stats(&self) -> WriterStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gone(&self) -> Error {
        Error::storage(&self.url, StorageFailure::WriterStopped)
    }

    pub fn send(&self, op: WriteOp) -> Result<()> {
        self.tx.send(op).map_err(|_| self.gone())
    }

    /// Sends the op that `make` builds around a reply channel, and waits
    /// for the answer, which comes once the op is committed.
    fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<std::result::Result<T, StorageFailure>>) -> WriteOp,
    ) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        self.send(make(reply))?;
        rx.blocking_recv()
            .map_err(|_| self.gone())?
            .map_err(|failure| Error::storage(&self.url, failure))
    }

    /// Creates a RUNNING trial held by `run_id`; returns `(trial_id,
    /// number)`, or `None` when the study has `budget` trials already.
    pub fn create_trial(
        &self,
        study_id: i64,
        params: Vec<StoredParam>,
        fixed: String,
        run_id: i64,
        budget: u64,
    ) -> Result<Option<(TrialId, TrialNumber)>> {
        self.ask(|reply| WriteOp::CreateTrial {
            study_id,
            params,
            fixed,
            run_id,
            budget,
            reply,
        })
    }

    /// Takes the WAITING trial `trial_id` for `run_id`, unless another
    /// process took it first.
    pub fn claim_waiting(
        &self,
        trial_id: TrialId,
        run_id: i64,
        params: Vec<StoredParam>,
    ) -> Result<bool> {
        self.ask(|reply| WriteOp::ClaimWaiting {
            trial_id,
            run_id,
            params,
            reply,
        })
    }

    /// Every trial of the study as it is now.
    pub fn read_trials(&self, study_id: i64) -> Result<Vec<super::TrialRow>> {
        self.ask(|reply| WriteOp::ReadTrials { study_id, reply })
    }

    /// Records the start of a run of the core; returns its `run_id` and
    /// process index.
    pub fn start_run(&self, study_id: i64, run: RunInfo) -> Result<(i64, i64)> {
        self.ask(|reply| WriteOp::StartRun {
            study_id,
            run,
            reply,
        })
    }

    /// The commands the dashboard left for this study since the last call.
    pub fn take_commands(&self, study_id: i64) -> Result<Vec<Command>> {
        self.ask(|reply| WriteOp::TakeCommands { study_id, reply })
    }

    /// Waits until everything sent so far is committed; reports any write
    /// that failed since the last flush.
    pub fn flush(&self) -> Result<()> {
        self.ask(|reply| WriteOp::Flush { reply })
    }
}

enum Reply {
    Trial(
        oneshot::Sender<std::result::Result<Option<(TrialId, TrialNumber)>, StorageFailure>>,
        Option<(TrialId, TrialNumber)>,
    ),
    Run(
        oneshot::Sender<std::result::Result<(i64, i64), StorageFailure>>,
        (i64, i64),
    ),
    Claimed(
        oneshot::Sender<std::result::Result<bool, StorageFailure>>,
        bool,
    ),
    Trials(
        oneshot::Sender<std::result::Result<Vec<super::TrialRow>, StorageFailure>>,
        Vec<super::TrialRow>,
    ),
    Commands(
        oneshot::Sender<std::result::Result<Vec<Command>, StorageFailure>>,
        Vec<Command>,
    ),
    Flush(oneshot::Sender<std::result::Result<(), StorageFailure>>),
}

async fn run(
    mut conn: AnyConnection,
    mut rx: mpsc::UnboundedReceiver<WriteOp>,
    stats: std::sync::Arc<std::sync::Mutex<WriterStats>>,
) {
    let mut failure: Option<StorageFailure> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let mut applied = apply(&mut conn, &mut batch).await;
        // PostgreSQL may abort one of two transactions that lock the same
        // rows in opposite orders (a deadlock); nothing of it was applied
        // or answered, so it is applied again.
        let mut tries = 1;
        while tries < 8 && applied.as_ref().is_err_and(retryable) {
            tries += 1;
            // Apart, so that the two sides do not meet again at once.
            let jitter = u64::from(std::process::id()) % 7 + 3 * tries;
            tokio::time::sleep(std::time::Duration::from_millis(jitter)).await;
            applied = apply(&mut conn, &mut batch).await;
        }
        let ms = started.elapsed().as_secs_f64() * 1e3;
        {
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            s.batches += 1;
            s.max_ms = s.max_ms.max(ms);
            s.total_ms += ms;
            s.over_100ms += u64::from(ms > 100.0);
        }
        match applied {
            Ok(replies) => {
                for r in replies {
                    match r {
                        Reply::Trial(tx, ids) => drop(tx.send(Ok(ids))),
                        Reply::Run(tx, id) => drop(tx.send(Ok(id))),
                        Reply::Claimed(tx, got) => drop(tx.send(Ok(got))),
                        Reply::Trials(tx, rows) => drop(tx.send(Ok(rows))),
                        Reply::Commands(tx, c) => drop(tx.send(Ok(c))),
                        Reply::Flush(tx) => drop(tx.send(failure.take().map_or(Ok(()), Err))),
                    }
                }
            }
            Err(e) => {
                let msg = StorageFailure::RolledBack(std::sync::Arc::new(e));
                for op in batch {
                    match op {
                        WriteOp::CreateTrial { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::StartRun { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::ClaimWaiting { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::ReadTrials { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::TakeCommands { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::Flush { reply } => drop(reply.send(Err(msg.clone()))),
                        _ => failure = Some(msg.clone()),
                    }
                }
            }
        }
    }
}

/// A deadlock or a serialisation failure (SQLSTATE 40P01, 40001): the
/// transaction was rolled back whole, and may be run again.
fn retryable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("40P01" | "40001")))
}

/// What an op answers once its transaction has committed.
enum Answer {
    /// A created trial's `(trial_id, number)`, or none: the study is full.
    Ids(Option<(TrialId, TrialNumber)>),
    RunId((i64, i64)),
    Claimed(bool),
    Trials(Vec<super::TrialRow>),
    Commands(Vec<Command>),
}

/// Applies a batch in one `BEGIN IMMEDIATE` transaction; then saves the
/// files it covers, and only then answers (see the module docs).
async fn apply(
    conn: &mut AnyConnection,
    batch: &mut [WriteOp],
) -> std::result::Result<Vec<Reply>, sqlx::Error> {
    let mut tx = begin_write(conn).await?;
    let time = super::dialect::clock(&mut tx).await?;
    let mut answers = Vec::with_capacity(batch.len());
    for op in batch.iter() {
        answers.push(write_op(&mut tx, op, &time).await?);
    }
    tx.commit().await?;
    // Files only now: what they cover is durable.
    for op in batch.iter() {
        if let WriteOp::SaveFile { path, bytes } = op
            && let Err(e) = crate::checkpoint::write_atomic(path, bytes)
        {
            // A missing checkpoint costs a restart from an earlier one (or
            // from zero), never the run: the values stay committed.
            eprintln!("warning: checkpoint {} not saved: {e}", path.display());
        }
        if let WriteOp::RemoveFile { path } = op {
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(replies(batch, answers))
}

/// An op's reply channel, moved out; the op keeps a closed one.
fn take<T>(reply: &mut oneshot::Sender<T>) -> oneshot::Sender<T> {
    std::mem::replace(reply, oneshot::channel().0)
}

/// The answers, each to its op's reply channel. They go out only now that
/// their writes are durable.
fn replies(batch: &mut [WriteOp], answers: Vec<Option<Answer>>) -> Vec<Reply> {
    let mut replies = Vec::new();
    for (op, answer) in batch.iter_mut().zip(answers) {
        match (op, answer) {
            (WriteOp::CreateTrial { reply, .. }, Some(Answer::Ids(ids))) => {
                replies.push(Reply::Trial(take(reply), ids))
            }
            (WriteOp::ClaimWaiting { reply, .. }, Some(Answer::Claimed(got))) => {
                replies.push(Reply::Claimed(take(reply), got))
            }
            (WriteOp::ReadTrials { reply, .. }, Some(Answer::Trials(rows))) => {
                replies.push(Reply::Trials(take(reply), rows))
            }
            (WriteOp::StartRun { reply, .. }, Some(Answer::RunId(id))) => {
                replies.push(Reply::Run(take(reply), id))
            }
            (WriteOp::TakeCommands { reply, .. }, Some(Answer::Commands(c))) => {
                replies.push(Reply::Commands(take(reply), c))
            }
            (WriteOp::Flush { reply }, _) => replies.push(Reply::Flush(take(reply))),
            _ => {}
        }
    }
    replies
}

/// One op's statements, inside the batch's transaction.
async fn write_op(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    match op {
        WriteOp::CreateTrial { .. } => return create_trial(conn, op, time).await,
        WriteOp::ClaimWaiting {
            trial_id,
            run_id,
            params,
            ..
        } => {
            let got = super::claims::claim_waiting(conn, *trial_id, *run_id, time).await?;
            if got {
                insert_params(conn, *trial_id, params).await?;
            }
            return Ok(Some(Answer::Claimed(got)));
        }
        WriteOp::ReadTrials { study_id, .. } => {
            let rows = super::read::read_trials(conn, *study_id).await?;
            return Ok(Some(Answer::Trials(rows)));
        }
        WriteOp::EndRun { run_id } => super::claims::end_run(conn, *run_id, time).await?,
        WriteOp::Requeue { .. } => trial_state(conn, op, time).await?,
        WriteOp::Finish(end) => return finish_trial(conn, end, time).await,
        WriteOp::Extras {
            trial_id,
            step,
            extras,
        } => trial_extras(conn, *trial_id, *step, extras).await?,
        WriteOp::KeepModel { .. } => keep_model(conn, op, time).await?,
        WriteOp::Resources { .. }
        | WriteOp::Intermediate { .. }
        | WriteOp::Priority { .. }
        | WriteOp::TrialAttr { .. }
        | WriteOp::Heartbeat { .. } => trial_progress(conn, op, time).await?,
        WriteOp::StartRun { .. }
        | WriteOp::Segment { .. }
        | WriteOp::Swap { .. }
        | WriteOp::LaneStats { .. } => return run_telemetry(conn, op, time).await,
        WriteOp::Event {
            study_id,
            trial_id,
            kind,
            detail,
        } => event(&mut *conn, *study_id, *trial_id, kind, detail, time).await?,
        WriteOp::TakeCommands { study_id, .. } => return take_commands(conn, study_id, time).await,
        WriteOp::Flush { .. } | WriteOp::SaveFile { .. } | WriteOp::RemoveFile { .. } => {}
    }
    Ok(None)
}

/// A trial starts (again) or goes back to WAITING.
async fn trial_state(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    let WriteOp::Requeue {
        trial_id,
        keep_steps,
        held_by,
    } = op
    else {
        unreachable!("write_op routes only requeues here")
    };
    // Only a RUNNING trial still held by the run seen holding it goes back:
    // when two processes find the same orphan, the first requeues it, and
    // the second changes nothing, even after a third took it meanwhile.
    // PostgreSQL: the trial's row is locked first, so that the update's
    // own snapshot (taken after the lock) sees the latest claim.
    if Dialect::of(conn) == Dialect::Postgres {
        sqlx::query("SELECT trial_id FROM trials WHERE trial_id = $1 FOR NO KEY UPDATE")
            .bind(*trial_id)
            .execute(&mut *conn)
            .await?;
    }
    let changed = sqlx::query(&sql(
        &*conn,
        "UPDATE trials SET state = 'WAITING', datetime_start = NULL, datetime_complete = NULL \
         WHERE trial_id = ? AND state = 'RUNNING' \
         AND (SELECT run_id FROM salus_claims WHERE trial_id = ?) IS NOT DISTINCT FROM ?",
    ))
    .bind(*trial_id)
    .bind(*trial_id)
    .bind(*held_by)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(());
    }
    sqlx::query(&sql(
        &*conn,
        "DELETE FROM trial_intermediate_values WHERE trial_id = ? AND step > ?",
    ))
    .bind(*trial_id)
    .bind(*keep_steps)
    .execute(&mut *conn)
    .await?;
    sqlx::query(&sql(&*conn, "DELETE FROM salus_claims WHERE trial_id = ?"))
        .bind(*trial_id)
        .execute(&mut *conn)
        .await?;
    let detail = serde_json::json!({ "kept_steps": keep_steps }).to_string();
    study_event(&mut *conn, *trial_id, "trial_requeue", &detail, time).await
}

/// What a running trial records: resources, values, priorities,
/// attributes and heartbeats.
async fn trial_progress(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    match op {
        WriteOp::Resources {
            trial_id,
            resources: r,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_trials (trial_id, device, lane, persistent_bytes, ephemeral_bytes, shared_bytes, total_iterations) VALUES (?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (trial_id) DO UPDATE SET device = excluded.device, lane = excluded.lane, persistent_bytes = excluded.persistent_bytes, \
                 ephemeral_bytes = excluded.ephemeral_bytes, shared_bytes = excluded.shared_bytes, total_iterations = excluded.total_iterations, \
                 iterations = 0, device_seconds = 0, fail_reason = NULL",))
            .bind(*trial_id)
            .bind(&r.device)
            .bind(r.lane)
            .bind(r.persistent_bytes)
            .bind(r.ephemeral_bytes)
            .bind(r.shared_bytes)
            .bind(r.total_iterations)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::Intermediate {
            trial_id,
            step,
            value,
        } => {
            let (v, kind) = optuna_value(*value, true);
            sqlx::query(&sql(&*conn, "INSERT INTO trial_intermediate_values (trial_id, step, intermediate_value, intermediate_value_type) VALUES (?, ?, NULLIF(?::float8, 'NaN'), ?::trialintermediatevaluetype) \
                 ON CONFLICT (trial_id, step) DO UPDATE SET intermediate_value = excluded.intermediate_value, intermediate_value_type = excluded.intermediate_value_type",))
            .bind(*trial_id)
            .bind(*step)
            .bind(nan_for_null(v))
            .bind(kind)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::Priority {
            trial_id,
            priority,
            rung,
            reason,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_priority (trial_id, time, priority, rung, reason) VALUES (?, ?::timestamp, ?, ?, ?)"))
                .bind(*trial_id)
                .bind(time)
                .bind(*priority)
                .bind(*rung)
                .bind(*reason)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::TrialAttr {
            trial_id,
            key,
            value_json,
        } => {
            set_trial_attr(conn, Attrs::System, *trial_id, key, value_json).await?;
        }
        WriteOp::Heartbeat { run_id, trial_ids } => {
            sqlx::query(&sql(
                &*conn,
                "UPDATE salus_runs SET heartbeat = ?::timestamp WHERE run_id = ?",
            ))
            .bind(time)
            .bind(*run_id)
            .execute(&mut *conn)
            .await?;
            for id in trial_ids.iter() {
                sqlx::query(&sql(&*conn, "INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, ?::timestamp) ON CONFLICT (trial_id) DO UPDATE SET heartbeat = excluded.heartbeat"))
                    .bind(*id)
                    .bind(time)
                    .execute(&mut *conn)
                    .await?;
            }
        }
        _ => unreachable!("write_op routes only trial progress here"),
    }
    Ok(())
}

/// Auxiliary metrics (a curve row each, and the latest value as the user
/// attribute of that name) and user attributes, each replacing an earlier
/// one of its key.
async fn trial_extras(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    step: i64,
    extras: &workers::ReportExtras,
) -> std::result::Result<(), sqlx::Error> {
    for (name, v) in &extras.metrics {
        sqlx::query(&sql(
            &*conn,
            "INSERT INTO salus_metrics (trial_id, name, step, value) VALUES (?, ?, ?, ?) \
             ON CONFLICT (trial_id, name, step) DO UPDATE SET value = excluded.value",
        ))
        .bind(trial_id)
        .bind(name)
        .bind(step)
        .bind(v.is_finite().then_some(*v))
        .execute(&mut *conn)
        .await?;
        let latest = serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, Into::into);
        set_trial_attr(conn, Attrs::User, trial_id, name, &latest.to_string()).await?;
    }
    for (key, value_json) in &extras.attrs {
        set_trial_attr(conn, Attrs::User, trial_id, key, value_json).await?;
    }
    Ok(())
}

/// Optuna's two tables of trial attributes.
#[derive(Clone, Copy)]
pub(super) enum Attrs {
    User,
    System,
}

/// Sets a trial attribute (a JSON value), replacing an earlier one.
pub(super) async fn set_trial_attr(
    conn: &mut AnyConnection,
    table: Attrs,
    trial_id: TrialId,
    key: &str,
    value_json: &str,
) -> std::result::Result<(), sqlx::Error> {
    let table = match table {
        Attrs::User => "trial_user_attributes",
        Attrs::System => "trial_system_attributes",
    };
    sqlx::query(&sql(
        &*conn,
        &format!(
            "INSERT INTO {table} (trial_id, \"key\", value_json) VALUES (?, ?, ?) \
         ON CONFLICT (trial_id, \"key\") DO UPDATE SET value_json = excluded.value_json"
        ),
    ))
    .bind(trial_id)
    .bind(key)
    .bind(value_json)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// See [`WriteOp::KeepModel`].
async fn keep_model(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    let WriteOp::KeepModel {
        trial_id,
        architecture,
        weights,
        best_of,
    } = op
    else {
        unreachable!("only KeepModel comes here")
    };
    if let Some(maximize) = best_of {
        let as_good = if *maximize { ">=" } else { "<=" };
        let rivals: i64 = sqlx::query_scalar(&sql(&*conn, &format!(
            "SELECT COUNT(*) FROM trials me \
             JOIN trial_values mv ON mv.trial_id = me.trial_id AND mv.objective = 0 \
             JOIN trials t ON t.study_id = me.study_id AND t.trial_id <> me.trial_id AND t.state = 'COMPLETE' \
             JOIN trial_values v ON v.trial_id = t.trial_id AND v.objective = 0 \
             WHERE me.trial_id = ? AND v.value {as_good} mv.value"
        )))
        .bind(*trial_id)
        .fetch_one(&mut *conn)
        .await?;
        if rivals > 0 {
            return Ok(());
        }
        sqlx::query(&sql(&*conn, "DELETE FROM salus_models WHERE trial_id IN \
             (SELECT trial_id FROM trials WHERE study_id = (SELECT study_id FROM trials WHERE trial_id = ?))",))
        .bind(*trial_id)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(&sql(&*conn, "INSERT INTO salus_models (trial_id, created, architecture, weights) VALUES (?, ?::timestamp, ?, ?) \
         ON CONFLICT (trial_id) DO UPDATE SET created = excluded.created, \
         architecture = excluded.architecture, weights = excluded.weights",))
    .bind(*trial_id)
    .bind(time)
    .bind(architecture)
    .bind(weights.as_slice())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The core's runs, lane segments, swaps and lane totals.
async fn run_telemetry(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    match op {
        WriteOp::StartRun { study_id, run, .. } => {
            lock_study(conn, *study_id).await?;
            let index = super::claims::free_process_index(conn, *study_id).await?;
            let run_id: i64 = sqlx::query_scalar(&sql(&*conn, "INSERT INTO salus_runs (study_id, started_at, device, policy, lanes, threads_per_lane, budget_bytes, \
                 host, pid, process_index, heartbeat) VALUES (?, ?::timestamp, ?, ?, ?, ?, ?, ?, ?, ?, ?::timestamp) RETURNING run_id",))
            .bind(*study_id)
            .bind(time)
            .bind(&run.device)
            .bind(&run.policy)
            .bind(run.lanes)
            .bind(run.threads_per_lane)
            .bind(run.budget_bytes)
            .bind(&run.host)
            .bind(run.pid)
            .bind(index)
            .bind(time)
            .fetch_one(&mut *conn)
            .await?;
            return Ok(Some(Answer::RunId((run_id, index))));
        }
        WriteOp::Segment {
            run_id,
            lane,
            trial_id,
            start_s,
            end_s,
            iterations,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_lane_segments (run_id, lane, trial_id, start_s, end_s, iterations) VALUES (?, ?, ?, ?, ?, ?)"))
                .bind(*run_id)
                .bind(*lane)
                .bind(*trial_id)
                .bind(*start_s)
                .bind(*end_s)
                .bind(*iterations)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::Swap {
            run_id,
            trial_id,
            lane,
            out,
            bytes,
            seconds,
            time_s,
        } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_swaps (run_id, trial_id, lane, direction, bytes, seconds, time_s) VALUES (?, ?, ?, ?, ?, ?, ?)"))
                .bind(*run_id)
                .bind(*trial_id)
                .bind(*lane)
                .bind(if *out { "out" } else { "in" })
                .bind(*bytes)
                .bind(*seconds)
                .bind(*time_s)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::LaneStats { run_id, stats: s } => {
            sqlx::query(&sql(&*conn, "INSERT INTO salus_lane_stats (run_id, lane, iterations, busy_s, wall_s, switches, switch_mean_us, switch_max_us) VALUES (?, ?, ?, ?, ?, ?, NULLIF(?::float8, 'NaN'), NULLIF(?::float8, 'NaN')) \
                 ON CONFLICT (run_id, lane) DO UPDATE SET iterations = excluded.iterations, busy_s = excluded.busy_s, wall_s = excluded.wall_s, \
                 switches = excluded.switches, switch_mean_us = excluded.switch_mean_us, switch_max_us = excluded.switch_max_us",))
            .bind(*run_id)
            .bind(s.lane)
            .bind(s.iterations)
            .bind(s.busy_s)
            .bind(s.wall_s)
            .bind(s.switches)
            .bind(nan_for_null(s.switch_mean_us))
            .bind(nan_for_null(s.switch_max_us))
            .execute(&mut *conn)
            .await?;
        }
        _ => unreachable!("write_op routes only telemetry here"),
    }
    Ok(None)
}

/// A dashboard command for one trial: `pause`, `resume` or `prune`.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    pub trial_id: TrialId,
    pub action: String,
}

/// Optuna's encoding of a float: `(value, type)`, with non-finite values
/// stored as NULL (intermediate NaN) or by their type alone.
/// A nullable float as a statement binds it: NaN for NULL, turned back into
/// NULL by `NULLIF(?::float8, 'NaN')`. sqlx 0.8's `Any` driver sends a
/// `None::<f64>` to PostgreSQL as a `float4` NULL, which a statement prepared
/// with a `float8` in that place refuses ("incorrect binary data format");
/// SQLite stores a bound NaN as NULL itself.
fn nan_for_null(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

fn optuna_value(v: f64, intermediate: bool) -> (Option<f64>, &'static str) {
    if v.is_nan() {
        (None, if intermediate { "NAN" } else { "FINITE" })
    } else if v == f64::INFINITY {
        (None, "INF_POS")
    } else if v == f64::NEG_INFINITY {
        (None, "INF_NEG")
    } else {
        (Some(v), "FINITE")
    }
}

/// Records an event in `salus_events`.
pub(super) async fn event(
    conn: &mut AnyConnection,
    study_id: i64,
    trial_id: Option<TrialId>,
    kind: &str,
    detail: &str,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(&sql(conn, "INSERT INTO salus_events (study_id, trial_id, time, kind, detail) VALUES (?, ?, ?::timestamp, ?, ?)",))
    .bind(study_id)
    .bind(trial_id)
    .bind(time)
    .bind(kind)
    .bind(detail)
    .execute(conn)
    .await?;
    Ok(())
}

/// An event for a trial, its study looked up.
pub(super) async fn study_event(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    kind: &str,
    detail: &str,
    time: &str,
) -> std::result::Result<(), sqlx::Error> {
    let study_id: i64 = sqlx::query_scalar(&sql(
        &*conn,
        "SELECT study_id FROM trials WHERE trial_id = ?",
    ))
    .bind(trial_id)
    .fetch_one(&mut *conn)
    .await?;
    event(conn, study_id, Some(trial_id), kind, detail, time).await
}

/// A new RUNNING trial, numbered after the study's others (the write lock
/// of `BEGIN IMMEDIATE` makes the count and the insert one step), with its
/// parameters and its claim; none when the study has its budget of trials.
async fn create_trial(
    conn: &mut AnyConnection,
    op: &WriteOp,
    time: &str,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    let WriteOp::CreateTrial {
        study_id,
        params,
        fixed,
        run_id,
        budget,
        ..
    } = op
    else {
        unreachable!("only CreateTrial comes here")
    };
    let number = next_number(conn, *study_id).await?;
    if number.0 as u64 >= *budget {
        return Ok(Some(Answer::Ids(None)));
    }
    let trial_id: TrialId = sqlx::query_scalar(&sql(&*conn, "INSERT INTO trials (number, study_id, state, datetime_start) VALUES (?, ?, 'RUNNING', ?::timestamp) RETURNING trial_id"))
            .bind(number)
            .bind(*study_id)
            .bind(time)
            .fetch_one(&mut *conn)
            .await?;
    insert_params(conn, trial_id, params).await?;
    set_trial_attr(conn, Attrs::User, trial_id, super::study::FIXED_KEY, fixed).await?;
    super::claims::claim(conn, trial_id, *run_id, time).await?;
    event(
        &mut *conn,
        *study_id,
        Some(trial_id),
        "trial_start",
        &serde_json::json!({ "number": number }).to_string(),
        time,
    )
    .await?;
    Ok(Some(Answer::Ids(Some((trial_id, number)))))
}

/// Holds the study until the transaction ends, so that what a process
/// reads and then writes (the next trial number, a free process index) no
/// other process reads meanwhile. SQLite's `BEGIN IMMEDIATE` already holds
/// the database's write lock; PostgreSQL locks the study's row `FOR NO KEY
/// UPDATE`: it excludes the other processes' same lock, but not the key
/// share that every insert referencing the study (an event, a trial)
/// takes, which `FOR UPDATE` would wait on; two processes that had both
/// inserted an event would then each wait for the other, a deadlock.
async fn lock_study(
    conn: &mut AnyConnection,
    study_id: i64,
) -> std::result::Result<(), sqlx::Error> {
    if Dialect::of(conn) == Dialect::Postgres {
        sqlx::query("SELECT study_id FROM studies WHERE study_id = $1 FOR NO KEY UPDATE")
            .bind(study_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The number the study's next trial takes: its count of trials, the
/// study held ([`lock_study`]) so that two processes never take the same.
pub(super) async fn next_number(
    conn: &mut AnyConnection,
    study_id: i64,
) -> std::result::Result<TrialNumber, sqlx::Error> {
    lock_study(conn, study_id).await?;
    sqlx::query_scalar(&sql(conn, "SELECT COUNT(*) FROM trials WHERE study_id = ?"))
        .bind(study_id)
        .fetch_one(&mut *conn)
        .await
}

/// A trial's parameters; one it has already stays.
async fn insert_params(
    conn: &mut AnyConnection,
    trial_id: TrialId,
    params: &[StoredParam],
) -> std::result::Result<(), sqlx::Error> {
    for p in params.iter() {
        sqlx::query(&sql(&*conn, "INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) VALUES (?, ?, ?, ?) \
             ON CONFLICT (trial_id, param_name) DO NOTHING",))
        .bind(trial_id)
        .bind(&p.name)
        .bind(p.internal)
        .bind(&p.distribution_json)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// A trial ends: its state, Optuna value, fail reason and totals.
async fn finish_trial(
    conn: &mut AnyConnection,
    end: &TrialEnd,
    time: &str,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    let TrialEnd {
        trial_id,
        state,
        value,
        iterations,
        device_seconds,
        fail_reason,
    } = end;
    sqlx::query(&sql(&*conn, "UPDATE trials SET state = ?::trialstate, datetime_complete = ?::timestamp WHERE trial_id = ?"))
        .bind(state.as_str())
        .bind(time)
        .bind(*trial_id)
        .execute(&mut *conn)
        .await?;
    if let Some(value) = value {
        let (v, kind) = optuna_value(*value, false);
        sqlx::query(&sql(&*conn, "INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (?, 0, NULLIF(?::float8, 'NaN'), ?::trialvaluetype) \
                 ON CONFLICT (trial_id, objective) DO UPDATE SET value = excluded.value, value_type = excluded.value_type",))
            .bind(*trial_id)
            .bind(nan_for_null(v))
            .bind(kind)
            .execute(&mut *conn)
            .await?;
    }
    if let Some(reason) = fail_reason {
        sqlx::query(&sql(&*conn, "INSERT INTO trial_system_attributes (trial_id, \"key\", value_json) VALUES (?, 'fail_reason', ?) ON CONFLICT (trial_id, \"key\") DO UPDATE SET value_json = excluded.value_json"))
                .bind(*trial_id)
                .bind(serde_json::to_string(reason).unwrap())
                .execute(&mut *conn)
                .await?;
    }
    sqlx::query(&sql(&*conn, "UPDATE salus_trials SET iterations = ?, device_seconds = ?, fail_reason = ? WHERE trial_id = ?"))
            .bind(*iterations)
            .bind(*device_seconds)
            .bind(fail_reason.as_deref())
            .bind(*trial_id)
            .execute(&mut *conn)
            .await?;
    let kind = match state {
        TrialState::Complete => "trial_complete",
        TrialState::Pruned => "trial_pruned",
        _ => "trial_fail",
    };
    study_event(
        &mut *conn,
        *trial_id,
        kind,
        &serde_json::json!({ "state": state.as_str(), "value": value, "reason": fail_reason })
            .to_string(),
        time,
    )
    .await?;
    Ok(None)
}

/// The dashboard's unapplied commands for the study, marked applied, in
/// the order they were given.
async fn take_commands(
    conn: &mut AnyConnection,
    study_id: &i64,
    time: &str,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    let rows = sqlx::query(&sql(
        &*conn,
        "UPDATE salus_commands SET applied = ?::timestamp WHERE study_id = ? AND applied IS NULL \
             RETURNING command_id, trial_id, action",
    ))
    .bind(time)
    .bind(*study_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut cmds: Vec<(i64, Command)> = rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                Command {
                    trial_id: r.get(1),
                    action: r.get(2),
                },
            )
        })
        .collect();
    cmds.sort_by_key(|(id, _)| *id);
    Ok(Some(Answer::Commands(
        cmds.into_iter().map(|(_, c)| c).collect(),
    )))
}
