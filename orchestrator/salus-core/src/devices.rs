//! Every device of a machine from one process: one [`SalusCore`] per
//! device (its own ledger, lanes and policy), all reporting on one event
//! channel.
//!
//! The cores share one job counter and number their lanes one after the
//! other ([`Numbering`]), so a job id or a lane in an event names one
//! device without saying which: [`DeviceCores`] remembers each job's device
//! and each device's lanes, and routes the caller's controls to the core
//! that holds the job.
//!
//! Placement is a pure function of the devices' loads: a new job goes where
//! it fits now and the fewest jobs share each lane ([`choose_device`]).
//! A job that waits off the device on a full one (a new job, or one
//! swapped out at a rung and resumed) moves to a device where it fits now
//! ([`moves`], [`DeviceCores::rebalance`]); its state is on the host, so
//! it resumes there from exactly where it stopped.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use kernels::Backend;
use training::{Job, WorkerError};

use super::core::{CoreConfig, CoreEvent, DeviceLoad, Donor, Numbering, SalusCore, TrialRef};
use super::ledger::LedgerSnapshot;
use super::{JobId, LaneId};

/// Which device a job goes to: among those where `need` bytes fit now, the
/// one whose lanes carry the fewest jobs, then the one given fewer jobs so
/// far (idle devices take turns, so that short trials one after another
/// do not all land on the first), then the one with the most free memory,
/// then the first. Where it fits nowhere now, the least loaded
/// device whose budget could ever hold it waits for it.
pub fn choose_device(loads: &[DeviceLoad], need: u64) -> usize {
    assert!(!loads.is_empty(), "at least one device");
    let per_lane = |l: &DeviceLoad| l.jobs as f64 / l.lanes.max(1) as f64;
    let best = |candidates: &mut dyn Iterator<Item = usize>| {
        candidates.min_by(|&a, &b| {
            let (la, lb) = (&loads[a], &loads[b]);
            per_lane(la)
                .total_cmp(&per_lane(lb))
                .then(la.given.cmp(&lb.given))
                .then(lb.free.cmp(&la.free))
                .then(a.cmp(&b))
        })
    };
    best(&mut (0..loads.len()).filter(|&d| loads[d].free >= need))
        .or_else(|| best(&mut (0..loads.len())))
        .expect("at least one device")
}

/// Which waiting jobs move, and where: `waiting` lists `(device, job,
/// need)`, best first. Jobs that fit where they wait stay, and their
/// memory is counted as taken. Each other job moves to a device where it
/// fits now ([`choose_device`] among those), each move counting against
/// the target's free memory and for its load.
pub fn moves(loads: &[DeviceLoad], waiting: &[(usize, JobId, u64)]) -> Vec<(JobId, usize, usize)> {
    let mut loads = loads.to_vec();
    let mut stuck = Vec::new();
    for &(from, job, need) in waiting {
        match loads[from].free.checked_sub(need) {
            Some(left) => loads[from].free = left,
            None => stuck.push((from, job, need)),
        }
    }
    let mut out = Vec::new();
    for (from, job, need) in stuck {
        let fits: Vec<usize> = (0..loads.len())
            .filter(|&d| d != from && loads[d].free >= need)
            .collect();
        if fits.is_empty() {
            continue;
        }
        let sub: Vec<DeviceLoad> = fits.iter().map(|&d| loads[d]).collect();
        let to = fits[choose_device(&sub, need)];
        loads[to].free -= need;
        loads[to].jobs += 1;
        loads[to].given += 1;
        loads[from].jobs = loads[from].jobs.saturating_sub(1);
        out.push((job, from, to));
    }
    out
}

/// One core per device. See the module docs.
pub struct DeviceCores<B: Backend> {
    cores: Vec<SalusCore<B>>,
    labels: Vec<String>,
    lanes: Vec<Range<LaneId>>,
    /// Each job's device, by index into `cores`.
    home: Mutex<BTreeMap<JobId, usize>>,
}

