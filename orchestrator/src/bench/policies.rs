//! `salus-tune bench policies`: the seed paper's headline experiment for
//! training jobs (SRTF against FIFO), on real trials.
//!
//! A seeded trace of jobs, each a real MLP trained for a heavy-tailed number
//! of iterations (Pareto, shape 1.1, clamped to 10..1500: a 150x spread),
//! arriving at staggered times (exponential gaps, the arrivals spread over
//! about a third of the total work, so that a queue builds). The trace is
//! replayed on one lane under each policy; a job's completion time runs from
//! its arrival to its last iteration.
//!
//! The order of arrival decides much of FIFO's fate, so it is drawn from
//! the seed too, and the headline rows are medians over several seeds. The
//! order that is worst for FIFO (the longest job first, the shortest second)
//! is kept as a second, labelled set of rows: it is what earlier versions
//! of this benchmark reported alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use kernels::Backend;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::json;
use training::{DeviceData, Job, StepOutcome, TrainTrial, TrialConfig};

use crate::error::{Error, Result};
use crate::salus::JobId;
use crate::salus::core::{CoreConfig, CoreEvent, SalusCore};
use crate::salus::policy::Policy;

const BATCH: usize = 64;
const MIN_ITERATIONS: u64 = 10;
const MAX_ITERATIONS: u64 = 1500;

/// The order in which a trace's jobs arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalOrder {
    /// Drawn from the seed, like the lengths.
    Seeded,
    /// The longest job first and the shortest second: FIFO's worst case.
    LongestFirst,
}

impl ArrivalOrder {
    pub fn label(self) -> &'static str {
        match self {
            ArrivalOrder::Seeded => "seeded",
            ArrivalOrder::LongestFirst => "longest-first",
        }
    }
}

/// One job of the trace.
#[derive(Debug, Clone, Copy)]
pub struct TraceJob {
    pub arrival_s: f64,
    pub iterations: u64,
}

pub struct PolicyRow {
    pub order: ArrivalOrder,
    pub policy: Policy,
    pub avg_jct_s: f64,
    pub makespan_s: f64,
    pub busy_fraction: f64,
    pub jct_ratio_vs_fifo: f64,
}

pub struct Results {
    pub rows: Vec<PolicyRow>,
    /// Seeds of the seeded rows (each its own trace); their figures are medians.
    pub seeds: usize,
    pub jobs: usize,
    pub shortest: u64,
    pub longest: u64,
    pub seconds_per_iteration: f64,
}

fn config(iterations: u64, seed: u64) -> TrialConfig {
    super::trial_config(vec![128, 128], BATCH, iterations, seed)
}

/// The seeded trace: lengths in `order`, then arrivals scaled to
/// `seconds_per_iteration`.
pub fn trace(
    jobs: usize,
    seed: u64,
    seconds_per_iteration: f64,
    order: ArrivalOrder,
) -> Vec<TraceJob> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut lengths: Vec<u64> = (0..jobs)
        .map(|_| {
            let u: f64 = rng.random_range(1e-9..1.0);
            ((MIN_ITERATIONS as f64) * u.powf(-1.0 / 1.1))
                .round()
                .clamp(MIN_ITERATIONS as f64, MAX_ITERATIONS as f64) as u64
        })
        .collect();
    // The spread is part of the experiment: make sure both ends occur.
    lengths[0] = MAX_ITERATIONS;
    if jobs > 1 {
        lengths[1] = MIN_ITERATIONS;
    }
    if order == ArrivalOrder::Seeded {
        use rand::seq::SliceRandom;
        lengths.shuffle(&mut rng);
    }
    let work: f64 = lengths.iter().sum::<u64>() as f64 * seconds_per_iteration;
    let mean_gap = work / 3.0 / jobs as f64;
    let mut t = 0.0;
    lengths
        .into_iter()
        .map(|iterations| {
            let job = TraceJob {
                arrival_s: t,
                iterations,
            };
            t += -mean_gap * rng.random_range(1e-9..1.0f64).ln();
            job
        })
        .collect()
}

/// Seconds per iteration of the trace's model on one lane.
fn calibrate<B: Backend>(backend: &Arc<B>, dev: &Arc<DeviceData<B>>) -> Result<f64> {
    let mut lane = training::Lane::new(backend.clone(), 0, super::cores())?;
    let mut t = TrainTrial::new(&mut lane, dev.clone(), config(200, 0))?;
    let start = Instant::now();
    lane.run(|lane| -> Result<()> {
        while !matches!(t.step(lane)?, StepOutcome::Finished(_)) {}
        Ok(())
    })?;
    Ok(start.elapsed().as_secs_f64() / 200.0)
}

