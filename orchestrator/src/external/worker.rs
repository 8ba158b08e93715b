//! `ExternalTrial`: a user's training script as a Salus job.
//!
//! One process per trial, started at admission (a swap-in) and stepped one
//! iteration per [`Job::step`]: the step answers the worker's `ready` with
//! `go` and waits for its next `ready` (or `done`). A lane's thread blocks
//! on that wait, so only workers holding a lane are inside an iteration,
//! and every policy and priority of the core applies to them as to the
//! built-in trials. A pruned trial's worker is told to exit when the core
//! drops the job.
//!
//! **Swap.** A worker whose client tracks its state (protocol version 2,
//! `swap: true` at `ready`) is swapped in process: `swap_out` moves its
//! state to host memory and the process stays, so `swap_in` costs a copy
//! back, not a Python start. Any other worker is asked to checkpoint and
//! exit, and the swap-in restarts it from that checkpoint.
//!
//! **Memory.** A version 2 client measures its device memory at each
//! `ready`; the footprint the ledger sees is that measurement, else the
//! declared `[worker] memory`, else (`memory = "auto"`) the run's first
//! measurement, else the whole budget, so that the first trial runs alone
//! while it is measured ([`plan_footprint`]). A worker that runs out of
//! device memory exits; its trial goes back to waiting with the need the
//! client reported and restarts from its last checkpoint (or from the
//! start), while its neighbours go on.
//!
//! **PBT.** A receiver takes its donor's state through a file: the donor
//! saves it (`save`, and goes on waiting), and the receiver is told to
//! continue from it with its new parameters (`exploit`). A client that can
//! load it in process does so (`exploited`); any other exits (`restart`)
//! and is started again from that file, in place, keeping its grant.
//!
//! Whatever goes wrong (the process dies, stays silent past the heartbeat
//! timeout, or sends a malformed message) is an error of this trial only:
//! it FAILs with the reason and the tail of the script's output, and the
//! study goes on.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kernels::{Activation, Backend, DeviceKind, KernelError};
use serde_json::Value;
use training::group::GroupShape;
use training::state::TrialSnapshot;
use training::{
    Footprint, FusionKey, Job, Lane, LossKind, ModelSpec, NewValues, OptimizerFamily, Report,
    StepOutcome, StoredState, SwapMedium, WorkerError,
};

use super::protocol::{self, FromWorker, MemoryReport, ToWorker};
use crate::storage::TrialNumber;
use crate::study::WorkerConfig;

/// Lines of the script's output kept for a failure's reason.
const TAIL_LINES: usize = 20;

type Tail = Arc<Mutex<VecDeque<String>>>;

/// A worker's `done`: its value, and whether it takes another trial.
/// A `done`: the trial's values (one per objective) and whether the
/// worker takes another trial.
type End = (Vec<f64>, bool);

struct Process {
    child: Child,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    tail: Tail,
    /// A `ready` waits for its answer.
    ready: bool,
    socket: PathBuf,
    /// The protocol version agreed at `hello`.
    version: u64,
    /// Its client tracks its state: it can swap in process.
    swap: bool,
}

/// How a run sizes its external trials for the ledger, shared by them all.
#[derive(Debug)]
pub struct MemoryPlan {
    /// `[worker] memory`; `None` for `"auto"`.
    declared: Option<u64>,
    /// The device budget: an unmeasured `"auto"` trial takes all of it.
    budget: u64,
    /// The run's first measurement, the guess for unmeasured trials.
    learned: Mutex<Option<MemoryReport>>,
    /// The most NVML has read a worker process hold, in bytes.
    learned_real: Mutex<Option<u64>>,
    /// With `[scheduler] mps = true`: the run's daemon, and its lanes.
    mps: Option<(super::mps::MpsDaemon, usize)>,
}

impl MemoryPlan {
    pub fn new(declared: Option<u64>, budget: u64) -> Self {
        MemoryPlan {
            declared,
            budget,
            learned: Mutex::new(None),
            learned_real: Mutex::new(None),
            mps: None,
        }
    }

    /// Workers share the GPU through `daemon`, each limited by its grant
    /// of the budget that `lanes` lanes share.
    pub fn with_mps(mut self, daemon: super::mps::MpsDaemon, lanes: usize) -> Self {
        self.mps = Some((daemon, lanes));
        self
    }

