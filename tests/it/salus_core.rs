//! The Salus core with real trials on the CPU: interleaving, admission
//! under a memory budget, pause, swap, resume, priorities and pruning.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};

use kernels::{Activation, CpuBackend};
use salus_tune::salus::JobId;
use salus_tune::salus::core::{CoreConfig, CoreEvent, Donor, SalusCore, TrialRef};
use salus_tune::salus::devices::DeviceCores;
use salus_tune::salus::policy::Policy;
use training::data::{split, synthetic_classification};
use training::{
    DeviceData, Job, Lane, Optimizer, Report, SlotHparams, StepOutcome, TrainTrial, TrialConfig,
};

type Data = Arc<DeviceData<CpuBackend>>;

fn data() -> Data {
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 0, 1).unwrap();
    DeviceData::upload(
        &mut lane,
        &split(&synthetic_classification(400, 12, 4, 6, 3), 0.25, 0).unwrap(),
    )
    .unwrap()
}

fn cfg(width: usize, seed: u64, epochs: u64) -> TrialConfig {
    TrialConfig {
        precision: Default::default(),
        hidden: vec![width, width],
        activation: Activation::Relu,
        batch_size: 25,
        epochs,
        hparams: SlotHparams {
            optimizer: Optimizer::adam(),
            lr: 3e-3,
            weight_decay: 0.0,
            dropout: 0.1,
            seed,
        },
        report_every: None,
        conv: None,
    }
}

/// The reports of a trial run alone on its own lane.
fn alone(data: &Data, c: &TrialConfig) -> Vec<Report> {
    alone_on(&Arc::new(CpuBackend::new()), data, c)
}

/// A core on a CPU backend of its own, and the receiver of its events.
fn cpu_core(config: CoreConfig) -> (SalusCore<CpuBackend>, Receiver<CoreEvent>) {
    let (tx, rx) = channel();
    let core = SalusCore::start(Arc::new(CpuBackend::new()), config, tx).unwrap();
    (core, rx)
}

fn job(data: &Data, c: &TrialConfig) -> Box<dyn Job<CpuBackend>> {
    Box::new(TrainTrial::new_on_host(data.clone(), c.clone()).unwrap())
}

fn bytes(data: &Data, c: &TrialConfig) -> u64 {
    let fp = job(data, c).footprint();
    (fp.persistent_bytes + fp.ephemeral_bytes) as u64
}

/// Every event until no job is left, with each job's reports.
struct Log {
    reports: BTreeMap<JobId, Vec<Report>>,
    events: Vec<CoreEvent>,
}

fn drain(rx: &Receiver<CoreEvent>, jobs: usize, mut on: impl FnMut(&CoreEvent)) -> Log {
    let mut log = Log {
        reports: BTreeMap::new(),
        events: Vec::new(),
    };
    let mut ended = 0;
    while ended < jobs {
        let ev = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("an event within a minute");
        on(&ev);
        match &ev {
            CoreEvent::Report { job, report } => {
                log.reports.entry(*job).or_default().push(report.clone())
            }
            CoreEvent::Finished { job, report, .. } => {
                log.reports.entry(*job).or_default().push(report.clone());
                ended += 1;
            }
            CoreEvent::Failed { error, .. } => panic!("a job failed: {error}"),
            CoreEvent::Pruned { .. } => ended += 1,
            _ => {}
        }
        log.events.push(ev);
    }
    log
}

#[test]
fn interleaved_jobs_give_exactly_what_they_give_alone() {
    let data = data();
    let configs: Vec<TrialConfig> = [8, 16, 8, 24, 16]
        .iter()
        .enumerate()
        .map(|(i, &w)| cfg(w, i as u64, 3))
        .collect();
    for policy in [
        Policy::Pack,
        Policy::Fair,
        Policy::Srtf,
        Policy::Fifo,
        Policy::Priority,
    ] {
        let (core, rx) = cpu_core(CoreConfig::cpu(policy, 2, 2, 1 << 30));
        // Placed all at once (submitted paused, resumed together): a lane
        // that empties takes a job from the other, so jobs submitted one
        // by one on a loaded machine could each find a lane of their own.
        let ids: Vec<JobId> = configs
            .iter()
            .map(|c| core.submit_paused(job(&data, c), 0.0, "d"))
            .collect();
        core.resume_all(&ids);
        let mut log = drain(&rx, ids.len(), |_| {});
        assert_eq!(core.ledger().used(), 0, "everything released");
        // The lanes' last segments, flushed as they stop.
        core.shutdown();
        log.events.extend(rx.try_iter());
        for (id, c) in ids.iter().zip(&configs) {
            assert_eq!(log.reports[id], alone(&data, c), "{policy:?}: job {id}");
        }
        // Under pack both lanes are used.
        if policy == Policy::Pack {
            let lanes: std::collections::BTreeSet<usize> = log
                .events
                .iter()
                .filter_map(|e| {
                    if let CoreEvent::Admitted { lane, .. } = e {
                        Some(*lane)
                    } else {
                        None
                    }
                })
                .collect();
            assert_eq!(lanes.len(), 2);
        }
        // Equal priorities run the least recently run job next: the jobs on
        // a lane take turns at every boundary.
        if policy == Policy::Priority {
            // Some lane ran a job, then another, then the first again.
            let mut runs: std::collections::BTreeMap<usize, Vec<JobId>> = Default::default();
            for e in &log.events {
                if let CoreEvent::Segment { lane, job, .. } = e {
                    let r = runs.entry(*lane).or_default();
                    if r.last() != Some(job) {
                        r.push(*job);
                    }
                }
            }
            let interleaved = runs.values().any(|r| {
                r.iter()
                    .enumerate()
                    .any(|(i, j)| r[i + 1..].iter().skip(1).any(|k| k == j))
            });
            assert!(interleaved, "no lane interleaved its jobs: {runs:?}");
            assert!(
                log.events
                    .iter()
                    .any(|e| matches!(e, CoreEvent::Switch { .. })),
                "interleaving resident jobs is a switch"
            );
        }
    }
}

