//! The core's timeline (segments, swaps, switches) as storage writes, and
//! the per-lane totals of `salus_lane_stats`.

use std::collections::BTreeMap;
use std::time::Instant;

use kernels::Backend;

use super::{LaneTally, RunState, Runner};
use crate::error::Result;
use crate::salus::JobId;
use crate::salus::core::CoreEvent;
use crate::storage::TrialId;
use crate::storage::Writer;
use crate::storage::writer::WriteOp;

impl Runner<'_> {
    pub(super) fn telemetry<B: Backend>(
        &mut self,
        st: &mut RunState<B>,
        event: CoreEvent,
    ) -> Result<()> {
        record_telemetry(
            &self.writer,
            st.timeline.run_id,
            &st.timeline.trial_ids,
            &mut st.timeline.lanes,
            st.timeline.started,
            event,
        )
    }
}

/// Stores the core's timeline events (segments, swaps, switch totals); others are ignored.
pub(super) fn record_telemetry(
    writer: &Writer,
    run_id: crate::storage::RunId,
    trial_ids: &BTreeMap<JobId, TrialId>,
    lanes: &mut BTreeMap<usize, LaneTally>,
    started: Instant,
    event: CoreEvent,
) -> Result<()> {
    match event {
        CoreEvent::Swapped {
            job,
            lane,
            out,
            bytes,
            seconds,
            medium,
        } => {
            let time_s = started.elapsed().as_secs_f64();
            writer.send(WriteOp::Swap {
                run_id,
                trial_id: trial_ids.get(&job).copied(),
                lane: lane as i64,
                out,
                bytes: bytes as i64,
                seconds,
                time_s,
                medium: medium.name(),
            })?;
        }
        CoreEvent::Segment {
            lane,
            job,
            start,
            end,
            iterations,
        } => {
            let t = lanes.entry(lane).or_default();
            t.iterations += iterations as i64;
            t.busy_s += end - start;
            writer.send(WriteOp::Segment {
                run_id,
                lane: lane as i64,
                trial_id: trial_ids.get(&job).copied(),
                start_s: start,
                end_s: end,
                iterations: iterations as i64,
            })?;
        }
        CoreEvent::Switch { lane, seconds, .. } => {
            let t = lanes.entry(lane).or_default();
            t.switches += 1;
            t.switch_sum_s += seconds;
            t.switch_max_s = t.switch_max_s.max(seconds);
        }
        _ => {}
    }
    Ok(())
}