    fn learned(&self) -> Option<MemoryReport> {
        *self.learned.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn learned_real(&self) -> Option<u64> {
        *self.learned_real.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn learn_real(&self, bytes: u64) {
        let mut r = self.learned_real.lock().unwrap_or_else(|e| e.into_inner());
        *r = Some(r.map_or(bytes, |b| b.max(bytes)));
    }

    fn learn(&self, m: MemoryReport) {
        self.learned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(m);
    }
}

/// The footprint of an external trial: its own measurement (persistent
/// memory and the allocator's cache, which the process holds between
/// iterations; the peak above that is the iteration's ephemeral need),
/// else the declared bytes, else the run's first measurement, else the
/// whole budget. Where NVML read what a worker process really holds
/// (`real`: its own reading, else the largest of the run's), at least that
/// in all: a CUDA context and cuDNN's workspaces are on the device whether
/// or not the client counts them, and under MPS the grant is a hard limit.
/// After an out-of-memory error, at least `oom_need` bytes in all.
pub fn plan_footprint(
    own: Option<MemoryReport>,
    declared: Option<u64>,
    learned: Option<MemoryReport>,
    real: Option<u64>,
    budget: u64,
    oom_need: u64,
) -> Footprint {
    let (persistent, ephemeral) = match (own, declared, learned) {
        (Some(m), _, _) | (None, None, Some(m)) => {
            (m.persistent + m.cached, m.peak.saturating_sub(m.persistent))
        }
        (None, Some(d), _) => (d, 0),
        (None, None, None) => (budget, 0),
    };
    let persistent = persistent
        .max(oom_need.saturating_sub(ephemeral))
        .max(real.unwrap_or(0).saturating_sub(ephemeral));
    Footprint {
        persistent_bytes: persistent as usize,
        ephemeral_bytes: ephemeral as usize,
        shared_bytes: 0,
    }
}

/// A user's script running one trial. See the module docs.
pub struct ExternalTrial {
    cfg: Arc<WorkerConfig>,
    plan: Arc<MemoryPlan>,
    number: TrialNumber,
    params: Value,
    checkpoint_path: PathBuf,
    resume_from: Option<String>,
    proc: Option<Process>,
    iteration: u64,
    last_step: u64,
    last_report: Option<Report>,
    /// User attributes set since the last report: stored with the next
    /// report, or with the end.
    attrs: Vec<(String, String)>,
    finished: bool,
    /// What the client last measured.
    measured: Option<MemoryReport>,
    /// Swapped out in process: the worker lives, its state on the host.
    on_host: bool,
    /// How the last swap-out kept the state.
    medium: SwapMedium,
    /// After an out-of-memory error: the bytes the trial needs at least.
    oom_need: u64,
    /// The iteration and step the last checkpoint holds: where a restart
    /// after an out-of-memory error resumes.
    resume_point: (u64, u64),
    /// The last `ready` said which iteration comes next.
    positioned: bool,
    /// `cuda` or `cpu`: what the worker calls its device.
    device: &'static str,
    /// The device the trial was placed on, as `--device` names it (`cpu`,
    /// `cpu:1`, `cuda:1`): its worker's `SALUS_TUNE_PLACEMENT`, and on
    /// CUDA, through `CUDA_VISIBLE_DEVICES`, the only device it sees.
    placement: String,
    /// The placement's CUDA ordinal in this process, where it is a GPU.
    cuda_ordinal: Option<usize>,
    /// When NVML last read the worker's real usage, and what it read.
    usage_checked: Option<Instant>,
    real: Option<u64>,
    /// Set by [`ExternalTrial::on_device`]: the lane's backend does not
    /// decide it.
    device_fixed: bool,
}

fn fail(msg: impl Into<String>) -> WorkerError {
    WorkerError::External(msg.into())
}

pub(crate) use crate::temp_folders::socket_dir;

/// At the end of a run: tells the idle serving workers to exit, reaps
/// them, and removes the socket folder.
pub fn shut_down_workers() {
    let mut idle: Vec<Process> = idle_pool_all()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain()
        .flat_map(|(_, v)| v)
        .collect();
    // An idle worker waits for `start`: the socket's end tells it to exit.
    // All are told at once and share one deadline: a PyTorch process takes
    // about a second to tear down its CUDA context, and one after another
    // that was seconds at the end of every run.
    for p in &idle {
        let _ = p.writer.shutdown(std::net::Shutdown::Both);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline
        && !idle
            .iter_mut()
            .all(|p| matches!(p.child.try_wait(), Ok(Some(_))))
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    for mut p in idle {
        let _ = p.child.kill();
        let _ = p.child.wait();
        let _ = std::fs::remove_file(&p.socket);
    }
    // A pruned trial's worker is reaped by a thread of its own that
    // removes its socket when the worker exits, which may be after the run
    // ends; it connected long ago, and a socket's name is only needed to
    // connect.
    crate::temp_folders::remove_sockets(&socket_dir());
}

/// Where a PBT donor saves the state a trial with checkpoint file
/// `checkpoint` takes: beside it, and kept while the trial may restart
/// from it.
/// An exploit's new values for an external worker: its parameters.
fn exploit_params(new: &NewValues) -> training::Result<Value> {
    let NewValues::Params(json) = new else {
        return Err(fail(
            "an external worker takes parameters, not a built-in trial's hyper-parameters",
        ));
    };
    serde_json::from_str(json).map_err(|e| fail(format!("the new parameters are not JSON: {e}")))
}

/// The file a worker whose checkpoints go by the name `checkpoint` saves
/// its state at report step `step` to: a file per step, so that a save
/// never overwrites the checkpoint the database names (see the
/// `checkpoint` module).
pub fn checkpoint_at(checkpoint: &Path, step: u64) -> PathBuf {
    let mut p = checkpoint.as_os_str().to_owned();
    p.push(format!(".s{step}"));
    PathBuf::from(p)
}

/// Removes every file saved under the name `checkpoint`: each step's and
/// the staged exploit.
fn remove_checkpoints(checkpoint: &Path) {
    let (Some(dir), Some(name)) = (checkpoint.parent(), checkpoint.file_name()) else {
        return;
    };
    let name = name.to_string_lossy().into_owned();
    for path in crate::checkpoint::files_named(dir, &[name]) {
        let _ = std::fs::remove_file(path);
    }
}

/// Where a receiver's donor state is staged, beside its checkpoints.
pub fn exploit_path(checkpoint: &Path) -> PathBuf {
    let mut p = checkpoint.as_os_str().to_owned();
    p.push(".exploit");
    PathBuf::from(p)
}

fn socket_path(number: TrialNumber) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = socket_dir();
    let _ = std::fs::create_dir_all(&dir);
    dir.join(format!(
        "t{number}-{}.sock",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Keeps the last lines of a stream, for error messages.
fn drain_into(tail: Tail, stream: impl std::io::Read + Send + 'static) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    });
}

/// Serving workers (`done` with `more`) waiting for their next trial, per
/// command line, folder and device.
type PoolKey = (Vec<String>, PathBuf, String);
type Pool = Mutex<std::collections::HashMap<PoolKey, Vec<Process>>>;

fn idle_pool_all() -> &'static Pool {
    static POOL: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
    POOL.get_or_init(Default::default)
}

fn idle_pool(cfg: &WorkerConfig, placement: &str) -> PoolGuard {
    PoolGuard {
        key: (cfg.command.clone(), cfg.cwd.clone(), placement.to_string()),
        pool: idle_pool_all(),
    }
}

/// `CUDA_VISIBLE_DEVICES` for a worker on CUDA device `ordinal` of this
/// process: the `ordinal`-th entry of this process's own list where it has
/// one (ordinals count what it lets this process see), else the ordinal.
pub fn visible_device(parent: Option<&str>, ordinal: usize) -> String {
    parent
        .and_then(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .nth(ordinal)
        })
        .map_or(ordinal.to_string(), str::to_string)
}

/// JAX's `XLA_PYTHON_CLIENT_MEM_FRACTION`: the grant's share of the
/// device budget, rounded up to a hundredth, between 0.01 and 1.
pub fn memory_fraction(grant: u64, budget: u64) -> String {
    let hundredths = (100 * grant).div_ceil(budget.max(1)).clamp(1, 100);
    format!("{:.2}", hundredths as f64 / 100.0)
}

struct PoolGuard {
    key: PoolKey,
    pool: &'static Pool,
}

impl PoolGuard {
    fn push(&self, p: Process) {
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(self.key.clone())
            .or_default()
            .push(p);
    }
    fn pop(&self) -> Option<Process> {
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&self.key)
            .and_then(Vec::pop)
    }
}

/// `; its last output:` and the lines kept, or nothing.
fn tail_text(tail: &Tail) -> String {
    let t = tail.lock().unwrap_or_else(|e| e.into_inner());
    if t.is_empty() {
        String::new()
    } else {
        format!(
            "; its last output:\n{}",
            t.iter().cloned().collect::<Vec<_>>().join("\n")
        )
    }
}

impl ExternalTrial {
    /// Trial `number` with `params` (a JSON object); checkpoints go to
    /// `checkpoint_path`, and it starts from `resume_from` (an earlier
    /// checkpoint of the trial) where given. Nothing starts until the core
    /// admits it.
    pub fn new(
        cfg: Arc<WorkerConfig>,
        plan: Arc<MemoryPlan>,
        number: TrialNumber,
        params: Value,
        checkpoint_path: PathBuf,
        resume_from: Option<PathBuf>,
    ) -> Self {
        let resume_from = resume_from.map(|p| p.display().to_string());
        ExternalTrial {
            cfg,
            plan,
            number,
            params,
            checkpoint_path,
            resume_from,
            proc: None,
            iteration: 0,
            last_step: 0,
            last_report: None,
            attrs: Vec::new(),
            finished: false,
            measured: None,
            on_host: false,
            medium: SwapMedium::HostMemory,
            oom_need: 0,
            resume_point: (0, 0),
            positioned: false,
            device: "cpu",
            placement: "cpu".into(),
            cuda_ordinal: None,
            usage_checked: None,
            real: None,
            device_fixed: false,
        }
    }

    /// Tells the worker its device is `device` (`cuda` or `cpu`) whatever
    /// lane steps it: a benchmark's worker on a GPU, gated from a CPU lane.
    pub fn on_device(mut self, device: &'static str) -> Self {
        self.device = device;
        self.placement = device.to_string();
        self.device_fixed = true;
        self
    }

    /// Waits until the worker asks for its next iteration (a benchmark's
    /// end of a resume).
    pub fn wait_ready(&mut self) -> training::Result<()> {
        if self.proc.as_ref().is_some_and(|p| p.ready) {
            return Ok(());
        }
        match self.until_ready(false)? {
            (_, None) => Ok(()),
            (_, Some(_)) => Err(fail("the worker finished instead")),
        }
    }

    /// The bytes the ledger grants the trial: its planned footprint's
    /// persistent and ephemeral parts (an external trial shares no data).
    fn grant(&self) -> u64 {
        let fp = self.planned();
        (fp.persistent_bytes + fp.ephemeral_bytes) as u64
    }

    /// The footprint the ledger plans with: see [`plan_footprint`].
    fn planned(&self) -> Footprint {
        plan_footprint(
            self.measured,
            self.plan.declared,
            self.plan.learned(),
            self.real.or_else(|| self.plan.learned_real()),
            self.plan.budget,
            self.oom_need,
        )
    }

    fn tail(&self) -> String {
        let Some(p) = &self.proc else {
            return String::new();
        };
        // Give the output threads a moment to catch the last lines.
        std::thread::sleep(Duration::from_millis(50));
        tail_text(&p.tail)
    }

    /// On a GPU, now and then: what the worker's process really holds
    /// ([`super::nvml`]), which the plan then takes as a floor, and whether
    /// that is clearly more than its client reports (said once per process).
    fn check_usage(&mut self) {
        if self.cuda_ordinal.is_none()
            || self
                .usage_checked
                .is_some_and(|t| t.elapsed() < super::nvml::CHECK_EVERY)
        {
            return;
        }
        let Some(pid) = self.proc.as_ref().map(|p| p.child.id()) else {
            return;
        };
        self.usage_checked = Some(Instant::now());
        let Some(real) = super::nvml::process_usage(pid) else {
            return;
        };
        self.real = Some(real);
        self.plan.learn_real(real);
        let reported = self.measured.map_or(0, |m| m.persistent + m.cached);
        // Said once per process: nvml keeps which it named.
        super::nvml::check(self.number.0 as u64, pid, real, reported);
    }

    /// What tells a worker where it was placed: `SALUS_TUNE_PLACEMENT`,
    /// and on a GPU `CUDA_VISIBLE_DEVICES` naming only that one (as this
    /// process's own `CUDA_VISIBLE_DEVICES` numbers it), so that the
    /// user's script keeps saying `"cuda"`. JAX gets its grant's share of
    /// the device (`XLA_PYTHON_CLIENT_MEM_FRACTION`). These win over
    /// `[worker] env`: the placement is the scheduler's.
    fn placement_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("SALUS_TUNE_PLACEMENT", self.placement.clone())];
        if let Some(n) = self.cuda_ordinal {
            let parent = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            env.push(("CUDA_VISIBLE_DEVICES", visible_device(parent.as_deref(), n)));
            env.push((
                "XLA_PYTHON_CLIENT_MEM_FRACTION",
                memory_fraction(self.grant(), self.plan.budget),
            ));
        }
        env
    }

