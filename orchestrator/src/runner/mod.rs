//! Runs a study: propose, train, record, until the budget is spent.
//!
//! Every trial runs through the Salus core: the runner keeps up to
//! `max_concurrent` trials submitted (default: two per lane), and turns the
//! core's events into storage writes and progress. It owns no output: it
//! tells a [`Reporter`] what happens, and the writer what to store. How
//! trials run as fused groups, leave them and join them is in `gangs`.
//!
//! Resuming: trials that are finished (COMPLETE, PRUNED, FAIL) count toward
//! the budget. A trial left RUNNING by a process that died, or interrupted
//! by Ctrl-C, goes back to WAITING and is run again first, with the same
//! parameters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::Receiver;

use kernels::{Backend, DeviceKind};
use workers::{DeviceData, Job, Lane, MemberOutcome, Report, TrainTrial, WorkerError};

mod gangs;
use gangs::{Gang, Parked};

use crate::checkpoint::Checkpoints;
use crate::error::{Error, Result};
use crate::external::ExternalTrial;
use crate::progress::Reporter;
use crate::pruner::{Curve, Curves, Decision, Pruner, priority, value_at};
use crate::salus::JobId;
use crate::salus::core::{CoreConfig, CoreEvent, SalusCore};
use crate::salus::ledger::MemoryLedger;
use crate::salus::policy::{Policy, default_policy};
use crate::sampler::{GridSampler, QmcSampler, RandomSampler, Sampler, TpeSampler, TrialRecord};
use crate::space::{Distribution, ParamValue, Params, distribution_json};
use crate::storage::writer::{LaneStats, RunInfo, WriteOp};
use crate::storage::{StudyInfo, TrialRow, TrialState, Writer};
use crate::study::{GraphsMode, PrunerKind, SamplerKind, Study};

/// What a run was asked to do beyond the study file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides `[study] trials`.
    pub trials: Option<u64>,
    /// Overrides `[study] seed` (and the sampler's seed).
    pub seed: Option<u64>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub finished: u64,
    pub ran: u64,
    pub interrupted: bool,
    pub best: Option<(i64, f64)>,
}

/// A trial the runner is about to run.
struct Pending {
    trial_id: i64,
    number: i64,
    params: Params,
    /// The checkpoint it continues from, if it has one.
    resume: Option<workers::TrialState>,
}

/// Decodes stored parameters through the current search space.
pub fn decode_params(study: &Study, row: &TrialRow) -> Params {
    let mut params = Params::new();
    for (name, value, _) in &row.params {
        let Some(p) = study.space.params().iter().find(|p| &p.name == name) else {
            continue;
        };
        let v = match p.dist {
            Distribution::Float { .. } => ParamValue::Float(*value),
            Distribution::Int { .. } => ParamValue::Int(value.round() as i64),
            Distribution::Categorical { .. } => ParamValue::Choice(*value as usize),
        };
        params.insert(name.clone(), v);
    }
    params
}

fn encode_params(study: &Study, params: &Params) -> Vec<(String, f64, String)> {
    study
        .space
        .params()
        .iter()
        .filter_map(|p| {
            params
                .get(&p.name)
                .map(|v| (p.name.clone(), v.internal(), distribution_json(&p.dist)))
        })
        .collect()
}

