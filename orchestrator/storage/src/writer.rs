//! The one writer: a task that owns a connection and applies writes in
//! short transactions (`BEGIN IMMEDIATE` on SQLite).
//!
//! Callers (the runner's thread) send [`WriteOp`]s over a channel. The task
//! takes whatever has queued up (up to [`MAX_BATCH`]) into one transaction,
//! so a burst of intermediate values costs one commit, and a transaction
//! never holds the write lock for long: readers on WAL never wait, and other
//! writers wait at most one short batch. Operations that need an answer
//! (a new trial's id, a flush) get it after their transaction commits.
//!
//! **Fenced.** Every op for a trial carries its [`Claim`]; it lands only
//! while that claim is the trial's current one (`claims::holds`, checked
//! once per claim and transaction). An op whose claim was lost changes
//! nothing, and its trial goes into the writer's *lost* set, which the
//! runner reads to drop the trial ([`Writer::take_lost`]). A checkpoint is
//! staged in a file of the writer's own before the transaction and put in
//! place inside it, after the check, so that a run that lost its trial
//! never replaces or removes a peer's checkpoint.
//!
//! **Never stalled by a peer for good.** Reads ([`WriteOp::ReadTrials`]) go
//! through a second connection outside any write transaction. A write that
//! meets a lock held by another process (SQLite's busy, PostgreSQL's
//! `lock_timeout`, a deadlock) is rolled back whole and applied again after
//! a pause, for as long as it takes, with a line on stderr when the wait
//! is long. Heartbeats do not wait in this queue: the [`heartbeat`] task
//! beats on its own connection and timer.
//!
//! [`heartbeat`]: super::heartbeat

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sqlx::AnyConnection;
use tokio::sync::{mpsc, oneshot};

use super::claims::{self, Claim, Claimed, Requeuer};
use super::dialect::{Clock, begin_write};
use super::heartbeat::{Beat, BeatStats};
use super::statements;
use super::{StoredParam, TrialId, TrialNumber, TrialState};
use crate::dashboard::DashCommand;
use crate::error::{Error, Result, StorageFailure};
use crate::ids::{RunId, StudyId};

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
    /// Where the process runs: its host name, pid and pid namespace.
    pub host: String,
    pub pid: i64,
    pub pid_namespace: Option<String>,
    pub device: String,
    pub policy: String,
    pub lanes: i64,
    pub threads_per_lane: i64,
    pub budget_bytes: i64,
    /// The liveness limit, to tell which process indices are taken.
    pub liveness_s: f64,
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
    pub claim: Claim,
    pub state: TrialState,
    /// The first objective's value (the only one, mostly).
    pub value: Option<f64>,
    /// The other objectives' values, in order, for a study of several.
    pub more_values: Vec<f64>,
    /// Each constraint's value by its key (at most 0: it holds), stored
    /// as Optuna's `trial.set_constraint` stores one.
    pub constraints: Vec<(String, f64)>,
    pub iterations: i64,
    pub device_seconds: f64,
    pub fail_reason: Option<String>,
}

/// PBT's exploit, as [`WriteOp::Exploit`] stores it for its receiver.
#[derive(Debug, Clone, PartialEq)]
pub struct PbtExploit {
    pub study_id: StudyId,
    pub donor: TrialId,
    pub generation: i64,
    /// The receiver's report count and iterations at the exploit.
    pub step: i64,
    pub iteration: i64,
    /// Typed JSON objects of the parameters before and after, and the
    /// names drawn anew (a JSON array).
    pub old_params: String,
    pub new_params: String,
    pub resampled: String,
    /// The receiver's parameters from now on, as `trial_params` holds them.
    pub params: Vec<StoredParam>,
    /// This exploit's entry of the receiver's schedule (a JSON object),
    /// which follows the donor's stored schedule (`pbt:schedule`).
    pub schedule_entry: String,
    pub bytes: i64,
    pub seconds: f64,
    pub on_device: bool,
    /// The receiver's checkpoint of its new state (path, bytes), put in
    /// place in the same transaction as the rest, as `SaveFile` does.
    pub checkpoint: Option<(PathBuf, Vec<u8>)>,
    /// An external worker's: the step that checkpoint covers, recorded as
    /// `CheckpointSaved` records it.
    pub external_step: Option<i64>,
    /// Files the new checkpoint makes stale, removed once it is committed
    /// (see `CheckpointSaved`).
    pub superseded: Vec<PathBuf>,
}

