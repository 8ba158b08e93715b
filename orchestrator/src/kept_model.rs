//! A finished trial's model, as users take it away (`[study] keep` and
//! `salus-tune export`): its weights as safetensors, and a JSON document
//! that says how to run them, standardisation included.
//!
//! Tensors, all float32: `layer{i}.weight` (`fan_in x fan_out`, row-major,
//! so a layer is `x @ W + b`), `layer{i}.bias`, `input.mean` and
//! `input.std` (a row is standardised as `(x - mean) / std` before the
//! first layer), and for regression `target.mean` and `target.std` (the
//! output is `y * std + mean` in the target's units).

use std::collections::HashMap;

use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value, json};
use training::data::{SplitData, Task};
use training::{ModelSpec, TrialSnapshot};

/// What the model needs of the data: its standardisation and task.
#[derive(Debug, Clone, PartialEq)]
pub struct Standardisation {
    pub task: Task,
    pub feature_mean: Vec<f32>,
    pub feature_std: Vec<f32>,
    pub target_mean: Vec<f32>,
    pub target_std: Vec<f32>,
}

impl Standardisation {
    pub fn of(data: &SplitData) -> Self {
        Standardisation {
            task: data.task,
            feature_mean: data.feature_mean.clone(),
            feature_std: data.feature_std.clone(),
            target_mean: data.target_mean.clone(),
            target_std: data.target_std.clone(),
        }
    }
}

/// The weights of `state` (a trial of `spec`) and the standardisation, as
/// a safetensors file's bytes.
pub fn safetensors(
    spec: &ModelSpec,
    state: &TrialSnapshot,
    norm: &Standardisation,
) -> Result<Vec<u8>, String> {
    let params = &state.slot.params;
    if params.len() != spec.n_params() {
        return Err(format!(
            "the state holds {} parameters, the network {}",
            params.len(),
            spec.n_params()
        ));
    }
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (i, l) in spec.layers().iter().enumerate() {
        tensors.push((
            format!("layer{i}.weight"),
            vec![l.fan_in, l.fan_out],
            bytes(&params[l.w_off..l.b_off]),
        ));
        tensors.push((
            format!("layer{i}.bias"),
            vec![l.fan_out],
            bytes(&params[l.b_off..l.b_off + l.fan_out]),
        ));
    }
    let vectors = [
        ("input.mean", &norm.feature_mean),
        ("input.std", &norm.feature_std),
        ("target.mean", &norm.target_mean),
        ("target.std", &norm.target_std),
    ];
    for (name, v) in vectors.into_iter().filter(|(_, v)| !v.is_empty()) {
        tensors.push((name.to_string(), vec![v.len()], bytes(v)));
    }
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            TensorView::new(Dtype::F32, shape.clone(), data).map(|v| (name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let info = HashMap::from([("format".to_string(), "salus-tune mlp".to_string())]);
    safetensors::serialize(views, Some(info)).map_err(|e| e.to_string())
}

/// How to run the weights: the network, the standardisation and the trial.
pub fn architecture(spec: &ModelSpec, norm: &Standardisation, trial: Value) -> Value {
    let task = match norm.task {
        Task::Classification { classes } => json!({
            "kind": "classification",
            "classes": classes,
            "output": "logits; the predicted class is the argmax",
        }),
        Task::Regression { targets } => json!({
            "kind": "regression",
            "targets": targets,
            "output": "standardised; multiply by target.std and add target.mean",
        }),
    };
    json!({
        "format": "salus-tune mlp 1",
        "weights": "model.safetensors",
        "input": spec.input,
        "hidden": spec.hidden,
        "output": spec.output,
        "activation": spec.activation.name(),
        "layer": "y = activation(x @ layer{i}.weight + layer{i}.bias); no activation after the last layer",
        "standardise": "x = (x - input.mean) / input.std, per feature, before the first layer",
        "task": task,
        "trial": trial,
    })
}