#[test]
fn an_idle_lane_takes_a_job_from_a_lane_that_has_two() {
    // Two long jobs of one shape share lane 0 (placement puts a shape with
    // its kind); a short one has lane 1 to itself. When it ends, lane 1
    // takes one of the long ones, which goes on bit-exactly.
    let data = data();
    // Long enough that the first is still running when the short one
    // ends, on a loaded machine too. Only a lane kept off the CPU for a
    // whole long job sees nothing to take: at 40 epochs (about 60 ms in
    // release) that happened once in CI, under the other tests' load;
    // 200 epochs make that window five times as long.
    let long = [cfg(96, 1, 200), cfg(96, 2, 200)];
    let short = cfg(8, 3, 1);
    let expected = [
        alone(&data, &long[0]),
        alone(&data, &short),
        alone(&data, &long[1]),
    ];
    for policy in [Policy::Pack, Policy::Fifo, Policy::Priority] {
        let (core, rx) = cpu_core(CoreConfig::cpu(policy, 2, 2, 1 << 30));
        let jobs = [
            job(&data, &long[0]),
            job(&data, &short),
            job(&data, &long[1]),
        ];
        // Submitted paused and resumed together, so that placement sees
        // all three at once however loaded the machine is.
        let ids: Vec<JobId> = jobs
            .into_iter()
            .map(|j| core.submit_paused(j, 0.0, "d"))
            .collect();
        core.resume_all(&ids);
        let mut log = drain(&rx, ids.len(), |_| {});
        assert_eq!(core.ledger().used(), 0, "everything released");
        // The lanes' last segments, flushed as they stop.
        core.shutdown();
        log.events.extend(rx.try_iter());
        let mut lanes: BTreeMap<JobId, Vec<usize>> = BTreeMap::new();
        for e in &log.events {
            if let CoreEvent::Admitted { job, lane } = e {
                lanes.entry(*job).or_default().push(*lane);
            }
        }
        assert_eq!(
            lanes[&ids[0]][0], lanes[&ids[2]][0],
            "{policy:?}: {lanes:?}"
        );
        assert_ne!(
            lanes[&ids[0]][0], lanes[&ids[1]][0],
            "{policy:?}: {lanes:?}"
        );
        let moved: Vec<&JobId> = lanes
            .iter()
            .filter(|(_, l)| l.len() == 2 && l[0] != l[1])
            .map(|(id, _)| id)
            .collect();
        assert_eq!(moved.len(), 1, "{policy:?}: one long job moves: {lanes:?}");
        assert!(moved[0] == &ids[0] || moved[0] == &ids[2]);
        // It ran on the lane it moved to, and gives what it gives alone.
        let to = lanes[moved[0]][1];
        assert!(
            log.events.iter().any(|e| matches!(e,
                CoreEvent::Segment { lane, job, .. } if job == moved[0] && *lane == to)),
            "{policy:?}"
        );
        for (id, want) in ids.iter().zip(&expected) {
            assert_eq!(&log.reports[id], want, "{policy:?}: job {id}");
        }
    }
}

#[test]
fn admission_never_exceeds_the_memory_budget() {
    let data = data();
    let c = cfg(32, 1, 2);
    let fp = job(&data, &c).footprint();
    // Two trials on two lanes, and their data set; not a third persistent part.
    let budget = 2 * bytes(&data, &c) + data.bytes() as u64 + fp.persistent_bytes as u64 / 2;
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Pack, 2, 2, budget));
    let ids: Vec<JobId> = (0..6)
        .map(|i| core.submit(job(&data, &cfg(32, i, 2)), 0.0, "d"))
        .collect();
    let (mut resident, mut max_resident) = (0i32, 0);
    let mut lanes = std::collections::BTreeSet::new();
    let log = drain(&rx, ids.len(), |e| {
        assert!(core.ledger().used() <= budget);
        match e {
            CoreEvent::Admitted { lane, .. } => {
                lanes.insert(*lane);
                resident += 1;
                max_resident = max_resident.max(resident);
            }
            CoreEvent::Finished { .. } => resident -= 1,
            _ => {}
        }
    });
    assert_eq!(max_resident, 2, "two fit, no more");
    assert_eq!(lanes.len(), 2, "a new lane while one is free");
    assert_eq!(log.reports.len(), 6, "every job ran once memory allowed");
}

/// A job that stops before iteration `at` until the test lets it go.
struct Gated {
    inner: Box<dyn Job<CpuBackend>>,
    at: u64,
    reached: std::sync::mpsc::Sender<u64>,
    go: Receiver<()>,
    tag: u64,
}

