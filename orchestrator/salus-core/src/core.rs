//! The executor: lanes that run jobs one iteration at a time.
//!
//! Each lane is a host thread that owns a `training::Lane` (an execution
//! context and its arena). At every iteration boundary it takes the core's
//! lock, asks [`policy::next`] which of its runnable jobs goes next, takes
//! that job out of the table, releases the lock, runs one `step`, and
//! gives the job back with what happened. Between steps a job belongs to
//! the table, so the scheduler may pause it, resume it, swap it out or
//! prune it at any boundary.
//!
//! **Streaks.** Waiting for each iteration to finish before deciding the
//! next one leaves the device idle for the host's bookkeeping and launch:
//! on an H200 that cost a 94 us iteration +57%. So when a step reports
//! nothing and ends nothing, and the policy would pick the same job again
//! (`State::keeps`), the lane queues the job's next iteration first and
//! then waits for the one before it ([`Lane::sync_previous`]); the job stays
//! with the lane meanwhile. A pause, prune, swap-out or stop, or another
//! job's turn, ends the streak at the next boundary, as before. When the
//! next job is resident and ops are queued (CUDA), the lane *hands over*:
//! it queues the next job's first iteration, then waits for the last one's
//! (`State::hand_over`); otherwise it syncs fully. Either way a job goes
//! back to the table only with nothing of it queued.
//!
//! **Work stealing.** A job stays on the lane that admitted it, but a lane
//! left with nothing to run takes a job from the lane with the most work
//! ([`policy::steal`]: two or more jobs, the one its policy runs next).
//! The job stays resident; only its lane changes (a new `Admitted`). A lane
//! that returns a job while it holds another wakes the idle lanes for
//! this. Without it, the end of a digits study on 2 lanes ran one lane
//! interleaving two long trials while the other sat idle for a quarter of
//! the study.
//!
//! Admission follows [`MemoryLedger`]: a submitted job waits until
//! [`place`] finds it a lane and memory. A new job's state starts on the
//! host, so admitting it is a swap-in, done by its lane before its first
//! step. When a waiting job does not fit and a paused job of lower priority
//! is resident, that job is swapped out first (the lowest priority first).
//!
//! Everything observable leaves as a [`CoreEvent`] on a channel: reports,
//! endings, swaps, and the per-lane timeline (segments of consecutive
//! iterations of one job, and switch latencies: the time from one live
//! job's last iteration to a resident one's next; a job's end or a swap-in
//! is not a switch).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use kernels::Backend;
use training::{
    Footprint, Job, Lane, MemberOutcome, MemberStep, NewValues, Report, StepOutcome, StoredState,
    SwapMedium, WorkerError, lane::GroupShape,
};

use super::ledger::{LaneLoad, LedgerSnapshot, MemoryLedger, Placement, place};
use super::policy::{self, JobState, Policy};
use super::{JobId, LaneId};

mod lane;
use lane::lane_main;

/// How the core runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoreConfig {
    pub policy: Policy,
    pub lanes: usize,
    /// Intra-op threads per lane (`lanes x threads <= cores` on the CPU).
    pub threads_per_lane: usize,
    /// Threads a lane may widen to while other lanes sit idle (its pool's
    /// size): a trial left alone at a study's end gets the idle lanes'
    /// cores. `threads_per_lane` turns it off; ignored by CUDA.
    pub max_threads_per_lane: usize,
    /// Device bytes the core may use.
    pub budget: u64,
    /// Hold a job after each report until [`SalusCore::release`] (or a
    /// pause or prune): early-stopping decisions then take effect exactly at
    /// the report boundary.
    pub hold_at_reports: bool,
    /// Export a lone trial's state after each report, as
    /// [`CoreEvent::Checkpoint`], for crash-safe resumption.
    pub checkpoints: bool,
    /// Export a trial's state when it finishes, as [`CoreEvent::FinalState`]
    /// (before its `Finished`), so that its model can be kept.
    pub keep_final: bool,
    /// Let trials replay captured iterations (CUDA graphs) on the lanes;
    /// ignored where the backend has none.
    pub graphs: bool,
    /// When trials run their optimizer steps (the same bits either way);
    /// `None`: the backend's default ([`training::OptimizerOrder::default_for`]).
    pub optimizer_order: Option<training::OptimizerOrder>,
}

impl CoreConfig {
    /// Lanes and threads for `cores` CPU cores: `lanes` lanes (at most one
    /// per core), sharing the cores between them.
    /// Lanes on a GPU when the study does not say: streams enough to
    /// overlap small trials' launches without thrashing the device.
    pub const CUDA_LANES: usize = 4;

    /// On CUDA each lane is one stream driven by one host thread.
    pub fn cuda(policy: Policy, lanes: usize, budget: u64) -> Self {
        CoreConfig {
            policy,
            lanes: lanes.max(1),
            threads_per_lane: 1,
            max_threads_per_lane: 1,
            budget,
            hold_at_reports: false,
            checkpoints: false,
            keep_final: false,
            graphs: false,
            optimizer_order: None,
        }
    }

    /// `lanes` lanes on a device of `kind`: on the CPU they share this
    /// machine's cores; on CUDA each is a stream.
    pub fn for_device(
        kind: kernels::DeviceKind,
        policy: Policy,
        lanes: usize,
        budget: u64,
    ) -> Self {
        match kind {
            kernels::DeviceKind::Cpu => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                Self::cpu(policy, lanes, cores, budget)
            }
            kernels::DeviceKind::Cuda(_) => Self::cuda(policy, lanes, budget),
        }
    }

    pub fn cpu(policy: Policy, lanes: usize, cores: usize, budget: u64) -> Self {
        let lanes = lanes.clamp(1, cores.max(1));
        CoreConfig {
            policy,
            lanes,
            threads_per_lane: (cores / lanes).max(1),
            // A lane's pool holds a thread for each core it may borrow,
            // but no more than four lanes' worth: 64 lanes of one thread
            // would otherwise start 4,096 threads.
            max_threads_per_lane: cores.min(4 * cores / lanes).max(1),
            budget,
            hold_at_reports: false,
            checkpoints: false,
            keep_final: false,
            graphs: false,
            optimizer_order: None,
        }
    }
}