/// A PBT member's arrival at an exploit point, as [`WriteOp::PbtPoint`]
/// stores it: what a process that shares the study needs to rank it and,
/// when it is a donor, to take its state.
#[derive(Debug, Clone, PartialEq)]
pub struct PbtPoint {
    pub study_id: StudyId,
    pub generation: i64,
    /// The member's report count and iterations there.
    pub step: i64,
    pub iteration: i64,
    /// Its latest value of the study's metric (`None`: diverged, or none).
    pub value: Option<f64>,
    /// Its parameters there, a typed JSON object.
    pub params: String,
    /// Its state at the point (path, content), put in place with the row.
    pub state: Option<(PathBuf, FileContent)>,
    /// The file of an earlier point that nobody can need any more.
    pub superseded: Option<PathBuf>,
}

/// What a write puts at a file's place.
#[derive(Debug, Clone, PartialEq)]
pub enum FileContent {
    /// Bytes, which the writer stages beside the place first.
    Bytes(Vec<u8>),
    /// A file already written (an external worker's own save, beside the
    /// place): synced, then renamed into place in the transaction. Large
    /// states never pass through this process's memory that way.
    Written(PathBuf),
}

/// A row of `salus_pbt_points`: a member at an exploit point.
#[derive(Debug, Clone, PartialEq)]
pub struct PbtPointRow {
    pub trial_id: TrialId,
    pub number: super::TrialNumber,
    pub generation: i64,
    pub step: i64,
    pub iteration: i64,
    pub value: Option<f64>,
    pub params: String,
    pub state_file: Option<PathBuf>,
}

/// A dashboard command for one trial, as a run takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TakenCommand {
    pub command_id: i64,
    pub trial_id: TrialId,
    /// `None`: an action this salus-tune does not know (a newer dashboard's).
    pub action: Option<DashCommand>,
    /// The action as stored.
    pub word: String,
}

/// A cap on a study's trials in flight over every process, which a new
/// trial must keep (a young study's start: the runner's `Ramp`). Checked
/// in the transaction that creates the trial, against the study's trials
/// as they are then, so that processes that each read the study a moment
/// ago cannot all start one.
#[derive(Debug, Clone)]
pub struct InFlightCap {
    /// The creating run's own trials in flight, as it counts them: the
    /// database counts only the others' RUNNING trials (those a pruner
    /// holds below a cut left out), since a run's own may be paused in
    /// ways the database does not show.
    pub here: u64,
    /// The cap when the study holds a number of trials.
    pub cap_at: CapAt,
}

/// The cap on a study's trials in flight as a function of how many trials
/// it holds; `None` where none applies.
#[derive(Clone)]
pub struct CapAt(pub Arc<dyn Fn(u64) -> Option<u64> + Send + Sync>);

impl CapAt {
    pub fn new(f: impl Fn(u64) -> Option<u64> + Send + Sync + 'static) -> Self {
        CapAt(Arc::new(f))
    }
}

impl std::fmt::Debug for CapAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapAt(..)")
    }
}

/// What [`WriteOp::CreateTrial`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewTrial {
    Created(Claim, TrialNumber),
    /// The study has its budget of trials: none was created.
    BudgetMet,
    /// None was created: with `trials` in the study, `elsewhere` trials
    /// in flight in other processes and the run's own fill the cap.
    AtCap {
        trials: u64,
        elsewhere: u64,
    },
}

