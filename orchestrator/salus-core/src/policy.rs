//! Scheduling policies: at each iteration boundary, which runnable job a
//! lane runs next. Each is a pure function of the jobs' state.
//!
//! | policy | picks | ties |
//! |---|---|---|
//! | `pack` | the least recently run (round-robin) | arrival |
//! | `fair` | the least device time so far | least recently run |
//! | `srtf` | the fewest remaining iterations; a shorter arrival preempts at the next boundary | arrival |
//! | `fifo` | the earliest arrival, to completion | - |
//! | `priority` | the highest priority (from the tuner's early-stopping signals) | least recently run |
//!
//! `pack` and `fair` switch in time slices of [`SLICE_S`]: a lane keeps its
//! current job until it has run that long. Switching every iteration costs
//! nothing on a GPU where everything stays resident, but on a CPU each switch
//! evicts the previous trial's weights from cache. `srtf`, `fifo` and
//! `priority` decide afresh at every boundary, so preemption is immediate.

use std::cmp::Ordering;

use super::{JobId, LaneId};

/// Scheduling policies of the Salus core. The study file names them as
/// [`Policy::name`] does (a test holds the two together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Pack,
    Fair,
    Srtf,
    Fifo,
    Priority,
}

impl Policy {
    /// Every policy, in the order the docs list them.
    pub const ALL: [Policy; 5] = [
        Policy::Pack,
        Policy::Fair,
        Policy::Srtf,
        Policy::Fifo,
        Policy::Priority,
    ];

    /// The name a study file and the database use.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Pack => "pack",
            Policy::Fair => "fair",
            Policy::Srtf => "srtf",
            Policy::Fifo => "fifo",
            Policy::Priority => "priority",
        }
    }
}

/// What a policy may look at for one runnable job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobState {
    pub id: JobId,
    /// Arrival order: smaller arrived earlier.
    pub arrival: u64,
    pub remaining_iterations: u64,
    /// Device seconds used so far.
    pub device_time: f64,
    /// Higher runs first under `priority`.
    pub priority: f64,
    /// The boundary at which the job last ran; 0 if never.
    pub last_run: u64,
    /// Device seconds of the lane's current slice, for the job the lane ran
    /// last; 0 for every other job.
    pub slice_s: f64,
}

/// The time slice of `pack` and `fair`, in device seconds.
pub const SLICE_S: f64 = 0.005;

/// The policy used when the study names none: `priority` when a pruner
/// feeds priorities, else `pack`.
pub fn default_policy(has_pruner: bool) -> Policy {
    if has_pruner {
        Policy::Priority
    } else {
        Policy::Pack
    }
}

fn order(policy: Policy, a: &JobState, b: &JobState) -> Ordering {
    let by_arrival = a.arrival.cmp(&b.arrival);
    let by_recency = a.last_run.cmp(&b.last_run).then(by_arrival);
    match policy {
        Policy::Pack => by_recency,
        Policy::Fair => a.device_time.total_cmp(&b.device_time).then(by_recency),
        Policy::Srtf => a
            .remaining_iterations
            .cmp(&b.remaining_iterations)
            .then(by_arrival),
        Policy::Fifo => by_arrival,
        Policy::Priority => b.priority.total_cmp(&a.priority).then(by_recency),
    }
}

/// The job a lane runs next, or `None` when nothing is runnable.
pub fn next(policy: Policy, runnable: &[JobState]) -> Option<JobId> {
    if matches!(policy, Policy::Pack | Policy::Fair)
        && let Some(j) = runnable
            .iter()
            .find(|j| j.slice_s > 0.0 && j.slice_s < SLICE_S)
    {
        return Some(j.id);
    }
    runnable
        .iter()
        .min_by(|a, b| order(policy, a, b))
        .map(|j| j.id)
}

/// Another lane's work, as an idle lane sees it when it looks for a job
/// to take (work stealing).
#[derive(Debug, Clone, PartialEq)]
pub struct LaneWork {
    pub lane: LaneId,
    /// Its jobs that are running or could run now.
    pub busy: usize,
    /// Those that could move now: resident, between iterations, not the
    /// one it ran last.
    pub movable: Vec<JobState>,
}

