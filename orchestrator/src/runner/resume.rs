//! Resume and recovery: what a run finds in the database before it starts.
//!
//! Trials that are finished (COMPLETE, PRUNED, FAIL) count toward the
//! budget. A trial left RUNNING by a process that died, or interrupted by
//! Ctrl-C, goes back to WAITING and runs again first, with the same
//! parameters, from its checkpoint when one fits the stored curve. A
//! RUNNING trial whose run is alive belongs to another live process and is
//! left alone, as is one that no salus-tune run claims (an Optuna
//! process's: the syncs watch its heartbeat). Then the sampler is built from the history, the run is
//! registered, and the core starts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use kernels::{Backend, DeviceKind};
use training::{DeviceData, TrainTrial};

use super::{
    DEFAULT_FUSE, Fusion, InFlight, Liveness, MemberId, Pending, RunState, Runner, Timeline,
    decode_params, trial_seed,
};
use crate::error::{Error, Result};
use crate::external::mps::MpsDaemon;
use crate::external::worker::MemoryPlan;
use crate::pruner::{Curve, Curves};
use crate::salus::core::CoreConfig;
use crate::salus::devices::DeviceCores;
use crate::sampler::{
    GpSampler, GridSampler, Nsga2Sampler, QmcSampler, RandomSampler, Sampler, TpeSampler,
    TrialRecord,
};
use crate::storage::writer::{RunInfo, WriteOp};
use crate::storage::{Claim, Requeuer, TrialId, TrialNumber};
use crate::storage::{TrialRow, TrialState};
use crate::study::SamplerKind;

/// What [`Runner::take_stock`] found.
struct Stock {
    history: Vec<TrialRecord>,
    waiting: VecDeque<Pending>,
    finished: u64,
    best: Option<(TrialNumber, f64)>,
    /// RUNNING trials with a fresh heartbeat: another live process runs them.
    elsewhere: u64,
    /// Steps each requeued trial keeps (those its checkpoint covers).
    kept_steps: BTreeMap<TrialNumber, i64>,
}

