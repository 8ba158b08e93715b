//! The knobs of the built-in models: `[model]`, `[train]` and the
//! optimizer sections, each value a fixed value, a range or choices,
//! checked against the knob's kind and domain.

use std::ops::Range;

use toml::Spanned;

use super::*;

impl Checker<'_> {
    /// `[model]`, `[train]` and the optimizer sections of the built-in MLP.
    pub(super) fn builtin_knobs(
        &mut self,
        model: &raw::ModelSection,
        train: &raw::TrainSection,
        knobs: &mut Knobs,
    ) -> Result<()> {
        let mut optimizer = None;
        let sections: [(&str, &dyn KnobSection); 2] = [("model", model), ("train", train)];
        for (section, fields) in sections {
            for knob in KNOBS.iter().filter(|k| k.section == section) {
                if let Some(v) = fields.knob(knob.key) {
                    let spec = self.knob(knob, v)?;
                    if knob.name == "optimizer" {
                        optimizer = Some(spec.clone());
                    }
                    knobs.place(knob, spec, None);
                }
            }
        }
        for (opt, span, fields) in train.optimizer_sections() {
            let name = format!("train.{opt}");
            let refuse = |why: String| {
                self.err(
                    span.clone(),
                    &name,
                    format!("[{name}] applies only when optimizer can be '{opt}', {why}"),
                )
            };
            let condition = match &optimizer {
                None if opt == "adam" => None,
                None => return Err(refuse("but optimizer is 'adam' (the default)".into())),
                Some(KnobSpec::Fixed(KnobValue::Str(o))) if o == opt => None,
                Some(KnobSpec::Fixed(o)) => {
                    return Err(refuse(format!("but optimizer is fixed to '{o}'")));
                }
                Some(KnobSpec::Dist(Distribution::Categorical { choices })) => {
                    if !choices.contains(&Choice::Str(opt.into())) {
                        return Err(refuse("which is not among its choices".into()));
                    }
                    Some(Condition {
                        parent: "optimizer".into(),
                        values: vec![Choice::Str(opt.into())],
                    })
                }
                Some(_) => unreachable!("optimizer is a string knob"),
            };
            for knob in KNOBS.iter().filter(|k| k.optimizer == Some(opt)) {
                if let Some(v) = fields.knob(knob.key) {
                    let spec = self.knob(knob, v)?;
                    knobs.place(knob, spec, condition.clone());
                }
            }
        }
        Ok(())
    }

    /// A knob's value: a scalar (fixed) or a distribution table.
    pub(super) fn knob(&mut self, knob: &Knob, v: &Spanned<KnobRaw>) -> Result<KnobSpec> {
        let key = format!("{}.{}", knob.section, knob.key);
        self.positions
            .insert(knob.name.to_string(), self.src.line_col(v.span().start));
        let table = match v.get_ref() {
            KnobRaw::Fixed(scalar) => {
                return Ok(KnobSpec::Fixed(self.scalar(
                    knob,
                    &key,
                    v.span(),
                    scalar,
                )?));
            }
            KnobRaw::Dist(t) => t,
        };
        let forms = [
            table.float.is_some(),
            table.int.is_some(),
            table.choices.is_some(),
        ];
        if forms.iter().filter(|f| **f).count() != 1 {
            return Err(self.err(v.span(), &key, "a distribution needs exactly one of: float = [low, high], int = [low, high], choices = [...]"));
        }
        let log = table.log.as_ref().is_some_and(|b| b.get_ref().0);
        let dist = if let Some(choices) = &table.choices {
            if table.log.is_some() || table.step.is_some() {
                return Err(self.err(v.span(), &key, "log and step do not apply to choices"));
            }
            self.choices(knob, &key, choices)?
        } else {
            self.range(knob, &key, table, log)?
        };
        dist.check().map_err(|m| self.err(v.span(), &key, m))?;
        Ok(KnobSpec::Dist(dist))
    }

    /// `float = [low, high]` or `int = [low, high]`, with `step`.
    pub(super) fn range(
        &self,
        knob: &Knob,
        key: &str,
        table: &raw::DistTable,
        log: bool,
    ) -> Result<Distribution> {
        let (form, pair) = match (&table.float, &table.int) {
            (Some(p), _) => ("float", p),
            (_, Some(p)) => ("int", p),
            _ => unreachable!("one form is present"),
        };
        let hint = match knob.kind {
            KnobKind::Float { .. } if form == "float" => None,
            KnobKind::Int { .. } if form == "int" => None,
            KnobKind::Float { .. } => Some("takes real numbers: use float = [low, high]"),
            KnobKind::Int { .. } => Some("takes integers: use int = [low, high]"),
            _ => Some("takes named values: use choices = [...]"),
        };
        if let Some(hint) = hint {
            return Err(self.err(pair.span(), key, format!("{} {hint}", knob.key)));
        }
        if knob.name == "kernel" {
            return Err(self.err(pair.span(), key, "kernel is 3 or 5: use choices = [3, 5]"));
        }
        let form_key = format!("{key}.{form}");
        let step_key = format!("{key}.step");
        let step = table.step.as_ref();
        let [low, high] = &pair.get_ref().0;
        let dist = if form == "float" {
            let num = |s: &Spanned<Scalar>| {
                s.get_ref()
                    .number()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| {
                        self.err(
                            s.span(),
                            &form_key,
                            format!("expected a number, found {}", s.get_ref().type_name()),
                        )
                    })
            };
            let (lo, hi) = (num(low)?, num(high)?);
            let step = match step {
                None => None,
                Some(s) => Some(s.get_ref().number().filter(|f| f.is_finite()).ok_or_else(
                    || {
                        self.err(
                            s.span(),
                            &step_key,
                            format!(
                                "expected a finite number, found {}",
                                s.get_ref().type_name()
                            ),
                        )
                    },
                )?),
            };
            for (bound, at) in [(lo, low), (hi, high)] {
                self.domain(knob, &KnobValue::Float(bound))
                    .map_err(|m| self.err(at.span(), key, m))?;
            }
            Distribution::Float {
                low: lo,
                high: hi,
                log,
                step,
            }
        } else {
            let int = |s: &Spanned<Scalar>, key: &str| match s.get_ref() {
                Scalar::Int(i) => Ok(*i),
                other => Err(self.err(
                    s.span(),
                    key,
                    format!("expected an integer, found {}", other.type_name()),
                )),
            };
            let (lo, hi) = (int(low, &form_key)?, int(high, &form_key)?);
            let step = step.map(|s| int(s, &step_key)).transpose()?.unwrap_or(1);
            for (bound, at) in [(lo, low), (hi, high)] {
                self.domain(knob, &KnobValue::Int(bound))
                    .map_err(|m| self.err(at.span(), key, m))?;
            }
            Distribution::Int {
                low: lo,
                high: hi,
                log,
                step,
            }
        };
        Ok(dist)
    }

    /// `choices = [...]`: each a valid value of the knob, none twice.
    pub(super) fn choices(
        &self,
        knob: &Knob,
        key: &str,
        list: &Spanned<raw::Choices>,
    ) -> Result<Distribution> {
        let key = format!("{key}.choices");
        let items = &list.get_ref().0;
        if items.is_empty() {
            return Err(self.err(list.span(), &key, "choices must not be empty"));
        }
        let mut choices = Vec::new();
        for item in items {
            let choice = match self.scalar(knob, &key, item.span(), item.get_ref())? {
                KnobValue::Float(f) => Choice::Float(f),
                KnobValue::Int(i) => Choice::Int(i),
                KnobValue::Str(st) => Choice::Str(st),
                KnobValue::Bool(b) => Choice::Bool(b),
            };
            if choices.contains(&choice) {
                let shown = crate::space::distribution_json(&Distribution::Categorical {
                    choices: vec![choice],
                });
                return Err(self.err(item.span(), &key, format!("'{shown}' appears twice")));
            }
            choices.push(choice);
        }
        Ok(Distribution::Categorical { choices })
    }

    /// A fixed value (or one choice) of a knob, checked against its type and domain.
    pub(super) fn scalar(
        &self,
        knob: &Knob,
        key: &str,
        span: Range<usize>,
        v: &Scalar,
    ) -> Result<KnobValue> {
        let value = match (knob.kind, v) {
            (KnobKind::Float { .. }, Scalar::Float(_) | Scalar::Int(_)) => {
                KnobValue::Float(v.number().unwrap_or(f64::NAN))
            }
            (KnobKind::Int { .. } | KnobKind::Free, Scalar::Int(i)) => KnobValue::Int(*i),
            (KnobKind::Str(_) | KnobKind::Free, Scalar::Str(s)) => KnobValue::Str(s.clone()),
            (KnobKind::Bool | KnobKind::Free, Scalar::Bool(b)) => KnobValue::Bool(*b),
            (KnobKind::Free, Scalar::Float(f)) => KnobValue::Float(*f),
            (kind, other) => {
                let want = match kind {
                    KnobKind::Float { .. } => "a number or a distribution table",
                    KnobKind::Int { .. } => "an integer or a distribution table",
                    KnobKind::Str(_) => "a string or a distribution table",
                    KnobKind::Bool => "true, false or a distribution table",
                    KnobKind::Free => "a number, string, boolean or a distribution table",
                };
                return Err(self.err(
                    span,
                    key,
                    format!("expected {want}, found {}", other.type_name()),
                ));
            }
        };
        self.domain(knob, &value)
            .map_err(|m| self.err(span, key, m))?;
        Ok(value)
    }

    pub(super) fn domain(&self, knob: &Knob, v: &KnobValue) -> std::result::Result<(), String> {
        match (knob.kind, v) {
            (
                KnobKind::Float {
                    min,
                    min_inclusive,
                    max,
                },
                KnobValue::Float(f),
            ) => {
                let low_ok = if min_inclusive { *f >= min } else { *f > min };
                let high_ok = max.is_none_or(|m| *f < m);
                if !f.is_finite() || !low_ok || !high_ok {
                    let range = match (min_inclusive, max) {
                        (true, Some(m)) => format!("in [{min}, {m})"),
                        (false, Some(m)) => format!("in ({min}, {m})"),
                        (true, None) => format!(">= {min}"),
                        (false, None) => format!("> {min}"),
                    };
                    return Err(format!("{} must be {range}, got {f}", knob.key));
                }
                Ok(())
            }
            (KnobKind::Int { min }, KnobValue::Int(i)) if *i < min => {
                Err(format!("{} must be >= {min}, got {i}", knob.key))
            }
            (KnobKind::Int { .. }, KnobValue::Int(i))
                if knob.name == "kernel" && ![3, 5].contains(i) =>
            {
                Err(format!("kernel must be 3 or 5, got {i}"))
            }
            (KnobKind::Str(allowed), KnobValue::Str(s)) if !allowed.contains(&s.as_str()) => {
                let hint =
                    suggest(s, allowed).map_or(String::new(), |k| format!("; did you mean '{k}'?"));
                Err(format!(
                    "unknown {} '{s}'; expected one of: {}{hint}",
                    knob.key,
                    allowed.join(", ")
                ))
            }
            _ => Ok(()),
        }
    }
}
