//! The knobs of the built-in models: their names, kinds, domains and
//! defaults (`KNOBS`), and the values a study file gives them.

use crate::space::Choice;

/// A value of a knob.
#[derive(Debug, Clone, PartialEq)]
pub enum KnobValue {
    Float(f64),
    Int(i64),
    Str(String),
    Bool(bool),
}

impl KnobValue {
    pub(super) fn from_choice(c: &Choice) -> Self {
        match c {
            Choice::Bool(b) => KnobValue::Bool(*b),
            Choice::Int(i) => KnobValue::Int(*i),
            Choice::Float(f) => KnobValue::Float(*f),
            Choice::Str(s) => KnobValue::Str(s.clone()),
        }
    }
    /// The exact value as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            KnobValue::Float(v) => (*v).into(),
            KnobValue::Int(v) => (*v).into(),
            KnobValue::Str(v) => v.clone().into(),
            KnobValue::Bool(v) => (*v).into(),
        }
    }

    pub(super) fn as_f64(&self) -> f64 {
        match *self {
            KnobValue::Float(f) => f,
            KnobValue::Int(i) => i as f64,
            _ => f64::NAN,
        }
    }
    pub(super) fn as_i64(&self) -> i64 {
        match *self {
            KnobValue::Int(i) => i,
            KnobValue::Float(f) => f.round() as i64,
            _ => 0,
        }
    }
    pub(super) fn as_str(&self) -> &str {
        match self {
            KnobValue::Str(s) => s,
            _ => "",
        }
    }
}

impl std::fmt::Display for KnobValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KnobValue::Float(v) => write!(f, "{}", crate::numbers::fmt_float(*v)),
            KnobValue::Int(v) => write!(f, "{v}"),
            KnobValue::Str(v) => write!(f, "{v}"),
            KnobValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// The type and domain of a knob.
#[derive(Debug, Clone, Copy)]
pub enum KnobKind {
    /// `min < x` (or `<=` when `min_inclusive`), and `x < max` when given.
    Float {
        min: f64,
        min_inclusive: bool,
        max: Option<f64>,
    },
    Int {
        min: i64,
    },
    Str(&'static [&'static str]),
    Bool,
    /// Any scalar: a command worker's own parameters.
    Free,
}

/// A tunable hyper-parameter. `name` is its parameter name in storage.
#[derive(Debug, Clone)]
pub struct Knob {
    pub name: &'static str,
    pub section: &'static str,
    pub key: &'static str,
    pub kind: KnobKind,
    pub default: KnobDefault,
    /// Active only when `optimizer` is this value.
    pub optimizer: Option<&'static str>,
}