/// The job an idle lane takes from another: from the lane with the most
/// work (at least two jobs, so that it keeps one), the one the policy
/// would run next among those that can move; ties to the lower lane.
/// Without it, a lane whose jobs all ended stays idle while another
/// interleaves two long ones (a quarter of a digits study's time on 2
/// lanes).
pub fn steal(policy: Policy, others: &[LaneWork]) -> Option<JobId> {
    let victim = others
        .iter()
        .filter(|w| w.busy >= 2 && !w.movable.is_empty())
        .min_by_key(|w| (std::cmp::Reverse(w.busy), w.lane))?;
    next(policy, &victim.movable)
}

/// The order in which waiting jobs are admitted as memory frees up.
pub fn admission_order(policy: Policy, waiting: &[JobState]) -> Vec<JobId> {
    let mut v = waiting.to_vec();
    // Round-robin means nothing before admission: pack and fair admit in arrival order.
    let admit_policy = match policy {
        Policy::Pack | Policy::Fair => Policy::Fifo,
        p => p,
    };
    v.sort_by(|a, b| order(admit_policy, a, b));
    v.into_iter().map(|j| j.id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job for the simulator: `cost` time units per iteration.
    #[derive(Clone, Copy)]
    struct SimJob {
        arrival_time: f64,
        iterations: u64,
        cost: f64,
        priority: f64,
    }

    /// One lane, pure: runs `jobs` under `policy` until all finish or
    /// `horizon` passes. Returns the (start time, job) of every iteration
    /// and each job's finish time.
    fn simulate(
        policy: Policy,
        jobs: &[SimJob],
        horizon: f64,
    ) -> (Vec<(f64, usize)>, Vec<Option<f64>>) {
        let mut state: Vec<JobState> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| JobState {
                id: JobId(i as u64),
                arrival: i as u64,
                remaining_iterations: j.iterations,
                device_time: 0.0,
                priority: j.priority,
                last_run: 0,
                slice_s: 0.0,
            })
            .collect();
        let (mut t, mut boundary, mut trace) = (0.0, 0u64, Vec::new());
        let mut finish = vec![None; jobs.len()];
        while t < horizon {
            let runnable: Vec<JobState> = state
                .iter()
                .filter(|s| s.remaining_iterations > 0 && jobs[s.id.0 as usize].arrival_time <= t)
                .copied()
                .collect();
            let Some(JobId(id)) = next(policy, &runnable) else {
                match jobs
                    .iter()
                    .map(|j| j.arrival_time)
                    .filter(|&a| a > t)
                    .min_by(f64::total_cmp)
                {
                    Some(a) => {
                        t = a;
                        continue;
                    }
                    None => break,
                }
            };
            boundary += 1;
            let id = id as usize;
            let s = &mut state[id];
            trace.push((t, id));
            t += jobs[id].cost;
            s.device_time += jobs[id].cost;
            s.remaining_iterations -= 1;
            s.last_run = boundary;
            if s.remaining_iterations == 0 {
                finish[id] = Some(t);
            }
        }
        (trace, finish)
    }

    fn job(arrival_time: f64, iterations: u64, cost: f64) -> SimJob {
        SimJob {
            arrival_time,
            iterations,
            cost,
            priority: 0.0,
        }
    }

    #[test]
    fn fair_equalises_device_time_within_ten_percent() {
        let jobs: Vec<SimJob> = [1.0, 2.0, 3.0, 5.0, 7.0]
            .iter()
            .map(|&c| job(0.0, u64::MAX / 2, c))
            .collect();
        let (trace, _) = simulate(Policy::Fair, &jobs, 2000.0);
        // Over the window, each job's device time is within 10% of the mean.
        let mut used = [0.0; 5];
        for (_, id) in &trace {
            used[*id] += jobs[*id].cost;
        }
        let mean = used.iter().sum::<f64>() / 5.0;
        for (i, u) in used.iter().enumerate() {
            assert!(
                (u - mean).abs() <= 0.1 * mean,
                "job {i}: {u} vs mean {mean}"
            );
        }
        // Pack, by contrast, gives time in proportion to cost.
        let (trace, _) = simulate(Policy::Pack, &jobs, 2000.0);
        let cheap = trace.iter().filter(|(_, id)| *id == 0).count() as f64;
        let dear = trace.iter().filter(|(_, id)| *id == 4).count() as f64;
        assert!(
            (cheap - dear).abs() <= 1.0,
            "pack alternates iterations, not time"
        );
    }

    #[test]
    fn srtf_runs_shortest_remaining_first_and_preempts_at_the_next_boundary() {
        let jobs = [
            job(0.0, 30, 1.0),
            job(0.0, 10, 1.0),
            job(0.0, 20, 1.0),
            job(15.5, 3, 1.0),
        ];
        let (trace, finish) = simulate(Policy::Srtf, &jobs, 1e9);
        let order: Vec<usize> = trace.iter().map(|(_, id)| *id).collect();
        assert!(
            order[..10].iter().all(|&id| id == 1),
            "the 10-iteration job first"
        );
        // Job 3 arrives at 15.5, mid-iteration of job 2; it runs at the boundary at 16.
        let first3 = trace.iter().find(|(_, id)| *id == 3).unwrap();
        assert_eq!(first3.0, 16.0);
        assert_eq!(trace[15].1, 2, "job 2 ran until then");
        assert!(finish[3].unwrap() < finish[2].unwrap() && finish[2].unwrap() < finish[0].unwrap());
        // Average completion time beats FIFO on this mix.
        let avg = |f: &[Option<f64>]| {
            f.iter()
                .zip(&jobs)
                .map(|(f, j)| f.unwrap() - j.arrival_time)
                .sum::<f64>()
                / 4.0
        };
        let (_, fifo) = simulate(Policy::Fifo, &jobs, 1e9);
        assert!(avg(&finish) < avg(&fifo));
    }

    #[test]
    fn fifo_runs_each_job_to_completion_in_arrival_order() {
        let jobs = [job(0.0, 5, 1.0), job(0.0, 2, 1.0), job(1.0, 1, 1.0)];
        let (trace, _) = simulate(Policy::Fifo, &jobs, 1e9);
        let order: Vec<usize> = trace.iter().map(|(_, id)| *id).collect();
        assert_eq!(order, vec![0, 0, 0, 0, 0, 1, 1, 2]);
    }

    #[test]
    fn a_higher_priority_arrival_runs_at_the_next_boundary() {
        let mut jobs = [job(0.0, 100, 1.0), job(0.0, 100, 1.0), job(10.25, 5, 1.0)];
        jobs[2].priority = 5.0;
        let (trace, _) = simulate(Policy::Priority, &jobs, 1e9);
        let at = trace.iter().position(|(t, _)| *t >= 10.25).unwrap();
        assert_eq!(trace[at], (11.0, 2), "the first boundary after its arrival");
        assert!(
            trace[at..at + 5].iter().all(|(_, id)| *id == 2),
            "it keeps the lane while it outranks the rest"
        );
        // Equal priorities share the lane round-robin.
        let before: Vec<usize> = trace[..10].iter().map(|(_, id)| *id).collect();
        assert_eq!(before, vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn nothing_starves_under_pack() {
        let jobs: Vec<SimJob> = (0..6)
            .map(|i| job(i as f64 * 0.5, 1000, 1.0 + i as f64))
            .collect();
        let (trace, _) = simulate(Policy::Pack, &jobs, 3000.0);
        // After every job has arrived, each runs within any 6 consecutive boundaries.
        let start = trace.iter().position(|(t, _)| *t >= 2.5).unwrap();
        for w in trace[start..].windows(6) {
            let mut seen: Vec<usize> = w.iter().map(|(_, id)| *id).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 6, "{w:?}");
        }
    }

    #[test]
    fn pack_and_fair_keep_the_current_job_for_a_slice() {
        let s = |id, device_time, last_run, slice_s| JobState {
            id: JobId(id),
            arrival: id,
            remaining_iterations: 10,
            device_time,
            priority: 0.0,
            last_run,
            slice_s,
        };
        let mid_slice = [s(0, 0.0, 1, 0.0), s(1, 0.004, 2, SLICE_S / 2.0)];
        let spent = [s(0, 0.0, 1, 0.0), s(1, 0.006, 2, SLICE_S * 1.2)];
        for p in [Policy::Pack, Policy::Fair] {
            assert_eq!(next(p, &mid_slice), Some(JobId(1)), "{p:?} keeps its slice");
            assert_eq!(next(p, &spent), Some(JobId(0)), "{p:?} switches after it");
        }
        // SRTF and priority decide at every boundary.
        let short = [
            JobState {
                remaining_iterations: 1,
                ..s(0, 0.0, 1, 0.0)
            },
            s(1, 0.0, 2, SLICE_S / 2.0),
        ];
        assert_eq!(next(Policy::Srtf, &short), Some(JobId(0)));
        let urgent = [
            JobState {
                priority: 9.0,
                ..s(0, 0.0, 1, 0.0)
            },
            s(1, 0.0, 2, SLICE_S / 2.0),
        ];
        assert_eq!(next(Policy::Priority, &urgent), Some(JobId(0)));
    }

    #[test]
    fn admission_follows_the_policy() {
        let s = |id, arrival, remaining, priority| JobState {
            id: JobId(id),
            arrival,
            remaining_iterations: remaining,
            device_time: 0.0,
            priority,
            last_run: 0,
            slice_s: 0.0,
        };
        let waiting = [s(0, 0, 50, 1.0), s(1, 1, 10, 3.0), s(2, 2, 30, 2.0)];
        assert_eq!(
            admission_order(Policy::Fifo, &waiting),
            [0, 1, 2].map(JobId)
        );
        assert_eq!(
            admission_order(Policy::Pack, &waiting),
            [0, 1, 2].map(JobId)
        );
        assert_eq!(
            admission_order(Policy::Srtf, &waiting),
            [1, 2, 0].map(JobId)
        );
        assert_eq!(
            admission_order(Policy::Priority, &waiting),
            [1, 2, 0].map(JobId)
        );
        assert_eq!(default_policy(true), Policy::Priority);
        assert_eq!(default_policy(false), Policy::Pack);
        assert_eq!(next(Policy::Fair, &[]), None);
    }

    #[test]
    fn an_idle_lane_takes_from_the_busiest_lane_what_its_policy_runs_next() {
        let job = |id: u64, priority: f64| JobState {
            id: JobId(id),
            arrival: id,
            remaining_iterations: 10,
            device_time: 0.0,
            priority,
            last_run: 0,
            slice_s: 0.0,
        };
        let work = |lane: LaneId, busy: usize, movable: Vec<JobState>| LaneWork {
            lane,
            busy,
            movable,
        };
        // One job alone on its lane stays; two on a lane: one moves.
        assert_eq!(steal(Policy::Pack, &[work(0, 1, vec![job(1, 0.0)])]), None);
        assert_eq!(
            steal(Policy::Pack, &[work(0, 2, vec![job(2, 0.0)])]),
            Some(JobId(2))
        );
        // The busiest lane gives, ties to the lower lane.
        let lanes = [
            work(0, 2, vec![job(1, 0.0)]),
            work(1, 3, vec![job(4, 0.0), job(5, 0.0)]),
            work(2, 3, vec![job(7, 0.0)]),
        ];
        assert_eq!(steal(Policy::Fifo, &lanes), Some(JobId(4)));
        // Of its movable jobs, the one the policy runs next.
        assert_eq!(
            steal(
                Policy::Priority,
                &[work(1, 3, vec![job(4, 0.1), job(5, 0.9)])]
            ),
            Some(JobId(5))
        );
        // Busy with jobs that cannot move (running, the last run): nothing.
        assert_eq!(steal(Policy::Pack, &[work(0, 3, vec![])]), None);
    }
}