impl Job<CpuBackend> for Gated {
    fn footprint(&self) -> training::Footprint {
        self.inner.footprint()
    }
    fn fusion_key(&self) -> training::FusionKey {
        self.inner.fusion_key()
    }
    fn iterations_done(&self) -> u64 {
        self.inner.iterations_done()
    }
    fn total_iterations(&self) -> u64 {
        self.inner.total_iterations()
    }
    fn is_resident(&self) -> bool {
        self.inner.is_resident()
    }
    fn step(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<StepOutcome> {
        if self.inner.iterations_done() == self.at {
            self.reached.send(self.tag).unwrap();
            self.go.recv().unwrap();
        }
        self.inner.step(lane)
    }
    fn report(&self) -> Option<&Report> {
        self.inner.report()
    }
    fn export_state(
        &mut self,
        lane: &mut Lane<CpuBackend>,
    ) -> training::Result<training::TrialSnapshot> {
        self.inner.export_state(lane)
    }
    fn import_state(
        &mut self,
        lane: &mut Lane<CpuBackend>,
        state: &training::TrialSnapshot,
    ) -> training::Result<()> {
        self.inner.import_state(lane, state)
    }
    fn swap_out(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<usize> {
        self.inner.swap_out(lane)
    }
    fn swap_in(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<usize> {
        self.inner.swap_in(lane)
    }
    fn can_move(&self) -> bool {
        self.inner.can_move()
    }
    fn rehome(&mut self, data: &Data) {
        self.inner.rehome(data)
    }
}

/// A gated job, the receiver of its "reached" signal and the sender of "go".
fn gated(
    data: &Data,
    c: &TrialConfig,
    at: u64,
    tag: u64,
    reached: &std::sync::mpsc::Sender<u64>,
) -> (Box<dyn Job<CpuBackend>>, std::sync::mpsc::Sender<()>) {
    let (go_tx, go_rx) = channel();
    (
        Box::new(Gated {
            inner: job(data, c),
            at,
            reached: reached.clone(),
            go: go_rx,
            tag,
        }),
        go_tx,
    )
}

#[test]
fn pause_swap_and_resume_continue_bit_exactly() {
    let data = data();
    let c = cfg(16, 7, 4);
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Pack, 1, 1, 1 << 30));
    let (reached_tx, reached) = channel();
    let (j, go) = gated(&data, &c, 15, 0, &reached_tx);
    let id = core.submit(j, 0.0, "d");
    // Mid-epoch, before iteration 15: pause it and move it to the host.
    reached.recv().unwrap();
    core.pause(id);
    core.swap_out(id);
    go.send(()).unwrap();
    let mut swapped = Vec::new();
    let log = drain(&rx, 1, |e| {
        if let CoreEvent::Swapped { out, bytes, .. } = e {
            swapped.push((*out, *bytes));
            if *out {
                assert_eq!(
                    core.ledger().persistent,
                    0,
                    "swapped out: no persistent memory held"
                );
                core.resume(id);
            }
        }
    });
    assert_eq!(
        log.reports[&id],
        alone(&data, &c),
        "the same trajectory as an uninterrupted run"
    );
    let persistent = job(&data, &c).footprint().persistent_bytes;
    // Admission (in), swap out, swap back in.
    assert_eq!(
        swapped,
        vec![(false, persistent), (true, persistent), (false, persistent)]
    );
}

/// Two devices in one process: a trial swapped out on a full device
/// resumes on the other, where there is room, bit-exactly.
#[test]
fn a_swapped_out_trial_resumes_on_another_device_with_room() {
    let datas: Vec<Data> = (0..2).map(|_| data()).collect();
    let (ca, cb) = (cfg(16, 11, 3), cfg(16, 12, 3));
    let fp = job(&datas[0], &ca).footprint();
    // Each device holds one trial, not two.
    let budget =
        (fp.persistent_bytes + fp.ephemeral_bytes + datas[0].bytes() + fp.persistent_bytes / 2)
            as u64;
    let (tx, rx) = channel();
    let devices = (0..2)
        .map(|i| {
            let backend = Arc::new(CpuBackend::numbered(i));
            let config = CoreConfig::cpu(Policy::Pack, 1, 1, budget);
            (format!("cpu:{i}"), backend, config)
        })
        .collect();
    let cores = DeviceCores::start(devices, tx).unwrap();
    assert_eq!(cores.layout().len(), 2);
    let (reached_tx, reached) = channel();
    let (ja, go) = gated(&datas[0], &ca, 5, 0, &reached_tx);
    let a = cores.submit_on(0, ja, 0.0, "d");
    reached.recv().unwrap();
    cores.pause(a);
    cores.swap_out(a);
    go.send(()).unwrap();
    // `b` waits at a gate of its own until `a` has moved: run through, it
    // could end (and `a` take device 0 again) before a loaded machine lets
    // this thread look.
    let (jb, go_b) = gated(&datas[0], &cb, 5, 1, &reached_tx);
    let jb = std::cell::Cell::new(Some(jb));
    let mut b = None;
    let mut moved = Vec::new();
    let mut admitted: Vec<(JobId, usize)> = Vec::new();
    let log = drain(&rx, 2, |e| match e {
        CoreEvent::Swapped { job, out: true, .. } if *job == a => {
            // Device 0 fills up again, then `a` may run: it waits there.
            b = Some(cores.submit_on(0, jb.take().unwrap(), 0.0, "d"));
            cores.resume(a);
            // The lane hands `a` back to its core just after this event;
            // on a loaded machine (the whole suite on 2 cores) that took
            // over 5 s once, so wait up to 30.
            for _ in 0..30_000 {
                moved = cores.rebalance(|j, d| j.rehome(&datas[d]));
                if !moved.is_empty() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(reached.recv().unwrap(), 1, "b reached its gate");
            go_b.send(()).unwrap();
        }
        CoreEvent::Admitted { job, lane } => admitted.push((*job, cores.device_of_lane(*lane))),
        _ => {}
    });
    let b = b.expect("b was submitted");
    assert_eq!(moved, vec![(a, 0, 1)], "a moved to the device with room");
    assert_eq!(admitted, vec![(a, 0), (b, 0), (a, 1)]);
    assert_eq!(cores.device_of(a), 1);
    assert_eq!(
        log.reports[&a],
        alone(&datas[0], &ca),
        "a's curve, bit for bit"
    );
    assert_eq!(log.reports[&b], alone(&datas[0], &cb));
}

#[test]
fn higher_priority_work_swaps_out_the_lowest_priority_paused_job() {
    let data = data();
    let (cl, cm, ch) = (cfg(32, 1, 3), cfg(32, 2, 3), cfg(32, 3, 3));
    let fp = job(&data, &cl).footprint();
    // One lane; room for two trials' persistent state, not three.
    let budget =
        (2 * fp.persistent_bytes + fp.ephemeral_bytes + data.bytes() + fp.persistent_bytes / 2)
            as u64;
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Priority, 1, 1, budget));
    let (reached_tx, reached) = channel();
    let (jl, go_low) = gated(&data, &cl, 5, 1, &reached_tx);
    let (jm, go_mid) = gated(&data, &cm, 5, 2, &reached_tx);
    // Mid first: it reaches its gate and holds the one lane there, so that
    // low cannot get ahead of it (submitted first, low could run to its
    // own gate before mid arrived on a loaded machine).
    let mid = core.submit(jm, 2.0, "d");
    let low = core.submit(jl, 1.0, "d");
    // The higher priority runs first: mid reaches its gate, is paused; then low.
    assert_eq!(reached.recv().unwrap(), 2);
    core.pause(mid);
    go_mid.send(()).unwrap();
    assert_eq!(reached.recv().unwrap(), 1);
    core.pause(low);
    let high = core.submit(job(&data, &ch), 9.0, "d");
    go_low.send(()).unwrap();
    let mut swapped_out = Vec::new();
    let log = drain(&rx, 3, |e| match e {
        CoreEvent::Swapped { job, out: true, .. } => swapped_out.push(*job),
        CoreEvent::Finished { job, .. } if *job == high => {
            core.resume(low);
            core.resume(mid);
        }
        _ => {}
    });
    assert_eq!(
        swapped_out,
        vec![low],
        "only the lowest-priority paused job made room"
    );
    assert_eq!(log.reports[&low], alone(&data, &cl));
    assert_eq!(log.reports[&mid], alone(&data, &cm));
    assert_eq!(log.reports[&high], alone(&data, &ch));
}