#[derive(Debug, Clone, Copy)]
pub enum KnobDefault {
    Float(f64),
    Int(i64),
    Str(&'static str),
    Bool(bool),
}

const ACTIVATIONS: &[&str] = &["relu", "gelu", "tanh", "sigmoid"];
const POOLS: &[&str] = &["max", "avg"];
/// The `[model]` knobs of a conv net (`kind = "cnn"`) alone.
pub const CNN_KNOBS: &[&str] = &[
    "channels",
    "stages",
    "blocks_per_stage",
    "kernel",
    "residual",
    "batch_norm",
    "pool",
    "global_pool",
];
const OPTIMIZERS: &[&str] = &["sgd", "adam", "adamw"];
const PRECISIONS: &[&str] = &["fp32", "tf32", "bf16"];
const POSITIVE: KnobKind = KnobKind::Float {
    min: 0.0,
    min_inclusive: false,
    max: None,
};
const NON_NEGATIVE: KnobKind = KnobKind::Float {
    min: 0.0,
    min_inclusive: true,
    max: None,
};
const UNIT: KnobKind = KnobKind::Float {
    min: 0.0,
    min_inclusive: true,
    max: Some(1.0),
};

const fn knob(
    name: &'static str,
    section: &'static str,
    key: &'static str,
    kind: KnobKind,
    default: KnobDefault,
    optimizer: Option<&'static str>,
) -> Knob {
    Knob {
        name,
        section,
        key,
        kind,
        default,
        optimizer,
    }
}

/// Every knob, in the order parameters are sampled (parents first).
pub static KNOBS: &[Knob] = &[
    knob(
        "depth",
        "model",
        "depth",
        KnobKind::Int { min: 1 },
        KnobDefault::Int(2),
        None,
    ),
    knob(
        "width",
        "model",
        "width",
        KnobKind::Int { min: 1 },
        KnobDefault::Int(128),
        None,
    ),
    knob(
        "activation",
        "model",
        "activation",
        KnobKind::Str(ACTIVATIONS),
        KnobDefault::Str("relu"),
        None,
    ),
    knob(
        "channels",
        "model",
        "channels",
        KnobKind::Int { min: 1 },
        KnobDefault::Int(16),
        None,
    ),
    knob(
        "stages",
        "model",
        "stages",
        KnobKind::Int { min: 1 },
        KnobDefault::Int(2),
        None,
    ),
    knob(
        "blocks_per_stage",
        "model",
        "blocks_per_stage",
        KnobKind::Int { min: 1 },
        KnobDefault::Int(1),
        None,
    ),
    knob(
        "kernel",
        "model",
        "kernel",
        KnobKind::Int { min: 3 },
        KnobDefault::Int(3),
        None,
    ),
    knob(
        "residual",
        "model",
        "residual",
        KnobKind::Bool,
        KnobDefault::Bool(false),
        None,
    ),
    knob(
        "batch_norm",
        "model",
        "batch_norm",
        KnobKind::Bool,
        KnobDefault::Bool(true),
        None,
    ),
    knob(
        "pool",
        "model",
        "pool",
        KnobKind::Str(POOLS),
        KnobDefault::Str("max"),
        None,
    ),
    knob(
        "global_pool",
        "model",
        "global_pool",
        KnobKind::Bool,
        KnobDefault::Bool(false),
        None,
    ),
    knob(
        "optimizer",
        "train",
        "optimizer",
        KnobKind::Str(OPTIMIZERS),
        KnobDefault::Str("adam"),
        None,
    ),
    knob(
        "lr",
        "train",
        "lr",
        POSITIVE,
        KnobDefault::Float(1e-3),
        None,
    ),
    knob(
        "batch_size",
        "train",
        "batch_size",
        KnobKind::Int { min: 1 },
        KnobDefault::Int(128),
        None,
    ),
    knob(
        "epochs",
        "train",
        "epochs",
        KnobKind::Int { min: 1 },
        KnobDefault::Int(10),
        None,
    ),
    knob(
        "weight_decay",
        "train",
        "weight_decay",
        NON_NEGATIVE,
        KnobDefault::Float(0.0),
        None,
    ),
    knob(
        "dropout",
        "train",
        "dropout",
        UNIT,
        KnobDefault::Float(0.0),
        None,
    ),
    knob(
        "precision",
        "train",
        "precision",
        KnobKind::Str(PRECISIONS),
        KnobDefault::Str("fp32"),
        None,
    ),
    knob(
        "sgd.momentum",
        "train.sgd",
        "momentum",
        UNIT,
        KnobDefault::Float(0.9),
        Some("sgd"),
    ),
    knob(
        "sgd.nesterov",
        "train.sgd",
        "nesterov",
        KnobKind::Bool,
        KnobDefault::Bool(false),
        Some("sgd"),
    ),
    knob(
        "adam.beta1",
        "train.adam",
        "beta1",
        UNIT,
        KnobDefault::Float(0.9),
        Some("adam"),
    ),
    knob(
        "adam.beta2",
        "train.adam",
        "beta2",
        UNIT,
        KnobDefault::Float(0.999),
        Some("adam"),
    ),
    knob(
        "adam.eps",
        "train.adam",
        "eps",
        POSITIVE,
        KnobDefault::Float(1e-8),
        Some("adam"),
    ),
    knob(
        "adamw.beta1",
        "train.adamw",
        "beta1",
        UNIT,
        KnobDefault::Float(0.9),
        Some("adamw"),
    ),
    knob(
        "adamw.beta2",
        "train.adamw",
        "beta2",
        UNIT,
        KnobDefault::Float(0.999),
        Some("adamw"),
    ),
    knob(
        "adamw.eps",
        "train.adamw",
        "eps",
        POSITIVE,
        KnobDefault::Float(1e-8),
        Some("adamw"),
    ),
];