/// Replays `trace` under `policy`: (average completion time, makespan, busy fraction).
fn replay<B: Backend>(
    backend: &Arc<B>,
    dev: &Arc<DeviceData<B>>,
    trace: &[TraceJob],
    policy: Policy,
) -> Result<(f64, f64, f64)> {
    let (tx, rx) = channel();
    let core = SalusCore::start(
        backend.clone(),
        CoreConfig::for_device(backend.kind(), policy, 1, u64::MAX / 4),
        tx,
    )?;
    let jobs: Vec<TrainTrial<B>> = trace
        .iter()
        .enumerate()
        .map(|(i, j)| TrainTrial::new_on_host(dev.clone(), config(j.iterations, i as u64)))
        .collect::<training::Result<_>>()?;
    let start = Instant::now();
    let mut arrived: BTreeMap<JobId, f64> = BTreeMap::new();
    let mut finished: BTreeMap<JobId, f64> = BTreeMap::new();
    let mut busy = 0.0;
    let mut pending = jobs.into_iter().zip(trace).peekable();
    while finished.len() < trace.len() {
        let now = start.elapsed().as_secs_f64();
        if let Some((_, j)) = pending.peek()
            && j.arrival_s <= now
        {
            let (job, _) = pending.next().expect("peeked");
            let id = core.submit(Box::new(job), 0.0, "trace");
            arrived.insert(id, now);
            continue;
        }
        let wait = pending.peek().map_or(Duration::from_secs(60), |(_, j)| {
            Duration::from_secs_f64((j.arrival_s - now).max(0.0))
        });
        match rx.recv_timeout(wait) {
            Ok(CoreEvent::Finished { job, .. }) => {
                finished.insert(job, start.elapsed().as_secs_f64());
            }
            Ok(CoreEvent::Failed { error, .. }) => return Err(error.into()),
            Ok(CoreEvent::Segment { start, end, .. }) => busy += end - start,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::CoreStopped);
            }
        }
    }
    core.shutdown();
    // Segments still open at the last finish were flushed by shutdown; drain them.
    while let Ok(e) = rx.try_recv() {
        if let CoreEvent::Segment { start, end, .. } = e {
            busy += end - start;
        }
    }
    let avg_jct =
        finished.iter().map(|(id, f)| f - arrived[id]).sum::<f64>() / finished.len() as f64;
    let first = arrived.values().cloned().fold(f64::INFINITY, f64::min);
    let makespan = finished.values().cloned().fold(0.0, f64::max) - first;
    Ok((avg_jct, makespan, (busy / makespan).min(1.0)))
}

/// Runs the benchmark: `seeds` seeded traces (from `seed` on) and the
/// longest-first trace of `seed`, each under every policy `rounds` times.
pub fn run<B: Backend>(
    backend: &Arc<B>,
    jobs: usize,
    seed: u64,
    seeds: usize,
    rounds: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Results> {
    let (_, dev) = super::bench_data(backend, 64, 10, BATCH, seed)?;
    let spi = calibrate(backend, &dev)?;
    let first = trace(jobs, seed, spi, ArrivalOrder::Seeded);
    let (shortest, longest) = (
        first.iter().map(|j| j.iterations).min().unwrap_or(0),
        first.iter().map(|j| j.iterations).max().unwrap_or(0),
    );
    progress(&format!(
        "trace: {jobs} trials, {shortest}..{longest} iterations ({:.0}x), {} iterations in all, {:.0} us per iteration, arrivals over {:.1} s",
        longest as f64 / shortest.max(1) as f64,
        first.iter().map(|j| j.iterations).sum::<u64>(),
        spi * 1e6,
        first.last().map_or(0.0, |j| j.arrival_s)
    ));
    let policies = [Policy::Fifo, Policy::Pack, Policy::Fair, Policy::Srtf];
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // One trace under every policy, `rounds` times interleaved (so that a
    // slow spell of a shared machine hits them alike): per policy, the
    // medians of (JCT, makespan, busy), and JCT as a ratio against FIFO's.
    let mut measure = |trace: &[TraceJob], label: &str| -> Result<Vec<[f64; 4]>> {
        let mut samples: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); policies.len()];
        for round in 0..rounds.max(1) {
            for (i, &policy) in policies.iter().enumerate() {
                let (jct, makespan, busy) = replay(backend, &dev, trace, policy)?;
                progress(&format!(
                    "{label} round {round}: {:<6} avg JCT {jct:.3} s  makespan {makespan:.3} s  busy {:.0}%",
                    policy.name(),
                    busy * 100.0
                ));
                samples[i].push((jct, makespan, busy));
            }
        }
        let per: Vec<[f64; 3]> = samples
            .iter()
            .map(|s| {
                [
                    median(s.iter().map(|x| x.0).collect()),
                    median(s.iter().map(|x| x.1).collect()),
                    median(s.iter().map(|x| x.2).collect()),
                ]
            })
            .collect();
        let fifo = per[0][0];
        Ok(per
            .iter()
            .map(|p| [p[0], p[1], p[2], fifo / p[0]])
            .collect())
    };
    let mut rows = Vec::new();
    let mut seeded: Vec<Vec<[f64; 4]>> = Vec::new();
    for s in 0..seeds.max(1) as u64 {
        let t = trace(jobs, seed + s, spi, ArrivalOrder::Seeded);
        seeded.push(measure(&t, &format!("seed {}", seed + s))?);
    }
    let longest_first = measure(
        &trace(jobs, seed, spi, ArrivalOrder::LongestFirst),
        "longest-first",
    )?;
    for (i, &policy) in policies.iter().enumerate() {
        // Each figure its own median over the seeds, the ratio included.
        let m = |k: usize| median(seeded.iter().map(|per| per[i][k]).collect());
        rows.push(PolicyRow {
            order: ArrivalOrder::Seeded,
            policy,
            avg_jct_s: m(0),
            makespan_s: m(1),
            busy_fraction: m(2),
            jct_ratio_vs_fifo: m(3),
        });
    }
    for (&policy, p) in policies.iter().zip(&longest_first) {
        rows.push(PolicyRow {
            order: ArrivalOrder::LongestFirst,
            policy,
            avg_jct_s: p[0],
            makespan_s: p[1],
            busy_fraction: p[2],
            jct_ratio_vs_fifo: p[3],
        });
    }
    Ok(Results {
        rows,
        seeds: seeds.max(1),
        jobs,
        shortest,
        longest,
        seconds_per_iteration: spi,
    })
}