/// What the core reports.
#[derive(Debug)]
pub enum CoreEvent {
    Admitted {
        job: JobId,
        lane: LaneId,
    },
    Report {
        job: JobId,
        report: Report,
    },
    Finished {
        job: JobId,
        report: Report,
        iterations: u64,
        device_seconds: f64,
    },
    Failed {
        job: JobId,
        error: WorkerError,
        iterations: u64,
        device_seconds: f64,
    },
    Pruned {
        job: JobId,
        iterations: u64,
        device_seconds: f64,
    },
    /// Members of a fused job at a report point or at their end (see
    /// `training::FusedTrials`). `device_seconds` is the job's so far and
    /// `members` how many shared it in this iteration.
    Members {
        job: JobId,
        steps: Vec<MemberStep>,
        device_seconds: f64,
        members: usize,
    },
    /// A trial's state at its latest report point; `member` is the tag
    /// of a fused group's member (whose group is `job`).
    Checkpoint {
        job: JobId,
        member: Option<u64>,
        state: training::TrialSnapshot,
    },
    /// A trial's state when it finished (only with `keep_final`); sent
    /// before the `Finished` or `Members` event that ends it.
    FinalState {
        job: JobId,
        member: Option<u64>,
        state: training::TrialSnapshot,
    },
    /// The device ran out of memory for a job whose footprint was too
    /// small: it went back to waiting with a larger estimate.
    Requeued {
        job: JobId,
        persistent_bytes: usize,
        ephemeral_bytes: usize,
    },
    /// A resident job measured a footprint other than the one it was
    /// admitted with (an external worker's client reports its own); the
    /// ledger now holds this one.
    Refit {
        job: JobId,
        lane: LaneId,
        footprint: Footprint,
    },
    /// A fused job whose members have all ended.
    GroupEnded {
        job: JobId,
        iterations: u64,
        device_seconds: f64,
    },
    /// A swap between host and device (`out`: to the host); `medium`, where
    /// the state was kept.
    Swapped {
        job: JobId,
        lane: LaneId,
        out: bool,
        bytes: usize,
        seconds: f64,
        medium: SwapMedium,
    },
    /// PBT's exploit done: `receiver` now holds `donor`'s state (`bytes`,
    /// copied in `seconds`; `on_device`: without leaving the device), or
    /// failed with `error` (then the receiver has failed too). With
    /// checkpoints on, `state` is the receiver's new state, to be stored
    /// with the exploit (one transaction: a crash keeps both or neither).
    Exploited {
        receiver: TrialRef,
        /// `None` for a stored donor ([`Donor::Stored`]).
        donor: Option<TrialRef>,
        lane: LaneId,
        bytes: usize,
        seconds: f64,
        on_device: bool,
        error: Option<String>,
        state: Option<training::TrialSnapshot>,
    },
    /// A trial's state saved to `path` for other processes' PBT receivers
    /// ([`SalusCore::save_state`]), or why it could not be (`error`; the
    /// trial goes on either way).
    Saved {
        trial: TrialRef,
        path: std::path::PathBuf,
        error: Option<String>,
    },
    /// `iterations` consecutive iterations of `job` on `lane`, in seconds
    /// since the core started.
    Segment {
        lane: LaneId,
        job: JobId,
        start: f64,
        end: f64,
        iterations: u64,
    },
    /// Time between two different jobs' iterations on one lane.
    Switch {
        lane: LaneId,
        from: JobId,
        to: JobId,
        seconds: f64,
    },
}

impl CoreEvent {
    /// The event with its lane numbers counted from `base`.
    fn with_lane_base(mut self, base: LaneId) -> Self {
        match &mut self {
            CoreEvent::Admitted { lane, .. }
            | CoreEvent::Refit { lane, .. }
            | CoreEvent::Swapped { lane, .. }
            | CoreEvent::Exploited { lane, .. }
            | CoreEvent::Segment { lane, .. }
            | CoreEvent::Switch { lane, .. } => *lane += base,
            _ => {}
        }
        self
    }
}

struct Entry<B: Backend> {
    /// `None` while a lane holds it.
    job: Option<Box<dyn Job<B>>>,
    sched: JobState,
    /// What the ledger plans with: the job's own footprint, never below
    /// `floor`.
    footprint: Footprint,
    /// Set by an out-of-memory requeue: the least the job is granted again.
    floor: Footprint,
    shape: GroupShape,
    shared_key: String,
    /// The lane whose arena and memory it holds; `None` while waiting or swapped out.
    lane: Option<LaneId>,
    paused: bool,
    /// Waiting for the caller's decision on its last report.
    held: bool,
    swap_out: bool,
    /// Asked to give back its allocator cache at its next boundary.
    release: bool,
    /// The cache it could give back when it last came back to the table
    /// (`Job::releasable_bytes`): what [`State::make_room`] counts on
    /// while the job runs (a streak may keep it off the table for long).
    releasable: usize,
    /// PBT's exploits asked for, in order: this job's trial (a fused
    /// group's member) takes the donor's state and continues with the new
    /// values.
    exploit: Vec<(Option<u64>, Donor, NewValues)>,
    /// Files to save this job's state to, for other processes
    /// ([`SalusCore::save_state`]), with the member each is for.
    saves: Vec<(Option<u64>, std::path::PathBuf)>,
    prune: bool,
    iterations: u64,
}

impl<B: Backend> Entry<B> {
    /// A job off the device, waiting for memory and a lane.
    fn waiting(
        job: Box<dyn Job<B>>,
        sched: JobState,
        floor: Footprint,
        shared_key: String,
        iterations: u64,
    ) -> Self {
        let releasable = job.releasable_bytes();
        Entry {
            footprint: at_least(job.footprint(), floor),
            floor,
            shape: job.fusion_key().shape,
            iterations,
            job: Some(job),
            sched,
            shared_key,
            lane: None,
            paused: false,
            held: false,
            swap_out: false,
            release: false,
            releasable,
            exploit: Vec::new(),
            saves: Vec::new(),
            prune: false,
        }
    }

