//! A lane's thread: it waits for work from the core's table, runs a
//! job's iterations in streaks (handing over to the next job without a
//! gap on an asynchronous device), exports checkpoints at report points,
//! swaps jobs out, and records its timeline segments.

use std::sync::Arc;
use std::time::Instant;

use kernels::Backend;
use training::{Job, Lane, StepOutcome, SwapMedium, WorkerError};

use super::{CoreEvent, DonorWork, Ending, Exploit, JobId, LaneId, Shared, State, TrialRef, Work};

/// A lane's current timeline segment: job, start, end, iterations.
type Segment = Option<(JobId, f64, f64, u64)>;

/// Emits the segment, if any.
fn flush<B: Backend>(seg: &mut Segment, lane: LaneId, st: &State<B>) {
    if let Some((job, start, end, iterations)) = seg.take() {
        st.emit(CoreEvent::Segment {
            lane,
            job,
            start,
            end,
            iterations,
        });
    }
}

/// Adds an iteration of `job` from `t0` to `end` to the lane's segment, or
/// starts a new one.
fn extend<B: Backend>(
    seg: &mut Segment,
    lane: LaneId,
    st: &State<B>,
    job: JobId,
    t0: f64,
    end: f64,
) {
    match seg {
        Some(s) if s.0 == job => {
            s.2 = end;
            s.3 += 1;
        }
        _ => {
            flush(seg, lane, st);
            *seg = Some((job, t0, end, 1));
        }
    }
}

/// What a job's first iteration after being picked reports: its swap-in
/// (bytes, seconds) and the switch to it (from, the previous end).
fn first_boundary<B: Backend>(
    st: &State<B>,
    lane: LaneId,
    job: JobId,
    swap_in: Option<(usize, f64, SwapMedium)>,
    switched: Option<(JobId, f64)>,
    start: f64,
) {
    if let Some((bytes, seconds, medium)) = swap_in {
        st.emit(CoreEvent::Swapped {
            job,
            lane,
            out: false,
            bytes,
            seconds,
            medium,
        });
    }
    if let Some((from, prev_end)) = switched {
        st.emit(CoreEvent::Switch {
            lane,
            from,
            to: job,
            seconds: (start - prev_end).max(0.0),
        });
    }
}

/// Whether a step's outcome lets its job's next iteration be queued at once:
/// nothing was reported and nothing ended.
fn continues(result: &Result<StepOutcome, WorkerError>) -> bool {
    match result {
        Ok(StepOutcome::Continue) => true,
        Ok(StepOutcome::Members(steps)) => steps.is_empty(),
        _ => false,
    }
}

/// The job a lane holds, from its pick to its return to the table.
struct Running<B: Backend> {
    id: JobId,
    job: Box<dyn Job<B>>,
    /// When the lane picked it, in seconds since the core started.
    start: f64,
    /// When its last queued iteration was queued.
    t0: f64,
    /// Reported at its first boundary: the switch to it (from, the previous
    /// job's end) and its swap-in (bytes, seconds).
    switched: Option<(JobId, f64)>,
    swap_in: Option<(usize, f64, SwapMedium)>,
    /// The last queued iteration's outcome, as far as the host knows.
    result: Result<StepOutcome, WorkerError>,
    /// Whether a mark ([`Lane::sync_previous`]) follows that iteration.
    marked: bool,
}

impl<B: Backend> Running<B> {
    /// Picks up `job`: swaps it in if it must, and queues its first iteration.
    fn begin(
        lane: &mut Lane<B>,
        epoch: Instant,
        id: JobId,
        mut job: Box<dyn Job<B>>,
        switched: Option<(JobId, f64)>,
    ) -> Self {
        let start = epoch.elapsed().as_secs_f64();
        let mut swap_in = None;
        let result = if job.is_resident() {
            Ok(())
        } else {
            let t = Instant::now();
            job.swap_in(lane)
                .map(|bytes| swap_in = Some((bytes, t.elapsed().as_secs_f64(), job.swap_medium())))
        };
        if result.is_err() {
            // A failed swap-in may have left copies queued.
            let _ = lane.sync();
        }
        let t0 = epoch.elapsed().as_secs_f64();
        let result = result.and_then(|_| job.step(lane));
        Running {
            id,
            job,
            start,
            t0,
            switched,
            swap_in,
            result,
            marked: false,
        }
    }