/// One write. See the module docs.
#[derive(Debug)]
pub enum WriteOp {
    /// A new RUNNING trial with its parameters, held by run `run_id`;
    /// answers [`NewTrial::BudgetMet`] when the study already has `budget`
    /// trials (every trial holds a slot: finished, running or waiting), so
    /// that processes together never start more than the target, and
    /// [`NewTrial::AtCap`] when it would take the study's trials in flight
    /// past `cap`.
    CreateTrial {
        study_id: StudyId,
        params: Vec<StoredParam>,
        /// The fixed knobs it runs with, a typed JSON object.
        fixed: String,
        run_id: RunId,
        budget: u64,
        cap: Option<InFlightCap>,
        reply: oneshot::Sender<std::result::Result<NewTrial, StorageFailure>>,
    },
    /// Takes a WAITING trial for run `run_id`: answers its claim, or none
    /// when another process took it first.
    ClaimWaiting {
        trial_id: TrialId,
        run_id: RunId,
        /// Parameters to store with it, for an enqueued trial that has none.
        params: Vec<StoredParam>,
        reply: oneshot::Sender<std::result::Result<Option<Claimed>, StorageFailure>>,
    },
    /// Every trial of the study as it is now (other processes' included),
    /// read outside any write transaction once the ops before it committed.
    ReadTrials {
        study_id: StudyId,
        reply: oneshot::Sender<std::result::Result<Vec<super::TrialRow>, StorageFailure>>,
    },
    /// The study's PBT members at exploit point `generation` or later
    /// (every process's), read as `ReadTrials` is.
    ReadPbtPoints {
        study_id: StudyId,
        generation: i64,
        reply: oneshot::Sender<std::result::Result<Vec<PbtPointRow>, StorageFailure>>,
    },
    /// The run ends cleanly: its trials are no longer its.
    EndRun {
        run_id: RunId,
    },
    /// Takes the dashboard's unapplied commands for the trials run `run_id`
    /// holds, and those for finished trials (which nobody will apply).
    TakeCommands {
        study_id: StudyId,
        run_id: RunId,
        reply: oneshot::Sender<std::result::Result<Vec<TakenCommand>, StorageFailure>>,
    },
    /// What became of a command.
    CommandOutcome {
        command_id: i64,
        outcome: String,
    },
    /// What the trial needs and where it runs.
    Resources {
        claim: Claim,
        resources: TrialResources,
    },
    /// An intermediate value; a repeated step replaces the earlier value.
    Intermediate {
        claim: Claim,
        step: i64,
        value: f64,
    },
    /// The trial ends (see [`TrialEnd`]).
    Finish(TrialEnd),
    /// A RUNNING trial goes back to WAITING (interrupted or orphaned) under
    /// [`Requeuer`]'s rules, its intermediate values after `keep_steps`
    /// cleared so that its rerun starts clean.
    Requeue {
        by: Requeuer,
        keep_steps: i64,
    },
    /// Puts `bytes` at `path` (a built-in trial's checkpoint, covering
    /// `step`, as the file itself says): staged before the transaction,
    /// renamed into place inside it while the claim holds.
    SaveFile {
        claim: Claim,
        path: PathBuf,
        bytes: Vec<u8>,
        step: i64,
    },
    /// An external worker saved its checkpoint (in a file of its attempt
    /// and step of its own), covering the steps up to `step`. The
    /// `superseded` files (earlier checkpoints of the trial) are removed
    /// only after the commit: until then the stored record still names one
    /// of them.
    CheckpointSaved {
        claim: Claim,
        step: i64,
        superseded: Vec<PathBuf>,
    },
    /// Deletes `path` (if it is there) while the claim holds, in order
    /// with `SaveFile`.
    RemoveFile {
        claim: Claim,
        path: PathBuf,
    },
    Event {
        study_id: StudyId,
        trial_id: Option<TrialId>,
        kind: &'static str,
        detail: String,
    },
    /// A run of the core starts; answers its `run_id` and its process
    /// index (the lowest no live run of the study has).
    StartRun {
        study_id: StudyId,
        run: RunInfo,
        reply: oneshot::Sender<std::result::Result<(RunId, i64), StorageFailure>>,
    },
    /// Consecutive iterations of a trial on a lane.
    Segment {
        run_id: RunId,
        lane: i64,
        trial_id: Option<TrialId>,
        start_s: f64,
        end_s: f64,
        iterations: i64,
    },
    Swap {
        run_id: RunId,
        trial_id: Option<TrialId>,
        lane: i64,
        out: bool,
        bytes: i64,
        seconds: f64,
        time_s: f64,
        /// `memory` or `checkpoint`: where the state went.
        medium: &'static str,
    },
    LaneStats {
        run_id: RunId,
        stats: LaneStats,
    },
    /// A trial's scheduling priority changed.
    Priority {
        claim: Claim,
        priority: f64,
        rung: Option<i64>,
        reason: &'static str,
    },
    /// An external worker's auxiliary metrics at `step` and the user
    /// attributes it set.
    Extras {
        claim: Claim,
        step: i64,
        extras: training::ReportExtras,
    },
    /// A COMPLETE trial's model (`[study] keep`). With `best_of`, it is
    /// kept only if no other COMPLETE trial of the study is as good (by
    /// that direction, `true` maximising), and it replaces the one kept.
    KeepModel {
        claim: Claim,
        architecture: String,
        weights: Vec<u8>,
        best_of: Option<bool>,
    },
    /// A trial system attribute (JSON value), replacing an earlier one.
    TrialAttr {
        claim: Claim,
        key: &'static str,
        value_json: String,
    },
    /// PBT's exploit landed in the receiver (`claim`'s trial): its
    /// parameters become those it continues with, the exploit is a row of
    /// `salus_pbt_events`, and its schedule (`pbt:schedule`, a user
    /// attribute) becomes the donor's followed by this exploit's entry, in
    /// one transaction.
    Exploit {
        claim: Claim,
        exploit: Box<PbtExploit>,
    },
    /// A PBT member reached an exploit point while other processes share
    /// the study: a row of `salus_pbt_points`, and its state there put in
    /// place in the same transaction.
    PbtPoint {
        claim: Claim,
        point: Box<PbtPoint>,
    },
    /// A PBT member's schedule as it starts (`pbt:schedule`: its own
    /// values from step 0), unless it has one (a resumed member keeps its
    /// own).
    ScheduleStart {
        claim: Claim,
        schedule_json: String,
    },
    /// Answers once everything sent before it is committed.
    Flush {
        reply: oneshot::Sender<std::result::Result<(), StorageFailure>>,
    },
}