    fn running(&self) -> bool {
        self.job.is_none()
    }

    /// Asked for work between its iterations that is not a step: a
    /// swap-out, a cache to give back, an exploit, a save.
    fn side_work(&self) -> bool {
        self.swap_out || self.release || !self.exploit.is_empty() || !self.saves.is_empty()
    }
}

struct State<B: Backend> {
    policy: Policy,
    hold_at_reports: bool,
    max_lanes: usize,
    ledger: MemoryLedger,
    jobs: BTreeMap<JobId, Entry<B>>,
    /// Jobs this core has been given (submitted or moved here), ever.
    given: u64,
    /// Numbers jobs; cores of one process share it (see [`Numbering`]).
    ids: Arc<AtomicU64>,
    /// Added to this core's lane numbers in its events.
    lane_base: LaneId,
    boundary: u64,
    stop: bool,
    events: Sender<CoreEvent>,
    /// Each lane's current job and the device seconds of its slice so far.
    current: BTreeMap<LaneId, (JobId, f64)>,
    /// Workspaces a lane should drop: no job of that shape is left on it.
    drop_shapes: BTreeMap<LaneId, Vec<GroupShape>>,
    /// Lanes asleep with nothing to run: a lane that returns a job while
    /// it holds another wakes them, so that one can take it.
    idle: usize,
    /// Each lane's threads, and what a lane may widen to (see
    /// [`State::lane_threads`]).
    threads_per_lane: usize,
    max_threads_per_lane: usize,
}

enum Work<B: Backend> {
    Step(JobId, Box<dyn Job<B>>),
    SwapOut(JobId, Box<dyn Job<B>>),
    /// Give back an allocator cache the ledger needs (`Job::release_cache`).
    Release(JobId, Box<dyn Job<B>>),
    /// PBT's exploit (`Job::exploit`): the receiver, then the donor.
    Exploit(Exploit<B>),
    /// Saves for other processes (`Job::save_for_exploit`).
    Save(
        JobId,
        Box<dyn Job<B>>,
        Vec<(Option<u64>, std::path::PathBuf)>,
    ),
}

/// An exploit a lane carries out: both jobs are out of the table meanwhile
/// (one job, when two members of a fused group exchange state, or when the
/// donor's state was read from storage).
struct Exploit<B: Backend> {
    receiver: (TrialRef, Box<dyn Job<B>>),
    donor: DonorWork<B>,
    new: NewValues,
}

/// The donor's side of an exploit a lane carries out.
enum DonorWork<B: Backend> {
    /// A trial of this core, its job taken out of the table (`None`: the
    /// receiver's own fused group).
    Held(TrialRef, Option<Box<dyn Job<B>>>),
    Stored(Box<StoredState>),
}

/// Where an exploit's donor state comes from.
pub enum Donor {
    /// A trial this core holds.
    Held(TrialRef),
    /// A state read from storage: the donor is another process's, on a
    /// study they share.
    Stored(Box<StoredState>),
}

/// A trial as the core holds it: a lone job, or member `member` (its tag)
/// of a fused group's job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TrialRef {
    pub job: JobId,
    pub member: Option<u64>,
}

impl TrialRef {
    /// A lone job's trial.
    pub fn alone(job: JobId) -> Self {
        TrialRef { job, member: None }
    }
}

struct Shared<B: Backend> {
    checkpoints: bool,
    keep_final: bool,
    state: Mutex<State<B>>,
    wake: Condvar,
    epoch: Instant,
}

impl<B: Backend> Shared<B> {
    /// The core's state; a lane that panicked holding it leaves it usable.
    fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The running core. See the module docs.
pub struct SalusCore<B: Backend> {
    shared: Arc<Shared<B>>,
    lanes: Vec<JoinHandle<()>>,
}

/// How a core numbers what it reports, so that the cores of several
/// devices can share one event channel ([`crate::devices::DeviceCores`]):
/// job ids come from one counter, and each core's lanes are numbered from
/// its own base.
#[derive(Debug, Clone, Default)]
pub struct Numbering {
    pub ids: Arc<AtomicU64>,
    pub lane_base: LaneId,
}

/// A job taken out of one core, off the device, to be adopted by another
/// ([`SalusCore::withdraw`], [`SalusCore::adopt`]). It keeps its id and
/// what the scheduler knows of it.
pub struct Withdrawn<B: Backend> {
    pub id: JobId,
    pub job: Box<dyn Job<B>>,
    sched: JobState,
    floor: Footprint,
    shared_key: String,
    iterations: u64,
}

/// A core's load, for placing jobs across devices
/// ([`crate::devices::choose_device`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLoad {
    /// Bytes the ledger has not placed.
    pub free: u64,
    pub lanes: usize,
    /// Jobs not ended: resident, waiting or paused.
    pub jobs: usize,
    /// Jobs given to it so far, ended ones included.
    pub given: u64,
}

impl<B: Backend> SalusCore<B> {
    /// Starts `config.lanes` lane threads on `backend`.
    pub fn start(
        backend: Arc<B>,
        config: CoreConfig,
        events: Sender<CoreEvent>,
    ) -> Result<Self, WorkerError> {
        Self::start_numbered(backend, config, events, Numbering::default())
    }