    fn spawn(&mut self) -> training::Result<()> {
        // A serving worker that finished a trial takes this one, where it
        // was started on the same device.
        while let Some(p) = idle_pool(&self.cfg, &self.placement).pop() {
            self.proc = Some(p);
            let line = protocol::encode(&self.start_message());
            if let Some(p) = self.proc.as_mut()
                && p.writer.write_all(line.as_bytes()).is_ok()
            {
                p.ready = false;
                return Ok(());
            }
            // It died while idle: reap it and try the next one.
            self.reap();
        }
        let cfg = self.cfg.clone();
        let socket = socket_path(self.number);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)
            .map_err(|e| fail(format!("cannot listen on {}: {e}", socket.display())))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail(format!("socket: {e}")))?;
        let mps_env = self
            .plan
            .mps
            .as_ref()
            .map_or(Vec::new(), |(daemon, lanes)| {
                daemon.worker_env(self.grant(), self.plan.budget, *lanes)
            });
        let mut child = Command::new(&cfg.command[0])
            .args(&cfg.command[1..])
            .current_dir(&cfg.cwd)
            // JAX takes 75% of a GPU at its start unless told not to, and
            // its neighbours would run out of memory (`[worker] env` may
            // say otherwise).
            .env("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            .envs(&cfg.env)
            .envs(mps_env)
            .envs(self.placement_env())
            .env("SALUS_TUNE_SOCKET", &socket)
            .env("SALUS_TUNE_TRIAL", self.number.to_string())
            .env("SALUS_TUNE_DEVICE", self.device)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                fail(format!(
                    "cannot start {:?} in {}: {e}",
                    cfg.command,
                    cfg.cwd.display()
                ))
            })?;
        let tail: Tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            drain_into(tail.clone(), out);
        }
        if let Some(err) = child.stderr.take() {
            drain_into(tail.clone(), err);
        }
        let started = Instant::now();
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Ok(Some(status)) = child.try_wait() {
                        let _ = std::fs::remove_file(&socket);
                        std::thread::sleep(Duration::from_millis(50));
                        let out = tail_text(&tail);
                        return Err(fail(format!(
                            "the worker exited ({status}) before connecting to SALUS_TUNE_SOCKET{out}"
                        )));
                    }
                    if started.elapsed() > cfg.heartbeat_timeout {
                        let _ = child.kill();
                        let _ = child.wait();
                        let _ = std::fs::remove_file(&socket);
                        return Err(fail(format!(
                            "the worker did not connect within {:?}: killed",
                            cfg.heartbeat_timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(fail(format!("socket: {e}"))),
            }
        };
        stream
            .set_nonblocking(false)
            .and_then(|_| stream.set_read_timeout(Some(cfg.heartbeat_timeout)))
            .map_err(|e| fail(format!("socket: {e}")))?;
        let writer = stream
            .try_clone()
            .map_err(|e| fail(format!("socket: {e}")))?;
        self.proc = Some(Process {
            child,
            reader: BufReader::new(stream),
            writer,
            tail,
            ready: false,
            socket,
            version: protocol::OLDEST,
            swap: false,
        });
        let version = match self.recv()? {
            FromWorker::Hello { version } => {
                protocol::negotiate(version).map_err(|e| self.abort(e))?
            }
            other => return Err(self.abort(format!("expected hello, got {other:?}"))),
        };
        if let Some(p) = self.proc.as_mut() {
            p.version = version;
        }
        self.send(&self.start_message())
    }

    /// The `start` message for this trial.
    fn start_message(&self) -> ToWorker {
        let version = self.proc.as_ref().map_or(protocol::OLDEST, |p| p.version);
        let v2 = version >= 2;
        ToWorker::Start {
            version,
            trial: self.number,
            params: self.params.clone(),
            report_every: self.cfg.report_every,
            checkpoint_path: self.checkpoint_path.display().to_string(),
            resume_from: self.resume_from.clone(),
            device: v2.then(|| self.device.to_string()),
            // The grant is a cap only once the trial's need is known.
            memory_limit: (v2 && (self.measured.is_some() || self.plan.declared.is_some()))
                .then(|| self.grant()),
        }
    }

    /// Kills the worker and returns an error carrying `msg` and its output.
    fn abort(&mut self, msg: String) -> WorkerError {
        let tail = self.tail();
        if let Some(mut p) = self.proc.take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
            let _ = std::fs::remove_file(&p.socket);
        }
        fail(format!("{msg}{tail}"))
    }

    fn send(&mut self, m: &ToWorker) -> training::Result<()> {
        let line = protocol::encode(m);
        let p = self.proc.as_mut().ok_or(WorkerError::NotResident)?;
        if let Err(e) = p.writer.write_all(line.as_bytes()) {
            return Err(self.abort(format!("cannot write to the worker: {e}")));
        }
        Ok(())
    }

    fn recv(&mut self) -> training::Result<FromWorker> {
        let p = self.proc.as_mut().ok_or(WorkerError::NotResident)?;
        let mut line = String::new();
        match p.reader.read_line(&mut line) {
            Ok(0) => {
                let status = p.child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(self.abort(format!(
                    "the worker exited ({status}) without finishing the trial"
                )))
            }
            Ok(_) => protocol::parse(&line)
                .map_err(|e| self.abort(format!("malformed message from the worker: {e}"))),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(self.abort(format!(
                    "the worker sent nothing for {:?} (heartbeat_timeout): killed",
                    self.cfg.heartbeat_timeout
                )))
            }
            Err(e) => Err(self.abort(format!("cannot read from the worker: {e}"))),
        }
    }

    fn report(
        &mut self,
        step: u64,
        value: f64,
        metrics: Vec<(String, f64)>,
    ) -> training::Result<Report> {
        if step <= self.last_step {
            return Err(self.abort(format!(
                "report steps must increase: step {step} after step {}",
                self.last_step
            )));
        }
        self.last_step = step;
        let r = Report {
            step,
            // Inside a granted iteration: counting it.
            iteration: self.iteration + 1,
            train_loss: f64::NAN,
            val_loss: f64::NAN,
            val_accuracy: None,
            val_rmse: None,
            val_r2: None,
            external: Some(value),
            extras: training::ReportExtras {
                metrics,
                attrs: std::mem::take(&mut self.attrs),
                more_values: Vec::new(),
            },
        };
        self.last_report = Some(r.clone());
        Ok(r)
    }

    /// Reads up to the worker's next `ready` (or its end), keeping its
    /// report. The end is `(value, more)`: `more` when the worker takes
    /// another trial. A report belongs to a granted iteration (`granted`:
    /// a `go` was sent), one per iteration: any other would be lost, so it
    /// fails the trial instead, saying how to fix the script.
    fn until_ready(&mut self, granted: bool) -> training::Result<(Option<Report>, Option<End>)> {
        let mut last: Option<Report> = None;
        loop {
            match self.recv()? {
                FromWorker::Ready {
                    memory,
                    swap,
                    iteration,
                } => {
                    if let Some(p) = self.proc.as_mut() {
                        p.ready = true;
                        p.swap = swap && p.version >= 2;
                    }
                    // The client's own count wins: a resumed script goes
                    // on from its checkpoint's iteration.
                    if let Some(i) = iteration {
                        self.iteration = i;
                        self.positioned = true;
                    }
                    if let Some(m) = memory {
                        self.measured = Some(m);
                        self.plan.learn(m);
                    }
                    self.check_usage();
                    return Ok((last, None));
                }
                FromWorker::Report { step, .. } if !granted => {
                    return Err(self.abort(format!(
                        "the script reported step {step} outside an iteration: call trial.report() \
                         inside `for i in trial.iterations(n)`, once per iteration"
                    )));
                }
                FromWorker::Report { step, .. } if last.is_some() => {
                    return Err(self.abort(format!(
                        "the script reported twice in one iteration (step {step} after step {}): \
                         report once per iteration of trial.iterations(n)",
                        self.last_step
                    )));
                }
                FromWorker::Report {
                    step,
                    value,
                    metrics,
                } => last = Some(self.report(step, value, metrics)?),
                FromWorker::Attr { key, value } => self.attrs.push((key, value.to_string())),
                FromWorker::Heartbeat => {}
                FromWorker::Done { value, more } => return Ok((last, Some((value, more)))),
                FromWorker::Error { message } => {
                    return Err(self.abort(format!("the worker reported an error: {message}")));
                }
                // Requeued, not failed: only the need matters to the core
                // (the script's traceback is in its own output).
                FromWorker::Oom { needed, .. } => return Err(self.out_of_memory(needed)),
                other => return Err(self.abort(format!("unexpected message {other:?}"))),
            }
        }
    }

    /// Sends `request` to the waiting worker and waits for its answer
    /// (`want`, which `bytes_of` reads the bytes from): the bytes moved.
    fn ask(
        &mut self,
        request: ToWorker,
        want: &str,
        bytes_of: fn(&FromWorker) -> Option<u64>,
    ) -> training::Result<u64> {
        self.send(&request)?;
        loop {
            let m = self.recv()?;
            if let Some(bytes) = bytes_of(&m) {
                return Ok(bytes);
            }
            match m {
                FromWorker::Heartbeat => {}
                FromWorker::Oom { needed, .. } => return Err(self.out_of_memory(needed)),
                FromWorker::Error { message } => {
                    return Err(self.abort(format!("the worker reported an error: {message}")));
                }
                other => return Err(self.abort(format!("expected {want}, got {other:?}"))),
            }
        }
    }

    /// The worker ran out of device memory and is exiting: the trial will
    /// restart from its last checkpoint (or the start) once the ledger
    /// grants at least what the client says it needs, and at least half as
    /// much again as it had.
    fn out_of_memory(&mut self, needed: u64) -> WorkerError {
        let had = self.grant();
        self.oom_need = needed.max(had + had / 2);
        self.reap();
        self.on_host = false;
        (self.iteration, self.last_step) = self.resume_point;
        self.last_report = None;
        WorkerError::Kernel(KernelError::OutOfMemory {
            requested: self.oom_need as usize,
        })
    }

    fn reap(&mut self) {
        if let Some(mut p) = self.proc.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = p.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
            let _ = std::fs::remove_file(&p.socket);
        }
    }
}