impl Results {
    pub fn json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.rows
                .iter()
                .map(|r| {
                    json!({
                        "trace": r.order.label(),
                        "seeds": match r.order {
                            ArrivalOrder::Seeded => self.seeds,
                            ArrivalOrder::LongestFirst => 1,
                        },
                        "policy": r.policy.name(),
                        "avg_jct_s": r.avg_jct_s,
                        "makespan_s": r.makespan_s,
                        "busy_fraction": r.busy_fraction,
                        "jct_ratio_vs_fifo": r.jct_ratio_vs_fifo,
                        "jobs": self.jobs,
                        "shortest_iterations": self.shortest,
                        "longest_iterations": self.longest,
                    })
                })
                .collect(),
        )
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "bench policies: {} real trials on one lane, {}..{} iterations, {:.0} us per iteration\n\n",
            self.jobs,
            self.shortest,
            self.longest,
            self.seconds_per_iteration * 1e6
        );
        out += "trace          policy  avg JCT (s)  makespan (s)  busy   JCT vs fifo\n";
        for r in &self.rows {
            let trace = match r.order {
                ArrivalOrder::Seeded => format!("{} seeds", self.seeds),
                ArrivalOrder::LongestFirst => "longest-first".into(),
            };
            out += &format!(
                "{trace:<14} {:<7} {:<12.3} {:<13.3} {:<6} {:.2}x\n",
                r.policy.name(),
                r.avg_jct_s,
                r.makespan_s,
                format!("{:.0}%", r.busy_fraction * 100.0),
                r.jct_ratio_vs_fifo
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_orders_vary_and_longest_first_is_fifos_worst_case() {
        let mut first_positions = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let t = trace(30, seed, 1e-4, ArrivalOrder::Seeded);
            let lengths: Vec<u64> = t.iter().map(|j| j.iterations).collect();
            assert!(lengths.contains(&MAX_ITERATIONS) && lengths.contains(&MIN_ITERATIONS));
            first_positions.insert(lengths.iter().position(|&l| l == MAX_ITERATIONS).unwrap());
            // Arrivals stay in time order whatever the order of lengths.
            assert!(t.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
            // The same seed, the same trace.
            let again: Vec<u64> = trace(30, seed, 1e-4, ArrivalOrder::Seeded)
                .iter()
                .map(|j| j.iterations)
                .collect();
            assert_eq!(lengths, again);
        }
        assert!(first_positions.len() > 10, "{first_positions:?}");
        let adversarial = trace(30, 3, 1e-4, ArrivalOrder::LongestFirst);
        assert_eq!(adversarial[0].iterations, MAX_ITERATIONS);
        assert_eq!(adversarial[1].iterations, MIN_ITERATIONS);
    }
}
