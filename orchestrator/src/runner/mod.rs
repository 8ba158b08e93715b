//! Runs a study: propose, train, record, until the budget is spent.
//!
//! Every trial runs through the Salus core: the runner keeps up to
//! `max_concurrent` trials submitted (default: [`InFlight::default_max`],
//! fewer at a study's start with [`InFlight::ramp`]), and turns the core's
//! events into storage writes and progress. It owns no output: it
//! tells a [`Reporter`] what happens, and the writer what to store.
//!
//! The loop ([`Runner::run`]) reads the core's events and, between them,
//! fills free slots, takes the dashboard's commands and beats the hearts.
//! Each responsibility has its file:
//! - `resume`: what a run finds in the database before it starts (requeued
//!   and orphaned trials, checkpoints, the sampler, the run's record);
//! - `events`: reports, prunes, finishes and failures from the core, and
//!   promotions;
//! - `groups`: fused groups (`Group`), members that leave and join them, placement;
//! - `commands`: the dashboard's commands and the heartbeats;
//! - `telemetry`: the core's timeline as storage writes;
//! - this file: the types, the loop, filling slots and the run's end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::Receiver;

use kernels::{Backend, DeviceKind};
use training::data::SplitData;
use training::{DeviceData, Job, Lane, TrainTrial};

mod dash_commands;
mod events;
mod groups;
mod keep;
mod pbt;
mod pbt_shared;
mod placement;
mod processes;
use processes::Next;
mod resume;
mod telemetry;
use groups::{Group, Parked};
use telemetry::record_telemetry;

use crate::checkpoint::Checkpoints;
use crate::error::{Error, Result};
use crate::external::ExternalTrial;
use crate::progress::Reporter;
use crate::pruner::{Curves, Pruner};
use crate::salus::JobId;
use crate::salus::core::{CoreConfig, CoreEvent};
use crate::salus::devices::DeviceCores;
use crate::salus::ledger::MemoryLedger;
use crate::salus::policy::{Policy, default_policy};
use crate::sampler::{Sampler, Stopped, TrialRecord};
use crate::space::{Distribution, ParamValue, Params, distribution_json};
use crate::storage::writer::{LaneStats, WriteOp};
use crate::storage::{
    CapAt, Claim, InFlightCap, Requeuer, StoredParam, StudyInfo, TrialRow, TrialState, Writer,
};
use crate::storage::{TrialId, TrialNumber};
use crate::study::{GraphsMode, Study};

/// What a run was asked to do beyond the study file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides `[study] trials`.
    pub trials: Option<u64>,
    /// Finished trials to add to those stored (instead of a total).
    pub more: Option<u64>,
    /// Overrides `[study] seed` (and the sampler's seed).
    pub seed: Option<u64>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub finished: u64,
    pub ran: u64,
    pub interrupted: bool,
    pub best: Option<(TrialNumber, f64)>,
    /// Set when the run stopped after too many failed trials in a row: the
    /// last one's reason.
    pub halted: Option<String>,
}

/// A trial the runner is about to run.
struct Pending {
    /// Its claim once this run took it (attempt 0 until then: fenced).
    claim: Claim,
    number: TrialNumber,
    params: Params,
    /// The checkpoint it continues from, if it has one.
    resume: Option<training::TrialSnapshot>,
    /// An enqueued trial's: what its claim stores as its parameters (its
    /// fixed values, the rest sampled), or why they are refused.
    enqueued: Option<std::result::Result<Vec<StoredParam>, String>>,
    /// An external trial's latest recorded checkpoint, which it resumes
    /// from: the attempt that wrote it and the step it covers.
    external_resume: Option<(i64, i64)>,
}

/// Decodes stored parameters through the current search space.
pub fn decode_params(study: &Study, row: &TrialRow) -> Params {
    decode_internal(
        study,
        row.params.iter().map(|s| (s.name.as_str(), s.internal)),
    )
}

/// Parameters from their internal values by name (as `trial_params`
/// holds them); names outside the space are left out.
fn decode_internal<'a>(study: &Study, stored: impl IntoIterator<Item = (&'a str, f64)>) -> Params {
    let mut params = Params::new();
    for (name, value) in stored {
        let Some(p) = study.space.params().iter().find(|p| p.name == name) else {
            continue;
        };
        let v = match p.dist {
            Distribution::Float { .. } => ParamValue::Float(value),
            Distribution::Int { .. } => ParamValue::Int(value.round() as i64),
            Distribution::Categorical { .. } => ParamValue::Choice(value as usize),
        };
        params.insert(name.to_string(), v);
    }
    params
}

fn encode_params(study: &Study, params: &Params) -> Vec<StoredParam> {
    study
        .space
        .params()
        .iter()
        .filter_map(|p| {
            params.get(&p.name).map(|v| StoredParam {
                name: p.name.clone(),
                internal: v.internal(),
                distribution_json: distribution_json(&p.dist),
            })
        })
        .collect()
}

/// Every objective's value of a COMPLETE trial, for the samplers of a
/// study of several (`TrialRecord::values`); empty for a study of one or
/// a trial without all of them.
fn all_values(study: &Study, value: Option<f64>, more: &[f64]) -> Vec<f64> {
    match value {
        Some(v) if study.objectives.len() > 1 && more.len() + 1 == study.objectives.len() => {
            std::iter::once(v).chain(more.iter().copied()).collect()
        }
        _ => Vec::new(),
    }
}

/// How a stored trial ended without a value, for the sampler's history:
/// pruned at its last report, or failed. A RUNNING trial that another
/// process's pruner holds below a rung's cut (`held`) reads as pruned at
/// its last report, as this process reads its own, until it is promoted.
fn stopped_of(state: TrialState, intermediate: &[(i64, f64)], held: bool) -> Option<Stopped> {
    let held = held && state == TrialState::Running;
    match state {
        TrialState::Pruned => Some(pruned_at_last(intermediate)),
        _ if held => Some(pruned_at_last(intermediate)),
        TrialState::Fail => Some(Stopped::Failed),
        _ => None,
    }
}

/// Pruned at its last report (step -1 and NaN where it made none).
fn pruned_at_last(intermediate: &[(i64, f64)]) -> Stopped {
    let (step, value) = intermediate.last().copied().unwrap_or((-1, f64::NAN));
    Stopped::Pruned { step, value }
}

