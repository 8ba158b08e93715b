//! The search space: each hyper-parameter is a distribution, possibly
//! active only under a condition on a categorical parent.
//!
//! Values follow Optuna's conventions, so storage can write them as Optuna
//! does: floats and ints as themselves, categoricals as the index of the
//! chosen value among `choices`.

use std::collections::BTreeMap;
use std::fmt;

/// A categorical choice.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Bool(b) => write!(f, "{b}"),
            Choice::Int(i) => write!(f, "{i}"),
            Choice::Float(x) => write!(f, "{x}"),
            Choice::Str(s) => write!(f, "{s}"),
        }
    }
}

/// Where a hyper-parameter's values come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    /// `low..=high`; `log` samples uniformly in log space; `step` snaps to
    /// `low + k * step`.
    Float {
        low: f64,
        high: f64,
        log: bool,
        step: Option<f64>,
    },
    /// `low..=high` in multiples of `step` from `low`.
    Int {
        low: i64,
        high: i64,
        log: bool,
        step: i64,
    },
    Categorical {
        choices: Vec<Choice>,
    },
}

/// A sampled value: floats and ints as themselves, categoricals by index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamValue {
    Float(f64),
    Int(i64),
    Choice(usize),
}

impl ParamValue {
    /// Optuna's internal representation (`trial_params.param_value`).
    pub fn internal(self) -> f64 {
        match self {
            ParamValue::Float(v) => v,
            ParamValue::Int(v) => v as f64,
            ParamValue::Choice(i) => i as f64,
        }
    }
}

impl Distribution {
    /// Why the distribution is unusable, if it is.
    pub fn check(&self) -> Result<(), String> {
        match *self {
            Distribution::Float {
                low,
                high,
                log,
                step,
            } => {
                if !(low.is_finite() && high.is_finite()) {
                    return Err("low and high must be finite numbers".into());
                }
                if low > high {
                    return Err(format!("low ({low}) must not exceed high ({high})"));
                }
                if log && low <= 0.0 {
                    return Err(format!("a log-scaled range needs low > 0, got low = {low}"));
                }
                match step {
                    Some(s) if !(s > 0.0 && s.is_finite()) => {
                        Err(format!("step must be > 0, got {s}"))
                    }
                    Some(_) if log => Err("step and log cannot be combined".into()),
                    _ => Ok(()),
                }
            }
            Distribution::Int {
                low,
                high,
                log,
                step,
            } => {
                if low > high {
                    return Err(format!("low ({low}) must not exceed high ({high})"));
                }
                if log && low < 1 {
                    return Err(format!(
                        "a log-scaled range needs low >= 1, got low = {low}"
                    ));
                }
                if step < 1 {
                    return Err(format!("step must be >= 1, got {step}"));
                }
                if log && step != 1 {
                    return Err("step and log cannot be combined".into());
                }
                Ok(())
            }
            Distribution::Categorical { ref choices } if choices.is_empty() => {
                Err("choices must not be empty".into())
            }
            Distribution::Categorical { .. } => Ok(()),
        }
    }

    /// Every value of a discrete distribution, in order; `None` for a
    /// continuous float (no step).
    pub fn grid(&self) -> Option<Vec<ParamValue>> {
        match *self {
            Distribution::Float { step: None, .. } => None,
            Distribution::Float {
                low,
                high,
                step: Some(s),
                ..
            } => {
                let n = ((high - low) / s + 1e-9).floor() as usize;
                Some(
                    (0..=n)
                        .map(|k| ParamValue::Float(low + k as f64 * s))
                        .collect(),
                )
            }
            Distribution::Int {
                low, high, step, ..
            } => Some(
                (low..=high)
                    .step_by(step as usize)
                    .map(ParamValue::Int)
                    .collect(),
            ),
            Distribution::Categorical { ref choices } => {
                Some((0..choices.len()).map(ParamValue::Choice).collect())
            }
        }
    }

