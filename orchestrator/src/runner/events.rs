//! The core's events, turned into decisions and writes: reports go to the
//! pruner (continue, pause, prune) and to storage; finished and failed
//! trials are recorded and release their slots; paused trials are promoted
//! when the pruner says so.

use std::collections::BTreeMap;

use kernels::Backend;
use training::{MemberOutcome, Report, WorkerError};

use super::{MemberId, Pending, RunState, Runner, TrialHandle};
use crate::error::Result;
use crate::pruner::{Curves, Decision, priority, value_at};
use crate::salus::core::CoreEvent;
use crate::sampler::Stopped;
use crate::storage::TrialState;
use crate::storage::writer::{TrialEnd, WriteOp};
use crate::storage::{Claim, TrialNumber};
use crate::study::PrunerKind;

/// A finished trial's other objectives' values, and its constraints' by key.
type EndValues = (Vec<f64>, Vec<(String, f64)>);

impl Runner<'_> {
    /// Workers that hold GPU memory their clients do not report
    /// (`external::nvml`): said once each, and stored as an event.
    pub(super) fn warn_unreported_memory<B: Backend>(&mut self, st: &RunState<B>) -> Result<()> {
        if self.study.worker.is_none() {
            return Ok(());
        }
        for w in crate::external::nvml::take_warnings() {
            self.reporter.note(&format!("warning: {}", w.message()));
            let trial_id = st
                .in_flight
                .values()
                .find(|f| f.pending.number.0 as u64 == w.trial)
                .map(|f| f.pending.claim.trial_id);
            self.writer.send(WriteOp::Event {
                study_id: self.info.id,
                trial_id,
                kind: "worker_unreported_memory",
                detail: serde_json::json!({ "pid": w.pid, "real_bytes": w.real, "reported_bytes": w.reported })
                    .to_string(),
            })?;
        }
        Ok(())
    }

    pub(super) fn on_event<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        event: CoreEvent,
    ) -> Result<()> {
        match event {
            CoreEvent::Admitted { job, lane } => {
                let ids: Vec<TrialHandle> = match st.fusion.groups.get_mut(&job) {
                    Some(g) => {
                        g.lane = Some(lane);
                        g.members.iter().map(|&m| TrialHandle::Member(m)).collect()
                    }
                    None => vec![TrialHandle::Alone(job)],
                };
                for f in ids.iter().filter_map(|id| st.in_flight.get(id)) {
                    self.writer.send(WriteOp::Resources {
                        claim: f.pending.claim,
                        resources: st.resources(f, lane),
                    })?;
                    if let Some(device) = st.placement(lane) {
                        self.reporter.trial_placed(f.pending.number, device);
                    }
                }
                Ok(())
            }
            CoreEvent::Report { job, report } => {
                self.on_report(st, TrialHandle::Alone(job), report)
            }
            CoreEvent::Members {
                job,
                steps,
                device_seconds,
                members,
            } => {
                // Every member at a report point holds the group until the
                // pruner (or PBT) has decided on all of them.
                // (Only those still in flight: no decision comes for others.)
                let deciding = self.study.pruner != PrunerKind::None || st.pbt.is_some();
                let mut holding = false;
                if let Some(group) = st.fusion.groups.get_mut(&job) {
                    for m in &steps {
                        let member = MemberId(m.tag);
                        if matches!(m.outcome, MemberOutcome::Report(_))
                            && deciding
                            && st.in_flight.contains_key(&TrialHandle::Member(member))
                        {
                            holding |= group.held.insert(member);
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
                    let member = MemberId(m.tag);
                    let run = TrialHandle::Member(member);
                    match m.outcome {
                        MemberOutcome::Report(r) => self.on_report(st, run, r)?,
                        MemberOutcome::Left => {
                            if let Some(control) =
                                st.fusion.groups.get(&job).map(|g| g.control.clone())
                            {
                                st.take_back(&control);
                            }
                        }
                        MemberOutcome::Finished(r) => {
                            st.leave_group(job, member);
                            let iterations = r.iteration;
                            self.on_finished(st, run, r, iterations, share)?
                        }
                        MemberOutcome::Failed(reason) => {
                            st.leave_group(job, member);
                            let iterations = st
                                .in_flight
                                .get(&run)
                                .and_then(|f| st.curves.get(&f.pending.number))
                                .map_or(0, |c| c.values.len() as i64);
                            self.fail_flight(st, run, iterations, share, reason)?;
                        }
                    }
                }
                if shrank && st.fusion.groups.contains_key(&job) {
                    self.record_group(st, job, &[])?;
                }
                // The core holds a group that reported. When members held
                // it, the last decision released it (and it may have run on
                // and be held again since: releasing now would skip that
                // report's decisions). When none did (every reporter had
                // ended meanwhile), nothing else will release it.
                if reported && !holding && deciding {
                    st.core.release(job);
                }
                if st.pbt.is_some() {
                    self.pbt_group_at_point(st, job);
                    self.pbt_meet(st, false)?;
                }
                Ok(())
            }
            CoreEvent::Checkpoint { job, member, state } => {
                let run = member.map_or(TrialHandle::Alone(job), |m| {
                    TrialHandle::Member(MemberId(m))
                });
                // Through the writer: saved once the values it covers are committed.
                if let (Some(c), Some(f)) = (&self.checkpoints, st.in_flight.get(&run)) {
                    self.writer.send(WriteOp::SaveFile {
                        claim: f.pending.claim,
                        path: c.path_of(f.pending.claim.trial_id),
                        bytes: state.to_bytes(),
                        step: state.reports as i64,
                    })?;
                }
                // A member's state at its exploit point, for processes
                // that share the study (see `pbt_shared`).
                if let Some(pop) = st.pbt.as_mut() {
                    pop.keep_point_state(run, state, st.liveness.elsewhere > 0);
                }
                Ok(())
            }
            CoreEvent::FinalState { job, member, state } => {
                let run = member.map_or(TrialHandle::Alone(job), |m| {
                    TrialHandle::Member(MemberId(m))
                });
                st.kept.finals.insert(run, state);
                Ok(())
            }
            CoreEvent::GroupEnded { job, .. } => {
                // Joiners it never took wait for another group.
                st.end_group(job);
                Ok(())
            }
            CoreEvent::Finished {
                job,
                report,
                iterations,
                device_seconds,
            } => self.on_finished(
                st,
                TrialHandle::Alone(job),
                report,
                iterations,
                device_seconds,
            ),
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
                let jobs: Vec<TrialHandle> = if st.fusion.groups.contains_key(&job) {
                    st.end_group(job)
                        .into_iter()
                        .map(TrialHandle::Member)
                        .collect()
                } else {
                    vec![TrialHandle::Alone(job)]
                };
                for j in jobs {
                    self.fail_flight(st, j, iterations as i64, device_seconds, reason.clone())?;
                }
                Ok(())
            }
            CoreEvent::Pruned { job, .. } if st.fusion.groups.contains_key(&job) => {
                // A group left without members (see `RunState::prune`).
                st.end_group(job);
                Ok(())
            }
            CoreEvent::Pruned {
                job,
                iterations,
                device_seconds,
            } => self.on_pruned(st, TrialHandle::Alone(job), iterations, device_seconds),
            CoreEvent::Refit {
                job,
                lane,
                footprint,
            } => {
                // What a worker's client measured replaces the declared need.
                if let Some(f) = st.in_flight.get_mut(&TrialHandle::Alone(job)) {
                    f.footprint = footprint;
                    let f = &st.in_flight[&TrialHandle::Alone(job)];
                    self.writer.send(WriteOp::Resources {
                        claim: f.pending.claim,
                        resources: st.resources(f, lane),
                    })?;
                }
                Ok(())
            }
            CoreEvent::Requeued {
                job,
                persistent_bytes,
                ephemeral_bytes,
            } => {
                // Out of device memory: fewer trials at once from now on,
                // and this one waits for the larger grant (stored when it
                // is admitted again).
                let before = st.max_concurrent;
                st.max_concurrent = before.saturating_sub(1).max(1);
                if let Some(f) = st.in_flight.get_mut(&TrialHandle::Alone(job)) {
                    f.footprint.persistent_bytes = persistent_bytes;
                    f.footprint.ephemeral_bytes = ephemeral_bytes;
                    self.reporter.note(&format!(
                        "trial {} ran out of device memory: it waits for a larger grant; at most {} trials at once now (was {before})",
                        f.pending.number, st.max_concurrent
                    ));
                    self.writer.send(WriteOp::Event {
                        study_id: self.info.id,
                        trial_id: Some(f.pending.claim.trial_id),
                        kind: "trial_out_of_memory",
                        detail: serde_json::json!({ "max_concurrent": st.max_concurrent })
                            .to_string(),
                    })?;
                }
                Ok(())
            }
            CoreEvent::Swapped {
                job,
                out: true,
                bytes,
                medium: training::SwapMedium::Checkpoint,
                ..
            } if self.study.worker.is_some() && bytes > 0 => {
                // An external worker swapped out saved its checkpoint,
                // covering every step it reported.
                if let Some(f) = st.in_flight.get_mut(&TrialHandle::Alone(job)) {
                    let step = st
                        .curves
                        .get(&f.pending.number)
                        .and_then(|c| c.values.keys().next_back().copied())
                        .map_or(0, |s| s as i64);
                    f.pending.external_resume = Some((f.pending.claim.attempt, step));
                    self.writer
                        .send(self.external_checkpoint_saved(f.pending.claim, step))?;
                }
                self.telemetry(st, event)
            }
            CoreEvent::Exploited {
                receiver,
                bytes,
                seconds,
                on_device,
                error,
                state,
                ..
            } => {
                let copied = super::pbt::Copied {
                    bytes,
                    seconds,
                    on_device,
                    state,
                };
                let receiver = match receiver.member {
                    Some(m) => TrialHandle::Member(MemberId(m)),
                    None => TrialHandle::Alone(receiver.job),
                };
                self.pbt_exploited(st, receiver, copied, error)
            }
            CoreEvent::Saved { trial, path, error } => {
                let run = match trial.member {
                    Some(m) => TrialHandle::Member(MemberId(m)),
                    None => TrialHandle::Alone(trial.job),
                };
                let number = st.in_flight.get(&run).map(|f| f.pending.number);
                let failed = match st.pbt.as_mut() {
                    Some(pop) => pop.keep_saved_state(run, path, error),
                    None => {
                        let _ = std::fs::remove_file(&path);
                        error
                    }
                };
                if let (Some(why), Some(number)) = (failed, number) {
                    self.reporter.note(&format!(
                        "pbt: trial {number} could not save its state for other processes' \
                         members at this point: {why}"
                    ));
                }
                Ok(())
            }
            telemetry => self.telemetry(st, telemetry),
        }
    }

    /// An external worker's auxiliary metrics and user attributes.
    fn store_extras(&self, claim: Claim, report: &Report) -> Result<()> {
        if report.extras.is_empty() {
            return Ok(());
        }
        Ok(self.writer.send(WriteOp::Extras {
            claim,
            step: report.step as i64,
            extras: report.extras.clone(),
        })?)
    }

    /// Stores a report, lets the pruner decide (the core holds the trial
    /// meanwhile when a pruner is set), and updates priorities.
    pub(super) fn on_report<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        run: TrialHandle,
        report: Report,
    ) -> Result<()> {
        let study = self.study;
        let Some(f) = st.in_flight.get(&run) else {
            return Ok(());
        };
        let value = report.metric(&study.metric).unwrap_or(f64::NAN);
        let (claim, number) = (f.pending.claim, f.pending.number);
        self.writer.send(WriteOp::Intermediate {
            claim,
            step: report.step as i64,
            value,
        })?;
        self.store_extras(claim, &report)?;
        self.reporter
            .trial_report(number, report.step, &study.metric, value);
        st.curves
            .entry(number)
            .or_default()
            .values
            .insert(report.step, value);
        if st.pbt.is_some() {
            return self.pbt_report(st, run, report.step, report.iteration);
        }
        let rung = st.pruner.rung(number, report.step);
        let priority =
            rung.map(|k| rank_priority(k, number, report.step, &st.curves, study.direction));
        match st
            .pruner
            .decide(number, report.step, &st.curves, study.direction)
        {
            Decision::Continue => {
                if let (Some(k), Some(p)) = (rung, priority) {
                    st.set_priority(run, p);
                    self.writer.send(WriteOp::Priority {
                        claim,
                        priority: p,
                        rung: Some(k as i64),
                        reason: "rung",
                    })?;
                }
                st.release(run);
            }
            Decision::Pause { rung: k } => {
                let p = priority.unwrap_or(0.0);
                st.set_priority(run, p);
                st.pause(run);
                st.release(run);
                st.paused.insert(run, k);
                // Below the cut, as Optuna's successive halving would have
                // pruned it: the sampler learns it so until a promotion.
                st.stopped(
                    number,
                    Some(Stopped::Pruned {
                        step: report.step as i64,
                        value,
                    }),
                );
                self.writer.send(WriteOp::Priority {
                    claim,
                    priority: p,
                    rung: Some(k as i64),
                    reason: "paused",
                })?;
            }
            Decision::Prune => {
                st.closing.insert(run);
                let member = st.prune(run);
                self.writer.send(WriteOp::Priority {
                    claim,
                    priority: priority.unwrap_or(0.0),
                    rung: rung.map(|k| k as i64),
                    reason: "pruned",
                })?;
                if member {
                    // It leaves its group at the next boundary; no core event follows.
                    let share = 0.0;
                    self.on_pruned(st, run, report.iteration, share)?;
                }
            }
        }
        self.promote(st)
    }

    /// What a finished trial gives beyond its first objective: the other
    /// objectives' values, in the study's order (none for a study of one),
    /// and each constraint's value (`study::Constraint::value`). A value
    /// that is not finite fails the trial, as its first objective's would.
    fn end_values<B: Backend>(
        &self,
        st: &RunState<B>,
        f: &super::Flight,
        report: &Report,
        device_seconds: f64,
    ) -> std::result::Result<EndValues, String> {
        let study = self.study;
        if study.worker.is_some() {
            // A worker's `done([a, b, ...])` names none: they come in order.
            let more = &report.extras.more_values;
            if more.len() + 1 != study.objectives.len() {
                return Err(format!(
                    "the worker's done() sent {} values for the study's {} objectives ({}); \
                     send a list, one per metric, in that order",
                    more.len() + 1,
                    study.objectives.len(),
                    study
                        .objectives
                        .iter()
                        .map(|(m, _)| m.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        let value = |name: &str| self.end_value(st, f, report, device_seconds, name);
        let mut more = Vec::new();
        for (name, _) in study.objectives.iter().skip(1) {
            let v = value(name)?;
            if !v.is_finite() {
                return Err(format!("{name} is {v}"));
            }
            more.push(v);
        }
        let mut constraints = Vec::new();
        for c in &study.constraints {
            let v = value(&c.metric)?;
            if !v.is_finite() {
                return Err(format!("{} is {v} (constraint {})", c.metric, c.text));
            }
            constraints.push((c.text.clone(), c.value(v)));
        }
        Ok((more, constraints))
    }

    /// A value known at a trial's end, by name: for a worker, one of the
    /// study's metrics (its `done()` list, in order); for a built-in
    /// trial, a reported metric or a built-in objective
    /// (`study::BUILT_IN_OBJECTIVES`).
    fn end_value<B: Backend>(
        &self,
        st: &RunState<B>,
        f: &super::Flight,
        report: &Report,
        device_seconds: f64,
        name: &str,
    ) -> std::result::Result<f64, String> {
        let study = self.study;
        if study.worker.is_some() {
            return Ok(match study.objectives.iter().position(|(m, _)| m == name) {
                Some(0) => report.metric(name).unwrap_or(f64::NAN),
                Some(i) => report
                    .extras
                    .more_values
                    .get(i - 1)
                    .copied()
                    .unwrap_or(f64::NAN),
                None => f64::NAN,
            });
        }
        Ok(match name {
            "params" | "flops" => {
                let cfg = study.trial_config(&f.pending.params, 0);
                let data = &st.data[0];
                let spec = cfg
                    .spec(data.features, data.task, data.image)
                    .map_err(|e| format!("{name}: {e}"))?;
                if name == "params" {
                    spec.n_params() as f64
                } else {
                    // Forward FLOPs of one example: two per multiply-add.
                    2.0 * spec.macs_per_sample() as f64
                }
            }
            "train_time" => device_seconds,
            "memory" => {
                let fp = f.footprint;
                (fp.persistent_bytes + fp.ephemeral_bytes) as f64
            }
            metric => report.metric(metric).unwrap_or(f64::NAN),
        })
    }

    pub(super) fn on_finished<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        run: TrialHandle,
        report: Report,
        iterations: u64,
        device_seconds: f64,
    ) -> Result<()> {
        let study = self.study;
        let Some(f) = st.in_flight.remove(&run) else {
            st.kept.finals.remove(&run);
            return Ok(());
        };
        st.forget_pauses(run);
        st.finished += 1;
        let value = report.metric(&study.metric).unwrap_or(f64::NAN);
        let curve = st.curves.entry(f.pending.number).or_default();
        curve.values.insert(report.step, value);
        curve.finished = true;
        self.promote(st)?;
        self.writer.send(WriteOp::Intermediate {
            claim: f.pending.claim,
            step: report.step as i64,
            value,
        })?;
        self.store_extras(f.pending.claim, &report)?;
        if !value.is_finite() {
            st.kept.finals.remove(&run);
            return self.fail(
                st,
                &f.pending,
                iterations as i64,
                device_seconds,
                format!("{} is {value}", study.metric),
            );
        }
        st.failures = (0, None);
        self.forget_checkpoint(&f.pending);
        let (more_values, constraints) = match self.end_values(st, &f, &report, device_seconds) {
            Ok(v) => v,
            Err(reason) => {
                st.kept.finals.remove(&run);
                return self.fail(st, &f.pending, iterations as i64, device_seconds, reason);
            }
        };
        let values = super::all_values(study, Some(value), &more_values);
        self.writer.send(WriteOp::Finish(TrialEnd {
            claim: f.pending.claim,
            state: TrialState::Complete,
            value: Some(value),
            more_values,
            constraints: constraints.clone(),
            iterations: iterations as i64,
            device_seconds,
            fail_reason: None,
        }))?;
        self.keep_model(&mut st.kept, run, &f.pending, value)?;
        self.writer.flush()?;
        if self.lost_at_its_end(st, &f.pending) {
            return Ok(());
        }
        let feasible = constraints.iter().all(|c| c.1 <= 0.0);
        if feasible
            && st
                .best
                .is_none_or(|(_, b)| study.direction.better(value, b))
        {
            st.best = Some((f.pending.number, value));
        }
        st.history[f.history_index].value = Some(value);
        st.history[f.history_index].values = values;
        st.history[f.history_index].violation = super::violation(constraints.iter().map(|c| c.1));
        self.reporter
            .trial_end(f.pending.number, Some(value), st.best, st.finished);
        Ok(())
    }

    pub(super) fn on_pruned<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        run: TrialHandle,
        iterations: u64,
        device_seconds: f64,
    ) -> Result<()> {
        let Some(f) = st.in_flight.remove(&run) else {
            return Ok(());
        };
        st.finished += 1;
        let number = f.pending.number;
        let rung = st.forget_pauses(run).or_else(|| {
            st.curves.get(&number).and_then(|c| {
                c.values
                    .keys()
                    .rev()
                    .find_map(|s| st.pruner.rung(number, *s))
            })
        });
        if let Some(k) = rung {
            self.writer.send(WriteOp::TrialAttr {
                claim: f.pending.claim,
                key: "salus:rung",
                value_json: k.to_string(),
            })?;
        }
        if let Some(c) = st.curves.get_mut(&number) {
            c.finished = true;
        }
        st.failures = (0, None);
        self.forget_checkpoint(&f.pending);
        self.writer.send(WriteOp::Finish(TrialEnd {
            claim: f.pending.claim,
            state: TrialState::Pruned,
            value: None,
            more_values: Vec::new(),
            constraints: Vec::new(),
            iterations: iterations as i64,
            device_seconds,
            fail_reason: None,
        }))?;
        self.writer.flush()?;
        if self.lost_at_its_end(st, &f.pending) {
            return Ok(());
        }
        let last = st
            .curves
            .get(&number)
            .and_then(|c| c.values.iter().next_back().map(|(&s, &v)| (s, v)));
        let (step, value) = last.map_or((-1, f64::NAN), |(s, v)| (s as i64, v));
        st.stopped(number, Some(Stopped::Pruned { step, value }));
        let at = last.map(|(s, _)| (s, rung));
        self.reporter.trial_pruned(number, at, st.best, st.finished);
        Ok(())
    }

    /// Whether the trial that just ended here (its end flushed) had been
    /// lost to another process: then its end did not land, it does not
    /// count here, and the run says so instead of reporting an end.
    fn lost_at_its_end<B: Backend>(&mut self, st: &mut RunState<B>, p: &Pending) -> bool {
        if !self.writer.is_lost(p.claim.trial_id) {
            return false;
        }
        st.finished -= 1;
        self.reporter.note(&format!(
            "trial {}: lost to another process before it ended here (this process did not beat \
             for longer than the liveness limit of {} s); its end was not written",
            p.number, st.liveness.limit_s
        ));
        true
    }

    /// Resumes the paused trials the pruner now promotes.
    pub(super) fn promote<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        let by_number: BTreeMap<TrialNumber, usize> = st
            .paused
            .iter()
            .filter_map(|(run, k)| st.in_flight.get(run).map(|f| (f.pending.number, *k)))
            .collect();
        for number in st
            .pruner
            .promotions(&by_number, &st.curves, self.study.direction)
        {
            let Some((&run, f)) = st
                .in_flight
                .iter()
                .find(|(_, f)| f.pending.number == number)
            else {
                continue;
            };
            let k = st.paused.remove(&run).unwrap_or(0);
            let step = st
                .curves
                .get(&number)
                .and_then(|c| c.values.keys().next_back().copied())
                .unwrap_or(0);
            let p = rank_priority(k, number, step, &st.curves, self.study.direction);
            let claim = f.pending.claim;
            st.stopped(number, None);
            st.set_priority(run, p);
            // Paused from the dashboard as well: it runs once resumed there.
            if !st.liveness.user_paused.contains(&run) {
                st.resume(run);
            }
            self.writer.send(WriteOp::Priority {
                claim,
                priority: p,
                rung: Some(k as i64),
                reason: "promoted",
            })?;
        }
        Ok(())
    }

    /// Ends in-flight trial `run` as FAIL with `reason`.
    pub(super) fn fail_flight<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        run: TrialHandle,
        iterations: i64,
        seconds: f64,
        reason: String,
    ) -> Result<()> {
        let Some(f) = st.in_flight.remove(&run) else {
            return Ok(());
        };
        st.forget_pauses(run);
        if let TrialHandle::Member(m) = run {
            st.fusion.parked.remove(&m);
        }
        st.closing.remove(&run);
        st.finished += 1;
        self.fail(st, &f.pending, iterations, seconds, reason)?;
        self.reporter
            .trial_end(f.pending.number, None, st.best, st.finished);
        Ok(())
    }

    /// Ends a trial as FAIL with `reason`, and counts it toward the
    /// failures in a row that stop the run.
    pub(super) fn fail<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        p: &Pending,
        iterations: i64,
        seconds: f64,
        reason: String,
    ) -> Result<()> {
        self.forget_checkpoint(p);
        self.writer.send(WriteOp::Finish(TrialEnd {
            claim: p.claim,
            state: TrialState::Fail,
            value: None,
            more_values: Vec::new(),
            constraints: Vec::new(),
            iterations,
            device_seconds: seconds,
            fail_reason: Some(reason.clone()),
        }))?;
        self.writer.flush()?;
        if self.lost_at_its_end(st, p) {
            return Ok(());
        }
        st.stopped(p.number, Some(Stopped::Failed));
        self.reporter.trial_failed(p.number, &reason);
        st.failures = (st.failures.0 + 1, Some(reason));
        Ok(())
    }

    /// Deletes a trial's checkpoints (every attempt's, and files a killed
    /// process left staged), in order after any save still queued, while
    /// its claim holds. Its own checkpoint goes even where it is not there
    /// yet: a save may still be queued (an external trial's, its latest
    /// recorded one).
    pub(super) fn forget_checkpoint(&self, p: &Pending) {
        let claim = p.claim;
        if let Some(c) = &self.checkpoints {
            let mut paths = c.files_of(claim.trial_id);
            let own = c.path_of(claim.trial_id);
            let external = p
                .external_resume
                .map(|(attempt, step)| c.external_at(claim.trial_id, attempt, step));
            for own in std::iter::once(own).chain(external) {
                if !paths.contains(&own) {
                    paths.push(own);
                }
            }
            for path in paths {
                let _ = self.writer.send(WriteOp::RemoveFile { claim, path });
            }
        }
    }
}

/// A trial's priority at rung `k`: its rank among the values reported at
/// `step` by every trial.
pub(super) fn rank_priority(
    k: usize,
    number: TrialNumber,
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