impl Drop for ExternalTrial {
    /// A trial dropped unfinished (pruned, or the study stopped) tells its
    /// worker to exit; a thread reaps it so that the core never waits.
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            if p.ready {
                let _ = p
                    .writer
                    .write_all(protocol::encode(&ToWorker::Prune).as_bytes());
            }
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = p.child.try_wait() {
                        let _ = std::fs::remove_file(&p.socket);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = p.child.kill();
                let _ = p.child.wait();
                let _ = std::fs::remove_file(&p.socket);
            });
        }
    }
}

impl<B: Backend> Job<B> for ExternalTrial {
    fn footprint(&self) -> Footprint {
        self.planned()
    }

    /// Only with no live worker: not started yet, or swapped out through
    /// its checkpoint. A worker keeps the device it started on.
    fn can_move(&self) -> bool {
        self.proc.is_none() && !self.on_host
    }

    /// Its client measures it at every `ready`.
    fn footprint_changes(&self) -> bool {
        true
    }

    /// No two external trials fuse: each key names its trial. They share
    /// one shape, so that a lane reserves one iteration's ephemeral memory
    /// for all of its trials (only the one holding the lane runs).
    fn fusion_key(&self) -> FusionKey {
        FusionKey {
            shape: GroupShape {
                spec: ModelSpec {
                    precision: Default::default(),
                    input: 0,
                    hidden: vec![],
                    output: 0,
                    activation: Activation::Relu,
                    loss: LossKind::Mse,
                    conv: None,
                },
                slots: 0,
                batch: 0,
                dropout: false,
                target_cols: 0,
            },
            family: OptimizerFamily::Sgd,
            data: format!("external:{}", self.number),
        }
    }