    /// A value written on the command line (`--param lr=0.01`), as
    /// Optuna's `fixed_params` holds it; a choice by its text.
    pub fn json_of_text(&self, text: &str) -> Option<serde_json::Value> {
        match self {
            Distribution::Float { .. } => text
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Into::into),
            Distribution::Int { .. } => text.parse::<i64>().ok().map(Into::into),
            Distribution::Categorical { choices } => choices
                .iter()
                .find(|c| c.to_string() == text)
                .map(|c| match c {
                    Choice::Bool(b) => (*b).into(),
                    Choice::Int(i) => (*i).into(),
                    Choice::Float(f) => (*f).into(),
                    Choice::Str(s) => s.clone().into(),
                }),
        }
    }

    /// A value as Optuna's `fixed_params` holds it: a number, or a choice
    /// as itself (not its index).
    pub fn from_json(&self, v: &serde_json::Value) -> Option<ParamValue> {
        match self {
            Distribution::Float { .. } => v.as_f64().map(ParamValue::Float),
            Distribution::Int { .. } => v
                .as_i64()
                .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                .map(ParamValue::Int),
            Distribution::Categorical { choices } => choices
                .iter()
                .position(|c| match (c, v) {
                    (Choice::Bool(b), serde_json::Value::Bool(x)) => b == x,
                    (Choice::Int(i), serde_json::Value::Number(n)) => n.as_f64() == Some(*i as f64),
                    (Choice::Float(f), serde_json::Value::Number(n)) => n.as_f64() == Some(*f),
                    (Choice::Str(s), serde_json::Value::String(x)) => s == x,
                    _ => false,
                })
                .map(ParamValue::Choice),
        }
    }

    /// Whether `v` is a value this distribution can produce.
    pub fn contains(&self, v: ParamValue) -> bool {
        match (self, v) {
            (Distribution::Float { low, high, .. }, ParamValue::Float(x)) => {
                *low <= x && x <= *high
            }
            (
                Distribution::Int {
                    low, high, step, ..
                },
                ParamValue::Int(x),
            ) => *low <= x && x <= *high && (x - low) % step == 0,
            (Distribution::Categorical { choices }, ParamValue::Choice(i)) => i < choices.len(),
            _ => false,
        }
    }
}

/// For people: `float [0.0001, 0.1] log`, `int [64, 256] step 64`,
/// `choices ["sgd", "adam"]`.
impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distribution::Float {
                low,
                high,
                log,
                step,
            } => {
                write!(f, "float [{low}, {high}]")?;
                if *log {
                    write!(f, " log")?;
                }
                if let Some(s) = step {
                    write!(f, " step {s}")?;
                }
                Ok(())
            }
            Distribution::Int {
                low,
                high,
                log,
                step,
            } => {
                write!(f, "int [{low}, {high}]")?;
                if *log {
                    write!(f, " log")?;
                }
                if *step != 1 {
                    write!(f, " step {step}")?;
                }
                Ok(())
            }
            Distribution::Categorical { choices } => {
                let list: Vec<String> = choices.iter().map(json_choice).collect();
                write!(f, "choices [{}]", list.join(", "))
            }
        }
    }
}

/// A parameter is active only when `parent` took one of `values`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub parent: String,
    pub values: Vec<Choice>,
}

/// One hyper-parameter of the search space.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: String,
    pub dist: Distribution,
    pub condition: Option<Condition>,
}

/// The parameters of one trial, by name.
pub type Params = BTreeMap<String, ParamValue>;

/// An ordered search space: every conditional parameter comes after its parent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchSpace {
    params: Vec<Param>,
}