    /// As [`SalusCore::start`], numbering jobs and lanes as `numbering` says.
    pub fn start_numbered(
        backend: Arc<B>,
        config: CoreConfig,
        events: Sender<CoreEvent>,
        numbering: Numbering,
    ) -> Result<Self, WorkerError> {
        // Every lane's pool: the threads it may widen to.
        let pool = config.max_threads_per_lane.max(config.threads_per_lane);
        let shared = Arc::new(Shared {
            checkpoints: config.checkpoints,
            keep_final: config.keep_final,
            state: Mutex::new(State {
                policy: config.policy,
                hold_at_reports: config.hold_at_reports,
                max_lanes: config.lanes,
                ledger: MemoryLedger::new(config.budget),
                jobs: BTreeMap::new(),
                given: 0,
                ids: numbering.ids,
                lane_base: numbering.lane_base,
                boundary: 0,
                stop: false,
                events,
                drop_shapes: BTreeMap::new(),
                idle: 0,
                current: BTreeMap::new(),
                threads_per_lane: config.threads_per_lane.max(1),
                max_threads_per_lane: pool,
            }),
            wake: Condvar::new(),
            epoch: Instant::now(),
        });
        let mut lanes = Vec::new();
        for id in 0..config.lanes {
            let mut lane = Lane::new(backend.clone(), id, pool)?;
            lane.set_threads(config.threads_per_lane);
            lane.set_graphs(config.graphs);
            if let Some(order) = config.optimizer_order {
                lane.set_optimizer_order(order);
            }
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("salus-lane-{id}"))
                .spawn(move || lane_main(lane, shared))
                .map_err(|e| WorkerError::Config(format!("cannot start lane thread: {e}")))?;
            lanes.push(handle);
        }
        Ok(SalusCore { shared, lanes })
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.shared.lock()
    }

    /// Queues a job; it runs once memory and a lane allow.
    pub fn submit(&self, job: Box<dyn Job<B>>, priority: f64, shared_key: &str) -> JobId {
        self.submit_as(job, priority, shared_key, false)
    }

    /// As [`SalusCore::submit`], paused: it waits for [`SalusCore::resume`]
    /// before its first iteration (jobs that must start together).
    pub fn submit_paused(&self, job: Box<dyn Job<B>>, priority: f64, shared_key: &str) -> JobId {
        self.submit_as(job, priority, shared_key, true)
    }

    fn submit_as(
        &self,
        job: Box<dyn Job<B>>,
        priority: f64,
        shared_key: &str,
        paused: bool,
    ) -> JobId {
        let st = self.lock();
        let id = JobId(st.ids.fetch_add(1, Ordering::Relaxed));
        let sched = JobState {
            id,
            arrival: id.0,
            remaining_iterations: job.total_iterations() - job.iterations_done(),
            device_time: 0.0,
            priority,
            last_run: 0,
            slice_s: 0.0,
        };
        let iterations = job.iterations_done();
        let mut entry = Entry::waiting(
            job,
            sched,
            Footprint::default(),
            shared_key.into(),
            iterations,
        );
        entry.paused = paused;
        self.enter(st, id, entry);
        id
    }

    fn with_job(&self, id: JobId, f: impl FnOnce(&mut Entry<B>)) {
        let mut st = self.lock();
        if let Some(e) = st.jobs.get_mut(&id) {
            f(e);
        }
        st.admit_waiting();
        drop(st);
        self.shared.wake.notify_all();
    }

    /// Stops running `id` at its next boundary; it stays resident until
    /// memory is needed.
    pub fn pause(&self, id: JobId) {
        self.with_job(id, |e| e.paused = true);
    }

    /// Lets a paused job run again (swapping it back in if it was swapped out).
    pub fn resume(&self, id: JobId) {
        self.resume_all(&[id]);
    }

    /// Resumes `ids` at once: none runs before the others may.
    pub fn resume_all(&self, ids: &[JobId]) {
        let mut st = self.lock();
        for id in ids {
            if let Some(e) = st.jobs.get_mut(id) {
                e.paused = false;
            }
        }
        st.admit_waiting();
        drop(st);
        self.shared.wake.notify_all();
    }

    /// Lets a job held at its report run on (see `CoreConfig::hold_at_reports`).
    pub fn release(&self, id: JobId) {
        self.with_job(id, |e| e.held = false);
    }

    /// Moves a paused, resident job's state to the host now.
    pub fn swap_out(&self, id: JobId) {
        self.with_job(id, |e| {
            if e.lane.is_some() {
                e.swap_out = true;
            }
        });
    }

    /// PBT's exploit: at their next boundary, while neither runs, trial
    /// `receiver` takes `donor`'s whole state and continues with `new`
    /// values (see `Job::exploit`; two members of one fused group copy slot
    /// to slot, `Job::exploit_within`); a lane copies it, on the device
    /// where both are resident, and says so with
    /// [`CoreEvent::Exploited`]. Both should be paused, so that neither
    /// moves on first.
    pub fn exploit(&self, receiver: TrialRef, donor: Donor, new: NewValues) {
        self.with_job(receiver.job, |e| {
            e.exploit.push((receiver.member, donor, new))
        });
    }

    /// Saves `trial`'s whole state to `path` at its next boundary, while it
    /// does not run (`Job::save_for_exploit`: an external worker's own
    /// checkpoint format), for another process's PBT receivers; says so
    /// with [`CoreEvent::Saved`].
    pub fn save_state(&self, trial: TrialRef, path: std::path::PathBuf) {
        self.with_job(trial.job, |e| e.saves.push((trial.member, path)));
    }

    /// Ends a job at its next boundary.
    pub fn prune(&self, id: JobId) {
        let mut st = self.lock();
        if let Some(e) = st.jobs.get_mut(&id) {
            e.prune = true;
            if !e.running() {
                st.remove(id, Ending::Pruned);
            }
        }
        st.admit_waiting();
        drop(st);
        self.shared.wake.notify_all();
    }

    pub fn set_priority(&self, id: JobId, priority: f64) {
        self.with_job(id, |e| e.sched.priority = priority);
    }

    /// The memory accounting now.
    pub fn ledger(&self) -> LedgerSnapshot {
        self.lock().ledger.snapshot()
    }

    /// Jobs not yet ended.
    pub fn live_jobs(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Free memory, lanes and jobs now.
    pub fn load(&self) -> DeviceLoad {
        let st = self.lock();
        DeviceLoad {
            free: st.ledger.free(),
            lanes: st.max_lanes,
            jobs: st.jobs.len(),
            given: st.given,
        }
    }

    /// Jobs that wait off the device for memory or a lane and could run on
    /// another device (`Job::can_move`), with the bytes each needs on an
    /// empty device ([`MemoryLedger::alone_cost`]), in the policy's
    /// admission order.
    pub fn movable_waiting(&self) -> Vec<(JobId, u64)> {
        let st = self.lock();
        let waiting: Vec<JobState> = st
            .jobs
            .values()
            .filter(|e| {
                e.lane.is_none()
                    && !e.paused
                    && !e.held
                    && !e.prune
                    && e.job.as_ref().is_some_and(|j| j.can_move())
            })
            .map(|e| e.sched)
            .collect();
        policy::admission_order(st.policy, &waiting)
            .into_iter()
            .map(|id| (id, MemoryLedger::alone_cost(&st.jobs[&id].footprint)))
            .collect()
    }

    /// Takes waiting job `id` out of this core, for another core to adopt;
    /// `None` unless it is off the device, not running, paused, held or
    /// pruned, and can move. No event says it left.
    pub fn withdraw(&self, id: JobId) -> Option<Withdrawn<B>> {
        let mut st = self.lock();
        let e = st.jobs.get(&id)?;
        let free = e.lane.is_none() && !e.paused && !e.held && !e.prune;
        if !free || !e.job.as_ref().is_some_and(|j| j.can_move()) {
            return None;
        }
        let e = st.jobs.remove(&id).expect("job");
        Some(Withdrawn {
            id,
            job: e.job.expect("not running"),
            sched: e.sched,
            floor: e.floor,
            shared_key: e.shared_key,
            iterations: e.iterations,
        })
    }

    /// Takes a job another core gave up; it waits here for memory and a
    /// lane as it waited there.
    pub fn adopt(&self, w: Withdrawn<B>) {
        let st = self.lock();
        let entry = Entry::waiting(w.job, w.sched, w.floor, w.shared_key, w.iterations);
        self.enter(st, w.id, entry);
    }

    /// Puts a waiting job in the table, and admits what fits.
    fn enter(&self, mut st: MutexGuard<'_, State<B>>, id: JobId, entry: Entry<B>) {
        st.jobs.insert(id, entry);
        st.given += 1;
        st.fail_if_never_fits(id);
        st.admit_waiting();
        drop(st);
        self.shared.wake.notify_all();
    }

    /// Stops every lane at its next boundary and returns the jobs that had
    /// not ended, by id.
    pub fn shutdown(mut self) -> Vec<(JobId, Box<dyn Job<B>>)> {
        self.stop()
    }

    /// As [`SalusCore::shutdown`], keeping the core: events it sent before
    /// stopping can still be acted on, and calls on it are no-ops.
    pub fn stop(&mut self) -> Vec<(JobId, Box<dyn Job<B>>)> {
        self.lock().stop = true;
        self.shared.wake.notify_all();
        for h in self.lanes.drain(..) {
            let _ = h.join();
        }
        let mut st = self.lock();
        std::mem::take(&mut st.jobs)
            .into_iter()
            .filter_map(|(id, e)| e.job.map(|j| (id, j)))
            .collect()
    }
}