#[test]
fn a_pruned_job_ends_and_frees_its_memory() {
    let data = data();
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Fifo, 1, 1, 1 << 30));
    let core = Arc::new(core);
    let a = core.submit(job(&data, &cfg(16, 1, 50)), 0.0, "d");
    let b = core.submit(job(&data, &cfg(16, 2, 2)), 0.0, "d");
    let mut pruned = Vec::new();
    drain(&rx, 2, |e| match e {
        CoreEvent::Report { job, .. } if *job == a => core.prune(a),
        CoreEvent::Pruned {
            job, iterations, ..
        } => pruned.push((*job, *iterations)),
        _ => {}
    });
    assert_eq!(pruned.len(), 1);
    assert_eq!(pruned[0].0, a);
    assert!(pruned[0].1 < 50 * 12, "ended early");
    let _ = b;
    assert_eq!(core.ledger().used(), 0);
}

/// A trial whose device "runs out of memory" for its first `fails` swap-ins,
/// as a device does when a footprint was underestimated.
/// A trial whose memory was misjudged: its first `fails` swap-ins run out
/// of memory, and until its first step it says its footprint is `guess`
/// (as an external worker does before its client has measured it). With a
/// `gate`, its swap-out says it started and waits to be let go on. It holds
/// `cache` bytes more between iterations until asked to release them, as
/// an external worker's allocator cache.
struct Misjudged {
    inner: TrainTrial<CpuBackend>,
    fails: usize,
    guess: Option<training::Footprint>,
    gate: Option<(std::sync::mpsc::Sender<()>, Receiver<()>)>,
    cache: usize,
    /// Its first step says it started on the first, then waits for the
    /// second, where given.
    first_step: Option<(std::sync::mpsc::Sender<()>, Receiver<()>)>,
}

impl Job<CpuBackend> for Misjudged {
    fn footprint(&self) -> training::Footprint {
        let mut fp = self.inner.footprint();
        fp.persistent_bytes += self.cache;
        self.guess.unwrap_or(fp)
    }
    fn footprint_changes(&self) -> bool {
        true
    }
    fn releasable_bytes(&self) -> usize {
        self.cache
    }
    fn release_cache(&mut self, _lane: &mut Lane<CpuBackend>) -> training::Result<usize> {
        Ok(std::mem::take(&mut self.cache))
    }
    fn fusion_key(&self) -> training::FusionKey {
        self.inner.fusion_key()
    }
    fn iterations_done(&self) -> u64 {
        self.inner.iterations_done()
    }
    fn total_iterations(&self) -> u64 {
        self.inner.total_iterations()
    }
    fn is_resident(&self) -> bool {
        self.inner.is_resident()
    }
    fn step(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<StepOutcome> {
        if let Some((started, go)) = self.first_step.take() {
            started.send(()).unwrap();
            go.recv().unwrap();
        }
        self.guess = None;
        self.inner.step(lane)
    }
    fn report(&self) -> Option<&Report> {
        self.inner.report()
    }
    fn export_state(
        &mut self,
        lane: &mut Lane<CpuBackend>,
    ) -> training::Result<training::TrialSnapshot> {
        self.inner.export_state(lane)
    }
    fn import_state(
        &mut self,
        lane: &mut Lane<CpuBackend>,
        state: &training::TrialSnapshot,
    ) -> training::Result<()> {
        self.inner.import_state(lane, state)
    }
    fn swap_out(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<usize> {
        if let Some((started, go_on)) = &self.gate {
            started.send(()).unwrap();
            go_on.recv().unwrap();
        }
        self.inner.swap_out(lane)
    }
    fn swap_in(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<usize> {
        if self.fails > 0 {
            self.fails -= 1;
            return Err(training::WorkerError::Kernel(
                kernels::KernelError::OutOfMemory { requested: 1 << 20 },
            ));
        }
        self.inner.swap_in(lane)
    }
}

#[test]
fn out_of_memory_requeues_with_a_larger_estimate_and_never_fails_the_trial() {
    let data = data();
    let c = cfg(16, 5, 2);
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Pack, 2, 2, 1 << 30));
    let before = job(&data, &c).footprint();
    let id = core.submit(
        Box::new(Misjudged {
            inner: TrainTrial::new_on_host(data.clone(), c.clone()).unwrap(),
            fails: 2,
            guess: None,
            gate: None,
            cache: 0,
            first_step: None,
        }),
        0.0,
        "d",
    );
    let other = core.submit(job(&data, &cfg(8, 6, 2)), 0.0, "d");
    let log = drain(&rx, 2, |_| {});
    let requeues: Vec<(usize, usize)> = log
        .events
        .iter()
        .filter_map(|e| match e {
            CoreEvent::Requeued {
                job,
                persistent_bytes,
                ephemeral_bytes,
            } if *job == id => Some((*persistent_bytes, *ephemeral_bytes)),
            _ => None,
        })
        .collect();
    assert_eq!(
        requeues.len(),
        2,
        "two out-of-memory swap-ins, two requeues"
    );
    assert_eq!(requeues[0].0, before.persistent_bytes * 3 / 2);
    assert!(
        requeues[1].0 > requeues[0].0,
        "the estimate grows each time"
    );
    // It then ran to the end, with exactly the reports it gives alone.
    assert_eq!(log.reports[&id], alone(&data, &c));
    assert_eq!(log.reports[&other].len(), 2);
    assert_eq!(core.ledger().persistent, 0, "everything was released");
}

#[test]
fn a_job_that_measures_itself_smaller_lets_the_waiting_jobs_in() {
    // As `memory = "auto"` plans: an unmeasured job claims the whole
    // budget, so the first runs alone until its first step measures it.
    let data = data();
    let c = cfg(16, 5, 2);
    let budget = 1 << 30;
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Pack, 2, 2, budget));
    let whole = training::Footprint {
        persistent_bytes: budget as usize,
        ..Default::default()
    };
    let ids: Vec<JobId> = (0..3)
        .map(|i| {
            let inner = TrainTrial::new_on_host(data.clone(), cfg(16, 5 + i, 2)).unwrap();
            core.submit(
                Box::new(Misjudged {
                    inner,
                    fails: 0,
                    guess: Some(whole),
                    gate: None,
                    cache: 0,
                    first_step: None,
                }),
                0.0,
                "d",
            )
        })
        .collect();
    let log = drain(&rx, 3, |_| {});
    let at = |want: &dyn Fn(&CoreEvent) -> bool| log.events.iter().position(want);
    let refit = at(&|e| matches!(e, CoreEvent::Refit { job, .. } if *job == ids[0]))
        .expect("the first job's measurement replaced its guess");
    for &other in &ids[1..] {
        let admitted = at(&|e| matches!(e, CoreEvent::Admitted { job, .. } if *job == other))
            .expect("admitted");
        assert!(admitted > refit, "{other:?} waited for the measurement");
    }
    match &log.events[refit] {
        CoreEvent::Refit { footprint, .. } => assert_eq!(*footprint, job(&data, &c).footprint()),
        _ => unreachable!(),
    }
    // Each job ran exactly as it does alone.
    assert_eq!(log.reports[&ids[0]], alone(&data, &c));
    assert_eq!(core.ledger().persistent, 0, "everything was released");
}

