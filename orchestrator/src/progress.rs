//! What a person sees while a study runs: indicatif bars on a terminal,
//! plain log lines otherwise. The runner calls these; nothing here touches
//! the engine.

use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::runner::RunSummary;
use crate::storage::TrialNumber;
use crate::study::Study;

pub enum Reporter {
    /// An overall bar (trials, best value) and one bar for the running trial.
    Bars {
        multi: MultiProgress,
        overall: ProgressBar,
        trials: std::collections::BTreeMap<TrialNumber, ProgressBar>,
        metric: String,
    },
    /// One line per event, to standard error.
    Lines { metric: String, started: Instant },
    /// Nothing at all.
    Quiet,
}

fn best_text(metric: &str, best: Option<(TrialNumber, f64)>) -> String {
    best.map_or("no complete trial yet".into(), |(n, v)| {
        format!("best {metric}={v:.4} (trial {n})")
    })
}

impl Reporter {
    /// Bars when standard error is a terminal, else lines.
    pub fn new(terminal: bool) -> Self {
        if terminal {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
            let overall = multi.add(ProgressBar::new(0));
            overall.set_style(ProgressStyle::with_template("{prefix:.bold} [{bar:30.cyan/blue}] {pos}/{len} trials  {elapsed_precise}  {msg}").unwrap().progress_chars("=> "));
            overall.enable_steady_tick(Duration::from_millis(200));
            Reporter::Bars {
                multi,
                overall,
                trials: Default::default(),
                metric: String::new(),
            }
        } else {
            Reporter::Lines {
                metric: String::new(),
                started: Instant::now(),
            }
        }
    }

    pub fn study_start(
        &mut self,
        study: &Study,
        budget: u64,
        finished: u64,
        best: Option<(TrialNumber, f64)>,
    ) {
        let resumed = if finished > 0 {
            format!(", resuming with {finished} finished")
        } else {
            String::new()
        };
        match self {
            Reporter::Bars {
                overall,
                metric,
                multi,
                ..
            } => {
                *metric = study.metric.clone();
                overall.set_prefix(study.name.clone());
                overall.set_length(budget);
                overall.set_position(finished.min(budget));
                overall.set_message(best_text(metric, best));
                let _ = multi.println(format!(
                    "study '{}': {budget} trials, {} {}{resumed}",
                    study.name,
                    study.direction.optuna().to_lowercase(),
                    study.metric
                ));
            }
            Reporter::Lines { metric, .. } => {
                *metric = study.metric.clone();
                eprintln!(
                    "study '{}': {budget} trials, {} {}{resumed}",
                    study.name,
                    study.direction.optuna().to_lowercase(),
                    study.metric
                );
            }
            Reporter::Quiet => {}
        }
    }

    pub fn trial_start(&mut self, number: TrialNumber, params: &str, reports: u64) {
        match self {
            Reporter::Bars { multi, trials, .. } => {
                let bar = multi.add(ProgressBar::new(reports));
                bar.set_style(
                    ProgressStyle::with_template(
                        "  trial {prefix:>4} [{bar:20.green/white}] report {pos}/{len}  {msg}",
                    )
                    .unwrap()
                    .progress_chars("=> "),
                );
                bar.set_prefix(number.to_string());
                bar.set_message(params.to_string());
                trials.insert(number, bar);
            }
            Reporter::Lines { .. } => eprintln!("trial {number} started: {params}"),
            Reporter::Quiet => {}
        }
    }

    /// Where a trial runs, when the run has several devices.
    pub fn trial_placed(&mut self, number: TrialNumber, device: &str) {
        match self {
            Reporter::Bars { trials, .. } => {
                if let Some(bar) = trials.get(&number) {
                    bar.set_prefix(format!("{number} on {device}"));
                }
            }
            Reporter::Lines { .. } => eprintln!("trial {number} runs on {device}"),
            Reporter::Quiet => {}
        }
    }

    pub fn trial_report(&mut self, number: TrialNumber, step: u64, metric: &str, value: f64) {
        if let Reporter::Bars { trials, .. } = self
            && let Some(bar) = trials.get(&number)
        {
            bar.set_position(step);
            bar.set_message(format!("{metric}={value:.4}"));
        }
    }

    fn finish_bar(&mut self, number: TrialNumber) {
        if let Reporter::Bars { trials, multi, .. } = self
            && let Some(bar) = trials.remove(&number)
        {
            bar.finish_and_clear();
            multi.remove(&bar);
        }
    }

    pub fn trial_end(
        &mut self,
        number: TrialNumber,
        value: Option<f64>,
        best: Option<(TrialNumber, f64)>,
        finished: u64,
    ) {
        self.finish_bar(number);
        match self {
            Reporter::Bars {
                multi,
                overall,
                metric,
                ..
            } => {
                overall.set_position(finished);
                overall.set_message(best_text(metric, best));
                if let Some(v) = value {
                    let _ = multi.println(format!("trial {number} COMPLETE {metric}={v:.4}"));
                }
            }
            Reporter::Lines { metric, started } => {
                if let Some(v) = value {
                    eprintln!(
                        "trial {number} COMPLETE {metric}={v:.4}; {} [{finished} finished, {:.1}s]",
                        best_text(metric, best),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            Reporter::Quiet => {}
        }
    }

    /// A trial the pruner stopped, at its last reported step and rung.
    pub fn trial_pruned(
        &mut self,
        number: TrialNumber,
        at: Option<(u64, Option<usize>)>,
        best: Option<(TrialNumber, f64)>,
        finished: u64,
    ) {
        self.trial_end(number, None, best, finished);
        let at = match at {
            Some((step, Some(rung))) => format!(" at step {step} (rung {rung})"),
            Some((step, None)) => format!(" at step {step}"),
            None => String::new(),
        };
        self.note(&format!("trial {number} PRUNED{at}"));
    }

    pub fn trial_failed(&mut self, number: TrialNumber, reason: &str) {
        self.finish_bar(number);
        self.note(&format!("trial {number} FAIL: {reason}"));
    }

    pub fn trial_interrupted(&mut self, number: TrialNumber) {
        self.finish_bar(number);
        self.note(&format!(
            "trial {number} interrupted; it is WAITING and will run first when the study resumes"
        ));
    }

    pub fn note(&mut self, msg: &str) {
        match self {
            Reporter::Bars { multi, .. } => drop(multi.println(msg)),
            Reporter::Lines { .. } => eprintln!("{msg}"),
            Reporter::Quiet => {}
        }
    }

    pub fn study_end(&mut self, study: &Study, s: &RunSummary) {
        if let Reporter::Bars { overall, .. } = self {
            overall.finish();
        }
        let how = if s.interrupted { "stopped" } else { "done" };
        self.note(&format!(
            "study '{}' {how}: {} trials run now, {} finished in all",
            study.name, s.ran, s.finished
        ));
    }
}