    fn iterations_done(&self) -> u64 {
        self.iteration.min(self.cfg.iterations)
    }

    fn total_iterations(&self) -> u64 {
        self.cfg.iterations.max(self.iteration + 1)
    }

    fn is_resident(&self) -> bool {
        self.proc.is_some() && !self.on_host
    }

    fn step(&mut self, _lane: &mut Lane<B>) -> training::Result<StepOutcome> {
        if self.finished {
            return Err(fail("the trial has already finished"));
        }
        if self.proc.is_none() || self.on_host {
            return Err(WorkerError::NotResident);
        }
        if !self.proc.as_ref().is_some_and(|p| p.ready) {
            let (early, done) = self.until_ready(false)?;
            if let Some((value, more)) = done {
                return self.finish(early, value, more);
            }
        }
        // SRTF and the pruners plan with the declared iterations.
        let declared = self.cfg.iterations;
        if self.iteration >= declared {
            return Err(self.abort(format!(
                "the script asked for iteration {} but [worker] iterations = {declared}: \
                 raise iterations, or loop over trial.iterations({declared})",
                self.iteration + 1
            )));
        }
        self.send(&ToWorker::Go)?;
        if let Some(p) = self.proc.as_mut() {
            p.ready = false;
        }
        self.positioned = false;
        let (report, done) = self.until_ready(true)?;
        if !self.positioned {
            self.iteration += 1;
        }
        if let Some((value, more)) = done {
            return self.finish(report, value, more);
        }
        Ok(match report {
            Some(r) => StepOutcome::Report(r),
            None => StepOutcome::Continue,
        })
    }

