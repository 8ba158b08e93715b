//! `[pbt]`: population-based training, checked against the rest of the
//! study (a population trains one model, so only optimizer and
//! regularisation knobs may differ between members and mutate).

use toml::Spanned;

use std::collections::BTreeMap;

use super::*;
use crate::pbt::PbtConfig;

/// The knobs a member may change while it trains: each is a per-trial
/// scalar of the optimizer or of dropout, so the model and its state keep
/// their shape. Every other knob defines the model or its data order.
pub const MUTABLE_KNOBS: &[&str] = &[
    "lr",
    "weight_decay",
    "dropout",
    "sgd.momentum",
    "sgd.nesterov",
    "adam.beta1",
    "adam.beta2",
    "adam.eps",
    "adamw.beta1",
    "adamw.beta2",
    "adamw.eps",
];

/// What `[pbt]` needs to know of the rest of the study.
pub(super) struct PbtContext<'s> {
    pub space: &'s SearchSpace,
    pub objectives: usize,
    pub worker: bool,
    pub pruner: &'s PrunerKind,
    pub pruner_span: Option<Range<usize>>,
    pub trials: Option<Spanned<i64>>,
    pub report_every: Option<u64>,
    pub report_every_span: Option<Range<usize>>,
}

/// `[train] schedule`: values that change as a trial trains, by report
/// step (what `best --schedule` writes from a PBT member's schedule).
pub type Schedule = Vec<(u64, BTreeMap<String, KnobValue>)>;

/// A schedule entry's keys, flattened: `adam = { beta1 = 0.8 }` and the
/// quoted `"adam.beta1" = 0.8` both give `adam.beta1`.
fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => flatten(&name, t, out),
            v => out.push((name, v.clone())),
        }
    }
}