impl<B: Backend> DeviceCores<B> {
    /// Starts one core per `(label, backend, config)`, all sending to `events`.
    pub fn start(
        devices: Vec<(String, Arc<B>, CoreConfig)>,
        events: Sender<CoreEvent>,
    ) -> Result<Self, WorkerError> {
        let ids = Arc::new(AtomicU64::new(0));
        let mut cores = Vec::new();
        let mut labels = Vec::new();
        let mut lanes = Vec::new();
        let mut base = 0;
        for (label, backend, config) in devices {
            let numbering = Numbering {
                ids: ids.clone(),
                lane_base: base,
            };
            cores.push(SalusCore::start_numbered(
                backend,
                config,
                events.clone(),
                numbering,
            )?);
            lanes.push(base..base + config.lanes);
            base += config.lanes;
            labels.push(label);
        }
        assert!(!cores.is_empty(), "at least one device");
        Ok(DeviceCores {
            cores,
            labels,
            lanes,
            home: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn len(&self) -> usize {
        self.cores.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// Device `d`'s name (`cpu:0`, `cuda:1`).
    pub fn label(&self, d: usize) -> &str {
        &self.labels[d]
    }

    /// The device whose core has lane `lane` (as events number lanes).
    pub fn device_of_lane(&self, lane: LaneId) -> usize {
        self.lanes
            .iter()
            .position(|r| r.contains(&lane))
            .unwrap_or(0)
    }

    /// Each device's name and lanes (as events number them).
    pub fn layout(&self) -> Vec<(String, Range<LaneId>)> {
        self.labels
            .iter()
            .cloned()
            .zip(self.lanes.iter().cloned())
            .collect()
    }

    /// Lanes, in all.
    pub fn lanes(&self) -> usize {
        self.lanes.iter().map(|r| r.len()).sum()
    }

    /// The device that holds (or last held) job `id`.
    pub fn device_of(&self, id: JobId) -> usize {
        self.home().get(&id).copied().unwrap_or(0)
    }

    fn home(&self) -> std::sync::MutexGuard<'_, BTreeMap<JobId, usize>> {
        self.home.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn loads(&self) -> Vec<DeviceLoad> {
        self.cores.iter().map(SalusCore::load).collect()
    }

    /// Where a job needing `need` bytes would go now ([`choose_device`]).
    pub fn choose(&self, need: u64) -> usize {
        choose_device(&self.loads(), need)
    }

    /// Queues a job on device `d`.
    pub fn submit_on(
        &self,
        d: usize,
        job: Box<dyn Job<B>>,
        priority: f64,
        shared_key: &str,
    ) -> JobId {
        // Its home is known before any event about it can be read.
        let mut home = self.home();
        let id = self.cores[d].submit(job, priority, shared_key);
        home.insert(id, d);
        id
    }

    fn core(&self, id: JobId) -> &SalusCore<B> {
        &self.cores[self.device_of(id)]
    }

    pub fn pause(&self, id: JobId) {
        self.core(id).pause(id)
    }

    pub fn resume(&self, id: JobId) {
        self.core(id).resume(id)
    }

    pub fn release(&self, id: JobId) {
        self.core(id).release(id)
    }

    /// PBT's exploit ([`SalusCore::exploit`]) between two jobs of one
    /// device; `false` (and nothing asked) when they are on two.
    pub fn exploit(&self, receiver: TrialRef, donor: TrialRef, new: training::NewValues) -> bool {
        if self.device_of(receiver.job) != self.device_of(donor.job) {
            return false;
        }
        self.core(receiver.job)
            .exploit(receiver, Donor::Held(donor), new);
        true
    }

    /// PBT's exploit from a stored state ([`Donor::Stored`]): a donor
    /// another process holds.
    pub fn exploit_stored(
        &self,
        receiver: TrialRef,
        state: training::StoredState,
        new: training::NewValues,
    ) {
        self.core(receiver.job)
            .exploit(receiver, Donor::Stored(Box::new(state)), new);
    }

    /// Saves `trial`'s state to `path` for other processes
    /// ([`SalusCore::save_state`]).
    pub fn save_state(&self, trial: TrialRef, path: std::path::PathBuf) {
        self.core(trial.job).save_state(trial, path)
    }

    pub fn swap_out(&self, id: JobId) {
        self.core(id).swap_out(id)
    }

    pub fn prune(&self, id: JobId) {
        self.core(id).prune(id)
    }

    pub fn set_priority(&self, id: JobId, priority: f64) {
        self.core(id).set_priority(id, priority)
    }

    /// Device `d`'s memory accounting now.
    pub fn ledger(&self, d: usize) -> LedgerSnapshot {
        self.cores[d].ledger()
    }

    /// Moves waiting jobs off full devices to ones where they fit now
    /// ([`moves`]); `rehome` points each at its new device's data
    /// (`Job::rehome`). Returns `(job, from, to)` for each move.
    pub fn rebalance(
        &self,
        mut rehome: impl FnMut(&mut dyn Job<B>, usize),
    ) -> Vec<(JobId, usize, usize)> {
        if self.cores.len() < 2 {
            return Vec::new();
        }
        let waiting: Vec<(usize, JobId, u64)> = self
            .cores
            .iter()
            .enumerate()
            .flat_map(|(d, c)| {
                c.movable_waiting()
                    .into_iter()
                    .map(move |(id, need)| (d, id, need))
            })
            .collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        let mut done = Vec::new();
        for (id, from, to) in moves(&self.loads(), &waiting) {
            let mut home = self.home();
            // It may have been admitted or paused since it was listed.
            let Some(mut w) = self.cores[from].withdraw(id) else {
                continue;
            };
            rehome(w.job.as_mut(), to);
            self.cores[to].adopt(w);
            home.insert(id, to);
            done.push((id, from, to));
        }
        done
    }

    /// Stops every core (see [`SalusCore::stop`]) and returns the jobs
    /// that had not ended.
    pub fn stop(&mut self) -> Vec<(JobId, Box<dyn Job<B>>)> {
        self.cores.iter_mut().flat_map(SalusCore::stop).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(free: u64, lanes: usize, jobs: usize) -> DeviceLoad {
        DeviceLoad {
            free,
            lanes,
            jobs,
            given: 0,
        }
    }

    fn given(l: DeviceLoad, given: u64) -> DeviceLoad {
        DeviceLoad { given, ..l }
    }

    #[test]
    fn a_job_goes_where_it_fits_and_lanes_are_least_loaded() {
        // Both fit: fewer jobs per lane wins, whatever the free memory.
        assert_eq!(choose_device(&[load(900, 2, 4), load(100, 2, 1)], 50), 1);
        // Equal loads: more free memory wins; then the first.
        assert_eq!(choose_device(&[load(100, 2, 2), load(900, 2, 2)], 50), 1);
        assert_eq!(choose_device(&[load(500, 2, 2), load(500, 2, 2)], 50), 0);
        // Equal loads, before free memory: the device given fewer jobs so
        // far, so that idle devices take turns.
        let idle = load(900, 1, 0);
        assert_eq!(
            choose_device(&[given(idle, 3), given(load(100, 1, 0), 2)], 50),
            1
        );
        assert_eq!(choose_device(&[given(idle, 3), given(idle, 3)], 50), 0);
        // Load first: a busier device is not chosen for having been given
        // fewer.
        assert_eq!(
            choose_device(&[given(load(500, 1, 1), 0), given(idle, 9)], 50),
            1
        );
        // Per lane, not per device: 4 jobs on 4 lanes beat 2 on 1.
        assert_eq!(choose_device(&[load(500, 1, 2), load(500, 4, 4)], 50), 1);
        // Only one fits: it goes there, however loaded.
        assert_eq!(choose_device(&[load(10, 2, 0), load(100, 2, 9)], 50), 1);
        // It fits nowhere now: the least loaded device queues it.
        assert_eq!(choose_device(&[load(10, 2, 3), load(20, 2, 1)], 50), 1);
    }

    #[test]
    fn only_jobs_that_cannot_be_admitted_where_they_wait_move() {
        let loads = [load(0, 1, 3), load(100, 1, 1), load(60, 1, 0)];
        let waiting = [
            (0, JobId(7), 50),
            (0, JobId(8), 50),
            (0, JobId(9), 50),
            (1, JobId(3), 10),
        ];
        // Job 3 fits where it waits and keeps its 10 bytes there. Job 7
        // takes the idle device 2, job 8 what device 1 has left; job 9
        // fits nowhere now and stays.
        assert_eq!(
            moves(&loads, &waiting),
            vec![(JobId(7), 0, 2), (JobId(8), 0, 1)]
        );
        // No device has room: nothing moves.
        assert!(moves(&[load(0, 1, 2), load(40, 1, 1)], &[(0, JobId(1), 50)]).is_empty());
    }
}