/// A trial's seed: a pure function of the study seed and the trial number.
pub fn trial_seed(study_seed: u64, number: i64) -> u64 {
    kernels::rng::mix64(study_seed ^ (number as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

pub struct Runner<'a> {
    pub study: &'a Study,
    pub info: StudyInfo,
    pub writer: Writer,
    pub reporter: &'a mut Reporter,
    pub stop: Arc<AtomicBool>,
    pub options: RunOptions,
    /// Where trials' checkpoints go; `None` runs without them.
    pub checkpoints: Option<Checkpoints>,
    /// No other live process runs studies on this database (this one holds
    /// its lock): every RUNNING trial then belongs to a dead process.
    pub sole: bool,
}

/// How often the runner tells the database its trials are alive.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(2);
/// A RUNNING trial whose heartbeat is older than this belongs to a dead process.
pub const STALE_AFTER_S: f64 = 10.0;

/// A trial handed to the core.
struct Flight {
    pending: Pending,
    history_index: usize,
    footprint: workers::Footprint,
    total_iterations: u64,
    /// Its latest priority (0 until it reaches a rung).
    priority: f64,
}

/// Per-lane totals for `salus_lane_stats`.
#[derive(Default)]
struct LaneTally {
    iterations: i64,
    busy_s: f64,
    switches: i64,
    switch_sum_s: f64,
    switch_max_s: f64,
}

impl Runner<'_> {
    /// The core's settings from `[scheduler]` and this machine.
    fn core_config<B: Backend>(&self, backend: &B) -> CoreConfig {
        let s = &self.study.scheduler;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let policy = s
            .policy
            .unwrap_or(default_policy(self.study.pruner != PrunerKind::None));
        let base = match backend.kind() {
            DeviceKind::Cpu => CoreConfig::cpu(
                policy,
                s.lanes.unwrap_or(cores),
                cores,
                MemoryLedger::cpu_budget(s.memory_bytes, backend.memory_bytes() as u64),
            ),
            DeviceKind::Cuda(_) => CoreConfig::cuda(
                policy,
                s.lanes.unwrap_or(CoreConfig::CUDA_LANES),
                s.memory_bytes
                    .unwrap_or(MemoryLedger::cuda_budget(backend.memory_bytes() as u64)),
            ),
        };
        CoreConfig {
            hold_at_reports: self.study.pruner != PrunerKind::None,
            checkpoints: self.checkpoints.is_some(),
            // `auto`: wherever the backend has graphs (CUDA).
            graphs: s.graphs != Some(GraphsMode::Off),
            ..base
        }
    }

    /// Runs the study to its budget, its timeout, an exhausted grid or a stop.
    pub fn run<B: Backend>(
        mut self,
        backend: Arc<B>,
        existing: Vec<TrialRow>,
    ) -> Result<RunSummary> {
        let study = self.study;
        let data = study.data.load()?;
        if let Some(max) = self.max_batch()
            && max as usize > data.n_train
        {
            let (line, col) = study.positions.get("batch_size").copied().unwrap_or((0, 0));
            return Err(Error::Study {
                path: study.path.display().to_string(),
                line,
                col,
                key: "train.batch_size".into(),
                msg: format!(
                    "batch_size can be {max}, but the training split has only {} rows",
                    data.n_train
                ),
            });
        }
        let device_data = DeviceData::upload(&mut Lane::new(backend.clone(), 0, 1)?, &data)?;
        let mut st = self.start(&backend, device_data, &existing)?;
        let interrupted = loop {
            if self.stop.load(Ordering::SeqCst) {
                break true;
            }
            let timed_out = study.timeout.is_some_and(|t| st.started.elapsed() >= t);
            self.take_commands(&mut st)?;
            self.heartbeat(&mut st)?;
            self.fill(&mut st, timed_out)?;
            self.close_paused(&mut st, timed_out)?;
            if st.in_flight.is_empty() {
                if timed_out {
                    self.reporter.note(&format!(
                        "timeout of {:?} reached; no new trials",
                        study.timeout.unwrap_or_default()
                    ));
                }
                break false;
            }
            match st
                .events
                .recv_timeout(std::time::Duration::from_millis(100))
            {
                Ok(event) => self.on_event(&mut st, event)?,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::CoreStopped);
                }
            }
        };
        self.finish(st, interrupted)
    }

    /// Takes stock of the stored trials, records the run, and starts the core.
    fn start<B: Backend>(
        &mut self,
        backend: &Arc<B>,
        data: Arc<DeviceData<B>>,
        existing: &[TrialRow],
    ) -> Result<RunState<B>> {
        let study = self.study;
        let budget = self.options.trials.unwrap_or(study.trials);
        let mut history: Vec<TrialRecord> = Vec::new();
        let mut waiting = VecDeque::new();
        let mut finished = 0u64;
        let mut best: Option<(i64, f64)> = None;
        let mut elsewhere = 0u64;
        let mut kept_steps: BTreeMap<i64, i64> = BTreeMap::new();
        let now = chrono::Local::now().naive_local();
        for row in existing {
            let params = decode_params(study, row);
            if row.state == TrialState::Running {
                // A fresh heartbeat: another live process runs it.
                let beat_age = row.heartbeat.as_deref().and_then(|h| {
                    chrono::NaiveDateTime::parse_from_str(h, "%Y-%m-%d %H:%M:%S%.f").ok()
                });
                if !self.sole
                    && beat_age.is_some_and(|t| {
                        ((now - t).num_milliseconds() as f64) < STALE_AFTER_S * 1e3
                    })
                {
                    elsewhere += 1;
                    history.push(TrialRecord {
                        params,
                        value: None,
                    });
                    continue;
                }
            }
            if matches!(row.state, TrialState::Running | TrialState::Waiting) {
                // The trial continues from its checkpoint when one fits it.
                let cfg = study.trial_config(
                    &params,
                    trial_seed(self.options.seed.unwrap_or(study.seed), row.number),
                );
                // It must not be ahead of the stored curve: a crash between
                // the checkpoint and its report's value would lose a step.
                let stored = row.intermediate.last().map_or(0, |&(s, _)| s);
                let resume = self
                    .checkpoints
                    .as_ref()
                    .and_then(|c| c.load(row.trial_id))
                    .filter(|s| s.reports as i64 <= stored)
                    .filter(|s| TrainTrial::resume_on_host(data.clone(), cfg, s.clone()).is_ok());
                let keep = resume.as_ref().map_or(0, |s| s.reports as i64);
                if row.state == TrialState::Running {
                    self.writer.send(WriteOp::Requeue {
                        trial_id: row.trial_id,
                        keep_steps: keep,
                    })?;
                }
                kept_steps.insert(row.number, keep);
                waiting.push_back(Pending {
                    trial_id: row.trial_id,
                    number: row.number,
                    params: params.clone(),
                    resume,
                });
            }
            if row.state.is_finished() {
                finished += 1;
            }
            if let (TrialState::Complete, Some(v)) = (row.state, row.value)
                && best.is_none_or(|(_, b)| study.direction.better(v, b))
            {
                best = Some((row.number, v));
            }
            history.push(TrialRecord {
                params,
                value: row.value,
            });
        }
        let sampler_seed = self.options.seed.unwrap_or(study.sampler.seed);
        let sampler: Box<dyn Sampler> = match study.sampler.kind {
            SamplerKind::Random => Box::new(RandomSampler::new(sampler_seed)),
            SamplerKind::Qmc => Box::new(QmcSampler { seed: sampler_seed }),
            SamplerKind::Tpe {
                startup_trials,
                multivariate,
            } => {
                let mut tpe = TpeSampler::new(sampler_seed, study.direction);
                tpe.startup_trials = startup_trials;
                tpe.multivariate = multivariate;
                Box::new(tpe)
            }
            SamplerKind::Grid => {
                Box::new(GridSampler::new(&study.space, sampler_seed).map_err(Error::Input)?)
            }
        };
        let config = self.core_config(backend.as_ref());
        let max_concurrent = study
            .worker
            .as_ref()
            .and_then(|w| w.max_concurrency)
            .or(study.scheduler.max_concurrent)
            .unwrap_or(2 * config.lanes)
            .max(1);
        let device = backend.name();
        let run_id = self.writer.start_run(
            self.info.id,
            RunInfo {
                device: device.clone(),
                policy: config.policy.name().to_string(),
                lanes: config.lanes as i64,
                threads_per_lane: config.threads_per_lane as i64,
                budget_bytes: config.budget as i64,
            },
        )?;
        self.writer.send(WriteOp::Event {
            study_id: self.info.id,
            trial_id: None,
            kind: "study_start",
            detail: serde_json::json!({ "budget": budget, "finished": finished, "device": device, "run_id": run_id, "lanes": config.lanes, "max_concurrent": max_concurrent }).to_string(),
        })?;
        self.reporter.study_start(study, budget, finished, best);
        let (tx, events) = std::sync::mpsc::channel();
        let core = SalusCore::start(backend.clone(), config, tx)?;
        // A requeued trial keeps only the values its checkpoint covers.
        let curves = existing
            .iter()
            .map(|r| {
                let keep = kept_steps.get(&r.number).copied().unwrap_or(i64::MAX);
                (
                    r.number,
                    Curve {
                        values: r
                            .intermediate
                            .iter()
                            .filter(|&&(s, _)| s <= keep)
                            .map(|&(s, v)| (s as u64, v))
                            .collect(),
                        finished: r.state.is_finished(),
                    },
                )
            })
            .collect();
        if let Some(c) = &self.checkpoints {
            let live: Vec<i64> = waiting.iter().map(|p| p.trial_id).collect();
            c.sweep(&live);
        }
        Ok(RunState {
            core,
            events,
            pruner: study.pruner.build(),
            sampler,
            data,
            run_id,
            device,
            started: Instant::now(),
            seed: self.options.seed.unwrap_or(study.seed),
            budget,
            max_concurrent,
            history,
            waiting,
            finished,
            ran: 0,
            best,
            exhausted: false,
            in_flight: BTreeMap::new(),
            curves,
            paused: BTreeMap::new(),
            closing: BTreeSet::new(),
            trial_ids: BTreeMap::new(),
            lanes: BTreeMap::new(),
            fuse: study.scheduler.fuse.unwrap_or(DEFAULT_FUSE).max(1),
            policy: config.policy,
            parked: BTreeMap::new(),
            lane_budget: config.budget / config.lanes.max(1) as u64,
            lanes_n: config.lanes.max(1),
            core_kind: backend.kind(),
            gangs: BTreeMap::new(),
            member_gang: BTreeMap::new(),
            next_member: FIRST_MEMBER,
            elsewhere,
            backend: backend.clone(),
            last_heartbeat: Instant::now(),
            user_paused: BTreeSet::new(),
            last_commands: Instant::now(),
        })
    }

    /// Submits trials (waiting ones first, then new proposals) while slots,
    /// the budget and the time allow. Paused trials hold no slot. With
    /// fusion on, new trials and parked ones that may run again join
    /// running groups of their fusion key or form new ones (see `gangs`).
    fn fill<B: Backend>(&mut self, st: &mut RunState<B>, timed_out: bool) -> Result<()> {
        let study = self.study;
        let mut batch: Vec<(TrainTrial<B>, Flight)> = Vec::new();
        while !st.exhausted
            && !timed_out
            && st.in_flight.len().saturating_sub(st.paused.len()) + batch.len() < st.max_concurrent
            && st.finished + st.elsewhere + ((st.in_flight.len() + batch.len()) as u64) < st.budget
        {
            let mut pending = match st.waiting.pop_front() {
                Some(p) => {
                    self.writer.send(WriteOp::StartTrial {
                        trial_id: p.trial_id,
                    })?;
                    p
                }
                None => match st.sampler.propose(&study.space, &st.history) {
                    None => {
                        self.reporter.note("the grid is exhausted");
                        st.exhausted = true;
                        break;
                    }
                    Some(params) => {
                        let (trial_id, number) = self
                            .writer
                            .create_trial(self.info.id, encode_params(study, &params))?;
                        st.history.push(TrialRecord {
                            params: params.clone(),
                            value: None,
                        });
                        Pending {
                            trial_id,
                            number,
                            params,
                            resume: None,
                        }
                    }
                },
            };
            let history_index = st
                .history
                .iter()
                .rposition(|t| t.params == pending.params)
                .unwrap_or(st.history.len() - 1);
            if let Some(w) = &study.worker {
                // The user's script: one process per trial, never fused.
                st.ran += 1;
                let ckpt = match &self.checkpoints {
                    Some(c) => c.external_path(pending.trial_id),
                    None => std::env::temp_dir()
                        .join(format!("salus-trial-{}.external", pending.trial_id)),
                };
                let trial = ExternalTrial::new(
                    Arc::new(w.clone()),
                    pending.number,
                    external_params(study, &pending.params),
                    ckpt,
                );
                self.reporter.trial_start(
                    pending.number,
                    &describe(study, &pending.params),
                    w.iterations.div_ceil(w.report_every.max(1)),
                );
                let flight = Flight {
                    footprint: Job::<B>::footprint(&trial),
                    total_iterations: w.iterations,
                    history_index,
                    pending,
                    priority: 0.0,
                };
                let id = st.core.submit(Box::new(trial), 0.0, "external");
                st.trial_ids.insert(id, flight.pending.trial_id);
                st.in_flight.insert(id, flight);
                continue;
            }
            let cfg = study.trial_config(&pending.params, trial_seed(st.seed, pending.number));
            st.ran += 1;
            let made = match pending.resume.take() {
                Some(state) => TrainTrial::resume_on_host(st.data.clone(), cfg.clone(), state),
                None => TrainTrial::new_on_host(st.data.clone(), cfg.clone()),
            };
            match made {
                Ok(trial) => {
                    let reports = trial.total_iterations().div_ceil(
                        cfg.report_every
                            .unwrap_or(trial.iterations_per_epoch())
                            .max(1),
                    );
                    self.reporter.trial_start(
                        pending.number,
                        &describe(study, &pending.params),
                        reports,
                    );
                    let flight = Flight {
                        footprint: trial.footprint(),
                        total_iterations: trial.total_iterations(),
                        history_index,
                        pending,
                        priority: 0.0,
                    };
                    batch.push((trial, flight));
                }
                Err(e) => {
                    st.finished += 1;
                    self.fail(&pending, 0, 0.0, format!("could not build the trial: {e}"))?;
                }
            }
        }
        self.place(st, batch)
    }

    /// When only paused trials are left and no new trial may start, none can
    /// be promoted any more: they end as PRUNED at their rung.
    fn close_paused<B: Backend>(&mut self, st: &mut RunState<B>, timed_out: bool) -> Result<()> {
        let can_start =
            !st.exhausted && !timed_out && st.finished + (st.in_flight.len() as u64) < st.budget;
        if !st.in_flight.is_empty() && st.in_flight.len() == st.paused.len() && !can_start {
            let paused: Vec<JobId> = st.paused.keys().copied().collect();
            for job in paused {
                let iterations = st
                    .parked
                    .get(&job)
                    .and_then(|p| p.trial.as_ref())
                    .map_or(0, |t| t.iterations_done());
                // A parked member has no core job to end: it ends here.
                if st.closing.insert(job) && st.prune(job) {
                    self.on_pruned(st, job, iterations, 0.0)?;
                }
            }
        }
        Ok(())
    }

    fn on_event<B: Backend>(&mut self, st: &mut RunState<B>, event: CoreEvent) -> Result<()> {
        match event {
            CoreEvent::Admitted { job, lane } => {
                let ids = match st.gangs.get_mut(&job) {
                    Some(g) => {
                        g.lane = Some(lane);
                        g.members.clone()
                    }
                    None => vec![job],
                };
                for f in ids.iter().filter_map(|id| st.in_flight.get(id)) {
                    self.writer.send(WriteOp::Resources {
                        trial_id: f.pending.trial_id,
                        resources: st.resources(f, lane),
                    })?;
                }
                Ok(())
            }
            CoreEvent::Report { job, report } => self.on_report(st, job, report),
            CoreEvent::Members {
                job,
                steps,
                device_seconds,
                members,
            } => {
                // Every member at a report point holds the group until the
                // pruner has decided on all of them.
                // (Only those still in flight: no decision comes for others.)
                let mut holding = false;
                if let Some(gang) = st.gangs.get_mut(&job) {
                    for m in &steps {
                        if matches!(m.outcome, MemberOutcome::Report(_))
                            && self.study.pruner != PrunerKind::None
                            && st.in_flight.contains_key(&m.tag)
                        {
                            holding |= gang.held.insert(m.tag);
                        }
                    }
                }
                // A member's device time is its share of the group's.
                let share = device_seconds / members.max(1) as f64;
                let shrank = steps
                    .iter()
                    .any(|m| !matches!(m.outcome, MemberOutcome::Report(_)));
                let reported = steps
                    .iter()
                    .any(|m| matches!(m.outcome, MemberOutcome::Report(_)));
                for m in steps {
                    match m.outcome {
                        MemberOutcome::Report(r) => self.on_report(st, m.tag, r)?,
                        MemberOutcome::Left => {
                            if let Some(control) = st.gangs.get(&job).map(|g| g.control.clone()) {
                                st.take_back(&control);
                            }
                        }
                        MemberOutcome::Finished(r) => {
                            st.leave_gang(job, m.tag);
                            let iterations = r.iteration;
                            self.on_finished(st, m.tag, r, iterations, share)?
                        }
                        MemberOutcome::Failed(reason) => {
                            st.leave_gang(job, m.tag);
                            let iterations = st
                                .in_flight
                                .get(&m.tag)
                                .and_then(|f| st.curves.get(&f.pending.number))
                                .map_or(0, |c| c.values.len() as i64);
                            self.fail_flight(st, m.tag, iterations, share, reason)?;
                        }
                    }
                }
                if shrank && st.gangs.contains_key(&job) {
                    self.record_group(st, job, &[])?;
                }
                // The core holds a group that reported. When members held
                // it, the last decision released it (and it may have run on
                // and be held again since: releasing now would skip that
                // report's decisions). When none did (every reporter had
                // ended meanwhile), nothing else will release it.
                if reported && !holding && self.study.pruner != PrunerKind::None {
                    st.core.release(job);
                }
                Ok(())
            }
            CoreEvent::Checkpoint { job, state } => {
                // Through the writer: saved once the values it covers are committed.
                if let (Some(c), Some(f)) = (&self.checkpoints, st.in_flight.get(&job)) {
                    self.writer.send(WriteOp::SaveFile {
                        path: c.path_of(f.pending.trial_id),
                        bytes: state.to_bytes(),
                    })?;
                }
                Ok(())
            }
            CoreEvent::GroupEnded { job, .. } => {
                // Joiners it never took wait for another group.
                st.end_gang(job);
                Ok(())
            }
            CoreEvent::Finished {
                job,
                report,
                iterations,
                device_seconds,
            } => self.on_finished(st, job, report, iterations, device_seconds),
            CoreEvent::Failed {
                job,
                error,
                iterations,
                device_seconds,
            } => {
                let reason = match error {
                    WorkerError::Diverged { iteration, loss } => {
                        format!("diverged at iteration {iteration}: training loss is {loss}")
                    }
                    e => e.to_string(),
                };
                // A fused group fails all its members; joiners it never took live on.
                let jobs = if st.gangs.contains_key(&job) {
                    st.end_gang(job)
                } else {
                    vec![job]
                };
                for j in jobs {
                    self.fail_flight(st, j, iterations as i64, device_seconds, reason.clone())?;
                }
                Ok(())
            }
            CoreEvent::Pruned {
                job,
                iterations,
                device_seconds,
            } => self.on_pruned(st, job, iterations, device_seconds),
            telemetry => self.telemetry(st, telemetry),
        }
    }

    /// Stores a report, lets the pruner decide (the core holds the trial
    /// meanwhile when a pruner is set), and updates priorities.
    fn on_report<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        job: JobId,
        report: Report,
    ) -> Result<()> {
        let study = self.study;
        let Some(f) = st.in_flight.get(&job) else {
            return Ok(());
        };
        let value = report.metric(&study.metric).unwrap_or(f64::NAN);
        let (trial_id, number) = (f.pending.trial_id, f.pending.number);
        self.writer.send(WriteOp::Intermediate {
            trial_id,
            step: report.step as i64,
            value,
        })?;
        self.reporter
            .trial_report(number, report.step, &study.metric, value);
        st.curves
            .entry(number)
            .or_default()
            .values
            .insert(report.step, value);
        let rung = st.pruner.rung(number, report.step);
        let priority =
            rung.map(|k| rank_priority(k, number, report.step, &st.curves, study.direction));
        match st
            .pruner
            .decide(number, report.step, &st.curves, study.direction)
        {
            Decision::Continue => {
                if let (Some(k), Some(p)) = (rung, priority) {
                    st.set_priority(job, p);
                    self.writer.send(WriteOp::Priority {
                        trial_id,
                        priority: p,
                        rung: Some(k as i64),
                        reason: "rung",
                    })?;
                }
                st.release(job);
            }
            Decision::Pause { rung: k } => {
                let p = priority.unwrap_or(0.0);
                st.set_priority(job, p);
                st.pause(job);
                st.release(job);
                st.paused.insert(job, k);
                self.writer.send(WriteOp::Priority {
                    trial_id,
                    priority: p,
                    rung: Some(k as i64),
                    reason: "paused",
                })?;
            }
            Decision::Prune => {
                st.closing.insert(job);
                let member = st.prune(job);
                self.writer.send(WriteOp::Priority {
                    trial_id,
                    priority: priority.unwrap_or(0.0),
                    rung: rung.map(|k| k as i64),
                    reason: "pruned",
                })?;
                if member {
                    // It leaves its group at the next boundary; no core event follows.
                    let share = 0.0;
                    self.on_pruned(st, job, report.iteration, share)?;
                }
            }
        }
        self.promote(st)
    }

    fn on_finished<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        job: JobId,
        report: Report,
        iterations: u64,
        device_seconds: f64,
    ) -> Result<()> {
        let study = self.study;
        let Some(f) = st.in_flight.remove(&job) else {
            return Ok(());
        };
        st.finished += 1;
        let value = report.metric(&study.metric).unwrap_or(f64::NAN);
        let curve = st.curves.entry(f.pending.number).or_default();
        curve.values.insert(report.step, value);
        curve.finished = true;
        self.promote(st)?;
        self.writer.send(WriteOp::Intermediate {
            trial_id: f.pending.trial_id,
            step: report.step as i64,
            value,
        })?;
        if !value.is_finite() {
            return self.fail(
                &f.pending,
                iterations as i64,
                device_seconds,
                format!("{} is {value}", study.metric),
            );
        }
        self.forget_checkpoint(f.pending.trial_id);
        self.writer.send(WriteOp::Finish {
            trial_id: f.pending.trial_id,
            state: TrialState::Complete,
            value: Some(value),
            iterations: iterations as i64,
            device_seconds,
            fail_reason: None,
        })?;
        self.writer.flush()?;
        if st
            .best
            .is_none_or(|(_, b)| study.direction.better(value, b))
        {
            st.best = Some((f.pending.number, value));
        }
        st.history[f.history_index].value = Some(value);
        self.reporter
            .trial_end(f.pending.number, Some(value), st.best, st.finished);
        Ok(())
    }

    fn on_pruned<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        job: JobId,
        iterations: u64,
        device_seconds: f64,
    ) -> Result<()> {
        let Some(f) = st.in_flight.remove(&job) else {
            return Ok(());
        };
        st.finished += 1;
        let number = f.pending.number;
        let rung = st.paused.remove(&job).or_else(|| {
            st.curves.get(&number).and_then(|c| {
                c.values
                    .keys()
                    .rev()
                    .find_map(|s| st.pruner.rung(number, *s))
            })
        });
        if let Some(k) = rung {
            self.writer.send(WriteOp::TrialAttr {
                trial_id: f.pending.trial_id,
                key: "salus:rung",
                value_json: k.to_string(),
            })?;
        }
        if let Some(c) = st.curves.get_mut(&number) {
            c.finished = true;
        }
        self.forget_checkpoint(f.pending.trial_id);
        self.writer.send(WriteOp::Finish {
            trial_id: f.pending.trial_id,
            state: TrialState::Pruned,
            value: None,
            iterations: iterations as i64,
            device_seconds,
            fail_reason: None,
        })?;
        self.reporter.trial_end(number, None, st.best, st.finished);
        Ok(())
    }

    /// Stops the core, requeues what did not end, and stores the run's totals.
    fn finish<B: Backend>(&mut self, mut st: RunState<B>, interrupted: bool) -> Result<RunSummary> {
        // Stop the lanes, then act on what they said before stopping: a
        // report or an ending already sent must reach the database.
        let stopped = st.core.stop();
        while let Ok(event) = st.events.try_recv() {
            self.on_event(&mut st, event)?;
        }
        // Trials groups handed back (or never took) wait parked like the rest.
        let controls: Vec<_> = st.gangs.values().map(|g| g.control.clone()).collect();
        for c in &controls {
            st.take_back(c);
        }
        let RunState {
            core,
            events,
            in_flight,
            gangs,
            parked,
            backend,
            ..
        } = st;
        let mut st_lanes = st.lanes;
        // Whatever has not ended goes back to WAITING and runs first on
        // resume, from a checkpoint taken now where it can be: a lone
        // trial's state, each member's of a fused group, a parked trial's.
        let mut lane = Lane::new(backend, 0, 1).ok();
        drop(core);
        let mut states: BTreeMap<JobId, workers::TrialState> = BTreeMap::new();
        if self.checkpoints.is_some() {
            for (job, mut boxed) in stopped {
                let Some(lane) = lane.as_mut() else { break };
                if gangs.contains_key(&job) {
                    states.extend(boxed.member_states(lane).unwrap_or_default());
                } else if let Ok(s) = boxed.export_state(lane) {
                    states.insert(job, s);
                }
            }
            for (job, p) in parked {
                if let Some(s) = p.trial.as_ref().and_then(|t| t.host_state()) {
                    states.insert(job, s.clone());
                }
            }
        }
        for (job, f) in in_flight {
            let keep = match (&self.checkpoints, states.get(&job)) {
                (Some(c), Some(s)) => {
                    self.writer.send(WriteOp::SaveFile {
                        path: c.path_of(f.pending.trial_id),
                        bytes: s.to_bytes(),
                    })?;
                    s.reports as i64
                }
                _ => 0,
            };
            self.writer.send(WriteOp::Requeue {
                trial_id: f.pending.trial_id,
                keep_steps: keep,
            })?;
            self.reporter.trial_interrupted(f.pending.number);
        }
        if self.study.worker.is_some() {
            crate::external::worker::shut_down_workers();
        }
        // Lanes flush their last timeline segments as they stop.
        for event in events.try_iter() {
            record_telemetry(
                &self.writer,
                st.run_id,
                &st.trial_ids,
                &mut st_lanes,
                st.started,
                event,
            )?;
        }
        let wall_s = st.started.elapsed().as_secs_f64();
        for (lane, t) in st_lanes {
            let stats = LaneStats {
                lane: lane as i64,
                iterations: t.iterations,
                busy_s: t.busy_s,
                wall_s,
                switches: t.switches,
                switch_mean_us: (t.switches > 0).then(|| 1e6 * t.switch_sum_s / t.switches as f64),
                switch_max_us: (t.switches > 0).then_some(1e6 * t.switch_max_s),
            };
            self.writer.send(WriteOp::LaneStats {
                run_id: st.run_id,
                stats,
            })?;
        }
        self.writer.send(WriteOp::Event {
            study_id: self.info.id,
            trial_id: None,
            kind: "study_stop",
            detail: serde_json::json!({
                "finished": st.finished,
                "interrupted": interrupted,
                "writer_batches": self.writer.stats().batches,
                "writer_max_ms": self.writer.stats().max_ms,
                "writer_over_100ms": self.writer.stats().over_100ms,
            })
            .to_string(),
        })?;
        self.writer.flush()?;
        let summary = RunSummary {
            finished: st.finished,
            ran: st.ran,
            interrupted,
            best: st.best,
        };
        self.reporter.study_end(self.study, &summary);
        Ok(summary)
    }

    /// Deletes a trial's checkpoints, in order after any save still queued.
    fn forget_checkpoint(&self, trial_id: i64) {
        if let Some(c) = &self.checkpoints {
            for path in c.paths_of(trial_id) {
                let _ = self.writer.send(WriteOp::RemoveFile { path });
            }
        }
    }

    /// Tells the database every [`HEARTBEAT`] that this process's trials live.
    fn heartbeat<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        if st.last_heartbeat.elapsed() < HEARTBEAT {
            return Ok(());
        }
        st.last_heartbeat = Instant::now();
        let trial_ids: Vec<i64> = st.in_flight.values().map(|f| f.pending.trial_id).collect();
        if !trial_ids.is_empty() {
            self.writer.send(WriteOp::Heartbeat { trial_ids })?;
        }
        Ok(())
    }

    /// Applies the dashboard's commands (at most every 250 ms): pause,
    /// resume or prune a trial at its next iteration boundary.
    fn take_commands<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        if st.last_commands.elapsed() < std::time::Duration::from_millis(250) {
            return Ok(());
        }
        st.last_commands = Instant::now();
        for cmd in self.writer.take_commands(self.info.id)? {
            let job = st
                .in_flight
                .iter()
                .find(|(_, f)| f.pending.trial_id == cmd.trial_id)
                .map(|(&j, _)| j);
            let outcome = match (job, cmd.action.as_str()) {
                (None, _) => "ignored: the trial is not running",
                (Some(j), "pause") => {
                    st.pause(j);
                    st.user_paused.insert(j);
                    self.command_priority(cmd.trial_id, "paused")?;
                    "applied"
                }
                (Some(j), "resume") => {
                    if st.user_paused.remove(&j) {
                        st.resume(j);
                        self.command_priority(cmd.trial_id, "resumed")?;
                        "applied"
                    } else {
                        "ignored: the trial was not paused from the dashboard"
                    }
                }
                (Some(j), "prune") => {
                    st.closing.insert(j);
                    if st.user_paused.remove(&j) {
                        st.resume(j);
                    }
                    self.command_priority(cmd.trial_id, "pruned")?;
                    if st.prune(j) {
                        self.on_pruned(st, j, 0, 0.0)?;
                    }
                    "applied"
                }
                (Some(_), _) => "ignored: unknown action",
            };
            self.writer.send(WriteOp::Event {
                study_id: self.info.id,
                trial_id: Some(cmd.trial_id),
                kind: "command",
                detail: serde_json::json!({ "action": cmd.action, "outcome": outcome }).to_string(),
            })?;
        }
        Ok(())
    }

    /// Records a dashboard command's effect in `salus_priority`.
    fn command_priority(&self, trial_id: i64, reason: &'static str) -> Result<()> {
        self.writer.send(WriteOp::Priority {
            trial_id,
            priority: 0.0,
            rung: None,
            reason,
        })
    }

    /// Resumes the paused trials the pruner now promotes.
    fn promote<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        let by_number: BTreeMap<i64, usize> = st
            .paused
            .iter()
            .filter_map(|(job, k)| st.in_flight.get(job).map(|f| (f.pending.number, *k)))
            .collect();
        for number in st
            .pruner
            .promotions(&by_number, &st.curves, self.study.direction)
        {
            let Some((&job, f)) = st
                .in_flight
                .iter()
                .find(|(_, f)| f.pending.number == number)
            else {
                continue;
            };
            let k = st.paused.remove(&job).unwrap_or(0);
            let step = st
                .curves
                .get(&number)
                .and_then(|c| c.values.keys().next_back().copied())
                .unwrap_or(0);
            let p = rank_priority(k, number, step, &st.curves, self.study.direction);
            let trial_id = f.pending.trial_id;
            st.set_priority(job, p);
            st.resume(job);
            self.writer.send(WriteOp::Priority {
                trial_id,
                priority: p,
                rung: Some(k as i64),
                reason: "promoted",
            })?;
        }
        Ok(())
    }

    fn telemetry<B: Backend>(&mut self, st: &mut RunState<B>, event: CoreEvent) -> Result<()> {
        record_telemetry(
            &self.writer,
            st.run_id,
            &st.trial_ids,
            &mut st.lanes,
            st.started,
            event,
        )
    }

    /// The largest batch size the space allows.
    fn max_batch(&self) -> Option<i64> {
        let study = self.study;
        match study
            .space
            .params()
            .iter()
            .find(|p| p.name == "batch_size")
            .map(|p| &p.dist)
        {
            Some(Distribution::Int { high, .. }) => Some(*high),
            Some(Distribution::Categorical { choices }) => choices
                .iter()
                .filter_map(|c| {
                    if let crate::space::Choice::Int(i) = c {
                        Some(*i)
                    } else {
                        None
                    }
                })
                .max(),
            _ => Some(match study.value(&Params::new(), "batch_size") {
                crate::study::KnobValue::Int(i) => i,
                _ => 0,
            }),
        }
    }

    /// Ends in-flight trial `job` as FAIL with `reason`.
    fn fail_flight<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        job: JobId,
        iterations: i64,
        seconds: f64,
        reason: String,
    ) -> Result<()> {
        let Some(f) = st.in_flight.remove(&job) else {
            return Ok(());
        };
        st.paused.remove(&job);
        st.parked.remove(&job);
        st.closing.remove(&job);
        st.finished += 1;
        self.fail(&f.pending, iterations, seconds, reason)?;
        self.reporter
            .trial_end(f.pending.number, None, st.best, st.finished);
        Ok(())
    }

    fn fail(&mut self, p: &Pending, iterations: i64, seconds: f64, reason: String) -> Result<()> {
        self.forget_checkpoint(p.trial_id);
        self.reporter.trial_failed(p.number, &reason);
        self.writer.send(WriteOp::Finish {
            trial_id: p.trial_id,
            state: TrialState::Fail,
            value: None,
            iterations,
            device_seconds: seconds,
            fail_reason: Some(reason),
        })?;
        self.writer.flush()
    }
}