impl Checker<'_> {
    /// `[train] schedule`: each entry a report step (from 1, increasing)
    /// and new values of knobs a trial may change as it trains
    /// ([`MUTABLE_KNOBS`]), each fixed in the study (not searched).
    pub(super) fn schedule(
        &self,
        field: &Option<Spanned<Vec<toml::Table>>>,
        knobs: &Knobs,
    ) -> Result<Schedule> {
        let Some(field) = field else {
            return Ok(Vec::new());
        };
        let span = field.span();
        let key = "train.schedule";
        let mut out: Schedule = Vec::new();
        for (i, entry) in field.get_ref().iter().enumerate() {
            let at = |msg: String| self.err(span.clone(), key, format!("entry {}: {msg}", i + 1));
            let mut values = Vec::new();
            flatten("", entry, &mut values);
            let step = match entry.get("step") {
                Some(toml::Value::Integer(s)) if *s >= 1 => *s as u64,
                _ => {
                    return Err(at(
                        "needs step = N, the report step (from 1) it starts at".into()
                    ));
                }
            };
            if out.last().is_some_and(|(prev, _)| *prev >= step) {
                return Err(at(format!("steps must increase, and {step} does not")));
            }
            let mut set = BTreeMap::new();
            for (name, v) in values.into_iter().filter(|(n, _)| n != "step") {
                let Some(knob) = KNOBS.iter().find(|k| k.name == name) else {
                    return Err(at(format!("unknown knob '{name}'")));
                };
                if !MUTABLE_KNOBS.contains(&knob.name) {
                    return Err(at(format!(
                        "'{name}' defines the model or its data and cannot change as a trial \
                         trains; a schedule may set {}",
                        MUTABLE_KNOBS.join(", ")
                    )));
                }
                if knobs.params.iter().any(|p| p.name == name) {
                    return Err(at(format!(
                        "'{name}' is searched: a scheduled knob starts from one fixed value"
                    )));
                }
                let scalar = match v {
                    toml::Value::Float(f) => raw::Scalar::Float(f),
                    toml::Value::Integer(n) => raw::Scalar::Int(n),
                    toml::Value::Boolean(b) => raw::Scalar::Bool(b),
                    toml::Value::String(s) => raw::Scalar::Str(s),
                    _ => raw::Scalar::Array,
                };
                let value = self
                    .scalar(knob, key, span.clone(), &scalar)
                    .map_err(|e| match e {
                        Error::Study { msg, .. } => at(msg),
                        other => other,
                    })?;
                let start = knobs.fixed.get(&name).map_or(0.0, KnobValue::as_f64);
                if name == "dropout" && (value.as_f64() > 0.0) != (start > 0.0) {
                    return Err(at(
                        "dropout cannot turn on or off as a trial trains (it changes the model)"
                            .into(),
                    ));
                }
                set.insert(name, value);
            }
            out.push((step, set));
        }
        Ok(out)
    }

    /// `[pbt]`, or `None` without it. Returns the population's config and
    /// the report interval its exploit points need.
    pub(super) fn pbt(
        &self,
        section: Option<Spanned<raw::Table<raw::PbtSection>>>,
        cx: PbtContext<'_>,
    ) -> Result<Option<(PbtConfig, Option<u64>)>> {
        let Some(section) = section else {
            return Ok(None);
        };
        let span = section.span();
        let s = section.into_inner().0;
        if cx.objectives > 1 {
            return Err(self.err(
                span,
                "pbt",
                format!(
                    "PBT ranks members by one value, and this study has {} objectives: give \
                     study.metric one name",
                    cx.objectives
                ),
            ));
        }
        if *cx.pruner != PrunerKind::None {
            return Err(self.err(
                cx.pruner_span.unwrap_or(span),
                "pruner.kind",
                "[pbt] decides which members go on and from where: remove [pruner] (or set \
                 kind = \"none\") in a PBT study",
            ));
        }
        let population = match (
            self.at_least(&s.population, "pbt.population", 2)?,
            &cx.trials,
        ) {
            (Some(p), Some(t)) if *t.get_ref() != p => {
                return Err(self.err(
                    t.span(),
                    "study.trials",
                    format!(
                        "a PBT study's trials are its population ({p}, pbt.population): remove \
                         study.trials or set it to {p}"
                    ),
                ));
            }
            (Some(p), _) => p as usize,
            (None, Some(t)) if *t.get_ref() >= 2 => *t.get_ref() as usize,
            (None, Some(t)) => {
                return Err(self.err(
                    t.span(),
                    "study.trials",
                    "a PBT population needs at least 2 members",
                ));
            }
            (None, None) => 8,
        };
        let interval = self
            .at_least(&s.interval, "pbt.interval", 1)?
            .map(|n| n as u64);
        let report_every = match (interval, cx.report_every) {
            (Some(i), Some(r)) if i % r != 0 => {
                // A worker's report_every has no span of its own here:
                // the error points at the interval instead.
                let (at, key) = match (cx.worker, &cx.report_every_span) {
                    (false, Some(r)) => (r.clone(), "train.report_every"),
                    _ => (
                        s.interval.as_ref().map_or(span.clone(), |v| v.span()),
                        "pbt.interval",
                    ),
                };
                return Err(self.err(
                    at,
                    key,
                    format!(
                        "members are compared at report points: pbt.interval ({i}) must be a \
                         multiple of report_every ({r})"
                    ),
                ));
            }
            (Some(i), None) => Some(i),
            (_, r) => r,
        };
        let fraction = |field: &Option<Spanned<raw::Num>>, key: &str, default: f64| {
            let Some(v) = field else { return Ok(default) };
            let q = v.get_ref().0;
            if !(q > 0.0 && q <= 0.5) {
                return Err(self.err(
                    v.span(),
                    key,
                    format!(
                        "expected a fraction of the population above 0 and at most 0.5 (no \
                         member both gives and takes), found {q}"
                    ),
                ));
            }
            Ok(q)
        };
        let exploit_quantile = fraction(&s.quantile, "pbt.quantile", 0.25)?;
        let donor_quantile = fraction(&s.donor_quantile, "pbt.donor_quantile", exploit_quantile)?;
        let resample_probability = match &s.resample_probability {
            Some(v) if !(0.0..=1.0).contains(&v.get_ref().0) => {
                return Err(self.err(
                    v.span(),
                    "pbt.resample_probability",
                    format!("expected a probability in [0, 1], found {}", v.get_ref().0),
                ));
            }
            Some(v) => v.get_ref().0,
            None => 0.25,
        };
        let factors = match &s.factors {
            Some(v) => {
                let f: Vec<f64> = v.get_ref().iter().map(|n| n.0).collect();
                if f.is_empty() || f.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                    return Err(self.err(
                        v.span(),
                        "pbt.factors",
                        "expected a non-empty array of positive numbers, such as [1.2, 0.8]",
                    ));
                }
                f
            }
            None => vec![1.2, 0.8],
        };
        let searched: Vec<&str> = cx.space.params().iter().map(|p| p.name.as_str()).collect();
        // A searched knob that would change the model cannot differ between
        // members: their states must fit one another. A worker's script
        // defines its own model: what it searches is its business.
        for name in searched.iter().filter(|_| !cx.worker) {
            if !MUTABLE_KNOBS.contains(name) {
                return Err(self.knob_err(
                    name,
                    span.clone(),
                    format!(
                        "'{name}' defines the model or its data, so PBT's members cannot differ \
                         in it (an exploit copies one member's state into another): fix it to \
                         one value; the knobs a PBT study may search are {}",
                        MUTABLE_KNOBS.join(", ")
                    ),
                ));
            }
        }
        if let Some(p) = cx.space.params().iter().find(|p| p.name == "dropout")
            && !cx.worker
            && matches!(p.dist, Distribution::Float { low, .. } if low <= 0.0)
        {
            return Err(self.knob_err(
                "dropout",
                span.clone(),
                "dropout 0 turns dropout's masks off, which changes the model: in a PBT study \
                 its range must start above 0 (such as { float = [0.05, 0.5] })",
            ));
        }
        let mutate = match &s.mutate {
            None => searched.iter().map(|n| n.to_string()).collect(),
            Some(m) => {
                let names: Vec<String> = m.get_ref().0.iter().map(|n| n.0.clone()).collect();
                if let Some(bad) = names.iter().find(|n| !searched.contains(&n.as_str())) {
                    let why = if MUTABLE_KNOBS.contains(&bad.as_str()) {
                        format!("'{bad}' is not searched: give it a range to mutate it")
                    } else {
                        format!(
                            "'{bad}' cannot mutate; the searched knobs are: {}",
                            searched.join(", ")
                        )
                    };
                    return Err(self.err(m.span(), "pbt.mutate", why));
                }
                names
            }
        };
        if mutate.is_empty() {
            return Err(self.err(
                span,
                "pbt",
                format!(
                    "nothing can mutate: search at least one of {} (such as lr = {{ float = \
                     [1e-4, 1e-1], log = true }})",
                    MUTABLE_KNOBS.join(", ")
                ),
            ));
        }
        Ok(Some((
            PbtConfig {
                population,
                interval,
                exploit_quantile,
                donor_quantile,
                resample_probability,
                factors,
                mutate,
            },
            report_every,
        )))
    }

    /// An error at a knob's place in the file (where its range is).
    fn knob_err(&self, name: &str, fallback: Range<usize>, msg: impl Into<String>) -> Error {
        let key = KNOBS
            .iter()
            .find(|k| k.name == name)
            .map_or(name.to_string(), |k| format!("{}.{}", k.section, k.key));
        match self.positions.get(name) {
            Some(&(line, col)) => Error::Study {
                path: self.src.path.display().to_string(),
                line,
                col,
                key,
                msg: msg.into(),
            },
            None => self.err(fallback, &key, msg),
        }
    }
}