#[test]
fn a_job_pruned_while_it_is_swapped_out_ends() {
    // An external worker's swap-out is a round trip to its process: the
    // pruner may decide meanwhile, and the job must still end.
    let data = data();
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Pack, 1, 1, 1 << 30));
    let (started_tx, started) = channel();
    let (go_on, go_on_rx) = channel();
    let id = core.submit(
        Box::new(Misjudged {
            inner: TrainTrial::new_on_host(data.clone(), cfg(8, 1, 50)).unwrap(),
            fails: 0,
            guess: None,
            gate: Some((started_tx, go_on_rx)),
            cache: 0,
            first_step: None,
        }),
        0.0,
        "d",
    );
    core.pause(id);
    core.swap_out(id);
    started
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the swap-out began");
    core.prune(id);
    go_on.send(()).unwrap();
    let log = drain(&rx, 1, |_| {});
    assert!(
        log.events
            .iter()
            .any(|e| matches!(e, CoreEvent::Pruned { job, .. } if *job == id)),
        "{:?}",
        log.events
    );
    assert_eq!(core.live_jobs(), 0);
}

#[test]
fn a_cache_is_given_back_before_anyone_is_swapped_out() {
    // Job A holds an allocator cache as large as B's state; B fits only
    // once A gives it back. B arrives while A runs (a streak keeps A off
    // the table): A gives its cache back at its next boundary, keeps its
    // state, and B comes in. (The core once looked only at jobs on the
    // table, and B waited for A's end.)
    let data = data();
    let (ca, cb) = (cfg(16, 5, 2), cfg(16, 6, 2));
    let (fa, fb) = (job(&data, &ca).footprint(), job(&data, &cb).footprint());
    let cache = fb.persistent_bytes;
    let budget = (fa.persistent_bytes
        + fa.ephemeral_bytes
        + fa.shared_bytes
        + fb.persistent_bytes
        + cache / 2) as u64;
    let (core, rx) = cpu_core(CoreConfig::cpu(Policy::Pack, 1, 1, budget));
    // B is sent once A runs, and A's first step waits for B to arrive:
    // sent together, the core could admit B first (A waits, its cache
    // never in the way); run through, A could end before B came.
    let (go_a, first_step) = channel();
    let (started, a_started) = channel();
    let a = core.submit(
        Box::new(Misjudged {
            inner: TrainTrial::new_on_host(data.clone(), ca.clone()).unwrap(),
            fails: 0,
            guess: None,
            gate: None,
            cache,
            first_step: Some((started, first_step)),
        }),
        0.0,
        "d",
    );
    a_started.recv().unwrap();
    let b = core.submit(job(&data, &cb), 0.0, "d");
    go_a.send(()).unwrap();
    let log = drain(&rx, 2, |_| {});
    let at = |want: &dyn Fn(&CoreEvent) -> bool| log.events.iter().position(want);
    let released = at(&|e| {
        matches!(e, CoreEvent::Refit { job, footprint, .. }
            if *job == a && footprint.persistent_bytes == fa.persistent_bytes)
    })
    .unwrap_or_else(|| panic!("A gave its cache back: {:#?}", log.events));
    let admitted = at(&|e| matches!(e, CoreEvent::Admitted { job, .. } if *job == b)).unwrap();
    assert!(admitted > released, "B waited for the room");
    assert!(
        !log.events
            .iter()
            .any(|e| matches!(e, CoreEvent::Swapped { out: true, .. })),
        "nobody was swapped out"
    );
    assert_eq!(log.reports[&a], alone(&data, &ca));
    assert_eq!(log.reports[&b], alone(&data, &cb));
}

/// The reports of a trial run alone on its own lane of `backend`.
fn alone_on<B: kernels::Backend>(
    backend: &Arc<B>,
    data: &Arc<DeviceData<B>>,
    c: &TrialConfig,
) -> Vec<Report> {
    let mut lane = Lane::new(backend.clone(), 9, 1).unwrap();
    lane.set_graphs(true);
    let mut t = TrainTrial::new(&mut lane, data.clone(), c.clone()).unwrap();
    let mut out = Vec::new();
    loop {
        match t.step(&mut lane).unwrap() {
            StepOutcome::Continue => {}
            StepOutcome::Report(r) => out.push(r),
            StepOutcome::Finished(r) => {
                out.push(r);
                return out;
            }
            StepOutcome::Members(_) => unreachable!("a lone trial"),
        }
    }
}