    /// Reports the first boundary (once), and adds the last queued
    /// iteration, from `t0` to `end`, to the lane's timeline segment.
    fn record(&mut self, st: &State<B>, lane: LaneId, segment: &mut Segment, end: f64) {
        let (swap_in, switched) = (self.swap_in.take(), self.switched.take());
        first_boundary(st, lane, self.id, swap_in, switched, self.start);
        extend(segment, lane, st, self.id, self.t0, end);
    }

    /// Marks the end of the last queued iteration, if nothing does yet.
    fn mark(&mut self, lane: &mut Lane<B>) {
        if !self.marked {
            if let Err(e) = lane.sync_previous() {
                self.result = Err(e);
            }
            self.marked = true;
        }
    }

    /// A streak: while the job goes on and the policy would pick it again,
    /// its next iteration is queued before the last one has finished, so the
    /// device never waits for the host's bookkeeping. The job stays with the
    /// lane meanwhile, so nothing else touches its memory.
    fn streak(&mut self, lane: &mut Lane<B>, shared: &Shared<B>, segment: &mut Segment) {
        let lane_id = lane.id();
        let mut keep = self.goes_on() && {
            let st = shared.lock();
            lane.set_threads(st.lane_threads());
            st.keeps(lane_id, self.id)
        };
        if keep {
            self.mark(lane);
            keep = self.goes_on();
        }
        while keep {
            let next = self.job.step(lane);
            let waited = lane.sync_previous();
            let end = shared.epoch.elapsed().as_secs_f64();
            let mut st = shared.lock();
            self.record(&st, lane_id, segment, end);
            st.count_iteration(lane_id, self.id, end - self.t0, true);
            self.t0 = end;
            self.result = waited.and(next);
            keep = self.goes_on() && st.keeps(lane_id, self.id);
            // Wider while other lanes sit idle (a trial alone at a study's end).
            lane.set_threads(st.lane_threads());
        }
    }

    /// Whether the job's next iteration may be queued at once: its step
    /// [`continues`], and a fused group's step left it a trial. A group
    /// whose members were all dropped at a boundary reports nothing, so
    /// only its return to the table ends it; a streak that went on would
    /// spin on the empty group and hold the lane for ever. Before its first
    /// step a group is not judged: joiners come in at that boundary.
    fn goes_on(&self) -> bool {
        match &self.result {
            Ok(StepOutcome::Members(steps)) => steps.is_empty() && self.job.live_members() > 0,
            other => continues(other),
        }
    }
}

pub(super) fn lane_main<B: Backend>(lane: Lane<B>, shared: Arc<Shared<B>>) {
    let mut lane = lane;
    lane.run(|lane| {
        // The job whose iterations the current timeline segment covers.
        let mut segment: Segment = None;
        while let Some((work, previous_live)) = wait_for_work(lane, &shared, &mut segment) {
            match work {
                Work::Step(job_id, job) => {
                    run_steps(lane, &shared, &mut segment, job_id, job, previous_live)
                }
                Work::SwapOut(job_id, job) => swap_out(lane, &shared, job_id, job),
                Work::Release(job_id, job) => release_cache(lane, &shared, job_id, job),
                Work::Exploit(exploit) => take_state(lane, &shared, exploit),
                Work::Save(job_id, job, saves) => save_states(lane, &shared, job_id, job, saves),
            }
        }
    });
}

/// Waits for the lane's next work, with whether the job of the current
/// segment is still live; `None` once the core stops.
fn wait_for_work<B: Backend>(
    lane: &mut Lane<B>,
    shared: &Shared<B>,
    segment: &mut Segment,
) -> Option<(Work<B>, bool)> {
    let id = lane.id();
    let mut st = shared.lock();
    loop {
        if let Some(shapes) = st.drop_shapes.remove(&id) {
            shapes.iter().for_each(|s| lane.release_workspace(s));
        }
        if st.stop {
            flush(segment, id, &st);
            return None;
        }
        if let Some(w) = st.next_work(id) {
            let live = segment.is_some_and(|s| st.jobs.contains_key(&s.0));
            return Some((w, live));
        }
        if st.steal_for(id) {
            continue;
        }
        flush(segment, id, &st);
        st.idle += 1;
        st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        st.idle -= 1;
    }
}