/// Stores the core's timeline events (segments, swaps, switch totals); others are ignored.
fn record_telemetry(
    writer: &Writer,
    run_id: i64,
    trial_ids: &BTreeMap<JobId, i64>,
    lanes: &mut BTreeMap<usize, LaneTally>,
    started: Instant,
    event: CoreEvent,
) -> Result<()> {
    match event {
        CoreEvent::Swapped {
            job,
            lane,
            out,
            bytes,
            seconds,
        } => {
            let time_s = started.elapsed().as_secs_f64();
            writer.send(WriteOp::Swap {
                run_id,
                trial_id: trial_ids.get(&job).copied(),
                lane: lane as i64,
                out,
                bytes: bytes as i64,
                seconds,
                time_s,
            })?;
        }
        CoreEvent::Segment {
            lane,
            job,
            start,
            end,
            iterations,
        } => {
            let t = lanes.entry(lane).or_default();
            t.iterations += iterations as i64;
            t.busy_s += end - start;
            writer.send(WriteOp::Segment {
                run_id,
                lane: lane as i64,
                trial_id: trial_ids.get(&job).copied(),
                start_s: start,
                end_s: end,
                iterations: iterations as i64,
            })?;
        }
        CoreEvent::Switch { lane, seconds, .. } => {
            let t = lanes.entry(lane).or_default();
            t.switches += 1;
            t.switch_sum_s += seconds;
            t.switch_max_s = t.switch_max_s.max(seconds);
        }
        _ => {}
    }
    Ok(())
}