    fn report(&self) -> Option<&Report> {
        self.last_report.as_ref()
    }

    fn export_state(&mut self, _lane: &mut Lane<B>) -> training::Result<TrialSnapshot> {
        Err(WorkerError::BadState(
            "an external worker checkpoints itself (the checkpoint message)".into(),
        ))
    }

    fn import_state(
        &mut self,
        _lane: &mut Lane<B>,
        _state: &TrialSnapshot,
    ) -> training::Result<()> {
        Err(WorkerError::BadState(
            "an external worker resumes itself from its checkpoint".into(),
        ))
    }

    /// Moves the worker's state to host memory (a client that tracks it),
    /// else asks it to checkpoint and exit; it restarts from there.
    fn swap_out(&mut self, _lane: &mut Lane<B>) -> training::Result<usize> {
        if self.proc.is_none() || self.on_host {
            return Ok(0);
        }
        if !self.proc.as_ref().is_some_and(|p| p.ready) {
            let (_, done) = self.until_ready(false)?;
            if done.is_some() {
                return Err(fail("the worker finished while being swapped out"));
            }
        }
        if self.proc.as_ref().is_some_and(|p| p.swap) {
            let bytes = self.ask(ToWorker::SwapOut, "swapped_out", |m| match m {
                FromWorker::SwappedOut { bytes } => Some(*bytes),
                _ => None,
            })?;
            self.on_host = true;
            self.medium = SwapMedium::HostMemory;
            return Ok(bytes as usize);
        }
        self.medium = SwapMedium::Checkpoint;
        let path = checkpoint_at(&self.checkpoint_path, self.last_step)
            .display()
            .to_string();
        self.send(&ToWorker::Checkpoint { path: path.clone() })?;
        loop {
            match self.recv()? {
                FromWorker::Checkpointed { .. } => break,
                FromWorker::Heartbeat => {}
                other => return Err(self.abort(format!("expected checkpointed, got {other:?}"))),
            }
        }
        self.reap();
        self.resume_from = Some(path);
        self.resume_point = (self.iteration, self.last_step);
        Ok(self.planned().persistent_bytes)
    }