/// Runs `job` for a streak of iterations, handing the lane over to the
/// next job without a gap where the device is asynchronous, then returns
/// the last job run to the table ([`finish_step`]).
fn run_steps<B: Backend>(
    lane: &mut Lane<B>,
    shared: &Shared<B>,
    segment: &mut Segment,
    job_id: JobId,
    job: Box<dyn Job<B>>,
    previous_live: bool,
) {
    let id = lane.id();
    // A switch is between two live jobs, the next one resident: a job's
    // end and a swap-in are not switches.
    let switched = segment
        .as_ref()
        .filter(|s| s.0 != job_id && previous_live && job.is_resident())
        .map(|s| (s.0, s.2));
    let mut run = Running::begin(lane, shared.epoch, job_id, job, switched);
    loop {
        run.streak(lane, shared, segment);
        // A hand-over: the next job's first iteration is queued before
        // this one's last has finished, so a switch leaves the device no
        // gap either. This job goes back to the table once its last is
        // done. Where ops run when called (the CPU), the last iteration
        // is already done: nothing to overlap.
        let next = (run.goes_on() && lane.backend().asynchronous())
            .then(|| {
                let mut st = shared.lock();
                st.hand_over(id, run.id)
            })
            .flatten();
        let Some((next_id, next_job)) = next else {
            break;
        };
        run.mark(lane);
        let mut next = Running::begin(lane, shared.epoch, next_id, next_job, None);
        let waited = lane.sync_previous();
        next.marked = true;
        let end = shared.epoch.elapsed().as_secs_f64();
        // Queued before `run` ended: no time between the two, and its
        // first iteration starts on the device when `run`'s last ends
        // (segments do not overlap).
        next.switched = Some((run.id, end));
        next.t0 = next.t0.max(end);
        let result = std::mem::replace(&mut run.result, Ok(StepOutcome::Continue))
            .and_then(|r| waited.map(|_| r));
        let mut st = shared.lock();
        run.record(&st, id, segment, end);
        if st.return_step(id, run.id, run.job, result, end - run.t0) {
            st.admit_waiting();
            drop(st);
            shared.wake.notify_all();
        } else if st.could_give(id) {
            drop(st);
            shared.wake.notify_all();
        }
        run = next;
    }
    finish_step(lane, shared, segment, run);
}

/// The end of a streak: waits for the device, exports checkpoints and
/// final states, requeues a job that ran out of memory with a larger
/// estimate, and returns the job to the table.
fn finish_step<B: Backend>(
    lane: &mut Lane<B>,
    shared: &Shared<B>,
    segment: &mut Segment,
    mut run: Running<B>,
) {
    let id = lane.id();
    let job_id = run.id;
    let result = std::mem::replace(&mut run.result, Ok(StepOutcome::Continue));
    // The iteration ends when the device says so (an event on CUDA; at
    // once on the CPU): only then may another lane take the job or its
    // memory. A failed step syncs too, before the failed job (and its
    // buffers) can be dropped.
    let synced = lane.sync();
    let result = result.and_then(|r| synced.map(|_| r));
    let end = shared.epoch.elapsed().as_secs_f64();
    // Checkpoints at report points: a lone trial's state, or every
    // member's of a fused group.
    let checkpoints: Vec<(Option<u64>, training::TrialSnapshot)> = match &result {
        Ok(StepOutcome::Report(_)) if shared.checkpoints => lone_state(&mut run.job, lane),
        Ok(StepOutcome::Members(steps)) if shared.checkpoints && !steps.is_empty() => {
            let states = run.job.member_states(lane).unwrap_or_default();
            states.into_iter().map(|(tag, s)| (Some(tag), s)).collect()
        }
        _ => Vec::new(),
    };
    let finals: Vec<(Option<u64>, training::TrialSnapshot)> = match &result {
        Ok(StepOutcome::Finished(_)) if shared.keep_final => lone_state(&mut run.job, lane),
        Ok(StepOutcome::Members(_)) if shared.keep_final => run
            .job
            .take_final_states()
            .into_iter()
            .map(|(tag, s)| (Some(tag), s))
            .collect(),
        _ => Vec::new(),
    };
    // A footprint too small for the device: back to waiting,
    // with its state on the host and a larger estimate.
    if is_oom(&result) {
        let _ = run.job.swap_out(lane);
        let mut st = shared.lock();
        flush(segment, id, &st);
        st.requeue_larger(job_id, run.job);
        st.admit_waiting();
        drop(st);
        shared.wake.notify_all();
        return;
    }
    let mut st = shared.lock();
    run.record(&st, id, segment, end);
    for (member, state) in finals {
        st.emit(CoreEvent::FinalState {
            job: job_id,
            member,
            state,
        });
    }
    // Only a job leaving (or measuring itself anew) frees memory or
    // changes other lanes' work.
    let left = st.return_step(id, job_id, run.job, result, end - run.t0);
    // After the report it covers, so that the runner stores the report's
    // value before the checkpoint.
    for (member, state) in checkpoints {
        st.emit(CoreEvent::Checkpoint {
            job: job_id,
            member,
            state,
        });
    }
    if left {
        st.admit_waiting();
        drop(st);
        shared.wake.notify_all();
    } else if st.could_give(id) {
        drop(st);
        shared.wake.notify_all();
    }
}

