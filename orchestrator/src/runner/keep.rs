//! `[study] keep`: the final states of finishing trials (the core's
//! `FinalState` events) become stored models once the trial is COMPLETE.

use std::collections::BTreeMap;

use serde_json::json;
use training::TrialSnapshot;

use super::{Pending, Runner, TrialHandle};
use crate::error::Result;
use crate::kept_model::{self, Standardisation};
use crate::storage::writer::WriteOp;
use crate::study::{Direction, Keep};

/// Final states waiting for their trial's end, and what a model needs of
/// the data.
#[derive(Default)]
pub(super) struct Kept {
    pub norm: Option<Standardisation>,
    pub finals: BTreeMap<TrialHandle, TrialSnapshot>,
}

impl Runner<'_> {
    /// Stores the model of a trial that just finished COMPLETE with
    /// `value`, as `[study] keep` says; a trial without a final state (an
    /// external worker's) has none.
    pub(super) fn keep_model(
        &mut self,
        kept: &mut Kept,
        run: TrialHandle,
        pending: &Pending,
        value: f64,
    ) -> Result<()> {
        let study = self.study;
        let (Some(state), Some(norm)) = (kept.finals.remove(&run), &kept.norm) else {
            return Ok(());
        };
        let best_of = match study.keep {
            Keep::None => return Ok(()),
            Keep::Best => Some(study.direction == Direction::Maximize),
            Keep::All => None,
        };
        // A kept model is an MLP (the study file refuses `keep` for a conv net).
        let spec = study
            .trial_config(&pending.params, 0)
            .spec(norm.feature_mean.len(), norm.task, None)
            .map_err(|e| e.to_string());
        let (weights, spec) = match spec
            .and_then(|spec| kept_model::safetensors(&spec, &state, norm).map(|w| (w, spec)))
        {
            Ok(w) => w,
            Err(why) => {
                self.reporter.note(&format!(
                    "trial {}: its model is not kept: {why}",
                    pending.number
                ));
                return Ok(());
            }
        };
        let params: serde_json::Map<String, serde_json::Value> = pending
            .params
            .keys()
            .map(|n| (n.clone(), study.value(&pending.params, n).to_json()))
            .collect();
        let trial = json!({
            "study": study.name,
            "number": pending.number,
            "metric": study.metric,
            "value": value,
            "params": params,
            "fixed": study.fixed_json(),
        });
        Ok(self.writer.send(WriteOp::KeepModel {
            claim: pending.claim,
            architecture: kept_model::architecture(&spec, norm, trial).to_string(),
            weights,
            best_of,
        })?)
    }
}