impl SearchSpace {
    /// Checks every distribution, and that each condition names an earlier
    /// categorical parameter and values among its choices.
    pub fn new(params: Vec<Param>) -> Result<Self, String> {
        for (i, p) in params.iter().enumerate() {
            p.dist.check().map_err(|e| format!("{}: {e}", p.name))?;
            if params[..i].iter().any(|q| q.name == p.name) {
                return Err(format!("{}: defined twice", p.name));
            }
            if let Some(c) = &p.condition {
                let parent = params[..i]
                    .iter()
                    .find(|q| q.name == c.parent)
                    .ok_or_else(|| {
                        format!(
                            "{}: the condition names '{}', which is not an earlier parameter",
                            p.name, c.parent
                        )
                    })?;
                let Distribution::Categorical { choices } = &parent.dist else {
                    return Err(format!(
                        "{}: the condition's parent '{}' must be categorical",
                        p.name, c.parent
                    ));
                };
                if let Some(v) = c.values.iter().find(|v| !choices.contains(v)) {
                    return Err(format!(
                        "{}: '{}' is not a choice of '{}'",
                        p.name, v, c.parent
                    ));
                }
            }
        }
        Ok(SearchSpace { params })
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The parameters of an enqueued trial: the `fixed` values (as Optuna's
    /// `fixed_params` holds them: numbers, and choices as themselves) where
    /// given, `draw` for the active ones not given. Says why when a value
    /// is not in the space, or names no parameter of it.
    pub fn with_fixed(
        &self,
        fixed: &serde_json::Map<String, serde_json::Value>,
        mut draw: impl FnMut(&Param) -> ParamValue,
    ) -> Result<Params, String> {
        if let Some(name) = fixed
            .keys()
            .find(|n| !self.params.iter().any(|p| &p.name == *n))
        {
            let names: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
            return Err(format!(
                "'{name}' is not a parameter of the study (it has: {})",
                names.join(", ")
            ));
        }
        let mut params = Params::new();
        for p in &self.params {
            let active = self.is_active(p, &params);
            match (fixed.get(&p.name), active) {
                (Some(_), false) => {
                    return Err(format!(
                        "'{}' does not apply: its condition on '{}' does not hold",
                        p.name,
                        p.condition.as_ref().map_or("", |c| c.parent.as_str())
                    ));
                }
                (Some(v), true) => {
                    let value = p
                        .dist
                        .from_json(v)
                        .filter(|x| p.dist.contains(*x))
                        .ok_or_else(|| {
                            format!("'{}' = {v} is not in the study's {}", p.name, p.dist)
                        })?;
                    params.insert(p.name.clone(), value);
                }
                (None, true) => {
                    params.insert(p.name.clone(), draw(p));
                }
                (None, false) => {}
            }
        }
        Ok(params)
    }

    /// Whether `p` is active given the values chosen so far.
    pub fn is_active(&self, p: &Param, chosen: &Params) -> bool {
        let Some(c) = &p.condition else { return true };
        let Some(parent) = self.params.iter().find(|q| q.name == c.parent) else {
            return false;
        };
        match (chosen.get(&c.parent), &parent.dist) {
            (Some(ParamValue::Choice(i)), Distribution::Categorical { choices }) => {
                c.values.contains(&choices[*i])
            }
            _ => false,
        }
    }
}

fn json_float(v: f64) -> String {
    // Debug keeps a ".0" on integral values, as Python's json does.
    format!("{v:?}")
}

fn json_choice(c: &Choice) -> String {
    match c {
        Choice::Bool(b) => b.to_string(),
        Choice::Int(i) => i.to_string(),
        Choice::Float(f) => json_float(*f),
        Choice::Str(s) => serde_json::to_string(s).expect("a string serialises"),
    }
}

/// Optuna's `distribution_json` (`optuna.distributions.distribution_to_json`),
/// with Python's separators and attribute order.
pub fn distribution_json(d: &Distribution) -> String {
    match d {
        Distribution::Float {
            low,
            high,
            log,
            step,
        } => format!(
            "{{\"name\": \"FloatDistribution\", \"attributes\": {{\"step\": {}, \"low\": {}, \"high\": {}, \"log\": {log}}}}}",
            step.map_or("null".to_string(), json_float),
            json_float(*low),
            json_float(*high)
        ),
        Distribution::Int {
            low,
            high,
            log,
            step,
        } => {
            format!(
                "{{\"name\": \"IntDistribution\", \"attributes\": {{\"log\": {log}, \"step\": {step}, \"low\": {low}, \"high\": {high}}}}}"
            )
        }
        Distribution::Categorical { choices } => {
            let list: Vec<String> = choices.iter().map(json_choice).collect();
            format!(
                "{{\"name\": \"CategoricalDistribution\", \"attributes\": {{\"choices\": [{}]}}}}",
                list.join(", ")
            )
        }
    }
}

/// A parameter's external value as JSON: the number, or the chosen value.
pub fn external_json(d: &Distribution, v: ParamValue) -> serde_json::Value {
    match (d, v) {
        (Distribution::Categorical { choices }, ParamValue::Choice(i)) => match &choices[i] {
            Choice::Bool(b) => (*b).into(),
            Choice::Int(n) => (*n).into(),
            Choice::Float(f) => (*f).into(),
            Choice::Str(s) => s.clone().into(),
        },
        (_, ParamValue::Int(n)) => n.into(),
        (_, v) => v.internal().into(),
    }
}

#[cfg(test)]
mod json_tests {
    use super::*;

    /// The strings Optuna 5.0.0 itself wrote for these distributions.
    #[test]
    fn distribution_json_matches_optuna() {
        let cases = [
            (
                Distribution::Float {
                    low: 1e-4,
                    high: 0.1,
                    log: true,
                    step: None,
                },
                r#"{"name": "FloatDistribution", "attributes": {"step": null, "low": 0.0001, "high": 0.1, "log": true}}"#,
            ),
            (
                Distribution::Int {
                    low: 32,
                    high: 512,
                    log: true,
                    step: 1,
                },
                r#"{"name": "IntDistribution", "attributes": {"log": true, "step": 1, "low": 32, "high": 512}}"#,
            ),
            (
                Distribution::Categorical {
                    choices: vec![Choice::Str("sgd".into()), Choice::Str("adam".into())],
                },
                r#"{"name": "CategoricalDistribution", "attributes": {"choices": ["sgd", "adam"]}}"#,
            ),
            (
                Distribution::Float {
                    low: 0.0,
                    high: 0.9,
                    log: false,
                    step: Some(0.45),
                },
                r#"{"name": "FloatDistribution", "attributes": {"step": 0.45, "low": 0.0, "high": 0.9, "log": false}}"#,
            ),
            (
                Distribution::Categorical {
                    choices: vec![Choice::Int(32), Choice::Int(64)],
                },
                r#"{"name": "CategoricalDistribution", "attributes": {"choices": [32, 64]}}"#,
            ),
        ];
        for (d, want) in cases {
            assert_eq!(distribution_json(&d), want);
        }
    }
}