/// The state of one run of the core: what is in flight, paused, learned.
struct RunState<B: Backend> {
    core: SalusCore<B>,
    events: Receiver<CoreEvent>,
    pruner: Box<dyn Pruner>,
    sampler: Box<dyn Sampler>,
    data: Arc<DeviceData<B>>,
    run_id: i64,
    device: String,
    started: Instant,
    /// Seeds each trial (with its number).
    seed: u64,
    /// Finished trials the study should reach.
    budget: u64,
    max_concurrent: usize,
    history: Vec<TrialRecord>,
    /// Stored trials to run first (interrupted or orphaned ones).
    waiting: VecDeque<Pending>,
    finished: u64,
    ran: u64,
    best: Option<(i64, f64)>,
    /// The sampler has nothing left (an exhausted grid).
    exhausted: bool,
    in_flight: BTreeMap<JobId, Flight>,
    curves: Curves,
    /// Trials paused below a promotion cut, with their rung.
    paused: BTreeMap<JobId, usize>,
    /// Paused trials already asked to stop for good.
    closing: BTreeSet<JobId>,
    /// Every job of this run, for telemetry that arrives after a trial ended.
    trial_ids: BTreeMap<JobId, i64>,
    lanes: BTreeMap<usize, LaneTally>,
    /// Most members a fused group may have (1: no fusion).
    fuse: usize,
    /// Device bytes one lane may fill, to bound a group's size.
    lane_budget: u64,
    /// The core's lanes.
    lanes_n: usize,
    core_kind: DeviceKind,
    /// Fused jobs, by the core's id.
    gangs: BTreeMap<JobId, Gang<B>>,
    /// Fused members waiting off the device between groups.
    parked: BTreeMap<JobId, Parked<B>>,
    /// The core's policy, which also seats fused groups.
    policy: Policy,
    /// Each fused member's id (the runner's own, from `FIRST_MEMBER`) and its job.
    member_gang: BTreeMap<JobId, JobId>,
    next_member: JobId,
    /// RUNNING trials that another live process runs.
    elsewhere: u64,
    backend: Arc<B>,
    last_heartbeat: Instant,
    /// Trials paused from the dashboard: they keep their slot.
    user_paused: BTreeSet<JobId>,
    last_commands: Instant,
}