/// Moves a job's state to the host, off the lane.
fn swap_out<B: Backend>(
    lane: &mut Lane<B>,
    shared: &Shared<B>,
    job_id: JobId,
    mut job: Box<dyn Job<B>>,
) {
    let id = lane.id();
    let t = Instant::now();
    let result = job.swap_out(lane);
    let seconds = t.elapsed().as_secs_f64();
    let medium = job.swap_medium();
    take_back(
        shared,
        job_id,
        job,
        result,
        |st| {
            st.jobs.get_mut(&job_id).expect("job").swap_out = false;
        },
        |st, bytes| {
            st.leave_lane(job_id);
            st.emit(CoreEvent::Swapped {
                job: job_id,
                lane: id,
                out: true,
                bytes,
                seconds,
                medium,
            });
        },
    );
}

/// Gives back a job's allocator cache, then accounts its smaller
/// footprint.
fn release_cache<B: Backend>(
    lane: &mut Lane<B>,
    shared: &Shared<B>,
    job_id: JobId,
    mut job: Box<dyn Job<B>>,
) {
    let result = job.release_cache(lane);
    take_back(
        shared,
        job_id,
        job,
        result,
        |st| {
            let e = st.jobs.get_mut(&job_id).expect("job");
            (e.release, e.releasable) = (false, 0);
        },
        |st, _| {
            st.refit(job_id);
        },
    );
}

/// Saves a job's state for other processes' PBT receivers; a failure is
/// said in the event and fails nothing (the receivers go without it).
fn save_states<B: Backend>(
    lane: &mut Lane<B>,
    shared: &Shared<B>,
    job_id: JobId,
    mut job: Box<dyn Job<B>>,
    saves: Vec<(Option<u64>, std::path::PathBuf)>,
) {
    let done: Vec<CoreEvent> = saves
        .into_iter()
        .map(|(member, path)| {
            let error = job
                .save_for_exploit(lane, &path)
                .err()
                .map(|e| e.to_string());
            CoreEvent::Saved {
                trial: TrialRef {
                    job: job_id,
                    member,
                },
                path,
                error,
            }
        })
        .collect();
    take_back(
        shared,
        job_id,
        job,
        Ok(0),
        |_| {},
        |st, _| done.into_iter().for_each(|e| st.emit(e)),
    );
}