/// Lanes queue a job's next iteration before the last one has finished
/// (a streak: see `salus::core`). Under fifo a lane runs one job's whole
/// epoch that way; under priority with equal priorities every boundary is
/// a switch. Either way each job's reports are bit for bit those it gives
/// alone, on every device; on CUDA with graphs, two lanes sharing the GPU.
fn streaks_give_what_jobs_give_alone<B: kernels::Backend>(backend: Arc<B>) {
    let mut lane = Lane::new(backend.clone(), 0, 1).unwrap();
    let data = DeviceData::upload(
        &mut lane,
        &split(&synthetic_classification(400, 12, 4, 6, 3), 0.25, 0).unwrap(),
    )
    .unwrap();
    let configs: Vec<TrialConfig> = [8, 16, 8, 24, 16]
        .iter()
        .enumerate()
        .map(|(i, &w)| cfg(w, i as u64, 3))
        .collect();
    let expected: Vec<Vec<Report>> = configs
        .iter()
        .map(|c| alone_on(&backend, &data, c))
        .collect();
    for policy in [Policy::Fifo, Policy::Priority, Policy::Pack] {
        let (tx, rx) = channel();
        let config = CoreConfig {
            graphs: true,
            ..CoreConfig::for_device(backend.kind(), policy, 2, 1 << 30)
        };
        let core = SalusCore::start(backend.clone(), config, tx).unwrap();
        // Each job paused as it arrives and all resumed together, so that
        // none runs alone while the others are still submitted (a loaded
        // machine would otherwise decide how many turns there are).
        let ids: Vec<JobId> = configs
            .iter()
            .map(|c| {
                let job: Box<dyn Job<B>> =
                    Box::new(TrainTrial::new_on_host(data.clone(), c.clone()).unwrap());
                core.submit_paused(job, 0.0, "d")
            })
            .collect();
        core.resume_all(&ids);
        let log = drain(&rx, ids.len(), |_| {});
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                log.reports[id],
                expected[i],
                "{}, {policy:?}: job {i}",
                backend.name()
            );
        }
        if policy == Policy::Priority {
            // Equal priorities take turns at every boundary: while a lane
            // holds two jobs, each of its segments is one iteration. (A
            // lane left with one job runs it in a streak; a lane whose jobs
            // all ended takes one from the other.) So a longer segment
            // overlaps no other job's span on its lane.
            let mut spans: BTreeMap<(usize, JobId), (f64, f64)> = BTreeMap::new();
            let mut segments = Vec::new();
            for e in &log.events {
                if let CoreEvent::Segment {
                    lane,
                    job,
                    start,
                    end,
                    iterations,
                } = *e
                {
                    let span = spans.entry((lane, job)).or_insert((start, end));
                    span.0 = span.0.min(start);
                    span.1 = span.1.max(end);
                    segments.push((lane, job, start, end, iterations));
                }
            }
            let mut long = 0;
            for &(lane, job, start, end, iterations) in &segments {
                if iterations < 2 {
                    continue;
                }
                long += 1;
                for (&(l, other), &(from, to)) in &spans {
                    assert!(
                        l != lane || other == job || to <= start || from >= end,
                        "{}: lane {lane} ran job {job} for {iterations} iterations \
                         ({start}-{end}) while it held job {other} ({from}-{to})",
                        backend.name()
                    );
                }
            }
            let switches = log
                .events
                .iter()
                .filter(|e| matches!(e, CoreEvent::Switch { .. }))
                .count();
            assert!(
                switches > long,
                "{}: {switches} switches, {long} streaks",
                backend.name()
            );
        }
        core.shutdown();
    }
}

/// Conv-net jobs (batch norm, residual blocks, augmentation) taking turns
/// at every boundary on one lane and packed on two, one of them paused and
/// swapped out to the host while the others run: each reports, bit for
/// bit, what it reports alone.
#[test]
fn interleaved_and_swapped_cnn_jobs_give_exactly_what_they_give_alone() {
    use training::data::{ImageShape, synthetic_images};
    use training::model::{Augment, ConvNetSpec};
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 0, 1).unwrap();
    let shape = ImageShape { h: 8, w: 8, c: 2 };
    let data = DeviceData::upload(
        &mut lane,
        &split(&synthetic_images(90, shape, 3, 4), 0.25, 0).unwrap(),
    )
    .unwrap();
    let configs: Vec<TrialConfig> = (0..4u64)
        .map(|i| TrialConfig {
            batch_size: 16,
            conv: Some(ConvNetSpec {
                image: shape,
                stages: vec![4, 6],
                blocks_per_stage: 1 + (i as usize % 2),
                kernel: 3,
                residual: i % 2 == 1,
                batch_norm: i != 2,
                pool: kernels::PoolKind::Max,
                global_pool: i == 3,
                augment: (i >= 2).then_some(Augment {
                    crop: 1,
                    flip: true,
                }),
            }),
            ..cfg(12, i, 3)
        })
        .collect();
    let expected: Vec<Vec<Report>> = configs.iter().map(|c| alone(&data, c)).collect();
    for (policy, lanes) in [(Policy::Priority, 1), (Policy::Pack, 2)] {
        let (core, rx) = cpu_core(CoreConfig::cpu(policy, lanes, 1, 1 << 30));
        // The first job stops before its second iteration until it is
        // paused and asked to move to the host: resident, whatever the
        // machine's timing. It is resumed at another job's first report
        // after the swap (or when the others are done).
        let (reached_tx, reached) = channel();
        let (first, go) = gated(&data, &configs[0], 1, 0, &reached_tx);
        let ids: Vec<JobId> = std::iter::once(first)
            .chain(configs[1..].iter().map(|c| job(&data, c)))
            .map(|j| core.submit(j, 0.0, "d"))
            .collect();
        reached.recv().unwrap();
        core.pause(ids[0]);
        core.swap_out(ids[0]);
        go.send(()).unwrap();
        let (mut resumed, mut swapped_out, mut others_done) = (false, false, 0);
        let log = drain(&rx, ids.len(), |e| {
            let other = match e {
                CoreEvent::Swapped { job, out: true, .. } if *job == ids[0] => {
                    swapped_out = true;
                    false
                }
                CoreEvent::Finished { job, .. } if *job != ids[0] => {
                    others_done += 1;
                    true
                }
                CoreEvent::Report { job, .. } => *job != ids[0],
                _ => false,
            };
            if other && !resumed && (swapped_out || others_done == ids.len() - 1) {
                resumed = true;
                core.resume(ids[0]);
            }
        });
        assert!(swapped_out, "{policy:?}: the paused job was swapped out");
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(log.reports[id], expected[i], "{policy:?}: job {i}");
        }
        core.shutdown();
    }
}

fn streaks_give_what_jobs_give_alone_on_every_device<B: kernels::Backend>(backend: &mut Arc<B>) {
    streaks_give_what_jobs_give_alone(Arc::clone(backend));
}