impl<B: Backend> Drop for SalusCore<B> {
    fn drop(&mut self) {
        if !self.lanes.is_empty() {
            self.lock().stop = true;
            self.shared.wake.notify_all();
            for h in self.lanes.drain(..) {
                let _ = h.join();
            }
        }
    }
}

enum Ending {
    Finished(Report),
    GroupEnded,
    Failed(WorkerError),
    Pruned,
}

/// Threads a running lane may split its work over when `idle` of `lanes`
/// lanes have nothing to run: the lanes' cores shared out among the busy
/// ones, never fewer than its own `per_lane`, never more than `max`. Ops
/// give the same bits on any number of threads, so widening mid-trial
/// changes no result.
pub fn lane_threads(lanes: usize, idle: usize, per_lane: usize, max: usize) -> usize {
    let busy = lanes.saturating_sub(idle).max(1);
    let per_lane = per_lane.max(1);
    (per_lane * lanes.max(1) / busy).clamp(per_lane, max.max(per_lane))
}

impl<B: Backend> State<B> {
    /// [`lane_threads`] now.
    fn lane_threads(&self) -> usize {
        lane_threads(
            self.max_lanes,
            self.idle,
            self.threads_per_lane,
            self.max_threads_per_lane,
        )
    }

    fn emit(&self, e: CoreEvent) {
        let _ = self.events.send(e.with_lane_base(self.lane_base));
    }

    fn lane_loads(&self, shape: &GroupShape) -> Vec<LaneLoad> {
        let mut loads: BTreeMap<LaneId, LaneLoad> = BTreeMap::new();
        for e in self.jobs.values() {
            if let Some(l) = e.lane {
                let load = loads.entry(l).or_insert(LaneLoad {
                    lane: l,
                    jobs: 0,
                    has_shape: false,
                });
                load.jobs += 1;
                load.has_shape |= &e.shape == shape;
            }
        }
        // Lanes whose arena is still held but have no jobs count as open too.
        for l in 0..self.max_lanes {
            if self.ledger.arena(l).is_some() {
                loads.entry(l).or_insert(LaneLoad {
                    lane: l,
                    jobs: 0,
                    has_shape: false,
                });
            }
        }
        loads.into_values().collect()
    }

    /// Fails waiting job `id` when it could not fit even on an empty
    /// device: waiting would never end. Checked where a footprint is set
    /// (on submission, and when an out-of-memory requeue enlarges it).
    fn fail_if_never_fits(&mut self, id: JobId) {
        let budget = self.ledger.budget();
        let needed = MemoryLedger::alone_cost(&self.jobs[&id].footprint);
        if needed > budget {
            self.remove(id, Ending::Failed(WorkerError::TooLarge { needed, budget }));
        }
    }

    /// Re-reads `id`'s footprint from a job that measures itself
    /// (`Job::footprint_changes`), never below its floor. Returns whether
    /// it changed.
    fn refresh_footprint(&mut self, id: JobId) -> bool {
        let e = self.jobs.get_mut(&id).expect("job");
        let Some(job) = e.job.as_ref().filter(|j| j.footprint_changes()) else {
            return false;
        };
        let fp = at_least(job.footprint(), e.floor);
        let changed = fp != e.footprint;
        e.footprint = fp;
        changed
    }