/// PBT's exploit: the receiver takes the donor's state, then both go back
/// to the table. A failure fails the receiver alone: a lone trial; a fused
/// group's member is left as it was (its group and the other members go
/// on), and the event says why.
fn take_state<B: Backend>(lane: &mut Lane<B>, shared: &Shared<B>, exploit: Exploit<B>) {
    let Exploit {
        receiver: (receiver, mut job),
        donor,
        new,
    } = exploit;
    let t = Instant::now();
    // Both states on the device: a device-to-device copy (an external
    // worker's goes through a file; a stored donor's from the host).
    let (donor, mut donor_job, on_device, result) = match donor {
        DonorWork::Held(d, Some(mut dj)) => {
            let on_device =
                job.device_slot(receiver.member).is_some() && dj.device_slot(d.member).is_some();
            let r = job.exploit(lane, receiver.member, &mut *dj, d.member, &new);
            (Some(d), Some(dj), on_device, r)
        }
        DonorWork::Held(d, None) => (
            Some(d),
            None,
            job.device_slot(receiver.member).is_some(),
            match (receiver.member, d.member) {
                (Some(r), Some(dm)) => job.exploit_within(lane, r, dm, &new),
                _ => Err(WorkerError::Config(
                    "a trial cannot take its own state".into(),
                )),
            },
        ),
        DonorWork::Stored(state) => (
            None,
            None,
            false,
            job.exploit_stored(lane, receiver.member, *state, &new),
        ),
    };
    // Queued copies end before either job can go to another lane.
    let result = result.and_then(|bytes| lane.sync().map(|_| bytes));
    let seconds = t.elapsed().as_secs_f64();
    // The receiver's new state, for its checkpoint: a resumed run goes on
    // from it.
    let state = match (&result, receiver.member) {
        (Ok(_), None) if shared.checkpoints => job.export_state(lane).ok(),
        (Ok(_), Some(m)) if shared.checkpoints => job
            .member_states(lane)
            .ok()
            .and_then(|all| all.into_iter().find_map(|(t, s)| (t == m).then_some(s))),
        _ => None,
    };
    let id = lane.id();
    {
        let mut st = shared.lock();
        if let (Some(d), Some(dj)) = (donor, donor_job.take()) {
            st.jobs.get_mut(&d.job).expect("donor").job = Some(dj);
            if st.jobs[&d.job].prune {
                st.remove(d.job, Ending::Pruned);
            }
        }
        st.emit(CoreEvent::Exploited {
            receiver,
            donor,
            lane: id,
            bytes: *result.as_ref().unwrap_or(&0),
            seconds,
            on_device,
            error: result.as_ref().err().map(|e| e.to_string()),
            state,
        });
    }
    // A member's failed exploit is its own: the group goes on.
    let result = match (result, receiver.member) {
        (Err(_), Some(_)) => Ok(0),
        (r, _) => r,
    };
    take_back(shared, receiver.job, job, result, |_| {}, |_, _| {});
}

/// Returns a job to the table after work that was not a step (`clear`
/// takes back the request): `done` on success, then the end of a job
/// pruned meanwhile; a failure ends it. Then admits what now fits.
fn take_back<B: Backend>(
    shared: &Shared<B>,
    job_id: JobId,
    job: Box<dyn Job<B>>,
    result: Result<usize, WorkerError>,
    clear: impl FnOnce(&mut State<B>),
    done: impl FnOnce(&mut State<B>, usize),
) {
    let mut st = shared.lock();
    st.jobs.get_mut(&job_id).expect("job").job = Some(job);
    clear(&mut st);
    match result {
        Ok(bytes) => {
            done(&mut st, bytes);
            // Pruned while the work ran: it ends now.
            if st.jobs[&job_id].prune {
                st.remove(job_id, Ending::Pruned);
            }
        }
        Err(error) => st.remove(job_id, Ending::Failed(error)),
    }
    st.admit_waiting();
    drop(st);
    shared.wake.notify_all();
}

/// A lone trial's exported state, untagged (none when export fails).
fn lone_state<B: Backend>(
    job: &mut Box<dyn Job<B>>,
    lane: &mut Lane<B>,
) -> Vec<(Option<u64>, training::TrialSnapshot)> {
    job.export_state(lane)
        .ok()
        .map(|s| (None, s))
        .into_iter()
        .collect()
}

/// Whether a step failed for want of device memory.
fn is_oom(result: &Result<StepOutcome, WorkerError>) -> bool {
    matches!(
        result,
        Err(WorkerError::Kernel(
            kernels::KernelError::OutOfMemory { .. }
        ))
    )
}