/// What decides whether a run's paused trials end as PRUNED
/// ([`Runner::close_paused`]).
#[derive(Debug, Clone, Copy)]
struct LastPaused {
    in_flight: usize,
    paused: usize,
    can_start: bool,
    /// RUNNING trials other processes run, and how many of them their
    /// pruners hold below a cut.
    elsewhere: u64,
    elsewhere_held: u64,
    timed_out: bool,
}

impl LastPaused {
    /// Nothing runs here but paused trials, and nothing new may start. The
    /// pruners share the study's curves, so a trial running in another
    /// process may still reach a rung and lift one of them over its cut:
    /// they wait for it (unless the study timed out), but not for trials
    /// held elsewhere, whose processes may be waiting on these.
    fn are_final(&self) -> bool {
        self.in_flight > 0
            && self.in_flight == self.paused
            && !self.can_start
            && (self.elsewhere == self.elsewhere_held || self.timed_out)
    }
}

/// How far a trial breaks its constraints: the sum of their positive
/// values (0 when it is feasible, or has none).
fn violation(constraints: impl Iterator<Item = f64>) -> f64 {
    constraints.map(|c| c.max(0.0)).sum()
}

/// A trial's seed: a pure function of the study seed and the trial number.
pub fn trial_seed(study_seed: u64, number: TrialNumber) -> u64 {
    kernels::rng::mix64(study_seed ^ (number.0 as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
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
}

/// A RUNNING trial whose heartbeat is older than this (by default) belongs
/// to a dead process.
pub use crate::storage::STALE_AFTER_S;

/// A trial handed to the core.
struct Flight {
    pending: Pending,
    history_index: usize,
    footprint: training::Footprint,
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
    /// A core's settings from `[scheduler]` and this machine, on one of
    /// `devices` devices: CPU devices share the machine's cores and memory.
    fn core_config<B: Backend>(&self, backend: &B, devices: usize) -> CoreConfig {
        let s = &self.study.scheduler;
        let devices = devices.max(1);
        let cores = (std::thread::available_parallelism().map_or(1, |n| n.get()) / devices).max(1);
        let policy = s
            .policy
            .unwrap_or(default_policy(self.study.decides_at_reports()));
        let base = match backend.kind() {
            DeviceKind::Cpu => CoreConfig::cpu(
                policy,
                s.lanes.unwrap_or(cores),
                cores,
                MemoryLedger::cpu_budget(
                    s.memory_bytes,
                    backend.memory_bytes() as u64 / devices as u64,
                ),
            ),
            DeviceKind::Cuda(_) => CoreConfig::cuda(
                policy,
                s.lanes.unwrap_or(CoreConfig::CUDA_LANES),
                s.memory_bytes
                    .unwrap_or(MemoryLedger::cuda_budget(backend.memory_bytes() as u64)),
            ),
        };
        CoreConfig {
            hold_at_reports: self.study.decides_at_reports(),
            checkpoints: self.checkpoints.is_some(),
            keep_final: self.study.keep != crate::study::Keep::None && self.study.worker.is_none(),
            // `auto`: wherever the backend has graphs (CUDA).
            graphs: s.graphs != Some(GraphsMode::Off),
            ..base
        }
    }

    /// Runs the study to its budget, its timeout, an exhausted grid or a
    /// stop, on `backends` (one Salus core each). `data` is the study's,
    /// loaded and checked ([`Study::load_data`]); each device gets a copy.
    pub fn run<B: Backend>(mut self, backends: Vec<Arc<B>>, data: SplitData) -> Result<RunSummary> {
        let study = self.study;
        let device_data = backends
            .iter()
            .map(|b| DeviceData::upload(&mut Lane::new(b.clone(), 0, 1)?, &data))
            .collect::<training::Result<Vec<_>>>()?;
        let mut st = self.start(&backends, device_data)?;
        st.kept.norm = Some(crate::kept_model::Standardisation::of(&data));
        let interrupted = loop {
            if self.stop.load(Ordering::SeqCst) {
                break true;
            }
            let timed_out = study
                .timeout
                .is_some_and(|t| st.timeline.started.elapsed() >= t);
            let halted = st.failures.0 >= study.max_consecutive_failures;
            self.drop_lost(&mut st)?;
            self.take_commands(&mut st)?;
            self.beat_claims(&mut st);
            self.sync(&mut st)?;
            self.fill(&mut st, timed_out || halted)?;
            self.pbt_meet(&mut st, timed_out || halted)?;
            self.rebalance(&mut st)?;
            self.warn_unreported_memory(&st)?;
            self.close_paused(&mut st, timed_out || halted)?;
            // Trials other live processes hold: this one stays until they
            // end (each process stops when the study is done), and takes
            // over any whose process dies.
            if st.in_flight.is_empty() && !halted && !timed_out && !st.exhausted {
                self.sync_now(&mut st)?;
                if !st.waiting.is_empty() {
                    continue;
                }
                if st.liveness.elsewhere > 0 {
                    std::thread::sleep(st.liveness.sync.interval());
                    continue;
                }
                // The reread may show room that the last fill's view (or
                // the start's cap, as the database counted it) did not.
                self.fill(&mut st, false)?;
                if !st.in_flight.is_empty() || st.liveness.at_cap {
                    continue;
                }
            }
            if st.in_flight.is_empty() {
                if halted {
                    self.reporter.note(&format!(
                        "stopping: {} trials failed in a row (max_consecutive_failures); the last: {}",
                        st.failures.0,
                        st.failures.1.as_deref().unwrap_or("")
                    ));
                } else if timed_out {
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

    /// Submits trials (waiting ones first, then new proposals) while slots,
    /// the budget and the time allow. Paused trials hold no slot. With
    /// fusion on, new trials and parked ones that may run again join
    /// running groups of their fusion key or form new ones (see `groups`).
    fn fill<B: Backend>(&mut self, st: &mut RunState<B>, timed_out: bool) -> Result<()> {
        let study = self.study;
        let mut batch: Vec<(TrainTrial<B>, Flight)> = Vec::new();
        loop {
            let here = st
                .in_flight
                .len()
                .saturating_sub(st.paused.len() + st.pbt_waiting())
                + batch.len();
            // Held below a cut elsewhere: pruned, to the sampler.
            let elsewhere = st
                .liveness
                .elsewhere
                .saturating_sub(st.liveness.elsewhere_held) as usize;
            let trials = st.history.len();
            if st.nothing_to_start()
                || timed_out
                || st.liveness.at_cap
                || Ramp::room(st.ramp, trials, st.max_concurrent, here, elsewhere) == 0
                || !st.budget_has_room(batch.len())
            {
                break;
            }
            // The start's cap, checked again where the trial is created,
            // against the study as it is then: other processes may have
            // made trials or started them since the last reread.
            let cap = st.ramp.map(|ramp| InFlightCap {
                here: here as u64,
                cap_at: CapAt::new(move |n| ramp.cap_at(n as usize).map(|c| c as u64)),
            });
            let mut pending = match self.next_pending(st, cap)? {
                Next::Run(p) => *p,
                Next::Skip => continue,
                Next::Stop => break,
            };
            let history_index = match st.history_at.get(&pending.number) {
                Some(&i) => i,
                // An enqueued trial, whose parameters were just settled.
                None => st.record(pending.number, pending.params.clone()),
            };
            if let Some(w) = &study.worker {
                // The user's script: one process per trial, never fused.
                st.ran += 1;
                // Each attempt writes its own file; it resumes from the
                // one the trial's latest recorded checkpoint names.
                let claim = pending.claim;
                let ckpt = self.worker_checkpoint(claim);
                let resume_from = self.checkpoints.as_ref().and_then(|c| {
                    pending
                        .external_resume
                        .map(|(attempt, step)| c.external_at(claim.trial_id, attempt, step))
                });
                let plan = st
                    .worker_memory
                    .clone()
                    .expect("a [worker] study has a plan");
                let trial = ExternalTrial::new(
                    Arc::new(w.clone()),
                    plan,
                    pending.number,
                    external_params(study, &pending.params),
                    ckpt,
                    resume_from.filter(|p| p.exists()),
                );
                self.reporter.trial_start(
                    pending.number,
                    &describe(study, &pending.params),
                    w.iterations.div_ceil(w.report_every.max(1)),
                );
                let footprint = Job::<B>::footprint(&trial);
                let flight = Flight {
                    footprint,
                    total_iterations: w.iterations,
                    history_index,
                    pending,
                    priority: 0.0,
                };
                let device = st.core.choose(MemoryLedger::alone_cost(&footprint));
                let id = st.core.submit_on(device, Box::new(trial), 0.0, "external");
                st.timeline
                    .trial_ids
                    .insert(id, flight.pending.claim.trial_id);
                st.in_flight.insert(TrialHandle::Alone(id), flight);
                continue;
            }
            let seed = trial_seed(st.seed, pending.number);
            let cfg = study.trial_config(&pending.params, seed);
            st.ran += 1;
            let made = match pending.resume.take() {
                Some(state) => TrainTrial::resume_on_host(st.data[0].clone(), cfg.clone(), state),
                None => TrainTrial::new_on_host(st.data[0].clone(), cfg.clone()),
            }
            .map(|t| {
                t.measuring_latency(study.measures_latency())
                    .with_schedule(study.schedule_hparams(&pending.params, seed))
            });
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
                    self.pbt_schedule_start(pending.claim, &pending.params)?;
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
                    let reason = format!("could not build the trial: {e}");
                    self.fail(st, &pending, 0, 0.0, reason)?;
                }
            }
        }
        self.place(st, batch)
    }

    /// When only paused trials are left and nothing can promote them any
    /// more, they end as PRUNED at their rung (see [`LastPaused`]).
    /// This run's count of finished trials misses those other processes
    /// finished since it started: once the database said the study holds
    /// its budget of trials and none waits, nothing can start either.
    fn close_paused<B: Backend>(&mut self, st: &mut RunState<B>, timed_out: bool) -> Result<()> {
        let can_start = !st.nothing_to_start() && !timed_out && st.budget_has_room(0);
        let last = LastPaused {
            in_flight: st.in_flight.len(),
            paused: st.paused.len(),
            can_start,
            elsewhere: st.liveness.elsewhere,
            elsewhere_held: st.liveness.elsewhere_held,
            timed_out,
        };
        if last.are_final() {
            let paused: Vec<TrialHandle> = st.paused.keys().copied().collect();
            for job in paused {
                let parked = match job {
                    TrialHandle::Member(m) => st.fusion.parked.get(&m),
                    TrialHandle::Alone(_) => None,
                };
                let iterations = parked
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

    /// Stops the core, requeues what did not end, and stores the run's totals.
    fn finish<B: Backend>(&mut self, mut st: RunState<B>, interrupted: bool) -> Result<RunSummary> {
        // Stop the lanes, then act on what they said before stopping: a
        // report or an ending already sent must reach the database.
        let stopped = st.core.stop();
        while let Ok(event) = st.events.try_recv() {
            self.on_event(&mut st, event)?;
        }
        // Trials groups handed back (or never took) wait parked like the rest.
        let controls: Vec<_> = st
            .fusion
            .groups
            .values()
            .map(|g| g.control.clone())
            .collect();
        for c in &controls {
            st.take_back(c);
        }
        let RunState {
            core,
            events,
            in_flight,
            fusion: Fusion { groups, parked, .. },
            backends,
            timeline,
            curves,
            ..
        } = st;
        let mut st_lanes = timeline.lanes;
        // Whatever has not ended goes back to WAITING and runs first on
        // resume, from a checkpoint taken now where it can be: a lone
        // trial's state, each member's of a fused group, a parked trial's.
        // Each is read through a lane of the device that holds it.
        let layout = core.layout();
        let homes: BTreeMap<JobId, usize> = stopped
            .iter()
            .map(|(id, _)| (*id, core.device_of(*id)))
            .collect();
        let mut lanes: Vec<Option<Lane<B>>> = backends
            .into_iter()
            .map(|b| Lane::new(b, 0, 1).ok())
            .collect();
        drop(core);
        let mut states: BTreeMap<TrialHandle, training::TrialSnapshot> = BTreeMap::new();
        // External trials whose worker saved its state as it stopped.
        let mut saved_by_worker: BTreeSet<TrialHandle> = BTreeSet::new();
        if self.checkpoints.is_some() {
            for (job, mut boxed) in stopped {
                let Some(lane) = lanes[homes[&job]].as_mut() else {
                    continue;
                };
                if self.study.worker.is_some() {
                    // A worker checkpoints itself when asked, covering
                    // every step it reported.
                    if boxed.swap_out(lane).is_ok_and(|bytes| bytes > 0) {
                        saved_by_worker.insert(TrialHandle::Alone(job));
                    }
                } else if groups.contains_key(&job) {
                    let members = boxed.member_states(lane).unwrap_or_default();
                    states.extend(
                        members
                            .into_iter()
                            .map(|(tag, s)| (TrialHandle::Member(MemberId(tag)), s)),
                    );
                } else if let Ok(s) = boxed.export_state(lane) {
                    states.insert(TrialHandle::Alone(job), s);
                }
            }
            for (m, p) in parked {
                if let Some(s) = p.trial.as_ref().and_then(|t| t.host_state()) {
                    states.insert(TrialHandle::Member(m), s.clone());
                }
            }
        }
        for (job, f) in in_flight {
            let claim = f.pending.claim;
            let keep = match (&self.checkpoints, states.get(&job)) {
                (Some(c), Some(s)) => {
                    self.writer.send(WriteOp::SaveFile {
                        claim,
                        path: c.path_of(claim.trial_id),
                        bytes: s.to_bytes(),
                        step: s.reports as i64,
                    })?;
                    s.reports as i64
                }
                (Some(_), None) if saved_by_worker.contains(&job) => {
                    let step = curves
                        .get(&f.pending.number)
                        .and_then(|c| c.values.keys().next_back().copied())
                        .map_or(0, |s| s as i64);
                    self.writer
                        .send(self.external_checkpoint_saved(claim, step))?;
                    step
                }
                // An external trial keeps what its last checkpoint covers.
                (Some(_), None) => f.pending.external_resume.map_or(0, |(_, step)| step),
                (None, _) => 0,
            };
            self.writer.send(WriteOp::Requeue {
                by: Requeuer::Holder(claim),
                keep_steps: keep,
            })?;
            self.reporter.trial_interrupted(f.pending.number);
        }
        // Its trials are no longer its: another process may take them now.
        self.writer.send(WriteOp::EndRun {
            run_id: timeline.run_id,
        })?;
        self.sweep_points_if_last(timeline.run_id)?;
        if self.study.worker.is_some() {
            crate::external::worker::shut_down_workers();
        }
        // Lanes flush their last timeline segments as they stop.
        for event in events.try_iter() {
            record_telemetry(
                &self.writer,
                timeline.run_id,
                &timeline.trial_ids,
                &mut st_lanes,
                timeline.started,
                event,
            )?;
        }
        let wall_s = timeline.started.elapsed().as_secs_f64();
        for line in placement::device_summary(&layout, &st_lanes, wall_s) {
            self.reporter.note(&line);
        }
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
                run_id: timeline.run_id,
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
                "writer_total_ms": self.writer.stats().total_ms,
                "writer_over_100ms": self.writer.stats().over_100ms,
                "writer_retries": self.writer.stats().retries,
                "heartbeats": self.writer.beat_stats().beats,
                "heartbeat_failures": self.writer.beat_stats().failures,
                "heartbeat_max_gap_s": self.writer.beat_stats().max_gap_s,
            })
            .to_string(),
        })?;
        self.writer.flush()?;
        // Beats until here: the run has ended, and its trials are requeued.
        self.writer.beat().stop();
        let summary = RunSummary {
            finished: st.finished,
            ran: st.ran,
            interrupted,
            best: st.best,
            halted: (st.failures.0 >= self.study.max_consecutive_failures)
                .then(|| st.failures.1.clone().unwrap_or_default()),
        };
        self.reporter.study_end(self.study, &summary);
        Ok(summary)
    }
}

/// The state of one run of the core: what is in flight, paused, learned.
struct RunState<B: Backend> {
    /// One Salus core per device.
    core: DeviceCores<B>,
    events: Receiver<CoreEvent>,
    pruner: Box<dyn Pruner>,
    sampler: Box<dyn Sampler>,
    /// The study's data on each device, by device index (trials are built
    /// against device 0's and pointed at their device's as they are placed).
    data: Vec<Arc<DeviceData<B>>>,
    /// Each device's name for `salus_trials.device`: the backend's own
    /// name on one device, `cpu:1` or `cuda:1` on several.
    device_names: Vec<String>,
    /// Seeds each trial (with its number).
    seed: u64,
    /// Finished trials the study should reach.
    budget: u64,
    max_concurrent: usize,
    /// A lower cap while the study is young (the default's, for TPE and GP).
    ramp: Option<Ramp>,
    history: Vec<TrialRecord>,
    /// Stored trials to run first (interrupted or orphaned ones).
    waiting: VecDeque<Pending>,
    finished: u64,
    ran: u64,
    best: Option<(TrialNumber, f64)>,
    /// The sampler has nothing left (an exhausted grid).
    exhausted: bool,
    in_flight: BTreeMap<TrialHandle, Flight>,
    curves: Curves,
    /// Trials paused below a promotion cut, with their rung.
    paused: BTreeMap<TrialHandle, usize>,
    /// Paused trials already asked to stop for good.
    closing: BTreeSet<TrialHandle>,
    /// Trials that failed in a row, and the last one's reason.
    failures: (u64, Option<String>),
    backends: Vec<Arc<B>>,
    /// How external trials are sized for the ledger (with `[worker]`).
    worker_memory: Option<Arc<crate::external::worker::MemoryPlan>>,
    fusion: Fusion<B>,
    timeline: Timeline,
    liveness: Liveness,
    kept: keep::Kept,
    /// Where each trial's record is in `history` (other processes add more).
    history_at: BTreeMap<TrialNumber, usize>,
    /// `[pbt]`: the population's meetings (`pbt.rs`).
    pbt: Option<pbt::Population>,
}

impl<B: Backend> RunState<B> {
    /// Forgets the pauses of trial `run`, which ended or left this run,
    /// returning the rung the pruner held it at: `paused` lists only
    /// trials in flight, or [`Runner::close_paused`] would never see
    /// that only paused ones are left.
    fn forget_pauses(&mut self, run: TrialHandle) -> Option<usize> {
        self.liveness.user_paused.remove(&run);
        self.paused.remove(&run)
    }

    /// PBT members waiting at an exploit point.
    fn pbt_waiting(&self) -> usize {
        self.pbt.as_ref().map_or(0, |p| p.waiting())
    }

    /// Whether the study's budget has room for `more` trials beside this
    /// run's finished and in-flight ones and those other processes run.
    fn budget_has_room(&self, more: usize) -> bool {
        self.finished + self.liveness.elsewhere + ((self.in_flight.len() + more) as u64)
            < self.budget
    }

    /// An exhausted grid, or a study whose budget other processes filled
    /// with no waiting trial left to take.
    fn nothing_to_start(&self) -> bool {
        self.exhausted || (self.liveness.target_met && self.waiting.is_empty())
    }

    /// Tells the sampler's history how trial `number` stopped without a
    /// value (`None`: it runs again, promoted).
    fn stopped(&mut self, number: TrialNumber, how: Option<Stopped>) {
        if let Some(&i) = self.history_at.get(&number) {
            self.history[i].stopped = how;
        }
    }

    /// Adds trial `number` to the sampler's history, as pending; returns
    /// where its record is.
    fn record(&mut self, number: TrialNumber, params: Params) -> usize {
        self.history.push(TrialRecord {
            params,
            value: None,
            values: Vec::new(),
            violation: 0.0,
            stopped: None,
        });
        self.history_at.insert(number, self.history.len() - 1);
        self.history.len() - 1
    }
}

/// How trials run as fused groups (`groups.rs`).
struct Fusion<B: Backend> {
    /// Most members a fused group may have (1: no fusion).
    fuse: usize,
    /// Whether trials of different widths share groups.
    mix: crate::study::MixWidths,
    /// Device bytes one lane may fill, to bound a group's size.
    lane_budget: u64,
    /// The core's lanes.
    lanes_n: usize,
    core_kind: DeviceKind,
    /// Fused jobs, by the core's id.
    groups: BTreeMap<JobId, Group<B>>,
    /// Fused members waiting off the device between groups.
    parked: BTreeMap<MemberId, Parked<B>>,
    /// The core's policy, which also seats fused groups.
    policy: Policy,
    /// Each fused member's group.
    member_group: BTreeMap<MemberId, JobId>,
    next_member: MemberId,
}

/// The run's record of the core's timeline (`telemetry.rs`).
struct Timeline {
    run_id: crate::storage::RunId,
    started: Instant,
    /// Every core job of this run, for telemetry that arrives after a
    /// trial ended; a fused group's is its first member's.
    trial_ids: BTreeMap<JobId, TrialId>,
    lanes: BTreeMap<usize, LaneTally>,
}

/// What other processes and the dashboard see of this run (`dash_commands.rs`).
struct Liveness {
    /// RUNNING trials that another live process runs: how many, and which.
    elsewhere: u64,
    elsewhere_ids: BTreeSet<TrialId>,
    /// Of those, how many its pruner holds below a rung's cut.
    elsewhere_held: u64,
    /// When this run next rereads the study.
    sync: processes::SyncPace,
    /// The database said the study has its budget of trials: no new ones.
    target_met: bool,
    /// The database said the start's cap is full, which this run's last
    /// reread did not show: no new trials until the next reread.
    at_cap: bool,
    /// Where this process runs, as `salus_runs` records it.
    place: crate::storage::Place,
    /// The liveness limit (`[study] liveness`), in seconds.
    limit_s: f64,
    /// RUNNING trials no salus-tune run claims (Optuna's): the heartbeat
    /// each had when this run first saw it so, and when. One whose
    /// heartbeat has not moved for the liveness limit is requeued.
    unclaimed: BTreeMap<TrialId, (Option<String>, Instant)>,
    /// Trials paused from the dashboard: they keep their slot.
    user_paused: BTreeSet<TrialHandle>,
    last_commands: Instant,
}

/// Group size when `[scheduler] fuse` is not set.
pub const DEFAULT_FUSE: usize = 8;

/// What the default number of trials in flight depends on (when neither
/// `[scheduler] max_concurrent` nor `[worker] max_concurrency` says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// Lanes over every device of the run.
    pub lanes: usize,
    /// Every device of the run is a CPU.
    pub cpu_only: bool,
    /// A pruner or a PBT population gives the scheduler priorities to
    /// choose between trials by.
    pub prioritised: bool,
    /// The trials are external workers.
    pub external: bool,
    /// `Some(n)`: the sampler models the results so far (TPE, GP) after
    /// its first `n` proposals, drawn at random, so that from then on each
    /// trial in flight is one result fewer for the next proposal to learn
    /// from; no PBT population replaces its proposals.
    pub model_after: Option<usize>,
}

/// Trials a study holds when a model-based sampler's start first lets the
/// study's trials in flight double ([`InFlight::ramp`]).
pub const RAMP_TRIALS: usize = 60;

/// A model-based sampler's first proposals after its random start, made
/// with 2 trials in flight ([`InFlight::ramp`]).
pub const FIRST_PROPOSALS: usize = 20;

/// Lower caps on the study's trials in flight while it is young (as the
/// `study_start` event and `bench samplers --json` write it). Each bound
/// counts the trials the study holds (every process's, in any state); the
/// caps count the study's trials in flight, every process's, except in
/// the random start, where each process keeps its `max_concurrent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Ramp {
    /// The sampler's random start: until the study holds this many
    /// trials, its proposals learn nothing from results, and the steady
    /// `max_concurrent` runs.
    pub random_start: usize,
    /// Trials in flight at most after the random start, until the study
    /// holds `first_until` trials.
    pub first_cap: usize,
    pub first_until: usize,
    /// Trials in flight at most after that, until the study holds
    /// `until_trials`; from there the cap doubles each time the trials
    /// the study holds double (twice `cap` until twice `until_trials`,
    /// and so on), until it no longer binds.
    pub cap: usize,
    pub until_trials: usize,
}

impl Ramp {
    /// The cap on the study's trials in flight when it holds `trials`:
    /// `None` in the random start, where only `max_concurrent` bounds.
    pub fn cap_at(self, trials: usize) -> Option<usize> {
        if trials < self.random_start {
            return None;
        }
        if trials < self.first_until {
            return Some(self.first_cap);
        }
        // Doublings of `until_trials` that `trials` has reached.
        let doublings = (trials / self.until_trials.max(1))
            .checked_ilog2()
            .map_or(0, |d| d + 1);
        Some(
            self.cap
                .saturating_mul(1usize.checked_shl(doublings).unwrap_or(usize::MAX)),
        )
    }

    /// Trials in flight at most when the study holds `trials`, under a
    /// steady `max_concurrent`, where this process runs all of them.
    pub fn limit(ramp: Option<Ramp>, trials: usize, max_concurrent: usize) -> usize {
        match ramp.and_then(|r| r.cap_at(trials)) {
            Some(cap) => max_concurrent.min(cap),
            None => max_concurrent,
        }
    }

    /// Trials this process may start now, with `here` of its own in
    /// flight and `elsewhere` in flight in other processes on the study:
    /// its own `max_concurrent` bounds `here`, and the start's cap bounds
    /// both together, since a proposal learns from none of them.
    pub fn room(
        ramp: Option<Ramp>,
        trials: usize,
        max_concurrent: usize,
        here: usize,
        elsewhere: usize,
    ) -> usize {
        let own = max_concurrent.saturating_sub(here);
        match ramp.and_then(|r| r.cap_at(trials)) {
            Some(cap) => own.min(cap.saturating_sub(here + elsewhere)),
            None => own,
        }
    }

    /// The start's steps, in words, up to where `max_concurrent` binds.
    pub fn steps(self, max_concurrent: usize) -> String {
        let mut out = Vec::new();
        if self.random_start > 0 {
            out.push(format!("all for the first {} trials", self.random_start));
        }
        if self.first_cap < self.cap && self.first_until > self.random_start {
            out.push(format!(
                "{} until {} trials",
                self.first_cap, self.first_until
            ));
        }
        let (mut cap, mut until) = (self.cap, self.until_trials.max(1));
        while cap > 0 && cap < max_concurrent {
            out.push(format!("{cap} until {until}"));
            cap = cap.saturating_mul(2);
            until = until.saturating_mul(2);
        }
        out.join(", ")
    }
}

impl InFlight {
    /// The default's inputs for `study` on `lanes` lanes.
    pub fn of(study: &Study, lanes: usize, cpu_only: bool) -> Self {
        InFlight {
            lanes,
            cpu_only,
            prioritised: study.decides_at_reports(),
            external: study.worker.is_some(),
            model_after: match study.sampler.kind {
                _ if study.pbt.is_some() => None,
                crate::study::SamplerKind::Tpe { startup_trials, .. }
                | crate::study::SamplerKind::Gp { startup_trials } => Some(startup_trials),
                _ => None,
            },
        }
    }

    /// One trial per lane for built-in trials on CPUs with nothing to
    /// prioritise, else two per lane.
    ///
    /// A CPU lane time-slices its trials, so a second one per lane finishes
    /// no work sooner (the digits study ran as fast either way,
    /// `docs/benchmarks/concurrency.md`), while every proposal made with
    /// it in flight sees one finished result fewer. A second trial per lane
    /// pays where the scheduler chooses between trials by priority, where a
    /// GPU's streams run them at once, and where an external worker's
    /// start-up overlaps another's run.
    pub fn default_max(self) -> usize {
        let per_lane = if self.cpu_only && !self.prioritised && !self.external {
            1
        } else {
            2
        };
        (per_lane * self.lanes).max(1)
    }

    /// Where the default keeps more than 2 trials in flight for a
    /// model-based sampler: all of them in its random start; then, over the study's
    /// processes, 2 in flight for its [`FIRST_PROPOSALS`] first proposals,
    /// 4 (at most half the default) until the study holds [`RAMP_TRIALS`]
    /// trials, and from there twice as many each time the trials double
    /// (8 until 120, 16 until 240), so that the trials in flight stay
    /// about one in 7.5 of those the study holds.
    ///
    /// While the history is short, each pending trial is a large share of
    /// what a proposal does not know: at 4 in flight our TPE fell behind
    /// sequential Optuna on Levy-5, and drew ahead when its first 60
    /// trials kept one per lane; at 8 (a GPU's 4 lanes) it stayed behind
    /// at 50 trials until its first proposals kept 2; at 16 (two GPUs)
    /// half the lanes and then one per lane stayed behind on 7 of 26 cells
    /// over 500 seeds, where 8's counts met all 26 over 1,000
    /// (`docs/benchmarks/concurrency.md`). The caps are counts of trials,
    /// not of lanes, for that reason. The random start's proposals do not
    /// depend on results, so running them all at once changes none of
    /// them. The second trial per lane pays off over the rest of the study.
    ///
    /// A CPU that keeps one trial per lane starts the same way where it has
    /// more than 2 lanes: the counts, not the lanes, are what the proposals
    /// see. There, fewer trials in flight should cost less time than on
    /// a GPU, since a lane borrows the cores of the lanes that sit idle
    /// (not measured).
    pub fn ramp(self) -> Option<Ramp> {
        let lanes = self.lanes.max(1);
        let random_start = self.model_after?;
        let first_cap = lanes.min(2);
        let max = self.default_max();
        (max > first_cap).then_some(Ramp {
            random_start,
            first_cap,
            first_until: random_start + FIRST_PROPOSALS,
            // Half the default at most: one per lane where it keeps two.
            // A 4-lane CPU's one per lane met fewer cells with 4 from 30
            // trials than with 2 until 60 (`docs/benchmarks/concurrency.md`).
            cap: (max / 2).clamp(first_cap, 4),
            until_trials: RAMP_TRIALS,
        })
    }
}

/// A fused member: the runner numbers them, and the training crate's fused
/// job knows each by this number (its `tag`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct MemberId(u64);

/// A running trial as the runner knows it: the core's job when it runs
/// alone, or its seat in a fused group (whose job is the group's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum TrialHandle {
    Alone(JobId),
    Member(MemberId),
}