/// Group size when `[scheduler] fuse` is not set.
pub const DEFAULT_FUSE: usize = 8;

/// Fused members get ids of their own, far from the core's.
const FIRST_MEMBER: JobId = 1 << 48;

/// A trial's priority at rung `k`: its rank among the values reported at
/// `step` by every trial.
fn rank_priority(
    k: usize,
    number: i64,
    step: u64,
    curves: &Curves,
    direction: crate::study::Direction,
) -> f64 {
    let mine = value_at(curves, number, step).unwrap_or(f64::NAN);
    let others: Vec<f64> = curves
        .values()
        .filter_map(|c| c.values.get(&step).copied())
        .filter(|v| v.is_finite())
        .collect();
    let rank = others
        .iter()
        .filter(|&&v| direction.better(v, mine))
        .count();
    priority(k, rank, others.len().max(1))
}

/// `name=value` pairs of a trial's sampled parameters.
pub fn describe(study: &Study, params: &Params) -> String {
    params
        .keys()
        .map(|name| format!("{name}={}", study.value(params, name)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A trial's parameters for its worker, as JSON: the sampled ones and the
/// fixed ones, as the study file wrote them.
fn external_params(study: &Study, params: &Params) -> serde_json::Value {
    use crate::study::KnobValue;
    let json = |v: KnobValue| match v {
        KnobValue::Float(f) => serde_json::json!(f),
        KnobValue::Int(i) => serde_json::json!(i),
        KnobValue::Str(s) => serde_json::json!(s),
        KnobValue::Bool(b) => serde_json::json!(b),
    };
    let mut map = serde_json::Map::new();
    for (name, v) in &study.fixed {
        map.insert(name.clone(), json(v.clone()));
    }
    for p in study.space.params() {
        if params.get(&p.name).is_some() {
            map.insert(p.name.clone(), json(study.value(params, &p.name)));
        }
    }
    serde_json::Value::Object(map)
}