impl Runner<'_> {
    /// Takes stock of the stored trials, records the run, and starts one
    /// core per device (`data`: the study's data on each).
    pub(super) fn start<B: Backend>(
        &mut self,
        backends: &[Arc<B>],
        data: Vec<Arc<DeviceData<B>>>,
    ) -> Result<RunState<B>> {
        let study = self.study;
        let configs: Vec<CoreConfig> = backends
            .iter()
            .map(|b| self.core_config(b.as_ref(), backends.len()))
            .collect();
        let config = configs[0];
        let lanes: usize = configs.iter().map(|c| c.lanes).sum();
        // Before the run is registered: MPS may fail to start.
        let worker_memory = match &study.worker {
            Some(w) => Some(Arc::new(self.worker_memory(
                w,
                backends[0].kind(),
                &config,
            )?)),
            None => None,
        };
        let several = backends.len() > 1;
        let device_names: Vec<String> = backends
            .iter()
            .map(|b| if several { b.label() } else { b.name() })
            .collect();
        let device = if several {
            let names: Vec<String> = backends
                .iter()
                .map(|b| format!("{} {}", b.label(), b.name()))
                .collect();
            names.join(", ")
        } else {
            backends[0].name()
        };
        let place = crate::storage::Place::here();
        let host = place.host.clone();
        let limit_s = study.liveness.as_secs_f64();
        // Registered first, so that no other process takes this run's
        // trials for a dead one's while it starts.
        let (run_id, process_index) = self.writer.start_run(
            self.info.id,
            RunInfo {
                host: host.clone(),
                pid: std::process::id() as i64,
                pid_namespace: place.pid_namespace.clone(),
                liveness_s: limit_s,
                device: device.clone(),
                policy: config.policy.name().to_string(),
                lanes: lanes as i64,
                threads_per_lane: config.threads_per_lane as i64,
                budget_bytes: configs.iter().map(|c| c.budget).sum::<u64>() as i64,
            },
        )?;
        self.writer.beat().start(run_id, limit_s);
        // The trials as they are now that this run is registered, not as
        // the command read them before the device and the data were ready:
        // a process that took a dead one's index replays its sampler's
        // stream from the length of its history, and a stale (shorter)
        // history would propose again what the dead process proposed.
        // A RUNNING trial whose run is dead is an orphan to requeue; at
        // the start this run has no heartbeat gap of its own to wait out.
        let (existing, orphans) = super::processes::judge_then_read(
            || self.writer.read_trials(self.info.id),
            |row| {
                let owner = row
                    .owner
                    .as_ref()
                    .filter(|_| row.state == TrialState::Running)?;
                super::processes::dead_holder(row.trial_id, owner, &place, limit_s, true)
            },
        )?;
        let Stock {
            history,
            waiting,
            finished,
            best,
            elsewhere,
            kept_steps,
        } = self.take_stock(&data[0], &existing, &orphans)?;
        let budget = match self.options.more {
            Some(n) => finished + n,
            None => self.options.trials.unwrap_or(study.trials),
        };
        if finished >= budget {
            self.reporter.note(&format!(
                "study '{}' already has {finished} finished trials (the target is {budget}): nothing to run; --more N runs N more",
                study.name
            ));
        }
        let sampler = self.build_sampler(process_index as u64)?;
        let cpu_only = backends.iter().all(|b| b.kind() == DeviceKind::Cpu);
        let in_flight = InFlight::of(study, lanes, cpu_only);
        let (max_concurrent, ramp) = match study.max_concurrent_set() {
            Some(n) => (n.max(1), None),
            None => (in_flight.default_max(), in_flight.ramp()),
        };
        self.writer.send(WriteOp::Event {
            study_id: self.info.id,
            trial_id: None,
            kind: "study_start",
            detail: serde_json::json!({ "budget": budget, "finished": finished, "device": device, "run_id": run_id, "lanes": lanes, "max_concurrent": max_concurrent, "ramp": ramp, "host": host, "pid": std::process::id(), "process_index": process_index }).to_string(),
        })?;
        self.reporter.study_start(study, budget, finished, best);
        let (tx, events) = std::sync::mpsc::channel();
        let core = DeviceCores::start(
            backends
                .iter()
                .zip(&configs)
                .map(|(b, c)| (b.label(), b.clone(), *c))
                .collect(),
            tx,
        )?;
        if several {
            let each: Vec<String> = backends
                .iter()
                .zip(&configs)
                .map(|(b, c)| format!("{} ({} lanes)", b.label(), c.lanes))
                .collect();
            self.reporter.note(&format!(
                "devices: {}; one Salus core each",
                each.join(", ")
            ));
        }
        let curves = Self::stored_curves(&existing, &kept_steps);
        if let Some(c) = &self.checkpoints {
            // Only finished trials' files: the folder may be shared with
            // other processes, whose trials' checkpoints must stay.
            let done: Vec<TrialId> = existing
                .iter()
                .filter(|r| r.state.is_finished())
                .map(|r| r.trial_id)
                .collect();
            c.sweep(&done);
            c.sweep_points(&done);
        }
        // `take_stock` gave each stored trial one record, in order.
        let history_at = existing
            .iter()
            .enumerate()
            .map(|(i, r)| (r.number, i))
            .collect();
        Ok(RunState {
            core,
            events,
            pruner: study.pruner.build(),
            sampler,
            data,
            device_names,
            seed: self.options.seed.unwrap_or(study.seed),
            budget,
            max_concurrent,
            ramp,
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
            failures: (0, None),
            backends: backends.to_vec(),
            worker_memory,
            fusion: Fusion {
                fuse: study.scheduler.fuse.unwrap_or(DEFAULT_FUSE).max(1),
                mix: study.scheduler.mix_widths.unwrap_or_default(),
                policy: config.policy,
                parked: BTreeMap::new(),
                lane_budget: config.budget / config.lanes.max(1) as u64,
                lanes_n: lanes.max(1),
                core_kind: backends[0].kind(),
                groups: BTreeMap::new(),
                member_group: BTreeMap::new(),
                next_member: MemberId(0),
            },
            timeline: Timeline {
                run_id,
                started: Instant::now(),
                trial_ids: BTreeMap::new(),
                lanes: BTreeMap::new(),
            },
            liveness: Liveness {
                elsewhere,
                elsewhere_ids: BTreeSet::new(),
                // Known from the first sync; until then none counts as held.
                elsewhere_held: 0,
                sync: super::processes::SyncPace::new(),
                target_met: false,
                at_cap: false,
                place,
                limit_s,
                unclaimed: BTreeMap::new(),
                user_paused: BTreeSet::new(),
                last_commands: Instant::now(),
            },
            kept: Default::default(),
            history_at,
            pbt: self.study.pbt.clone().map(super::pbt::Population::new),
        })
    }

    /// What the stored trials say: the history the sampler learns from,
    /// trials to run again first (each with its checkpoint, when one fits),
    /// how many are finished, the best, and how many run elsewhere.
    fn take_stock<B: Backend>(
        &self,
        data: &Arc<DeviceData<B>>,
        existing: &[TrialRow],
        orphans: &BTreeMap<TrialId, Requeuer>,
    ) -> Result<Stock> {
        let study = self.study;
        let mut history: Vec<TrialRecord> = Vec::new();
        let mut waiting = VecDeque::new();
        let mut finished = 0u64;
        let mut best: Option<(TrialNumber, f64)> = None;
        let mut elsewhere = 0u64;
        let mut kept_steps: BTreeMap<TrialNumber, i64> = BTreeMap::new();
        for row in existing {
            let params = decode_params(study, row);
            // A RUNNING one held by no run (Optuna's) is left alone at the
            // start: the runs' syncs watch its heartbeat.
            let requeue = orphans.get(&row.trial_id).cloned();
            if row.state == TrialState::Running && requeue.is_none() {
                elsewhere += 1;
                history.push(TrialRecord {
                    params,
                    value: None,
                    values: Vec::new(),
                    violation: 0.0,
                    stopped: None,
                });
                continue;
            }
            let mut params = params;
            if matches!(row.state, TrialState::Running | TrialState::Waiting) {
                let (pending, keep) = self.pending_of(data, row, params, requeue)?;
                params = pending.params.clone();
                kept_steps.insert(row.number, keep);
                waiting.push_back(pending);
            }
            if row.state.is_finished() {
                finished += 1;
            }
            if let (TrialState::Complete, Some(v)) = (row.state, row.value)
                && best.is_none_or(|(_, b)| study.direction.better(v, b))
            {
                best = Some((row.number, v));
            }
            let values = match row.state {
                TrialState::Complete => super::all_values(study, row.value, &row.more_values),
                _ => Vec::new(),
            };
            history.push(TrialRecord {
                params,
                value: row.value,
                values,
                violation: super::violation(row.constraints.iter().copied()),
                stopped: super::stopped_of(
                    row.state,
                    &row.intermediate,
                    row.held_at_rung.is_some(),
                ),
            });
        }
        Ok(Stock {
            history,
            waiting,
            finished,
            best,
            elsewhere,
            kept_steps,
        })
    }

    /// A stored trial to run (again): from its checkpoint when one fits it.
    /// A RUNNING one (an orphan) goes back to WAITING first under
    /// `requeue`'s rules, its curve cut to what the checkpoint covers; the
    /// requeue changes nothing when another process requeued it already.
    /// Answers the steps it keeps.
    pub(super) fn pending_of<B: Backend>(
        &self,
        data: &Arc<DeviceData<B>>,
        row: &TrialRow,
        params: crate::space::Params,
        requeue: Option<Requeuer>,
    ) -> Result<(Pending, i64)> {
        let study = self.study;
        let (params, enqueued) = match &row.fixed_params {
            Some(fixed) if row.params.is_empty() => self.enqueued_params(row, fixed),
            _ => (params, None),
        };
        let cfg = study.trial_config(
            &params,
            trial_seed(self.options.seed.unwrap_or(study.seed), row.number),
        );
        // It must not be ahead of the stored curve: a crash between the
        // checkpoint and its report's value would lose a step. A missing or
        // unreadable one means a restart from zero.
        let stored = row.intermediate.last().map_or(0, |&(s, _)| s);
        let (resume, external_resume) = match &study.worker {
            None => {
                let resume = self.checkpoints.as_ref().and_then(|c| {
                    crate::checkpoint::furthest_covered(c.load_all(row.trial_id), stored, |s| {
                        TrainTrial::resume_on_host(data.clone(), cfg.clone(), s.clone()).is_ok()
                    })
                });
                (resume, None)
            }
            // A worker checkpoints itself, each attempt into its own file;
            // the latest recorded one says which file and what it covers.
            Some(_) => {
                let external = self.checkpoints.as_ref().and_then(|c| {
                    row.checkpoint.filter(|&(attempt, step)| {
                        c.external_at(row.trial_id, attempt, step).is_file()
                    })
                });
                (None, external)
            }
        };
        let keep = match (&resume, external_resume) {
            (Some(s), _) => s.reports as i64,
            (None, Some((_, step))) => step,
            (None, None) => 0,
        };
        if let Some(by) = requeue {
            self.writer.send(WriteOp::Requeue {
                by,
                keep_steps: keep,
            })?;
        }
        Ok((
            Pending {
                claim: Claim {
                    trial_id: row.trial_id,
                    run_id: crate::storage::RunId(0),
                    attempt: 0,
                },
                number: row.number,
                params,
                resume,
                enqueued,
                external_resume,
            },
            keep,
        ))
    }

    /// A WAITING trial this run just claimed resumes from a point the
    /// database's curve reaches: the point read when it was listed may be
    /// stale (another process's requeue, not this one's, cut the curve, at
    /// another step). Of that point and the checkpoint as it is now (no
    /// other run writes it while this one holds the claim), the furthest
    /// one not past the last stored step; none means a restart from zero.
    pub(super) fn settle_resume<B: Backend>(
        &self,
        data: &Arc<DeviceData<B>>,
        p: &mut Pending,
        claimed: &crate::storage::Claimed,
    ) {
        p.claim = claimed.claim;
        let last = claimed.last_step;
        if self.study.worker.is_some() {
            p.external_resume = claimed.checkpoint.filter(|&(attempt, step)| {
                step <= last
                    && self.checkpoints.as_ref().is_some_and(|c| {
                        c.external_at(claimed.claim.trial_id, attempt, step)
                            .is_file()
                    })
            });
            return;
        }
        let cfg = self.study.trial_config(
            &p.params,
            trial_seed(self.options.seed.unwrap_or(self.study.seed), p.number),
        );
        let now = self
            .checkpoints
            .as_ref()
            .map(|c| c.load_all(claimed.claim.trial_id))
            .unwrap_or_default();
        p.resume = crate::checkpoint::furthest_covered(
            p.resume.take().into_iter().chain(now),
            last,
            |s| TrainTrial::resume_on_host(data.clone(), cfg.clone(), s.clone()).is_ok(),
        );
    }

    /// An enqueued trial's parameters (Optuna's `enqueue_trial`, or
    /// `salus-tune enqueue`): its fixed values, the others drawn at random
    /// from a stream of its own, so that every process draws the same.
    fn enqueued_params(
        &self,
        row: &TrialRow,
        fixed: &serde_json::Map<String, serde_json::Value>,
    ) -> (
        crate::space::Params,
        Option<std::result::Result<Vec<crate::storage::StoredParam>, String>>,
    ) {
        use rand::SeedableRng;
        let study = self.study;
        let seed = self.options.seed.unwrap_or(study.seed);
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(trial_seed(seed, row.number) ^ ENQUEUED_STREAM);
        match study
            .space
            .with_fixed(fixed, |p| crate::sampler::random::draw(&mut rng, &p.dist))
        {
            Ok(params) => {
                let stored = super::encode_params(study, &params);
                (params, Some(Ok(stored)))
            }
            Err(why) => (crate::space::Params::new(), Some(Err(why))),
        }
    }

    /// The study's sampler, seeded by `--seed` or the study, plus the
    /// process index: processes on one study draw different points, and
    /// a process alone (index 0) draws what it always did.
    fn build_sampler(&self, process_index: u64) -> Result<Box<dyn Sampler>> {
        let study = self.study;
        let sampler_seed = self
            .options
            .seed
            .unwrap_or(study.sampler.seed)
            .wrapping_add(process_index);
        Ok(match study.sampler.kind {
            SamplerKind::Random => Box::new(RandomSampler::new(sampler_seed)),
            SamplerKind::Qmc => Box::new(QmcSampler { seed: sampler_seed }),
            SamplerKind::Tpe {
                startup_trials,
                multivariate,
                pending,
            } => {
                let directions = study.objectives.iter().map(|(_, d)| *d).collect();
                let mut tpe = TpeSampler::multi(sampler_seed, directions);
                tpe.startup_trials = startup_trials;
                tpe.multivariate = multivariate;
                tpe.pending = pending;
                Box::new(tpe)
            }
            SamplerKind::Gp { startup_trials } => {
                let mut gp = GpSampler::new(sampler_seed, study.direction);
                gp.startup_trials = startup_trials;
                Box::new(gp)
            }
            SamplerKind::Grid => {
                Box::new(GridSampler::new(&study.space, sampler_seed).map_err(Error::Input)?)
            }
            SamplerKind::Nsga2 { population } => Box::new(Nsga2Sampler::with_population(
                sampler_seed,
                study.objectives.iter().map(|(_, d)| *d).collect(),
                population,
            )),
            SamplerKind::Nsga3 { population } => Box::new(Nsga2Sampler::nsga3(
                sampler_seed,
                study.objectives.iter().map(|(_, d)| *d).collect(),
                population,
            )),
        })
    }

    /// The stored curves the pruner compares against; a requeued trial
    /// keeps only the values its checkpoint covers.
    fn stored_curves(existing: &[TrialRow], kept_steps: &BTreeMap<TrialNumber, i64>) -> Curves {
        existing
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
            .collect()
    }
}

/// Keeps enqueued trials' draws apart from other users of a trial's seed.
const ENQUEUED_STREAM: u64 = 0xe9c0_e0ed_0000_0001;

impl Runner<'_> {
    /// How this run sizes its external trials; with `[scheduler] mps`, the
    /// MPS daemon they share (an error names what is missing).
    fn worker_memory(
        &mut self,
        w: &crate::study::WorkerConfig,
        device: DeviceKind,
        config: &CoreConfig,
    ) -> Result<MemoryPlan> {
        let plan = MemoryPlan::new(w.memory_bytes, config.budget);
        if !self.study.scheduler.mps {
            return Ok(plan);
        }
        let DeviceKind::Cuda(_) = device else {
            return Err(Error::Mps(
                "[scheduler] mps = true needs a CUDA device, and this run is on the CPU \
                 (see `salus-tune devices`; or set mps = false)"
                    .into(),
            ));
        };
        let daemon =
            MpsDaemon::start(&crate::external::worker::socket_dir()).map_err(Error::Mps)?;
        self.reporter
            .note("MPS: the run's own control daemon started; workers share the GPU through it");
        Ok(plan.with_mps(daemon, config.lanes))
    }
}