    fn swap_in(&mut self, lane: &mut Lane<B>) -> training::Result<usize> {
        if !self.device_fixed && self.proc.is_none() {
            let backend = lane.backend();
            (self.device, self.cuda_ordinal) = match backend.kind() {
                DeviceKind::Cuda(n) => ("cuda", Some(n)),
                DeviceKind::Cpu => ("cpu", None),
            };
            self.placement = backend.label();
        }
        if self.finished {
            return Ok(0);
        }
        if self.on_host {
            let bytes = self.ask(ToWorker::SwapIn, "swapped_in", |m| match m {
                FromWorker::SwappedIn { bytes } => Some(*bytes),
                _ => None,
            })?;
            self.on_host = false;
            return Ok(bytes as usize);
        }
        if self.proc.is_some() {
            return Ok(0);
        }
        // A process start, from the last checkpoint where there is one.
        self.medium = SwapMedium::Checkpoint;
        self.spawn()?;
        Ok(self.planned().persistent_bytes)
    }

    fn swap_medium(&self) -> SwapMedium {
        self.medium
    }

    /// The live worker saves itself (`save`); one swapped out through its
    /// checkpoint has its state in that file already.
    fn save_for_exploit(&mut self, _lane: &mut Lane<B>, path: &Path) -> training::Result<()> {
        let Some(version) = self.proc.as_ref().map(|p| p.version) else {
            let from = self
                .resume_from
                .clone()
                .ok_or_else(|| fail("the donor has no saved state yet"))?;
            std::fs::copy(&from, path)
                .map_err(|e| fail(format!("cannot copy the donor's checkpoint {from}: {e}")))?;
            return Ok(());
        };
        if version < 3 {
            return Err(fail(format!(
                "the donor's client speaks protocol version {version}; PBT needs version 3 \
                 (a newer salus_worker)"
            )));
        }
        self.wait_ready()?;
        self.ask(
            ToWorker::Save {
                path: path.display().to_string(),
            },
            "saved",
            |m| matches!(m, FromWorker::Saved { .. }).then_some(0),
        )?;
        Ok(())
    }

    /// Takes the donor's saved state: in process where the client can
    /// load it, else by a restart from it (the process keeps its grant).
    fn exploit(
        &mut self,
        lane: &mut Lane<B>,
        _tag: Option<u64>,
        donor: &mut dyn Job<B>,
        _donor_tag: Option<u64>,
        new: &NewValues,
    ) -> training::Result<usize> {
        let params = exploit_params(new)?;
        let staged = exploit_path(&self.checkpoint_path);
        donor.save_for_exploit(lane, &staged)?;
        let iteration = donor.iterations_done();
        let step = donor.report().map_or(0, |r| r.step);
        self.last_report = donor.report().cloned();
        self.take_saved(staged, params, iteration, step)
    }

    /// Takes another process's donor's state, from the file its worker
    /// saved at the point (copied first: that file goes once every
    /// receiver has moved on), as [`Job::exploit`] takes a donor's own.
    fn exploit_stored(
        &mut self,
        _lane: &mut Lane<B>,
        _tag: Option<u64>,
        state: StoredState,
        new: &NewValues,
    ) -> training::Result<usize> {
        let StoredState::File {
            path,
            iteration,
            step,
        } = state
        else {
            return Err(fail(
                "an external worker takes another worker's saved file, not a built-in trial's state",
            ));
        };
        let params = exploit_params(new)?;
        let staged = exploit_path(&self.checkpoint_path);
        std::fs::copy(&path, &staged).map_err(|e| {
            fail(format!(
                "cannot copy the donor's saved state {}: {e}",
                path.display()
            ))
        })?;
        self.take_saved(staged, params, iteration, step)
    }

    fn releasable_bytes(&self) -> usize {
        // Only a version 2 client measures; it must be waiting to answer.
        let waiting = self.proc.as_ref().is_some_and(|p| p.ready);
        match self.measured {
            Some(m) if waiting && !self.on_host => m.cached as usize,
            _ => 0,
        }
    }

    /// Asks the waiting worker to empty its allocator's cache.
    fn release_cache(&mut self, _lane: &mut Lane<B>) -> training::Result<usize> {
        if Job::<B>::releasable_bytes(self) == 0 {
            return Ok(0);
        }
        let bytes = self.ask(ToWorker::ReleaseCache, "released", |m| match m {
            FromWorker::Released { bytes } => Some(*bytes),
            _ => None,
        })?;
        if let Some(m) = self.measured.as_mut() {
            m.cached = 0;
        }
        Ok(bytes as usize)
    }
}