impl WriteOp {
    /// The checkpoint file an op puts in place, staged before its
    /// transaction: `SaveFile`'s, an exploit's, and a PBT point's, with
    /// what goes there.
    fn file(&self) -> Option<(&std::path::Path, Content<'_>)> {
        match self {
            WriteOp::SaveFile { path, bytes, .. } => Some((path, Content::Bytes(bytes))),
            WriteOp::Exploit { exploit, .. } => exploit
                .checkpoint
                .as_ref()
                .map(|(p, b)| (p.as_path(), Content::Bytes(b))),
            WriteOp::PbtPoint { point, .. } => point.state.as_ref().map(|(p, c)| {
                let content = match c {
                    FileContent::Bytes(b) => Content::Bytes(b),
                    FileContent::Written(from) => Content::Written(from),
                };
                (p.as_path(), content)
            }),
            _ => None,
        }
    }

    /// Files to remove once the op is committed (its claim held).
    fn superseded(&self) -> &[PathBuf] {
        match self {
            WriteOp::CheckpointSaved { superseded, .. } => superseded,
            WriteOp::Exploit { exploit, .. } => &exploit.superseded,
            _ => &[],
        }
    }

    /// The claim a trial's op lands under, for the fence.
    fn claim(&self) -> Option<&Claim> {
        match self {
            WriteOp::Resources { claim, .. }
            | WriteOp::Intermediate { claim, .. }
            | WriteOp::SaveFile { claim, .. }
            | WriteOp::CheckpointSaved { claim, .. }
            | WriteOp::RemoveFile { claim, .. }
            | WriteOp::Priority { claim, .. }
            | WriteOp::Extras { claim, .. }
            | WriteOp::KeepModel { claim, .. }
            | WriteOp::TrialAttr { claim, .. }
            | WriteOp::Exploit { claim, .. }
            | WriteOp::PbtPoint { claim, .. }
            | WriteOp::ScheduleStart { claim, .. }
            | WriteOp::Finish(TrialEnd { claim, .. }) => Some(claim),
            _ => None,
        }
    }
}

/// The sending side, cheap to clone. Its methods block: call them from a
/// plain thread, not from async code.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::UnboundedSender<WriteOp>,
    url: String,
    stats: Arc<Mutex<WriterStats>>,
    /// Trials whose claim this process lost (see the module docs).
    lost: Arc<Mutex<BTreeSet<TrialId>>>,
    beat: Beat,
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
    /// Transactions rolled back by a lock held elsewhere and applied again.
    pub retries: u64,
}