kernels::device_tests!(
    cpu: std::sync::Arc::new(kernels::CpuBackend::new()),
    cuda: std::sync::Arc::new;
    streaks_give_what_jobs_give_alone_on_every_device,
);

/// PBT's exploit through the core: two trials paused at their first
/// report; the receiver takes the donor's state on the device and goes on
/// with new hyper-parameters exactly as a trial resumed from the donor's
/// state would, while the donor goes on as it would alone.
#[test]
fn an_exploit_copies_a_paused_donor_into_a_paused_receiver_on_the_device() {
    let data = data();
    let donor_cfg = cfg(16, 1, 3);
    let receiver_cfg = cfg(16, 2, 3);
    let new = SlotHparams {
        lr: 1e-3,
        weight_decay: 1e-4,
        ..donor_cfg.hparams
    };
    let (core, rx) = cpu_core(CoreConfig {
        hold_at_reports: true,
        ..CoreConfig::cpu(Policy::Fair, 2, 1, 1 << 30)
    });
    let donor = core.submit(job(&data, &donor_cfg), 0.0, "d");
    let receiver = core.submit(job(&data, &receiver_cfg), 0.0, "d");
    let mut paused = 0;
    let mut exploited = None;
    let log = drain(&rx, 2, |ev| match ev {
        CoreEvent::Report { job, report } if report.step == 1 => {
            core.pause(*job);
            core.release(*job);
            paused += 1;
            if paused == 2 {
                core.exploit(
                    TrialRef::alone(receiver),
                    Donor::Held(TrialRef::alone(donor)),
                    training::NewValues::Hparams(new),
                );
            }
        }
        CoreEvent::Report { job, .. } => core.release(*job),
        CoreEvent::Exploited {
            receiver: r,
            donor: d,
            bytes,
            on_device,
            error,
            ..
        } => {
            assert_eq!((r.job, d.map(|d| d.job)), (receiver, Some(donor)));
            assert_eq!(error, &None);
            exploited = Some((*bytes, *on_device));
            core.resume(receiver);
            core.resume(donor);
        }
        _ => {}
    });
    let (bytes, on_device) = exploited.expect("an Exploited event");
    assert!(on_device, "both were resident");
    assert_eq!(bytes, job(&data, &donor_cfg).footprint().persistent_bytes);
    assert_eq!(log.reports[&donor], alone(&data, &donor_cfg));

    // The receiver's reports after the exploit: those of a trial resumed
    // from the donor's state at its first report, with the new values.
    let mut lane = Lane::new(Arc::new(CpuBackend::new()), 9, 1).unwrap();
    let mut first = TrainTrial::new(&mut lane, data.clone(), donor_cfg.clone()).unwrap();
    while !matches!(first.step(&mut lane).unwrap(), StepOutcome::Report(_)) {}
    let state = first.export_state(&mut lane).unwrap();
    let resumed_cfg = TrialConfig {
        hparams: SlotHparams {
            seed: receiver_cfg.hparams.seed,
            ..new
        },
        ..receiver_cfg.clone()
    };
    let mut resumed = TrainTrial::resume_on_host(data.clone(), resumed_cfg, state).unwrap();
    resumed.swap_in(&mut lane).unwrap();
    let mut expected = Vec::new();
    loop {
        match resumed.step(&mut lane).unwrap() {
            StepOutcome::Report(r) => expected.push(r),
            StepOutcome::Finished(r) => {
                expected.push(r);
                break;
            }
            _ => {}
        }
    }
    assert_eq!(log.reports[&receiver][1..], expected[..]);
    assert_ne!(
        log.reports[&receiver][1..],
        alone(&data, &receiver_cfg)[1..],
        "the exploit changed the receiver's course"
    );
}

/// A fused group whose members are all dropped at one boundary (pruned,
/// as the runner prunes members) reports nothing more; the core must
/// still end it and free its lane. It once spun on the empty group for
/// ever, the lane's only job, and the study behind it never finished.
#[test]
fn a_group_whose_members_are_all_dropped_ends_and_frees_its_lane() {
    let data = data();
    for policy in [Policy::Priority, Policy::Fifo, Policy::Pack] {
        let (core, rx) = cpu_core(CoreConfig::cpu(policy, 1, 1, 1 << 30));
        // Long enough that the group is still streaking when the drops
        // arrive, however loaded the machine is.
        let members = (0..2)
            .map(|i| {
                let trial = TrainTrial::new_on_host(data.clone(), cfg(16, i, 10_000)).unwrap();
                (i, trial)
            })
            .collect();
        let group = training::FusedTrials::new(members).unwrap();
        let control = group.control();
        let id = core.submit(Box::new(group), 0.0, "d");
        // Its first report: the group is resident and running.
        let first = rx.recv_timeout(std::time::Duration::from_secs(60));
        let mut ended = None;
        if let Ok(ev) = first {
            let mut ev = Some(ev);
            while let Some(e) = ev.take() {
                if matches!(e, CoreEvent::Members { .. }) {
                    control.drop_member(0);
                    control.drop_member(1);
                }
                if let CoreEvent::GroupEnded { job, .. } = e {
                    ended = Some(job);
                    break;
                }
                ev = rx.recv_timeout(std::time::Duration::from_secs(30)).ok();
            }
        }
        if ended != Some(id) {
            // A lane that spins would keep `shutdown` waiting too.
            std::mem::forget(core);
            panic!("{policy:?}: the emptied group never ended");
        }
        // The lane is free: a lone job runs to its end.
        let c = cfg(8, 7, 1);
        let lone = core.submit(job(&data, &c), 0.0, "d");
        let log = drain(&rx, 1, |_| {});
        assert_eq!(log.reports[&lone], alone(&data, &c), "{policy:?}");
        assert_eq!(core.ledger().used(), 0, "{policy:?}: everything released");
        core.shutdown();
    }
}