impl ExternalTrial {
    /// Goes on from the state saved in `staged` with `params`, at
    /// `iteration` and report `step`: in process where the client can load
    /// it, else by a restart from it (the process keeps its grant).
    fn take_saved(
        &mut self,
        staged: PathBuf,
        params: Value,
        iteration: u64,
        step: u64,
    ) -> training::Result<usize> {
        let bytes = std::fs::metadata(&staged).map_or(0, |m| m.len() as usize);
        self.params = params.clone();
        self.resume_from = Some(staged.display().to_string());
        (self.iteration, self.last_step) = (iteration, step);
        self.resume_point = (iteration, step);
        let Some(version) = self.proc.as_ref().map(|p| p.version) else {
            // Not running: its next start is from the donor's state.
            return Ok(bytes);
        };
        let live = !self.on_host;
        self.wait_ready()?;
        if version >= 3 && live {
            self.send(&ToWorker::Exploit {
                resume_from: staged.display().to_string(),
                params,
                iteration,
            })?;
            loop {
                match self.recv()? {
                    FromWorker::Exploited => return Ok(bytes),
                    FromWorker::Restart => break,
                    FromWorker::Heartbeat => {}
                    FromWorker::Error { message } => {
                        return Err(self.abort(format!("the worker reported an error: {message}")));
                    }
                    other => {
                        return Err(self.abort(format!("expected exploited, got {other:?}")));
                    }
                }
            }
        } else {
            self.send(&ToWorker::Prune)?;
        }
        self.reap();
        self.on_host = false;
        if live {
            // Restarted in place: the ledger still holds its memory.
            self.spawn()?;
        }
        Ok(bytes)
    }
}

impl ExternalTrial {
    fn finish(
        &mut self,
        report: Option<Report>,
        values: Vec<f64>,
        more: bool,
    ) -> training::Result<StepOutcome> {
        let value = values[0];
        self.finished = true;
        match (more, self.proc.take()) {
            // A serving worker waits for its next trial, in the pool.
            (true, Some(p)) => idle_pool(&self.cfg, &self.placement).push(p),
            (_, p) => {
                self.proc = p;
                self.reap();
            }
        }
        remove_checkpoints(&self.checkpoint_path);
        let step = report.as_ref().map_or(self.last_step.max(1), |r| r.step);
        // What the last report carried is stored with it; what came after
        // is stored with the end.
        let mut extras = report.map(|r| r.extras).unwrap_or_default();
        extras.attrs.append(&mut self.attrs);
        extras.more_values = values[1..].to_vec();
        let mut r = Report {
            step,
            iteration: self.iteration,
            train_loss: f64::NAN,
            val_loss: f64::NAN,
            val_accuracy: None,
            val_rmse: None,
            val_r2: None,
            external: Some(value),
            extras,
        };
        if !value.is_finite() {
            r.external = Some(value);
        }
        self.last_report = Some(r.clone());
        Ok(StepOutcome::Finished(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_sees_only_its_own_gpu_as_this_process_numbers_it() {
        assert_eq!(visible_device(None, 1), "1");
        // This process sees physical GPUs 4 and 6: its cuda:1 is GPU 6.
        assert_eq!(visible_device(Some("4,6"), 1), "6");
        assert_eq!(visible_device(Some(" GPU-a1 , GPU-b2 "), 0), "GPU-a1");
        // A list shorter than the ordinal (or empty) falls back to it.
        assert_eq!(visible_device(Some(""), 2), "2");
        assert_eq!(visible_device(Some("3"), 1), "1");
    }

    #[test]
    fn jax_gets_its_grant_as_a_fraction_of_the_device() {
        assert_eq!(memory_fraction(1 << 30, 4 << 30), "0.25");
        // Rounded up to a hundredth, at least one, at most all.
        assert_eq!(memory_fraction(1, 100 << 30), "0.01");
        assert_eq!(memory_fraction((1 << 30) + 1, 4 << 30), "0.26");
        assert_eq!(memory_fraction(8 << 30, 4 << 30), "1.00");
    }

    #[test]
    fn the_plan_takes_the_report_then_the_declaration_then_the_budget_and_nvml_as_a_floor() {
        const MIB: u64 = 1 << 20;
        let report = MemoryReport {
            persistent: 40 * MIB,
            peak: 100 * MIB,
            cached: 4 * MIB,
        };
        let total = |f: Footprint| (f.persistent_bytes as u64, f.ephemeral_bytes as u64);
        // Its own report: persistent and cached held, the peak above as the
        // iteration's need.
        let own = plan_footprint(Some(report), Some(1 << 30), None, None, 8 << 30, 0);
        assert_eq!(total(own), (44 * MIB, 60 * MIB));
        // Unmeasured: the declaration, else the run's first report, else all.
        assert_eq!(
            total(plan_footprint(
                None,
                Some(1 << 30),
                Some(report),
                None,
                8 << 30,
                0
            )),
            (1 << 30, 0)
        );
        assert_eq!(
            total(plan_footprint(None, None, Some(report), None, 8 << 30, 0)),
            (44 * MIB, 60 * MIB)
        );
        assert_eq!(
            total(plan_footprint(None, None, None, None, 8 << 30, 0)),
            (8 << 30, 0)
        );
        // NVML read the process hold 589 MiB (a CUDA context and cuDNN's
        // workspaces beside a 44 MiB report): the plan holds that in all.
        let real = plan_footprint(Some(report), None, None, Some(589 * MIB), 8 << 30, 0);
        assert_eq!(total(real), (529 * MIB, 60 * MIB));
        // A reading below the report changes nothing; an OOM's need still
        // wins when larger.
        assert_eq!(
            plan_footprint(Some(report), None, None, Some(10 * MIB), 8 << 30, 0),
            own
        );
        assert_eq!(
            total(plan_footprint(
                Some(report),
                None,
                None,
                Some(589 * MIB),
                8 << 30,
                2 << 30
            )),
            ((2 << 30) - 60 * MIB, 60 * MIB)
        );
    }
}