impl Runner<'_> {
    /// The record that an external trial's attempt `claim` saved its
    /// checkpoint covering `step`, with the files it makes stale.
    fn external_checkpoint_saved(&self, claim: crate::storage::Claim, step: i64) -> WriteOp {
        WriteOp::CheckpointSaved {
            claim,
            step,
            superseded: self.superseded_by(claim, step),
        }
    }

    /// The checkpoint files of `claim`'s trial that its checkpoint at
    /// `step` makes stale.
    fn superseded_by(&self, claim: crate::storage::Claim, step: i64) -> Vec<std::path::PathBuf> {
        self.checkpoints.as_ref().map_or_else(Vec::new, |c| {
            c.external_superseded(claim.trial_id, claim.attempt, step)
        })
    }

    /// The name an external trial's attempt `claim` checkpoints under.
    fn worker_checkpoint(&self, claim: crate::storage::Claim) -> std::path::PathBuf {
        match &self.checkpoints {
            Some(c) => c.external_path(claim.trial_id, claim.attempt),
            None => std::env::temp_dir().join(format!(
                "salus-trial-{}.a{}.external",
                claim.trial_id, claim.attempt
            )),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::{FIRST_PROPOSALS, InFlight, RAMP_TRIALS, Ramp};

    #[test]
    fn built_in_trials_on_a_cpu_with_nothing_to_prioritise_run_one_per_lane() {
        let plain = InFlight {
            lanes: 2,
            cpu_only: true,
            prioritised: false,
            external: false,
            model_after: None,
        };
        assert_eq!(plain.default_max(), 2);
        assert_eq!(InFlight { lanes: 0, ..plain }.default_max(), 1);
        // Each of these keeps a second trial per lane.
        for other in [
            InFlight {
                cpu_only: false,
                ..plain
            },
            InFlight {
                prioritised: true,
                ..plain
            },
            InFlight {
                external: true,
                ..plain
            },
        ] {
            assert_eq!(other.default_max(), 4, "{other:?}");
        }
        assert_eq!(
            InFlight {
                lanes: 32,
                cpu_only: false,
                ..plain
            }
            .default_max(),
            64
        );
    }

    #[test]
    fn a_model_based_sampler_keeps_few_trials_in_flight_while_the_study_is_young() {
        let gpu = InFlight {
            lanes: 32,
            cpu_only: false,
            prioritised: false,
            external: false,
            model_after: Some(10),
        };
        let ramp = gpu.ramp().expect("two per lane by default");
        assert_eq!(
            ramp,
            Ramp {
                random_start: 10,
                first_cap: 2,
                first_until: 10 + FIRST_PROPOSALS,
                cap: 4,
                until_trials: RAMP_TRIALS
            }
        );
        assert_eq!(
            ramp.steps(gpu.default_max()),
            "all for the first 10 trials, 2 until 30 trials, 4 until 60, 8 until 120, \
             16 until 240, 32 until 480"
        );
        let limit = |trials| Ramp::limit(Some(ramp), trials, gpu.default_max());
        // The random start's proposals learn nothing from results: all
        // run; then 2, then 4, then twice as many each time the trials
        // double, until two per lane.
        assert_eq!(limit(0), 64);
        assert_eq!(limit(9), 64);
        assert_eq!(limit(10), 2);
        assert_eq!(limit(29), 2);
        assert_eq!(limit(30), 4);
        assert_eq!(limit(RAMP_TRIALS - 1), 4);
        assert_eq!(limit(RAMP_TRIALS), 8);
        assert_eq!(limit(2 * RAMP_TRIALS - 1), 8);
        assert_eq!(limit(2 * RAMP_TRIALS), 16);
        assert_eq!(limit(4 * RAMP_TRIALS), 32);
        assert_eq!(limit(8 * RAMP_TRIALS - 1), 32);
        assert_eq!(limit(8 * RAMP_TRIALS), 64);
        assert_eq!(limit(usize::MAX), 64);
        // A cap lowered after running out of memory stays lower.
        assert_eq!(Ramp::limit(Some(ramp), 0, 20), 20);
        assert_eq!(Ramp::limit(Some(ramp), 12, 1), 1);
        assert_eq!(Ramp::limit(None, 0, 64), 64);
        // The caps count trials, not lanes, but never more than one per
        // lane before the doubling: one GPU's 4 lanes and two GPUs' 8 keep
        // the same counts until 60 trials, and 8 lanes keep one per lane
        // until 120, where 4 lanes reach their steady 8 at 60.
        let on = |lanes: usize| InFlight { lanes, ..gpu }.ramp().expect("two per lane");
        assert_eq!(
            [1, 2, 3, 4, 8].map(|n| (on(n).first_cap, on(n).cap)),
            [(1, 1), (2, 2), (2, 3), (2, 4), (2, 4)]
        );
        assert_eq!(on(2).steps(4), "all for the first 10 trials, 2 until 60");
        assert_eq!(
            on(4).steps(8),
            "all for the first 10 trials, 2 until 30 trials, 4 until 60"
        );
        let one_gpu = |t| Ramp::limit(Some(on(4)), t, 8);
        let two_gpus = |t| Ramp::limit(Some(on(8)), t, 16);
        for trials in 10..2 * RAMP_TRIALS {
            assert_eq!(one_gpu(trials), two_gpus(trials), "{trials}");
        }
        assert_eq!((one_gpu(120), two_gpus(120)), (8, 16));
        // No random start: the first proposals start at once.
        let from_0 = InFlight {
            model_after: Some(0),
            lanes: 4,
            ..gpu
        }
        .ramp()
        .expect("two per lane");
        assert_eq!(Ramp::limit(Some(from_0), 0, 8), 2);
        assert_eq!(Ramp::limit(Some(from_0), FIRST_PROPOSALS, 8), 4);
        // No ramp for samplers that learn nothing from results in flight.
        assert_eq!(
            InFlight {
                model_after: None,
                ..gpu
            }
            .ramp(),
            None
        );
        // A CPU's one trial per lane: the same start on its 32 lanes (up to
        // 32 in flight), none where it keeps 2 or fewer.
        let cpu = InFlight {
            cpu_only: true,
            ..gpu
        };
        assert_eq!(cpu.default_max(), 32);
        assert_eq!(cpu.ramp(), Some(ramp));
        assert_eq!(
            ramp.steps(cpu.default_max()),
            "all for the first 10 trials, 2 until 30 trials, 4 until 60, 8 until 120, \
             16 until 240"
        );
        for lanes in [1, 2] {
            assert_eq!(InFlight { lanes, ..cpu }.ramp(), None, "{lanes} lanes");
        }
        // Half the default at most until 60 trials: a 4-lane CPU keeps 2,
        // as 2 lanes keeping two per lane do.
        let four = InFlight { lanes: 4, ..cpu }.ramp();
        assert_eq!(four, InFlight { lanes: 2, ..gpu }.ramp());
        assert_eq!(four.map(|r| (r.first_cap, r.cap)), Some((2, 2)));
        let three = InFlight { lanes: 3, ..cpu }.ramp().expect("3 in flight");
        assert_eq!((three.first_cap, three.cap), (2, 2));
        for pays in [
            InFlight {
                prioritised: true,
                ..cpu
            },
            InFlight {
                external: true,
                ..cpu
            },
        ] {
            assert_eq!(pays.ramp(), Some(ramp), "{pays:?}");
        }
    }

    #[test]
    fn the_start_caps_the_study_s_trials_in_flight_over_every_process() {
        // One process per GPU, 4 lanes each, on one study.
        let per_gpu = InFlight {
            lanes: 4,
            cpu_only: false,
            prioritised: false,
            external: false,
            model_after: Some(10),
        };
        let ramp = per_gpu.ramp();
        let max = per_gpu.default_max();
        // The random start: each process fills its own 8.
        assert_eq!(Ramp::room(ramp, 5, max, 0, 8), 8);
        assert_eq!(Ramp::room(ramp, 5, max, 3, 8), 5);
        // The first proposals: 2 in flight over both processes.
        assert_eq!(Ramp::room(ramp, 12, max, 0, 0), 2);
        assert_eq!(Ramp::room(ramp, 12, max, 0, 1), 1);
        assert_eq!(Ramp::room(ramp, 12, max, 0, 2), 0);
        assert_eq!(Ramp::room(ramp, 12, max, 1, 5), 0);
        // 4 until 60 trials, 8 until 120: this process may take them all.
        assert_eq!(Ramp::room(ramp, 40, max, 1, 2), 1);
        assert_eq!(Ramp::room(ramp, 60, max, 0, 3), 5);
        assert_eq!(Ramp::room(ramp, 60, max, 0, 0), 8);
        // From 120 the cap of 16 no longer binds: each keeps its own 8.
        assert_eq!(Ramp::room(ramp, 120, max, 2, 8), 6);
        assert_eq!(Ramp::room(ramp, 120, max, 8, 8), 0);
        // Set, max_concurrent alone bounds each process.
        assert_eq!(Ramp::room(None, 12, 8, 3, 100), 5);
    }

    #[test]
    fn the_ramp_follows_the_study_s_sampler_and_population() {
        let at = |name: &str, cpu_only: bool| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("studies")
                .join(name);
            let study = crate::study::parse::load(&path).expect("an example study");
            InFlight::of(&study, 2, cpu_only).ramp()
        };
        // Each starts with its sampler's random proposals (`startup_trials`).
        let ramp = |random_start| {
            Some(Ramp {
                random_start,
                first_cap: 2,
                first_until: random_start + FIRST_PROPOSALS,
                cap: 2,
                until_trials: RAMP_TRIALS,
            })
        };
        // GP on a GPU, and TPE with external workers on a CPU.
        assert_eq!(at("digits_gp.toml", false), ramp(8));
        assert_eq!(at("external_objective.toml", true), ramp(10));
        // One per lane already, random search (with a pruner, and with
        // external workers), and a PBT population.
        assert_eq!(at("digits_gp.toml", true), None);
        assert_eq!(at("digits_asha.toml", false), None);
        assert_eq!(at("external_torch.toml", true), None);
        let pbt = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("studies/digits_pbt.toml");
        let text = std::fs::read_to_string(&pbt).expect("the PBT example")
            + "\n[sampler]\nkind = \"tpe\"\n";
        let study = crate::study::parse::parse_str(&text, &pbt).expect("PBT with TPE");
        assert!(matches!(
            study.sampler.kind,
            crate::study::SamplerKind::Tpe { .. }
        ));
        assert_eq!(InFlight::of(&study, 2, false).ramp(), None);
    }

    #[test]
    fn paused_trials_end_only_when_nothing_here_or_elsewhere_can_promote_them() {
        let last = super::LastPaused {
            in_flight: 3,
            paused: 3,
            can_start: false,
            elsewhere: 0,
            elsewhere_held: 0,
            timed_out: false,
        };
        assert!(last.are_final());
        // One of this run's trials still runs, or a new one may start.
        assert!(!super::LastPaused { paused: 2, ..last }.are_final());
        assert!(
            !super::LastPaused {
                can_start: true,
                ..last
            }
            .are_final()
        );
        assert!(
            !super::LastPaused {
                in_flight: 0,
                paused: 0,
                ..last
            }
            .are_final()
        );
        // Another process's running trial may still reach a rung and lift
        // one of them over its cut; its held trials cannot.
        let others = super::LastPaused {
            elsewhere: 5,
            elsewhere_held: 4,
            ..last
        };
        assert!(!others.are_final());
        assert!(
            super::LastPaused {
                elsewhere_held: 5,
                ..others
            }
            .are_final()
        );
        assert!(
            super::LastPaused {
                timed_out: true,
                ..others
            }
            .are_final()
        );
    }

    #[test]
    fn a_stored_trial_that_ended_without_a_value_tells_the_sampler_how() {
        use crate::sampler::Stopped;
        use crate::storage::TrialState;
        assert_eq!(
            super::stopped_of(TrialState::Pruned, &[(1, 0.5), (3, 0.2)], false),
            Some(Stopped::Pruned {
                step: 3,
                value: 0.2
            })
        );
        assert!(matches!(
            super::stopped_of(TrialState::Pruned, &[], false),
            Some(Stopped::Pruned { step: -1, value }) if value.is_nan()
        ));
        assert_eq!(
            super::stopped_of(TrialState::Fail, &[(1, 0.5)], false),
            Some(Stopped::Failed)
        );
        for running in [
            TrialState::Complete,
            TrialState::Running,
            TrialState::Waiting,
        ] {
            assert_eq!(super::stopped_of(running, &[(1, 0.5)], false), None);
        }
        // Held below a cut by another process's pruner: pruned at its
        // last report until promoted; only a RUNNING trial can be held.
        assert_eq!(
            super::stopped_of(TrialState::Running, &[(1, 0.5), (2, 0.4)], true),
            Some(Stopped::Pruned {
                step: 2,
                value: 0.4
            })
        );
        assert_eq!(
            super::stopped_of(TrialState::Complete, &[(1, 0.5)], true),
            None
        );
        assert_eq!(
            super::stopped_of(TrialState::Waiting, &[(1, 0.5)], true),
            None
        );
    }
}
