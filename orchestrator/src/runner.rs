//! Runs a study: propose, train, record, until the budget is spent.
//!
//! Trials run one after another on one lane for now; the Salus core will
//! schedule many at once. The runner owns no output: it tells a
//! [`Reporter`] what happens, and the writer what to store.
//!
//! Resuming: trials that are finished (COMPLETE, PRUNED, FAIL) count toward
//! the budget. A trial left RUNNING by a process that died, or interrupted
//! by Ctrl-C, goes back to WAITING and is run again first, with the same
//! parameters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use kernels::{Backend, CpuBackend};
use workers::{DeviceData, Job, Lane, StepOutcome, TrainTrial, WorkerError};

use crate::error::{Error, Result};
use crate::progress::Reporter;
use crate::sampler::{GridSampler, RandomSampler, Sampler, TrialRecord};
use crate::space::{Distribution, ParamValue, Params, distribution_json};
use crate::storage::writer::{TrialResources, WriteOp};
use crate::storage::{StudyInfo, TrialRow, TrialState, Writer};
use crate::study::{SamplerKind, Study};

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
}

impl Runner<'_> {
    /// Runs the study to its budget, its timeout, an exhausted grid or a stop.
    pub fn run(mut self, existing: Vec<TrialRow>) -> Result<RunSummary> {
        let study = self.study;
        let budget = self.options.trials.unwrap_or(study.trials);
        let seed = self.options.seed.unwrap_or(study.seed);
        let data = study.data.load()?;
        if let Some(max) = self.max_batch()
            && max as usize > data.n_train
        {
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
        }
        let backend = Arc::new(CpuBackend::new());
        let mut lane = Lane::new(backend.clone(), 0, 1)?;
        let device_data = DeviceData::upload(&mut lane, &data)?;

        let mut history: Vec<TrialRecord> = Vec::new();
        let mut waiting = std::collections::VecDeque::new();
        let mut finished = 0u64;
        let mut best: Option<(i64, f64)> = None;
        for row in &existing {
            let params = decode_params(study, row);
            if row.state == TrialState::Running {
                self.writer.send(WriteOp::Requeue {
                    trial_id: row.trial_id,
                })?;
            }
            if matches!(row.state, TrialState::Running | TrialState::Waiting) {
                waiting.push_back(Pending {
                    trial_id: row.trial_id,
                    number: row.number,
                    params: params.clone(),
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
        let mut sampler: Box<dyn Sampler> = match study.sampler.kind {
            SamplerKind::Random => Box::new(RandomSampler::new(
                self.options.seed.unwrap_or(study.sampler.seed),
            )),
            SamplerKind::Grid => Box::new(
                GridSampler::new(
                    &study.space,
                    self.options.seed.unwrap_or(study.sampler.seed),
                )
                .map_err(Error::Input)?,
            ),
        };
        self.writer.send(WriteOp::Event { study_id: self.info.id, trial_id: None, kind: "study_start", detail: serde_json::json!({ "budget": budget, "finished": finished, "device": backend.name() }).to_string() })?;
        self.reporter.study_start(study, budget, finished, best);

        let started = Instant::now();
        let mut ran = 0;
        let mut interrupted = false;
        while finished < budget {
            if self.stop.load(Ordering::SeqCst) {
                interrupted = true;
                break;
            }
            if study.timeout.is_some_and(|t| started.elapsed() >= t) {
                self.reporter.note(&format!(
                    "timeout of {:?} reached; no new trials",
                    study.timeout.unwrap()
                ));
                break;
            }
            let pending = match waiting.pop_front() {
                Some(p) => {
                    self.writer.send(WriteOp::StartTrial {
                        trial_id: p.trial_id,
                    })?;
                    p
                }
                None => match sampler.propose(&study.space, &history) {
                    None => {
                        self.reporter.note("the grid is exhausted");
                        break;
                    }
                    Some(params) => {
                        let (trial_id, number) = self
                            .writer
                            .create_trial(self.info.id, encode_params(study, &params))?;
                        Pending {
                            trial_id,
                            number,
                            params,
                        }
                    }
                },
            };
            let outcome = self.run_trial(&mut lane, &device_data, &pending, seed)?;
            ran += 1;
            let value = match outcome {
                TrialEnd::Complete(v) => {
                    finished += 1;
                    if best.is_none_or(|(_, b)| study.direction.better(v, b)) {
                        best = Some((pending.number, v));
                    }
                    Some(v)
                }
                TrialEnd::Failed => {
                    finished += 1;
                    None
                }
                TrialEnd::Interrupted => {
                    interrupted = true;
                    self.writer.flush()?;
                    break;
                }
            };
            self.writer.flush()?;
            self.reporter
                .trial_end(pending.number, value, best, finished);
            history.push(TrialRecord {
                params: pending.params,
                value,
            });
        }
        self.writer.send(WriteOp::Event {
            study_id: self.info.id,
            trial_id: None,
            kind: "study_stop",
            detail: serde_json::json!({ "finished": finished, "interrupted": interrupted })
                .to_string(),
        })?;
        self.writer.flush()?;
        let summary = RunSummary {
            finished,
            ran,
            interrupted,
            best,
        };
        self.reporter.study_end(study, &summary);
        Ok(summary)
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

    fn run_trial(
        &mut self,
        lane: &mut Lane<CpuBackend>,
        data: &Arc<DeviceData<CpuBackend>>,
        p: &Pending,
        seed: u64,
    ) -> Result<TrialEnd> {
        let study = self.study;
        let cfg = study.trial_config(&p.params, trial_seed(seed, p.number));
        let mut trial = match TrainTrial::new(lane, data.clone(), cfg.clone()) {
            Ok(t) => t,
            Err(e) => return self.fail(p, 0, 0.0, format!("could not build the trial: {e}")),
        };
        let fp = trial.footprint();
        self.writer.send(WriteOp::Resources {
            trial_id: p.trial_id,
            resources: TrialResources {
                device: lane.backend().name(),
                lane: Some(lane.id() as i64),
                persistent_bytes: fp.persistent_bytes as i64,
                ephemeral_bytes: fp.ephemeral_bytes as i64,
                shared_bytes: fp.shared_bytes as i64,
                total_iterations: trial.total_iterations() as i64,
            },
        })?;
        let reports = trial.total_iterations().div_ceil(
            cfg.report_every
                .unwrap_or(trial.iterations_per_epoch())
                .max(1),
        );
        self.reporter
            .trial_start(p.number, &describe(study, &p.params), reports);
        let start = Instant::now();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                self.writer.send(WriteOp::Requeue {
                    trial_id: p.trial_id,
                })?;
                self.reporter.trial_interrupted(p.number);
                return Ok(TrialEnd::Interrupted);
            }
            let outcome = match trial.step(lane) {
                Ok(o) => o,
                Err(WorkerError::Diverged { iteration, loss }) => {
                    return self.fail(
                        p,
                        trial.iterations_done() as i64,
                        start.elapsed().as_secs_f64(),
                        format!("diverged at iteration {iteration}: training loss is {loss}"),
                    );
                }
                Err(e) => {
                    return self.fail(
                        p,
                        trial.iterations_done() as i64,
                        start.elapsed().as_secs_f64(),
                        e.to_string(),
                    );
                }
            };
            let (report, last) = match outcome {
                StepOutcome::Continue => continue,
                StepOutcome::Report(r) => (r, false),
                StepOutcome::Finished(r) => (r, true),
            };
            let value = report.metric(&study.metric).unwrap_or(f64::NAN);
            self.writer.send(WriteOp::Intermediate {
                trial_id: p.trial_id,
                step: report.step as i64,
                value,
            })?;
            self.reporter
                .trial_report(p.number, report.step, &study.metric, value);
            if last {
                let seconds = start.elapsed().as_secs_f64();
                if !value.is_finite() {
                    return self.fail(
                        p,
                        trial.iterations_done() as i64,
                        seconds,
                        format!("{} is {value}", study.metric),
                    );
                }
                self.writer.send(WriteOp::Finish {
                    trial_id: p.trial_id,
                    state: TrialState::Complete,
                    value: Some(value),
                    iterations: trial.iterations_done() as i64,
                    device_seconds: seconds,
                    fail_reason: None,
                })?;
                return Ok(TrialEnd::Complete(value));
            }
        }
    }

    fn fail(
        &mut self,
        p: &Pending,
        iterations: i64,
        seconds: f64,
        reason: String,
    ) -> Result<TrialEnd> {
        self.reporter.trial_failed(p.number, &reason);
        self.writer.send(WriteOp::Finish {
            trial_id: p.trial_id,
            state: TrialState::Fail,
            value: None,
            iterations,
            device_seconds: seconds,
            fail_reason: Some(reason),
        })?;
        Ok(TrialEnd::Failed)
    }
}

enum TrialEnd {
    Complete(f64),
    Failed,
    Interrupted,
}

/// `name=value` pairs of a trial's sampled parameters.
pub fn describe(study: &Study, params: &Params) -> String {
    params
        .keys()
        .map(|name| format!("{name}={}", study.value(params, name)))
        .collect::<Vec<_>>()
        .join(" ")
}