impl Writer {
    /// Starts the writer task on the current tokio runtime, with `reader`
    /// for its reads and `beat` (both to the same database) for the
    /// heartbeat task.
    pub fn spawn(
        conn: AnyConnection,
        reader: AnyConnection,
        beat: AnyConnection,
        url: &str,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Mutex::new(WriterStats::default()));
        let lost = Arc::new(Mutex::new(BTreeSet::new()));
        let beat = Beat::spawn(beat, lost.clone());
        let handle = tokio::spawn(run(
            conn,
            reader,
            rx,
            stats.clone(),
            lost.clone(),
            beat.clone(),
        ));
        (
            Writer {
                tx,
                url: url.to_string(),
                stats,
                lost,
                beat,
            },
            handle,
        )
    }

    /// Transaction times so far.
    pub fn stats(&self) -> WriterStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The heartbeat task's times so far.
    pub fn beat_stats(&self) -> BeatStats {
        self.beat.stats()
    }

    /// The heartbeat task (see [`Beat`]).
    pub fn beat(&self) -> &Beat {
        &self.beat
    }

    /// Trials found lost since the last call: another process holds them
    /// now, and nothing this process writes for them lands.
    pub fn take_lost(&self) -> BTreeSet<TrialId> {
        std::mem::take(&mut *self.lost.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether `trial_id` was found lost (and not yet taken by
    /// [`take_lost`](Self::take_lost)).
    pub fn is_lost(&self, trial_id: TrialId) -> bool {
        self.lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&trial_id)
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

    /// Creates a RUNNING trial held by `run_id`, unless the study has
    /// `budget` trials already or, under `cap`, as many in flight as the
    /// cap allows (see [`WriteOp::CreateTrial`]).
    pub fn create_trial(
        &self,
        study_id: StudyId,
        params: Vec<StoredParam>,
        fixed: String,
        run_id: RunId,
        budget: u64,
        cap: Option<InFlightCap>,
    ) -> Result<NewTrial> {
        self.ask(|reply| WriteOp::CreateTrial {
            study_id,
            params,
            fixed,
            run_id,
            budget,
            cap,
            reply,
        })
    }

    /// Takes the WAITING trial `trial_id` for `run_id`, unless another
    /// process took it first.
    pub fn claim_waiting(
        &self,
        trial_id: TrialId,
        run_id: RunId,
        params: Vec<StoredParam>,
    ) -> Result<Option<Claimed>> {
        self.ask(|reply| WriteOp::ClaimWaiting {
            trial_id,
            run_id,
            params,
            reply,
        })
    }

    /// Every trial of the study as it is now.
    pub fn read_trials(&self, study_id: StudyId) -> Result<Vec<super::TrialRow>> {
        self.ask(|reply| WriteOp::ReadTrials { study_id, reply })
    }

    /// The study's PBT members at exploit point `generation` or later.
    pub fn read_pbt_points(&self, study_id: StudyId, generation: i64) -> Result<Vec<PbtPointRow>> {
        self.ask(|reply| WriteOp::ReadPbtPoints {
            study_id,
            generation,
            reply,
        })
    }

    /// Records the start of a run of the core; returns its `run_id` and
    /// process index.
    pub fn start_run(&self, study_id: StudyId, run: RunInfo) -> Result<(RunId, i64)> {
        self.ask(|reply| WriteOp::StartRun {
            study_id,
            run,
            reply,
        })
    }

    /// The commands the dashboard left for the trials `run_id` holds since
    /// the last call.
    pub fn take_commands(&self, study_id: StudyId, run_id: RunId) -> Result<Vec<TakenCommand>> {
        self.ask(|reply| WriteOp::TakeCommands {
            study_id,
            run_id,
            reply,
        })
    }

    /// Waits until everything sent so far is committed; reports any write
    /// that failed since the last flush.
    pub fn flush(&self) -> Result<()> {
        self.ask(|reply| WriteOp::Flush { reply })
    }
}

enum Reply {
    Trial(
        oneshot::Sender<std::result::Result<NewTrial, StorageFailure>>,
        NewTrial,
    ),
    Run(
        oneshot::Sender<std::result::Result<(RunId, i64), StorageFailure>>,
        (RunId, i64),
    ),
    Claimed(
        oneshot::Sender<std::result::Result<Option<Claimed>, StorageFailure>>,
        Option<Claimed>,
    ),
    Commands(
        oneshot::Sender<std::result::Result<Vec<TakenCommand>, StorageFailure>>,
        Vec<TakenCommand>,
    ),
    Flush(oneshot::Sender<std::result::Result<(), StorageFailure>>),
}

/// A wait for a lock held elsewhere longer than this is said on stderr.
const LONG_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

async fn run(
    mut conn: AnyConnection,
    mut reader: AnyConnection,
    mut rx: mpsc::UnboundedReceiver<WriteOp>,
    stats: Arc<Mutex<WriterStats>>,
    lost: Arc<Mutex<BTreeSet<TrialId>>>,
    beat: Beat,
) {
    let mut failure: Option<StorageFailure> = None;
    // A read that ended the last batch: served once that batch committed.
    let mut carried: Option<WriteOp> = None;
    loop {
        let first = match carried.take() {
            Some(op) => op,
            None => match rx.recv().await {
                Some(op) => op,
                None => break,
            },
        };
        let first = match first {
            WriteOp::ReadTrials { study_id, reply } => {
                let rows = super::read::read_trials(&mut reader, study_id).await;
                drop(reply.send(rows.map_err(|e| StorageFailure::Sql(Arc::new(e)))));
                continue;
            }
            WriteOp::ReadPbtPoints {
                study_id,
                generation,
                reply,
            } => {
                let rows = super::read::read_pbt_points(&mut reader, study_id, generation).await;
                drop(reply.send(rows.map_err(|e| StorageFailure::Sql(Arc::new(e)))));
                continue;
            }
            op => op,
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op @ (WriteOp::ReadTrials { .. } | WriteOp::ReadPbtPoints { .. })) => {
                    carried = Some(op);
                    break;
                }
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let mut applied = apply(&mut conn, &mut batch, &lost, &beat).await;
        let mut tries = 0u64;
        let mut said = false;
        while applied.as_ref().is_err_and(retryable) {
            tries += 1;
            if !said && started.elapsed() > LONG_WAIT {
                said = true;
                eprintln!(
                    "waiting for the database: another process has held a lock for {:.0} s (a paused or stopped process?); retrying",
                    started.elapsed().as_secs_f64()
                );
            }
            // Apart, so that two sides do not meet again at once.
            let jitter = u64::from(std::process::id()) % 7 + 3 * tries.min(30);
            tokio::time::sleep(std::time::Duration::from_millis(jitter)).await;
            applied = apply(&mut conn, &mut batch, &lost, &beat).await;
        }
        if said {
            eprintln!(
                "the database answered again after {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        let ms = started.elapsed().as_secs_f64() * 1e3;
        {
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            s.batches += 1;
            s.max_ms = s.max_ms.max(ms);
            s.total_ms += ms;
            s.over_100ms += u64::from(ms > 100.0);
            s.retries += tries;
        }
        match applied {
            Ok(replies) => {
                for r in replies {
                    match r {
                        Reply::Trial(tx, ids) => drop(tx.send(Ok(ids))),
                        Reply::Run(tx, id) => drop(tx.send(Ok(id))),
                        Reply::Claimed(tx, got) => drop(tx.send(Ok(got))),
                        Reply::Commands(tx, c) => drop(tx.send(Ok(c))),
                        Reply::Flush(tx) => drop(tx.send(failure.take().map_or(Ok(()), Err))),
                    }
                }
            }
            Err(e) => {
                let msg = StorageFailure::RolledBack(Arc::new(e));
                for op in batch {
                    match op {
                        WriteOp::CreateTrial { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::StartRun { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::ClaimWaiting { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::TakeCommands { reply, .. } => drop(reply.send(Err(msg.clone()))),
                        WriteOp::Flush { reply } => drop(reply.send(Err(msg.clone()))),
                        _ => failure = Some(msg.clone()),
                    }
                }
            }
        }
    }
}

/// A transaction rolled back whole by a lock another process holds, which
/// may be applied again: SQLite's busy or locked; PostgreSQL's deadlock,
/// serialisation failure or `lock_timeout` (SQLSTATE 40P01, 40001, 55P03).
pub(super) fn retryable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(
        d.code().as_deref(),
        Some("40P01" | "40001" | "55P03" | "5" | "6" | "261" | "517")
    ))
}

/// What an op answers once its transaction has committed.
pub(super) enum Answer {
    /// What [`WriteOp::CreateTrial`] did.
    Ids(NewTrial),
    RunId((RunId, i64)),
    Claimed(Option<Claimed>),
    Commands(Vec<TakenCommand>),
}

/// What an op puts at a file's place ([`WriteOp::file`]).
#[derive(Clone, Copy)]
enum Content<'a> {
    Bytes(&'a [u8]),
    Written(&'a std::path::Path),
}

/// A checkpoint's content, in a temporary file beside its place, synced:
/// the transaction then only renames it. Bytes go to a file of this
/// process's; a file already written is that file.
fn stage(path: &std::path::Path, content: Content<'_>) -> std::io::Result<PathBuf> {
    match content {
        Content::Bytes(bytes) => {
            let tmp = super::files::staging_path(path);
            super::files::write_synced(&tmp, bytes)?;
            Ok(tmp)
        }
        Content::Written(from) => {
            std::fs::File::open(from)?.sync_all()?;
            Ok(from.to_path_buf())
        }
    }
}

/// Puts a staged checkpoint in place, while the claim holds; the folder is
/// synced after the commit (see `apply`), not under the write lock.
/// `replaced`: the paths this transaction has put a file at already. Only
/// the first keeps the file before it as the previous one: that is the
/// committed checkpoint a crash before the commit must leave. A later
/// file of the same batch replaces the first without touching it (two
/// checkpoints of one trial in one batch once left two uncommitted ones,
/// and a `kill -9` then lost the trial's progress).
fn put_in_place(
    staged: Option<&std::path::Path>,
    file: Option<(&std::path::Path, Content<'_>)>,
    replaced: &mut BTreeSet<PathBuf>,
) {
    let (Some(tmp), Some((path, _))) = (staged, file) else {
        return;
    };
    let put = match replaced.insert(path.to_path_buf()) {
        true => super::files::replace_keeping_previous(tmp, path),
        false => std::fs::rename(tmp, path),
    };
    if let Err(e) = put {
        eprintln!("warning: checkpoint {} not saved: {e}", path.display());
    }
}

/// Applies a batch in one transaction: stages its checkpoints, then runs
/// each op whose claim (if it has one) holds, checkpoints put in place and
/// files removed inside the transaction; answers only once it committed.
async fn apply(
    conn: &mut AnyConnection,
    batch: &mut [WriteOp],
    lost: &Mutex<BTreeSet<TrialId>>,
    beat: &Beat,
) -> std::result::Result<Vec<Reply>, sqlx::Error> {
    // A checkpoint that cannot be staged costs a restart from an earlier
    // one (or from zero), never the run: the values stay committed.
    let staged: Vec<Option<PathBuf>> = batch
        .iter()
        .map(|op| {
            let (path, content) = op.file()?;
            stage(path, content)
                .map_err(|e| eprintln!("warning: checkpoint {} not saved: {e}", path.display()))
                .ok()
        })
        .collect();
    let result = apply_staged(conn, batch, &staged, lost, beat).await;
    let (result, superseded) = match result {
        Ok((replies, superseded)) => (Ok(replies), superseded),
        Err(e) => (Err(e), Vec::new()),
    };
    // A staged file that is gone was put in place: the checkpoint it
    // replaced goes with the commit, or comes back with a rollback (once
    // per path: a second file of one path kept no previous one).
    let mut settled: BTreeSet<&std::path::Path> = BTreeSet::new();
    for (op, tmp) in batch.iter().zip(&staged) {
        if let (Some((path, _)), Some(tmp)) = (op.file(), tmp)
            && !tmp.exists()
            && settled.insert(path)
        {
            super::files::settled(path, result.is_ok());
        }
    }
    // What was not put in place (a lost claim, a rollback) goes.
    for tmp in staged.iter().flatten() {
        let _ = std::fs::remove_file(tmp);
    }
    // Renames made durable, once per folder.
    if result.is_ok() {
        let mut synced: Vec<&std::path::Path> = Vec::new();
        for op in batch.iter() {
            if let Some((path, _)) = op.file()
                && let Some(dir) = path.parent()
                && !synced.contains(&dir)
            {
                synced.push(dir);
                let _ = super::files::sync_folder_of(path);
            }
        }
    }
    // Stale checkpoints go once the record naming their successor is
    // durable.
    for path in superseded {
        let _ = std::fs::remove_file(path);
    }
    result
}

async fn apply_staged(
    conn: &mut AnyConnection,
    batch: &mut [WriteOp],
    staged: &[Option<PathBuf>],
    lost: &Mutex<BTreeSet<TrialId>>,
    beat: &Beat,
) -> std::result::Result<(Vec<Reply>, Vec<PathBuf>), sqlx::Error> {
    let mut tx = begin_write(conn).await?;
    let clock = super::dialect::clock(&mut tx).await?;
    // A transaction that has the lock beats for the run too: under
    // contention for SQLite's one write lock, the heartbeat task's own
    // transaction may wait its turn for long.
    let run_id = beat.due();
    if let Some(run_id) = run_id {
        super::heartbeat::beat_run(&mut tx, run_id, &clock.beat).await?;
    }
    let mut answers = Vec::with_capacity(batch.len());
    let mut held: HashMap<Claim, bool> = HashMap::new();
    let mut lost_now: BTreeSet<TrialId> = BTreeSet::new();
    let mut replaced: BTreeSet<PathBuf> = BTreeSet::new();
    let mut superseded: Vec<PathBuf> = Vec::new();
    for (op, tmp) in batch.iter().zip(staged) {
        if let Some(claim) = op.claim() {
            let step = match op {
                WriteOp::Intermediate { step, .. } => Some(*step),
                _ => None,
            };
            // A step's record of its writer is written under the fence;
            // where the claim is not checked yet, it is the check.
            let holds = match (held.get(claim), step) {
                (Some(&true), Some(step)) => {
                    statements::record_write(&mut tx, claim, "step", step).await?;
                    true
                }
                (Some(&h), _) => h,
                (None, Some(step)) => {
                    statements::record_write_fenced(&mut tx, claim, "step", step).await?
                }
                (None, None) => claims::holds(&mut tx, claim).await?,
            };
            held.insert(*claim, holds);
            if !holds {
                lost_now.insert(claim.trial_id);
                answers.push(None);
                continue;
            }
        }
        answers.push(write_op(&mut tx, op, tmp.as_deref(), &mut replaced, &clock).await?);
        superseded.extend_from_slice(op.superseded());
        // A holder's requeue ends its claim: later ops under it are fenced.
        if let WriteOp::Requeue {
            by: Requeuer::Holder(claim),
            ..
        } = op
        {
            held.insert(*claim, false);
        }
    }
    tx.commit().await?;
    if run_id.is_some() {
        beat.beaten();
    }
    if !lost_now.is_empty() {
        lost.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(lost_now);
    }
    Ok((replies(batch, answers), superseded))
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

/// One op's statements, inside the batch's transaction, its claim (if it
/// has one) known to hold. `staged`: a `SaveFile`'s staged checkpoint;
/// `replaced`: see [`put_in_place`].
async fn write_op(
    conn: &mut AnyConnection,
    op: &WriteOp,
    staged: Option<&std::path::Path>,
    replaced: &mut BTreeSet<PathBuf>,
    clock: &Clock,
) -> std::result::Result<Option<Answer>, sqlx::Error> {
    let time = clock.local.as_str();
    match op {
        WriteOp::CreateTrial { .. } => return statements::create_trial(conn, op, clock).await,
        WriteOp::ClaimWaiting {
            trial_id,
            run_id,
            params,
            ..
        } => {
            let got = claims::claim_waiting(conn, *trial_id, *run_id, clock).await?;
            if got.is_some() {
                statements::insert_params(conn, *trial_id, params).await?;
            }
            return Ok(Some(Answer::Claimed(got)));
        }
        WriteOp::ReadTrials { .. } | WriteOp::ReadPbtPoints { .. } => {
            unreachable!("reads are served outside transactions")
        }
        WriteOp::EndRun { run_id } => claims::end_run(conn, *run_id, time).await?,
        WriteOp::Requeue { by, keep_steps } => {
            claims::requeue(conn, by, *keep_steps, clock).await?;
        }
        WriteOp::Finish(end) => statements::finish_trial(conn, end, time).await?,
        WriteOp::Extras {
            claim,
            step,
            extras,
        } => statements::trial_extras(conn, claim.trial_id, *step, extras).await?,
        WriteOp::KeepModel { .. } => statements::keep_model(conn, op, time).await?,
        WriteOp::Exploit { claim, exploit } => {
            statements::pbt_exploit(conn, claim.trial_id, exploit, time).await?;
            if let Some(step) = exploit.external_step {
                statements::record_checkpoint(conn, claim, step).await?;
            }
            put_in_place(staged, op.file(), replaced)
        }
        WriteOp::ScheduleStart {
            claim,
            schedule_json,
        } => statements::schedule_start(conn, claim.trial_id, schedule_json).await?,
        WriteOp::PbtPoint { claim, point } => {
            statements::pbt_point(conn, claim.trial_id, point, time).await?;
            put_in_place(staged, op.file(), replaced);
            if let Some(old) = &point.superseded {
                let _ = std::fs::remove_file(old);
            }
        }
        WriteOp::Resources { .. }
        | WriteOp::Intermediate { .. }
        | WriteOp::Priority { .. }
        | WriteOp::TrialAttr { .. } => statements::trial_progress(conn, op, time).await?,
        WriteOp::StartRun { .. }
        | WriteOp::Segment { .. }
        | WriteOp::Swap { .. }
        | WriteOp::LaneStats { .. } => return statements::run_telemetry(conn, op, clock).await,
        WriteOp::Event {
            study_id,
            trial_id,
            kind,
            detail,
        } => statements::event(&mut *conn, *study_id, *trial_id, kind, detail, time).await?,
        WriteOp::TakeCommands {
            study_id, run_id, ..
        } => return statements::take_commands(conn, *study_id, *run_id, time).await,
        WriteOp::CommandOutcome {
            command_id,
            outcome,
        } => statements::command_outcome(conn, *command_id, outcome).await?,
        WriteOp::SaveFile { .. } => put_in_place(staged, op.file(), replaced),
        WriteOp::CheckpointSaved { claim, step, .. } => {
            statements::record_checkpoint(conn, claim, *step).await?
        }
        WriteOp::RemoveFile { path, .. } => {
            let _ = std::fs::remove_file(path);
            let _ = std::fs::remove_file(super::files::previous_of(path));
        }
        WriteOp::Flush { .. } => {}
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two checkpoints of one trial in one transaction, then a crash
    /// before the commit: the file left beside the current one must be
    /// the committed checkpoint, not the first of the two uncommitted ones
    /// (resume takes the furthest file the stored curve covers, and with
    /// both uncommitted it found none: a `kill -9` lost the trial's
    /// progress). A rollback brings the committed one back.
    #[test]
    fn a_second_file_for_one_path_in_a_transaction_keeps_the_committed_previous() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trial-1.state");
        std::fs::write(&path, b"committed").unwrap();
        let prev = super::super::files::previous_of(&path);
        let put = |bytes: &[u8], replaced: &mut BTreeSet<PathBuf>| {
            let tmp = stage(&path, Content::Bytes(bytes)).unwrap();
            put_in_place(Some(&tmp), Some((&path, Content::Bytes(bytes))), replaced);
        };
        let mut replaced = BTreeSet::new();
        put(b"step 3", &mut replaced);
        put(b"step 4", &mut replaced);
        // The process dies here: what a resume reads.
        assert_eq!(std::fs::read(&path).unwrap(), b"step 4");
        assert_eq!(std::fs::read(&prev).unwrap(), b"committed");
        // Rolled back instead: the committed one is current again.
        super::super::files::settled(&path, false);
        assert_eq!(std::fs::read(&path).unwrap(), b"committed");
        assert!(!prev.exists());
        // A new transaction keeps the committed one again, and its commit
        // drops it.
        let mut replaced = BTreeSet::new();
        put(b"step 5", &mut replaced);
        assert_eq!(std::fs::read(&prev).unwrap(), b"committed");
        super::super::files::settled(&path, true);
        assert_eq!(std::fs::read(&path).unwrap(), b"step 5");
        assert!(!prev.exists());
    }
}
