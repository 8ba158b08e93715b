//! Several devices in one run (`--device cuda:0,cuda:1`): each has its own
//! Salus core (`salus_core::devices`). New trials are placed where they
//! fit and lanes are least loaded (in `fill` and `groups`); here, a trial
//! that waits off a full device (its state on the host: not started, or
//! swapped out) moves to one with room now, and the run's end says how
//! busy each device was.

use std::collections::BTreeMap;

use kernels::Backend;

use super::{LaneTally, RunState, Runner, TrialHandle};
use crate::error::Result;
use crate::storage::writer::WriteOp;

impl Runner<'_> {
    /// Moves waiting trials off full devices ([`DeviceCores::rebalance`]).
    ///
    /// [`DeviceCores::rebalance`]: crate::salus::devices::DeviceCores::rebalance
    pub(super) fn rebalance<B: Backend>(&mut self, st: &mut RunState<B>) -> Result<()> {
        if st.core.len() < 2 {
            return Ok(());
        }
        let data = st.data.clone();
        for (job, from, to) in st.core.rebalance(|job, d| job.rehome(&data[d])) {
            let Some(f) = st.in_flight.get(&TrialHandle::Alone(job)) else {
                continue;
            };
            let (from, to) = (st.core.label(from), st.core.label(to));
            self.writer.send(WriteOp::Event {
                study_id: self.info.id,
                trial_id: Some(f.pending.claim.trial_id),
                kind: "trial_moved",
                detail: serde_json::json!({ "from": from, "to": to }).to_string(),
            })?;
            self.reporter.note(&format!(
                "trial {} waits on a full {from}: it moves to {to}",
                f.pending.number
            ));
        }
        Ok(())
    }
}

impl<B: Backend> RunState<B> {
    /// Where a trial admitted on `lane` runs, for the progress output;
    /// `None` on one device.
    pub(super) fn placement(&self, lane: usize) -> Option<&str> {
        (self.core.len() > 1).then(|| self.core.label(self.core.device_of_lane(lane)))
    }
}

/// One line per device at the run's end: iterations, and how busy its
/// lanes were over `wall_s`; nothing on one device. `layout` is each
/// device's name and lanes ([`DeviceCores::layout`]).
///
/// [`DeviceCores::layout`]: crate::salus::devices::DeviceCores::layout
pub(super) fn device_summary(
    layout: &[(String, std::ops::Range<usize>)],
    lanes: &BTreeMap<usize, LaneTally>,
    wall_s: f64,
) -> Vec<String> {
    if layout.len() < 2 {
        return Vec::new();
    }
    layout
        .iter()
        .map(|(label, range)| {
            let mine = lanes.iter().filter(|(l, _)| range.contains(l));
            let iterations: i64 = mine.clone().map(|(_, t)| t.iterations).sum();
            let busy_s: f64 = mine.map(|(_, t)| t.busy_s).sum();
            let busy = 100.0 * busy_s / (wall_s * range.len().max(1) as f64).max(1e-9);
            format!("{label}: {iterations} iterations, its lanes {busy:.0}% busy")
        })
        .collect()
}