/// A fused group paused between iterations (as at a PBT exploit point)
/// takes no step, so it never sees its members dropped: the runner prunes
/// it once it has none, and the core ends it at once and frees its memory.
#[test]
fn a_paused_group_emptied_and_pruned_ends_at_once() {
    let data = data();
    let config = CoreConfig {
        hold_at_reports: true,
        ..CoreConfig::cpu(Policy::Fifo, 1, 1, 1 << 30)
    };
    let (core, rx) = cpu_core(config);
    let members = (0..2)
        .map(|i| {
            (
                i,
                TrainTrial::new_on_host(data.clone(), cfg(16, i, 10_000)).unwrap(),
            )
        })
        .collect();
    let group = training::FusedTrials::new(members).unwrap();
    let control = group.control();
    let id = core.submit(Box::new(group), 0.0, "d");
    let wait = std::time::Duration::from_secs(60);
    // Held at its first report (as a runner holds a group whose members
    // reached an exploit point), and paused there, still resident.
    loop {
        match rx.recv_timeout(wait).expect("the group reports") {
            CoreEvent::Members { .. } => break,
            CoreEvent::Failed { error, .. } => panic!("{error}"),
            _ => {}
        }
    }
    core.pause(id);
    control.drop_member(0);
    control.drop_member(1);
    // Held and paused, it takes no step: the drops alone never end it.
    let quiet = std::time::Duration::from_millis(300);
    while let Ok(e) = rx.recv_timeout(quiet) {
        assert!(
            !matches!(e, CoreEvent::GroupEnded { .. } | CoreEvent::Pruned { .. }),
            "the held group ended by itself"
        );
    }
    assert!(core.ledger().used() > 0, "paused, resident");
    core.prune(id);
    let ended = loop {
        match rx.recv_timeout(wait).expect("the group ends") {
            CoreEvent::Pruned { job, .. } => break job,
            CoreEvent::GroupEnded { job, .. } => break job,
            _ => {}
        }
    };
    assert_eq!(ended, id);
    assert_eq!(core.ledger().used(), 0, "its memory is free");
    core.shutdown();
}

/// A trial that notes how many threads its lane splits work over at each
/// iteration.
struct Watched {
    trial: TrainTrial<CpuBackend>,
    threads: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Job<CpuBackend> for Watched {
    fn footprint(&self) -> training::Footprint {
        self.trial.footprint()
    }
    fn fusion_key(&self) -> training::FusionKey {
        self.trial.fusion_key()
    }
    fn iterations_done(&self) -> u64 {
        self.trial.iterations_done()
    }
    fn total_iterations(&self) -> u64 {
        self.trial.total_iterations()
    }
    fn is_resident(&self) -> bool {
        self.trial.is_resident()
    }
    fn step(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<StepOutcome> {
        self.threads.lock().unwrap().push(lane.threads());
        self.trial.step(lane)
    }
    fn report(&self) -> Option<&Report> {
        self.trial.report()
    }
    fn export_state(
        &mut self,
        lane: &mut Lane<CpuBackend>,
    ) -> training::Result<training::TrialSnapshot> {
        self.trial.export_state(lane)
    }
    fn import_state(
        &mut self,
        lane: &mut Lane<CpuBackend>,
        state: &training::TrialSnapshot,
    ) -> training::Result<()> {
        self.trial.import_state(lane, state)
    }
    fn swap_out(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<usize> {
        self.trial.swap_out(lane)
    }
    fn swap_in(&mut self, lane: &mut Lane<CpuBackend>) -> training::Result<usize> {
        self.trial.swap_in(lane)
    }
}

/// The threads a busy lane may use: the cores of the lanes with work,
/// shared out, between its own and its pool's.
#[test]
fn a_busy_lane_borrows_the_cores_of_idle_lanes() {
    use salus_tune::salus::core::lane_threads;
    // Two lanes of one thread on two cores.
    assert_eq!(lane_threads(2, 0, 1, 2), 1);
    assert_eq!(lane_threads(2, 1, 1, 2), 2);
    // A lane about to run is not idle: all counted idle still means one busy.
    assert_eq!(lane_threads(2, 2, 1, 2), 2);
    // Four lanes of four threads on 16 cores.
    assert_eq!(lane_threads(4, 0, 4, 16), 4);
    assert_eq!(lane_threads(4, 1, 4, 16), 5, "15 of the 16 cores");
    assert_eq!(lane_threads(4, 2, 4, 16), 8);
    assert_eq!(lane_threads(4, 3, 4, 16), 16);
    // Never past the pool (CUDA lanes have one host thread), never below its own.
    assert_eq!(lane_threads(4, 3, 1, 1), 1);
    assert_eq!(lane_threads(3, 2, 2, 4), 4);
    assert_eq!(lane_threads(3, 0, 2, 1), 2);
    // The pools: every core on a small machine, four lanes' worth on a large one.
    let pool = |lanes, cores| CoreConfig::cpu(Policy::Fifo, lanes, cores, 1).max_threads_per_lane;
    assert_eq!(
        (
            pool(2, 2),
            pool(1, 2),
            pool(4, 16),
            pool(64, 64),
            pool(3, 8)
        ),
        (2, 2, 16, 4, 8)
    );
}

/// Through the core: a trial alone on a core of two lanes runs on both
/// cores once the other lane sits idle, and still reports what it reports
/// alone; with widening turned off it stays on one. (That a busy lane
/// narrows again is `lane_threads`'s test above.)
#[test]
fn a_trial_left_alone_widens_into_the_idle_lane() {
    let data = data();
    let long = cfg(64, 1, 100);
    for widen in [true, false] {
        let mut config = CoreConfig::cpu(Policy::Fifo, 2, 2, 1 << 30);
        assert_eq!(
            (config.threads_per_lane, config.max_threads_per_lane),
            (1, 2)
        );
        if !widen {
            config.max_threads_per_lane = 1;
        }
        let (core, rx) = cpu_core(config);
        let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let watched = Watched {
            trial: TrainTrial::new_on_host(data.clone(), long.clone()).unwrap(),
            threads: threads.clone(),
        };
        let id = core.submit(Box::new(watched), 0.0, "d");
        let log = drain(&rx, 1, |_| {});
        core.shutdown();
        let threads = threads.lock().unwrap().clone();
        assert_eq!(log.reports[&id], alone(&data, &long), "widen {widen}");
        // The other lane goes idle as soon as its thread starts, long
        // before the trial's 1,200 iterations are done, and stays idle.
        let most = *threads.iter().max().unwrap();
        assert_eq!(
            most,
            if widen { 2 } else { 1 },
            "widen {widen}: {threads:?}"
        );
        if widen {
            assert_eq!(*threads.last().unwrap(), 2, "{threads:?}");
        }
    }
}