    /// After a step: a resident job whose footprint changed is accounted
    /// anew. When the device is then over budget, a paused job is asked
    /// to make room.
    fn refit(&mut self, id: JobId) -> bool {
        if !self.refresh_footprint(id) {
            return false;
        }
        let e = &self.jobs[&id];
        let (fp, lane) = (e.footprint, e.lane);
        if let Some(lane) = lane {
            self.ledger.refit(id, lane, &fp);
            if self.ledger.snapshot().used() > self.ledger.budget() {
                self.make_room(id);
            }
            self.emit(CoreEvent::Refit {
                job: id,
                lane,
                footprint: fp,
            });
        }
        true
    }

    /// Admits waiting jobs in the policy's order while memory and lanes allow.
    fn admit_waiting(&mut self) {
        let ids: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, e)| e.lane.is_none() && !e.running())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if self.refresh_footprint(id) {
                self.fail_if_never_fits(id);
            }
        }
        let waiting: Vec<JobState> = self
            .jobs
            .values()
            .filter(|e| e.lane.is_none() && !e.paused && !e.running() && !e.prune)
            .map(|e| e.sched)
            .collect();
        for id in policy::admission_order(self.policy, &waiting) {
            let (fp, shape, key) = {
                let e = &self.jobs[&id];
                (e.footprint, e.shape.clone(), e.shared_key.clone())
            };
            let loads = self.lane_loads(&shape);
            let (lane, growth) = match place(&self.ledger, &loads, self.max_lanes, &fp, &key) {
                Placement::NewLane { arena_bytes } => {
                    let open: Vec<LaneId> = loads.iter().map(|l| l.lane).collect();
                    match (0..self.max_lanes).find(|l| !open.contains(l)) {
                        Some(l) => (l, arena_bytes),
                        None => continue,
                    }
                }
                Placement::Join { lane, arena_growth } => (lane, arena_growth),
                Placement::Wait => {
                    self.make_room(id);
                    continue;
                }
            };
            if self.ledger.admit(id, &fp, &key, lane, growth).is_ok() {
                self.jobs.get_mut(&id).expect("waiting job").lane = Some(lane);
                self.emit(CoreEvent::Admitted { job: id, lane });
            }
        }
    }

    /// Asks for the lowest-priority paused, resident job below `for_job`'s
    /// priority to be swapped out, if none is already on its way out. One
    /// still finishing its iteration counts: it goes out at that boundary.
    ///
    /// Before any swap, resident jobs that hold an allocator cache
    /// (`Job::releasable_bytes`) are asked to give it back, a running one
    /// at its next boundary: that costs them nothing they need, and only
    /// happens when the ledger needs the room, never at every switch.
    fn make_room(&mut self, for_job: JobId) {
        if self.jobs.values().any(|e| e.swap_out || e.release) {
            return;
        }
        // A running job's is the cache it had at its last boundary: asked
        // now, it ends its streak and gives it back at the next one.
        let caches: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, e)| {
                e.lane.is_some()
                    && e.job
                        .as_ref()
                        .map_or(e.releasable, |j| j.releasable_bytes())
                        > 0
            })
            .map(|(id, _)| *id)
            .collect();
        if !caches.is_empty() {
            for id in caches {
                self.jobs.get_mut(&id).expect("job").release = true;
            }
            return;
        }
        let want = self.jobs[&for_job].sched.priority;
        // When every resident job is paused, nothing would ever free memory:
        // then the waiting job may push out even a higher-priority paused one.
        let stuck = self
            .jobs
            .values()
            .filter(|e| e.lane.is_some())
            .all(|e| e.paused);
        let victim = self
            .jobs
            .iter()
            .filter(|(_, e)| e.paused && e.lane.is_some() && (stuck || e.sched.priority <= want))
            .min_by(|a, b| {
                a.1.sched
                    .priority
                    .total_cmp(&b.1.sched.priority)
                    .then(a.0.cmp(b.0))
            })
            .map(|(id, _)| *id);
        if let Some(v) = victim {
            self.jobs.get_mut(&v).expect("victim").swap_out = true;
        }
    }

    /// Frees `id`'s memory on its lane (ledger and, if it was the last job
    /// of its shape there, the workspace).
    fn leave_lane(&mut self, id: JobId) {
        let (lane, shape, key, eph) = {
            let e = &self.jobs[&id];
            (
                e.lane,
                e.shape.clone(),
                e.shared_key.clone(),
                e.footprint.ephemeral_bytes as u64,
            )
        };
        let Some(lane) = lane else { return };
        self.ledger.release(id, &key);
        let e = self.jobs.get_mut(&id).expect("job");
        e.lane = None;
        // Off the device, it has no cache to give back.
        e.release = false;
        let shape_left = self
            .jobs
            .values()
            .any(|e| e.lane == Some(lane) && e.shape == shape);
        if !shape_left {
            self.ledger.shrink_arena(lane, eph);
            self.drop_shapes.entry(lane).or_default().push(shape);
        }
    }

    fn remove(&mut self, id: JobId, ending: Ending) {
        self.leave_lane(id);
        let e = self.jobs.remove(&id).expect("job");
        let (iterations, device_seconds) = (e.iterations, e.sched.device_time);
        self.emit(match ending {
            Ending::Finished(report) => CoreEvent::Finished {
                job: id,
                report,
                iterations,
                device_seconds,
            },
            Ending::Failed(error) => CoreEvent::Failed {
                job: id,
                error,
                iterations,
                device_seconds,
            },
            Ending::GroupEnded => CoreEvent::GroupEnded {
                job: id,
                iterations,
                device_seconds,
            },
            Ending::Pruned => CoreEvent::Pruned {
                job: id,
                iterations,
                device_seconds,
            },
        });
    }

    fn next_work(&mut self, lane: LaneId) -> Option<Work<B>> {
        if let Some((&id, _)) = self
            .jobs
            .iter()
            .find(|(_, e)| e.lane == Some(lane) && e.swap_out && !e.running())
        {
            return Some(Work::SwapOut(id, self.take(id)));
        }
        if let Some((&id, _)) = self
            .jobs
            .iter()
            .find(|(_, e)| e.lane == Some(lane) && e.release && !e.running())
        {
            return Some(Work::Release(id, self.take(id)));
        }
        if let Some((&id, _)) = self.jobs.iter().find(|(_, e)| {
            (e.lane == Some(lane) || e.lane.is_none()) && !e.saves.is_empty() && !e.running()
        }) {
            let saves = std::mem::take(&mut self.jobs.get_mut(&id).expect("job").saves);
            return Some(Work::Save(id, self.take(id), saves));
        }
        if let Some((receiver, donor, new)) = self.exploit_for(lane) {
            let job = self.take(receiver.job);
            let donor = match donor {
                Donor::Held(d) => {
                    DonorWork::Held(d, (d.job != receiver.job).then(|| self.take(d.job)))
                }
                Donor::Stored(state) => DonorWork::Stored(state),
            };
            return Some(Work::Exploit(Exploit {
                receiver: (receiver, job),
                donor,
                new,
            }));
        }
        let id = policy::next(self.policy, &self.runnable(lane, None))?;
        Some(Work::Step(id, self.take(id)))
    }

    /// Whether `lane`, just back from a step, should wake the idle lanes:
    /// some sleep, and it holds a job it could give (two or more that may
    /// run).
    pub(crate) fn could_give(&self, lane: LaneId) -> bool {
        self.idle > 0
            && self
                .jobs
                .values()
                .filter(|e| e.lane == Some(lane) && !e.paused && !e.held && !e.prune)
                .nth(1)
                .is_some()
    }

    /// Moves a job from the lane with the most work to `lane`, which has
    /// none ([`policy::steal`]). The job stays resident: between
    /// iterations nothing of it is queued, so any lane of the device may
    /// run it (a captured graph is keyed by the buffers it touches, so the
    /// new lane captures its own). Its workspace comes with a new arena
    /// share where `lane` has none of its shape. Returns whether one moved.
    pub(crate) fn steal_for(&mut self, lane: LaneId) -> bool {
        let mut work: BTreeMap<LaneId, policy::LaneWork> = BTreeMap::new();
        for e in self.jobs.values() {
            let Some(l) = e.lane.filter(|&l| l != lane) else {
                continue;
            };
            if e.paused || e.held || e.prune {
                continue;
            }
            let w = work.entry(l).or_insert(policy::LaneWork {
                lane: l,
                busy: 0,
                movable: Vec::new(),
            });
            w.busy += 1;
            if !e.running() && !e.side_work() {
                w.movable.push(e.sched);
            }
        }
        let others: Vec<policy::LaneWork> = work.into_values().collect();
        let Some(id) = policy::steal(self.policy, &others) else {
            return false;
        };
        let (fp, shape, key, from) = {
            let e = &self.jobs[&id];
            (e.footprint, e.shape.clone(), e.shared_key.clone(), e.lane)
        };
        let has_shape = self
            .jobs
            .values()
            .any(|e| e.lane == Some(lane) && e.shape == shape);
        let growth = if has_shape {
            0
        } else {
            fp.ephemeral_bytes as u64
        };
        if growth > self.ledger.free() {
            return false;
        }
        self.leave_lane(id);
        // It fits: leaving gave back at least what it takes again.
        let to = match self.ledger.admit(id, &fp, &key, lane, growth) {
            Ok(()) => lane,
            Err(_) => {
                let back = from.expect("a stolen job had a lane");
                let _ = self.ledger.admit(id, &fp, &key, back, 0);
                back
            }
        };
        self.jobs.get_mut(&id).expect("stolen job").lane = Some(to);
        self.emit(CoreEvent::Admitted { job: id, lane: to });
        to == lane
    }

    /// An exploit `lane` may carry out now: its receiver is on this lane
    /// (or on none), and neither it nor its donor is running. A donor that
    /// has ended fails the request.
    fn exploit_for(&mut self, lane: LaneId) -> Option<(TrialRef, Donor, NewValues)> {
        let free = |d: &Entry<B>| !d.running();
        let (id, at) = self.jobs.iter().find_map(|(&id, e)| {
            let here = e.lane == Some(lane) || e.lane.is_none();
            if !here || e.running() {
                return None;
            }
            let at = e.exploit.iter().position(|(_, donor, _)| match donor {
                Donor::Held(d) => self.jobs.get(&d.job).is_none_or(free),
                Donor::Stored(_) => true,
            })?;
            Some((id, at))
        })?;
        let (member, donor, new) = self.jobs.get_mut(&id).expect("receiver").exploit.remove(at);
        let receiver = TrialRef { job: id, member };
        if let Donor::Held(d) = &donor
            && !self.jobs.contains_key(&d.job)
        {
            self.emit(CoreEvent::Exploited {
                receiver,
                donor: Some(*d),
                lane,
                bytes: 0,
                seconds: 0.0,
                on_device: false,
                error: Some("the donor ended before the exploit".into()),
                state: None,
            });
            return None;
        }
        Some((receiver, donor, new))
    }

    /// The policy's view of `lane`'s runnable jobs; `running`, which the
    /// lane holds, counts as runnable too.
    fn runnable(&self, lane: LaneId, running: Option<JobId>) -> Vec<JobState> {
        let current = self.current.get(&lane).copied();
        self.jobs
            .values()
            .filter(|e| {
                e.lane == Some(lane)
                    && (!e.running() || Some(e.sched.id) == running)
                    && !e.paused
                    && !e.held
                    && !e.prune
            })
            .map(|e| JobState {
                slice_s: current.filter(|c| c.0 == e.sched.id).map_or(0.0, |c| c.1),
                ..e.sched
            })
            .collect()
    }

    /// Whether nothing waits on `lane` between its iterations: a stop, a
    /// swap-out, a workspace to drop.
    fn lane_free(&self, lane: LaneId) -> bool {
        !self.stop
            && !self.drop_shapes.contains_key(&lane)
            && !self
                .jobs
                .values()
                .any(|e| e.lane == Some(lane) && e.side_work())
    }

    /// The policy's pick for `lane` while it holds `running` with one
    /// iteration in flight. That iteration is not counted yet: decide as if
    /// it were, or a round-robin policy would give it two turns in a row.
    fn pick_in_flight(&self, lane: LaneId, running: JobId) -> Option<JobId> {
        let mut runnable = self.runnable(lane, Some(running));
        if let Some(j) = runnable.iter_mut().find(|j| j.id == running) {
            j.last_run = self.boundary + 1;
            j.remaining_iterations = j.remaining_iterations.saturating_sub(1);
        }
        policy::next(self.policy, &runnable)
    }

    /// Whether `lane` may queue `id`'s next iteration before the one it just
    /// queued has finished: nothing waits on the lane, the job is not
    /// paused, held or pruned, and the policy would pick it again. See
    /// [`lane_main`](lane::lane_main).
    fn keeps(&self, lane: LaneId, id: JobId) -> bool {
        self.lane_free(lane) && self.pick_in_flight(lane, id) == Some(id)
    }

    /// The job `lane` runs after `from`, taken from the table, when its
    /// first iteration may be queued before `from`'s last has finished:
    /// nothing waits on the lane and the policy's pick is another job that
    /// is resident (a swap-in waits for a full sync).
    fn hand_over(&mut self, lane: LaneId, from: JobId) -> Option<(JobId, Box<dyn Job<B>>)> {
        if !self.lane_free(lane) {
            return None;
        }
        let next = self.pick_in_flight(lane, from)?;
        let resident = self.jobs[&next]
            .job
            .as_ref()
            .is_some_and(|j| j.is_resident());
        (next != from && resident).then(|| (next, self.take(next)))
    }

    /// Counts one iteration of `id` on `lane` that took `seconds` of the
    /// device (`ok`: it succeeded).
    fn count_iteration(&mut self, lane: LaneId, id: JobId, seconds: f64, ok: bool) {
        let slice = match self.current.get(&lane) {
            Some(&(j, s)) if j == id => s + seconds,
            _ => seconds,
        };
        self.current.insert(lane, (id, slice));
        self.boundary += 1;
        let boundary = self.boundary;
        let e = self.jobs.get_mut(&id).expect("job");
        e.sched.device_time += seconds;
        e.sched.last_run = boundary;
        if ok {
            e.iterations += 1;
            e.sched.remaining_iterations = e.sched.remaining_iterations.saturating_sub(1);
        }
    }

    /// Puts a job that ran out of device memory back to waiting, its
    /// footprint estimate half as large again, or, for a job that measures
    /// itself, what it now says it needs where that is more.
    fn requeue_larger(&mut self, id: JobId, job: Box<dyn Job<B>>) {
        self.leave_lane(id);
        let e = self.jobs.get_mut(&id).expect("job");
        let mut fp = e.footprint;
        fp.persistent_bytes += fp.persistent_bytes / 2;
        fp.ephemeral_bytes += fp.ephemeral_bytes / 2;
        if job.footprint_changes() {
            fp = at_least(fp, job.footprint());
        }
        e.job = Some(job);
        e.floor = fp;
        e.footprint = fp;
        let (persistent_bytes, ephemeral_bytes) = (fp.persistent_bytes, fp.ephemeral_bytes);
        self.emit(CoreEvent::Requeued {
            job: id,
            persistent_bytes,
            ephemeral_bytes,
        });
        self.fail_if_never_fits(id);
    }

    /// Hands job `id` to a lane: the table keeps its entry, not the job.
    fn take(&mut self, id: JobId) -> Box<dyn Job<B>> {
        self.jobs
            .get_mut(&id)
            .expect("job")
            .job
            .take()
            .expect("not running")
    }

    /// Takes a stepped job back. Returns whether memory or other lanes'
    /// work may have changed: the job left, or its footprint changed.
    fn return_step(
        &mut self,
        lane: LaneId,
        id: JobId,
        job: Box<dyn Job<B>>,
        result: Result<StepOutcome, WorkerError>,
        seconds: f64,
    ) -> bool {
        self.count_iteration(lane, id, seconds, result.is_ok());
        let members = job.live_members();
        let e = self.jobs.get_mut(&id).expect("job");
        e.releasable = job.releasable_bytes();
        e.job = Some(job);
        let refitted = self.refit(id);
        let e = self.jobs.get_mut(&id).expect("job");
        let prune = e.prune;
        match result {
            Ok(StepOutcome::Continue) => {}
            Ok(StepOutcome::Report(report)) => {
                e.held = self.hold_at_reports;
                self.emit(CoreEvent::Report { job: id, report })
            }
            Ok(StepOutcome::Finished(report)) => {
                self.remove(id, Ending::Finished(report));
                return true;
            }
            Ok(StepOutcome::Members(steps)) => {
                let reported = steps
                    .iter()
                    .any(|m| matches!(m.outcome, MemberOutcome::Report(_)));
                let device_seconds = e.sched.device_time;
                let ended = steps
                    .iter()
                    .filter(|m| !matches!(m.outcome, MemberOutcome::Report(_)))
                    .count();
                e.held = self.hold_at_reports && reported;
                if !steps.is_empty() {
                    self.emit(CoreEvent::Members {
                        job: id,
                        steps,
                        device_seconds,
                        members: members + ended,
                    });
                }
                if members == 0 {
                    self.remove(id, Ending::GroupEnded);
                    return true;
                }
            }
            Err(error) => {
                self.remove(id, Ending::Failed(error));
                return true;
            }
        }
        if prune {
            self.remove(id, Ending::Pruned);
        }
        prune || refitted
    }
}

/// Each part of `a`, raised to `b`'s where that is larger.
fn at_least(a: Footprint, b: Footprint) -> Footprint {
    Footprint {
        persistent_bytes: a.persistent_bytes.max(b.persistent_bytes),
        ephemeral_bytes: a.ephemeral_bytes.max(b.ephemeral_bytes),
        shared_bytes: a.shared_bytes.max(b.shared_bytes),
    }
}
