//! Reading `study.toml` into a [`Study`], with errors that point at the
//! file, line, column and key.
//!
//! The file is parsed into toml's spanned tree and walked by hand, so that
//! every unknown key, wrong type and out-of-range value is reported where it
//! stands, with a "did you mean" for misspelt keys.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;
use toml::de::{DeTable, DeValue};
use workers::data::TaskKind;

use super::*;
use crate::error::{Error, Result};
use crate::sampler::GridSampler;
use crate::space::{Choice, Condition, Distribution, Param, SearchSpace};

/// Reads and validates the study file at `path`.
pub fn load(path: &Path) -> Result<Study> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Input(format!(
            "{}: cannot read the study file: {e}",
            path.display()
        ))
    })?;
    parse_str(&text, path)
}

/// Validates study-file text; `path` names it in errors and anchors relative paths.
pub fn parse_str(src: &str, path: &Path) -> Result<Study> {
    let cx = Cx { path, src };
    let root = DeTable::parse(src).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        cx.err(
            span,
            "(syntax)",
            format!("invalid TOML: {}", e.message().trim()),
        )
    })?;
    Parser {
        cx,
        positions: BTreeMap::new(),
    }
    .study(root.get_ref(), root.span())
}

/// The source, for turning byte offsets into line and column.
#[derive(Clone, Copy)]
struct Cx<'a> {
    path: &'a Path,
    src: &'a str,
}

impl Cx<'_> {
    fn err(&self, span: Range<usize>, key: &str, msg: impl Into<String>) -> Error {
        let at = span.start.min(self.src.len());
        let before = &self.src[..at];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Error::Study {
            path: self.path.display().to_string(),
            line,
            col,
            key: key.to_string(),
            msg: msg.into(),
        }
    }
}

type Val<'i> = Spanned<DeValue<'i>>;

/// One table of the file, with its dotted name.
struct Section<'a, 'i> {
    name: String,
    table: &'a DeTable<'i>,
    span: Range<usize>,
}

impl<'a, 'i> Section<'a, 'i> {
    fn get(&self, key: &str) -> Option<(Range<usize>, &'a Val<'i>)> {
        self.table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| (v.span(), v))
    }
    fn dotted(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }
}

const ALIASES: &[(&str, &str)] = &[
    ("learning_rate", "lr"),
    ("n_trials", "trials"),
    ("num_trials", "trials"),
    ("batch", "batch_size"),
    ("batchsize", "batch_size"),
    ("hidden", "width"),
    ("hidden_size", "width"),
    ("layers", "depth"),
    ("n_layers", "depth"),
    ("num_epochs", "epochs"),
    ("l2", "weight_decay"),
    ("val_fraction", "validation"),
    ("test_size", "validation"),
    ("objective", "metric"),
    ("study_name", "name"),
];

/// The closest known key, for "did you mean": by spelling, or through a
/// common alias (also misspelt, as in "lerning_rate").
fn suggest<'k>(word: &str, known: &[&'k str]) -> Option<&'k str> {
    let lower = word.to_lowercase();
    let aliases = ALIASES
        .iter()
        .filter_map(|(from, to)| known.iter().find(|k| *k == to).map(|k| (*from, *k)));
    known
        .iter()
        .map(|k| (*k, *k))
        .chain(aliases)
        .map(|(spelling, key)| {
            (
                key,
                strsim::jaro_winkler(&lower, spelling),
                strsim::levenshtein(&lower, spelling),
            )
        })
        .filter(|(_, sim, dist)| *sim >= 0.8 || *dist <= 2)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _, _)| k)
}

fn type_name(v: &DeValue) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

fn int_of(v: &DeValue) -> Option<i64> {
    let DeValue::Integer(i) = v else { return None };
    let digits: String = i.as_str().chars().filter(|c| *c != '_').collect();
    let digits = digits
        .trim_start_matches("0x")
        .trim_start_matches("0o")
        .trim_start_matches("0b");
    i64::from_str_radix(digits, i.radix()).ok()
}

fn float_of(v: &DeValue) -> Option<f64> {
    match v {
        DeValue::Float(f) => f.as_str().replace('_', "").parse().ok(),
        DeValue::Integer(_) => int_of(v).map(|i| i as f64),
        _ => None,
    }
}

/// A parsed knob: fixed, or a distribution.
enum KnobSpec {
    Fixed(KnobValue),
    Dist(Distribution),
}

struct Parser<'a> {
    cx: Cx<'a>,
    positions: BTreeMap<String, (usize, usize)>,
}

impl<'a> Parser<'a> {
    fn err(&self, span: Range<usize>, key: &str, msg: impl Into<String>) -> Error {
        self.cx.err(span, key, msg)
    }

    /// Refuses keys outside `known`, suggesting the closest.
    fn check_keys(&self, s: &Section, known: &[&str]) -> Result<()> {
        for (k, _) in s.table.iter() {
            let key = k.get_ref().as_ref();
            if !known.contains(&key) {
                let hint = suggest(key, known).map_or_else(
                    || format!("; expected one of: {}", known.join(", ")),
                    |k| format!("; did you mean '{k}'?"),
                );
                let what = if s.name.is_empty() {
                    format!("unknown section [{key}]")
                } else {
                    format!("unknown key '{key}' in [{}]", s.name)
                };
                return Err(self.err(
                    k.span(),
                    s.dotted(key).trim_start_matches('.'),
                    format!("{what}{hint}"),
                ));
            }
        }
        Ok(())
    }

    /// The sub-table `key` of `parent`, or an empty one named `name`.
    fn section<'b, 'i>(
        &self,
        parent: &Section<'b, 'i>,
        key: &str,
        name: &str,
        empty: &'b DeTable<'i>,
    ) -> Result<Section<'b, 'i>> {
        match parent.get(key) {
            None => Ok(Section {
                name: name.into(),
                table: empty,
                span: 0..0,
            }),
            Some((span, v)) => match v.get_ref() {
                DeValue::Table(t) => Ok(Section {
                    name: name.into(),
                    table: t,
                    span,
                }),
                other => Err(self.err(
                    span,
                    name,
                    format!("expected a table ([{name}]), found {}", type_name(other)),
                )),
            },
        }
    }

    fn string(&self, s: &Section, key: &str) -> Result<Option<(Range<usize>, String)>> {
        match s.get(key) {
            None => Ok(None),
            Some((span, v)) => match v.get_ref() {
                DeValue::String(t) => Ok(Some((span, t.to_string()))),
                other => Err(self.err(
                    span,
                    &s.dotted(key),
                    format!("expected a string, found {}", type_name(other)),
                )),
            },
        }
    }

    fn one_of(
        &self,
        s: &Section,
        key: &str,
        allowed: &[&str],
    ) -> Result<Option<(Range<usize>, String)>> {
        let Some((span, v)) = self.string(s, key)? else {
            return Ok(None);
        };
        if !allowed.contains(&v.as_str()) {
            let hint =
                suggest(&v, allowed).map_or(String::new(), |k| format!("; did you mean '{k}'?"));
            return Err(self.err(
                span,
                &s.dotted(key),
                format!(
                    "unknown value '{v}'; expected one of: {}{hint}",
                    allowed.join(", ")
                ),
            ));
        }
        Ok(Some((span, v)))
    }

    fn int(&self, s: &Section, key: &str, min: i64) -> Result<Option<(Range<usize>, i64)>> {
        let Some((span, v)) = s.get(key) else {
            return Ok(None);
        };
        let n = int_of(v.get_ref()).ok_or_else(|| {
            self.err(
                span.clone(),
                &s.dotted(key),
                format!("expected an integer, found {}", type_name(v.get_ref())),
            )
        })?;
        if n < min {
            return Err(self.err(
                span,
                &s.dotted(key),
                format!("expected an integer >= {min}, found {n}"),
            ));
        }
        Ok(Some((span, n)))
    }

    fn float(&self, s: &Section, key: &str) -> Result<Option<(Range<usize>, f64)>> {
        let Some((span, v)) = s.get(key) else {
            return Ok(None);
        };
        match float_of(v.get_ref()) {
            Some(f) if f.is_finite() => Ok(Some((span, f))),
            _ => Err(self.err(
                span,
                &s.dotted(key),
                format!("expected a finite number, found {}", type_name(v.get_ref())),
            )),
        }
    }

    fn path(&self, s: &Section, key: &str) -> Result<Option<PathBuf>> {
        let Some((span, p)) = self.string(s, key)? else {
            return Ok(None);
        };
        let base = self.cx.path.parent().unwrap_or(Path::new("."));
        let full = if Path::new(&p).is_absolute() {
            PathBuf::from(&p)
        } else {
            base.join(&p)
        };
        if !full.is_file() {
            return Err(self.err(
                span,
                &s.dotted(key),
                format!("data file not found: {}", full.display()),
            ));
        }
        Ok(Some(full))
    }

    fn study(mut self, root: &DeTable, span: Range<usize>) -> Result<Study> {
        let top = Section {
            name: String::new(),
            table: root,
            span,
        };
        self.check_keys(
            &top,
            &[
                "study",
                "data",
                "model",
                "train",
                "sampler",
                "pruner",
                "scheduler",
                "worker",
                "params",
            ],
        )?;
        let empty = DeTable::default();
        let worker_sec = self.section(&top, "worker", "worker", &empty)?;
        let worker = self.worker(&worker_sec)?;
        if worker.is_some() {
            for (name, what) in [
                ("model", "[model]"),
                ("train", "[train]"),
                ("data", "[data]"),
            ] {
                if let Some((span, _)) = top.get(name) {
                    return Err(self.err(span, name, format!("{what} configures the built-in MLP; a kind = \"command\" worker's parameters go in [params]")));
                }
            }
        } else if let Some((span, _)) = top.get("params") {
            return Err(self.err(span, "params", "[params] applies to [worker] kind = \"command\"; the built-in MLP's knobs go in [model] and [train]"));
        }

        let study = self.section(&top, "study", "study", &empty)?;
        self.check_keys(
            &study,
            &[
                "name",
                "direction",
                "metric",
                "trials",
                "seed",
                "storage",
                "timeout",
            ],
        )?;

        let data = self.section(&top, "data", "data", &empty)?;
        let data = self.data(&data, &study)?;
        let task_is_regression = data.task == TaskKind::Regression;

        let name = match self.string(&study, "name")? {
            Some((span, n)) if n.trim().is_empty() => {
                return Err(self.err(span, "study.name", "the name must not be empty"));
            }
            Some((_, n)) => n,
            None => self
                .cx
                .path
                .file_stem()
                .map_or("study".into(), |s| s.to_string_lossy().into_owned()),
        };
        let metrics: &[&str] = if worker.is_some() {
            &[]
        } else if task_is_regression {
            &["val_rmse", "val_r2", "val_loss", "train_loss"]
        } else {
            &["val_accuracy", "val_loss", "train_loss"]
        };
        let metric = match self.string(&study, "metric")? {
            // A command worker reports values under any name.
            Some((_, m)) if worker.is_some() => m,
            None if worker.is_some() => "value".to_string(),
            Some((span, m)) if !metrics.contains(&m.as_str()) => {
                let task = if task_is_regression {
                    "regression"
                } else {
                    "classification"
                };
                let hint = suggest(&m, metrics)
                    .map_or(String::new(), |k| format!("; did you mean '{k}'?"));
                return Err(self.err(
                    span,
                    "study.metric",
                    format!(
                        "'{m}' is not a metric of {task}; expected one of: {}{hint}",
                        metrics.join(", ")
                    ),
                ));
            }
            Some((_, m)) => m,
            None => metrics[0].to_string(),
        };
        let direction = match self.one_of(&study, "direction", &["minimize", "maximize"])? {
            Some((_, d)) if d == "maximize" => Direction::Maximize,
            Some(_) => Direction::Minimize,
            None if matches!(metric.as_str(), "val_accuracy" | "val_r2") => Direction::Maximize,
            None => Direction::Minimize,
        };
        let trials = self.int(&study, "trials", 1)?.map_or(20, |(_, n)| n as u64);
        let seed = self.int(&study, "seed", 0)?.map_or(0, |(_, n)| n as u64);
        let storage = self
            .string(&study, "storage")?
            .map(|(_, s)| resolve_storage(&s, self.cx.path));
        let timeout = self.timeout(&study)?;

        let model = self.section(&top, "model", "model", &empty)?;
        self.check_keys(&model, &["kind", "depth", "width", "activation"])?;
        self.one_of(&model, "kind", &["mlp"])?;
        let train = self.section(&top, "train", "train", &empty)?;
        self.check_keys(
            &train,
            &[
                "optimizer",
                "lr",
                "batch_size",
                "epochs",
                "weight_decay",
                "dropout",
                "report_every",
                "sgd",
                "adam",
                "adamw",
            ],
        )?;
        let report_every = self.int(&train, "report_every", 1)?.map(|(_, n)| n as u64);

        let mut fixed = BTreeMap::new();
        let mut params = Vec::new();
        let mut optimizer: Option<(Range<usize>, KnobSpec)> = None;
        if worker.is_some() {
            let sec = self.section(&top, "params", "params", &empty)?;
            for (k, v) in sec.table.iter() {
                let name: &'static str = Box::leak(k.get_ref().to_string().into_boxed_str());
                let form = |f: &str| matches!(v.get_ref(), DeValue::Table(t) if t.iter().any(|(k, _)| k.get_ref().as_ref() == f));
                let kind = if form("float") {
                    KnobKind::Float {
                        min: f64::NEG_INFINITY,
                        min_inclusive: true,
                        max: None,
                    }
                } else if form("int") {
                    KnobKind::Int { min: i64::MIN }
                } else {
                    KnobKind::Free
                };
                let knob = Knob {
                    name,
                    section: "params",
                    key: name,
                    kind,
                    default: KnobDefault::Int(0),
                    optimizer: None,
                };
                let spec = self.knob(&knob, v.span(), v)?;
                self.place(&knob, spec, None, &mut fixed, &mut params);
            }
        }
        for section in [&model, &train] {
            if worker.is_some() {
                break;
            }
            let section_name = section.name.as_str();
            for knob in KNOBS.iter().filter(|k| k.section == section_name) {
                if let Some((span, v)) = section.get(knob.key) {
                    let spec = self.knob(knob, span.clone(), v)?;
                    if knob.name == "optimizer" {
                        optimizer = Some((span.clone(), clone_spec(&spec)));
                    }
                    self.place(knob, spec, None, &mut fixed, &mut params);
                }
            }
        }
        for opt in ["sgd", "adam", "adamw"] {
            if train.get(opt).is_none() {
                continue;
            }
            let sub = self.section(&train, opt, &format!("train.{opt}"), &empty)?;
            let keys: Vec<&str> = KNOBS
                .iter()
                .filter(|k| k.optimizer == Some(opt))
                .map(|k| k.key)
                .collect();
            self.check_keys(&sub, &keys)?;
            let condition = match &optimizer {
                None if opt == "adam" => None,
                None => return Err(self.err(sub.span.clone(), &sub.name, format!("[{}] applies only when optimizer can be '{opt}', but optimizer is 'adam' (the default)", sub.name))),
                Some((_, KnobSpec::Fixed(KnobValue::Str(o)))) if o == opt => None,
                Some((_, KnobSpec::Fixed(o))) => return Err(self.err(sub.span.clone(), &sub.name, format!("[{}] applies only when optimizer can be '{opt}', but optimizer is fixed to '{o}'", sub.name))),
                Some((_, KnobSpec::Dist(Distribution::Categorical { choices }))) => {
                    if !choices.contains(&Choice::Str(opt.into())) {
                        return Err(self.err(sub.span.clone(), &sub.name, format!("[{}] applies only when optimizer can be '{opt}', which is not among its choices", sub.name)));
                    }
                    Some(Condition { parent: "optimizer".into(), values: vec![Choice::Str(opt.into())] })
                }
                Some(_) => unreachable!("optimizer is a string knob"),
            };
            for knob in KNOBS.iter().filter(|k| k.optimizer == Some(opt)) {
                if let Some((span, v)) = sub.get(knob.key) {
                    let spec = self.knob(knob, span, v)?;
                    self.place(knob, spec, condition.clone(), &mut fixed, &mut params);
                }
            }
        }
        let space = SearchSpace::new(params)
            .map_err(|e| Error::Input(format!("{}: {e}", self.cx.path.display())))?;

        let sampler_sec = self.section(&top, "sampler", "sampler", &empty)?;
        self.check_keys(
            &sampler_sec,
            &["kind", "seed", "startup_trials", "multivariate"],
        )?;
        let kind = match self.one_of(&sampler_sec, "kind", &["random", "grid", "tpe", "qmc"])? {
            Some((span, k)) if k == "grid" => {
                GridSampler::new(&space, 0).map_err(|e| self.err(span, "sampler.kind", e))?;
                SamplerKind::Grid
            }
            Some((_, k)) if k == "tpe" => SamplerKind::Tpe {
                startup_trials: self
                    .int(&sampler_sec, "startup_trials", 0)?
                    .map_or(10, |(_, n)| n as usize),
                multivariate: match sampler_sec.get("multivariate") {
                    None => true,
                    Some((span, v)) => match v.get_ref() {
                        DeValue::Boolean(b) => *b,
                        other => {
                            return Err(self.err(
                                span,
                                "sampler.multivariate",
                                format!("expected true or false, found {}", type_name(other)),
                            ));
                        }
                    },
                },
            },
            Some((_, k)) if k == "qmc" => SamplerKind::Qmc,
            _ => SamplerKind::Random,
        };
        for key in ["startup_trials", "multivariate"] {
            if let (Some((span, _)), false) = (
                sampler_sec.get(key),
                matches!(kind, SamplerKind::Tpe { .. }),
            ) {
                return Err(self.err(
                    span,
                    &format!("sampler.{key}"),
                    format!("{key} applies only to kind = \"tpe\""),
                ));
            }
        }
        let sampler = SamplerConfig {
            kind,
            seed: self
                .int(&sampler_sec, "seed", 0)?
                .map_or(seed, |(_, n)| n as u64),
        };

        let pruner_sec = self.section(&top, "pruner", "pruner", &empty)?;
        let pruner = self.pruner(&pruner_sec)?;

        let sched = self.section(&top, "scheduler", "scheduler", &empty)?;
        let scheduler = self.scheduler(&sched)?;

        Ok(Study {
            path: self.cx.path.to_path_buf(),
            name,
            direction,
            metric,
            trials,
            seed,
            storage,
            timeout,
            data,
            space,
            fixed,
            report_every,
            sampler,
            pruner,
            scheduler,
            worker,
            positions: std::mem::take(&mut self.positions),
        })
    }

    fn place(
        &mut self,
        knob: &Knob,
        spec: KnobSpec,
        condition: Option<Condition>,
        fixed: &mut BTreeMap<String, KnobValue>,
        params: &mut Vec<Param>,
    ) {
        match spec {
            KnobSpec::Fixed(v) => {
                fixed.insert(knob.name.to_string(), v);
            }
            KnobSpec::Dist(dist) => params.push(Param {
                name: knob.name.to_string(),
                dist,
                condition,
            }),
        }
    }

    /// A knob's value: a scalar (fixed) or a distribution table.
    fn knob(&mut self, knob: &Knob, span: Range<usize>, v: &Val) -> Result<KnobSpec> {
        let key = format!("{}.{}", knob.section, knob.key);
        let start = self.cx.err(span.clone(), "", "");
        if let Error::Study { line, col, .. } = start {
            self.positions.insert(knob.name.to_string(), (line, col));
        }
        let DeValue::Table(t) = v.get_ref() else {
            let value = self.scalar(knob, &key, span.clone(), v.get_ref())?;
            return Ok(KnobSpec::Fixed(value));
        };
        let s = Section {
            name: key.clone(),
            table: t,
            span: v.span(),
        };
        self.check_keys(&s, &["float", "int", "choices", "log", "step"])?;
        let forms: Vec<&str> = ["float", "int", "choices"]
            .into_iter()
            .filter(|f| s.get(f).is_some())
            .collect();
        if forms.len() != 1 {
            return Err(self.err(v.span(), &key, "a distribution needs exactly one of: float = [low, high], int = [low, high], choices = [...]"));
        }
        let log = match s.get("log") {
            None => false,
            Some((sp, b)) => match b.get_ref() {
                DeValue::Boolean(b) => *b,
                other => {
                    return Err(self.err(
                        sp,
                        &s.dotted("log"),
                        format!("expected true or false, found {}", type_name(other)),
                    ));
                }
            },
        };
        let dist = match forms[0] {
            "choices" => {
                if s.get("log").is_some() || s.get("step").is_some() {
                    return Err(self.err(v.span(), &key, "log and step do not apply to choices"));
                }
                let (csp, arr) = s.get("choices").unwrap();
                let DeValue::Array(items) = arr.get_ref() else {
                    return Err(self.err(
                        csp,
                        &s.dotted("choices"),
                        format!("expected an array, found {}", type_name(arr.get_ref())),
                    ));
                };
                if items.is_empty() {
                    return Err(self.err(
                        arr.span(),
                        &s.dotted("choices"),
                        "choices must not be empty",
                    ));
                }
                let mut choices = Vec::new();
                for item in items.iter() {
                    let value =
                        self.scalar(knob, &s.dotted("choices"), item.span(), item.get_ref())?;
                    let choice = match value {
                        KnobValue::Float(f) => Choice::Float(f),
                        KnobValue::Int(i) => Choice::Int(i),
                        KnobValue::Str(st) => Choice::Str(st),
                        KnobValue::Bool(b) => Choice::Bool(b),
                    };
                    if choices.contains(&choice) {
                        return Err(self.err(
                            item.span(),
                            &s.dotted("choices"),
                            format!(
                                "'{}' appears twice",
                                crate::space::distribution_json(&Distribution::Categorical {
                                    choices: vec![choice]
                                })
                            ),
                        ));
                    }
                    choices.push(choice);
                }
                Distribution::Categorical { choices }
            }
            form => {
                let (rsp, range) = s.get(form).unwrap();
                let pair = match range.get_ref() {
                    DeValue::Array(a) if a.len() == 2 => a,
                    other => {
                        return Err(self.err(
                            rsp,
                            &s.dotted(form),
                            format!("expected [low, high], found {}", type_name(other)),
                        ));
                    }
                };
                match (form, knob.kind) {
                    ("float", KnobKind::Float { .. }) => {
                        let num = |i: usize| {
                            float_of(pair[i].get_ref())
                                .filter(|f| f.is_finite())
                                .ok_or_else(|| {
                                    self.err(
                                        pair[i].span(),
                                        &s.dotted("float"),
                                        format!(
                                            "expected a number, found {}",
                                            type_name(pair[i].get_ref())
                                        ),
                                    )
                                })
                        };
                        let (low, high) = (num(0)?, num(1)?);
                        let step = self.float(&s, "step")?.map(|(_, f)| f);
                        for (i, b) in [low, high].into_iter().enumerate() {
                            self.domain(knob, &KnobValue::Float(b))
                                .map_err(|m| self.err(pair[i].span(), &key, m))?;
                        }
                        Distribution::Float {
                            low,
                            high,
                            log,
                            step,
                        }
                    }
                    ("int", KnobKind::Int { .. }) => {
                        let num = |i: usize| {
                            int_of(pair[i].get_ref()).ok_or_else(|| {
                                self.err(
                                    pair[i].span(),
                                    &s.dotted("int"),
                                    format!(
                                        "expected an integer, found {}",
                                        type_name(pair[i].get_ref())
                                    ),
                                )
                            })
                        };
                        let (low, high) = (num(0)?, num(1)?);
                        let step = self.int(&s, "step", i64::MIN)?.map_or(1, |(_, n)| n);
                        for (i, b) in [low, high].into_iter().enumerate() {
                            self.domain(knob, &KnobValue::Int(b))
                                .map_err(|m| self.err(pair[i].span(), &key, m))?;
                        }
                        Distribution::Int {
                            low,
                            high,
                            log,
                            step,
                        }
                    }
                    (_, KnobKind::Float { .. }) => {
                        return Err(self.err(
                            rsp,
                            &key,
                            format!("{} takes real numbers: use float = [low, high]", knob.key),
                        ));
                    }
                    (_, KnobKind::Int { .. }) => {
                        return Err(self.err(
                            rsp,
                            &key,
                            format!("{} takes integers: use int = [low, high]", knob.key),
                        ));
                    }
                    _ => {
                        return Err(self.err(
                            rsp,
                            &key,
                            format!("{} takes named values: use choices = [...]", knob.key),
                        ));
                    }
                }
            }
        };
        dist.check().map_err(|m| self.err(v.span(), &key, m))?;
        Ok(KnobSpec::Dist(dist))
    }

    /// A fixed value (or one choice) of a knob, checked against its type and domain.
    fn scalar(&self, knob: &Knob, key: &str, span: Range<usize>, v: &DeValue) -> Result<KnobValue> {
        let value = match (knob.kind, v) {
            (KnobKind::Float { .. }, DeValue::Float(_) | DeValue::Integer(_)) => {
                KnobValue::Float(float_of(v).unwrap_or(f64::NAN))
            }
            (KnobKind::Int { .. }, DeValue::Integer(_)) => KnobValue::Int(
                int_of(v).ok_or_else(|| self.err(span.clone(), key, "integer out of range"))?,
            ),
            (KnobKind::Str(_), DeValue::String(s)) => KnobValue::Str(s.to_string()),
            (KnobKind::Bool, DeValue::Boolean(b)) => KnobValue::Bool(*b),
            (KnobKind::Free, DeValue::Float(_)) => {
                KnobValue::Float(float_of(v).unwrap_or(f64::NAN))
            }
            (KnobKind::Free, DeValue::Integer(_)) => KnobValue::Int(
                int_of(v).ok_or_else(|| self.err(span.clone(), key, "integer out of range"))?,
            ),
            (KnobKind::Free, DeValue::String(s)) => KnobValue::Str(s.to_string()),
            (KnobKind::Free, DeValue::Boolean(b)) => KnobValue::Bool(*b),
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
                    format!("expected {want}, found {}", type_name(other)),
                ));
            }
        };
        self.domain(knob, &value)
            .map_err(|m| self.err(span, key, m))?;
        Ok(value)
    }

    fn domain(&self, knob: &Knob, v: &KnobValue) -> std::result::Result<(), String> {
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

    fn timeout(&self, s: &Section) -> Result<Option<Duration>> {
        let Some((span, v)) = s.get("timeout") else {
            return Ok(None);
        };
        let secs = match v.get_ref() {
            DeValue::Integer(_) => int_of(v.get_ref()).filter(|n| *n > 0).map(|n| n as f64),
            DeValue::Float(_) => float_of(v.get_ref()).filter(|f| *f > 0.0 && f.is_finite()),
            DeValue::String(t) => parse_duration(t),
            _ => None,
        };
        secs.map(|s| Some(Duration::from_secs_f64(s)))
            .ok_or_else(|| self.err(span, "study.timeout", "expected a positive number of seconds or a duration such as \"90s\", \"30m\" or \"2h\""))
    }

    fn data(&self, s: &Section, study: &Section) -> Result<DataConfig> {
        const KEYS: &[&str] = &[
            "source",
            "path",
            "target",
            "targets",
            "task",
            "validation",
            "split_seed",
            "rows",
            "features",
            "classes",
            "informative",
            "noise",
        ];
        self.check_keys(s, KEYS)?;
        let sources = [
            "digits",
            "csv",
            "npy",
            "synthetic-classification",
            "synthetic-regression",
        ];
        let (source_span, source) = self
            .one_of(s, "source", &sources)?
            .unwrap_or((s.span.clone(), "digits".into()));
        let applies: &[&str] = match source.as_str() {
            "digits" => &[],
            "csv" => &["path", "target", "task"],
            "npy" => &["path", "targets", "task"],
            "synthetic-classification" => &["rows", "features", "classes", "informative"],
            _ => &["rows", "features", "informative", "noise"],
        };
        for key in &KEYS[1..] {
            if let Some((span, _)) = s.get(key)
                && !applies.contains(key)
                && !["validation", "split_seed"].contains(key)
            {
                return Err(self.err(
                    span,
                    &s.dotted(key),
                    format!("'{key}' does not apply to source = \"{source}\""),
                ));
            }
        }
        let required = |key: &str| {
            self.err(
                source_span.clone(),
                &s.dotted(key),
                format!("source = \"{source}\" needs '{key}'"),
            )
        };
        let task = match self.one_of(s, "task", &["classification", "regression"])? {
            Some((_, t)) if t == "regression" => TaskKind::Regression,
            _ if source == "synthetic-regression" => TaskKind::Regression,
            _ => TaskKind::Classification,
        };
        let usize_of = |key: &str, min: i64, default: usize| -> Result<usize> {
            Ok(self.int(s, key, min)?.map_or(default, |(_, n)| n as usize))
        };
        let source = match source.as_str() {
            "digits" => DataSource::Digits,
            "csv" => DataSource::Csv {
                path: self.path(s, "path")?.ok_or_else(|| required("path"))?,
                target: self
                    .string(s, "target")?
                    .ok_or_else(|| required("target"))?
                    .1,
            },
            "npy" => DataSource::Npy {
                path: self.path(s, "path")?.ok_or_else(|| required("path"))?,
                targets: self
                    .path(s, "targets")?
                    .ok_or_else(|| required("targets"))?,
            },
            "synthetic-classification" => DataSource::SyntheticClassification {
                rows: usize_of("rows", 4, 1000)?,
                features: usize_of("features", 1, 20)?,
                classes: usize_of("classes", 2, 2)?,
                informative: usize_of("informative", 1, 5)?,
            },
            _ => DataSource::SyntheticRegression {
                rows: usize_of("rows", 4, 1000)?,
                features: usize_of("features", 1, 20)?,
                informative: usize_of("informative", 1, 5)?,
                noise: match self.float(s, "noise")? {
                    Some((span, n)) if n < 0.0 => {
                        return Err(self.err(span, "data.noise", "noise must be >= 0"));
                    }
                    Some((_, n)) => n as f32,
                    None => 0.1,
                },
            },
        };
        let validation = match self.float(s, "validation")? {
            Some((span, v)) if !(v > 0.0 && v < 1.0) => {
                return Err(self.err(
                    span,
                    "data.validation",
                    format!("validation must be a fraction in (0, 1), got {v}"),
                ));
            }
            Some((_, v)) => v,
            None => 0.2,
        };
        let study_seed = self.int(study, "seed", 0)?.map_or(0, |(_, n)| n as u64);
        let split_seed = self
            .int(s, "split_seed", 0)?
            .map_or(study_seed, |(_, n)| n as u64);
        Ok(DataConfig {
            source,
            task,
            validation,
            split_seed,
        })
    }

    fn pruner(&self, s: &Section) -> Result<PrunerKind> {
        const KEYS: &[&str] = &[
            "kind",
            "min_resource",
            "reduction_factor",
            "max_resource",
            "startup_trials",
            "warmup_steps",
        ];
        self.check_keys(s, KEYS)?;
        let kind = self
            .one_of(s, "kind", &["none", "asha", "hyperband", "median"])?
            .map_or("none".to_string(), |(_, k)| k);
        let applies: &[&str] = match kind.as_str() {
            "asha" => &["min_resource", "reduction_factor"],
            "hyperband" => &["min_resource", "reduction_factor", "max_resource"],
            "median" => &["startup_trials", "warmup_steps"],
            _ => &[],
        };
        for key in &KEYS[1..] {
            if let Some((span, _)) = s.get(key)
                && !applies.contains(key)
            {
                return Err(self.err(
                    span,
                    &s.dotted(key),
                    format!("'{key}' does not apply to kind = \"{kind}\""),
                ));
            }
        }
        let min_resource = self.int(s, "min_resource", 1)?.map_or(1, |(_, n)| n as u64);
        let reduction_factor = self
            .int(s, "reduction_factor", 2)?
            .map_or(3, |(_, n)| n as u64);
        Ok(match kind.as_str() {
            "asha" => PrunerKind::Asha {
                min_resource,
                reduction_factor,
            },
            "hyperband" => {
                let max_resource =
                    match self.int(s, "max_resource", 1)? {
                        Some((span, m)) if (m as u64) < min_resource => return Err(self.err(
                            span,
                            "pruner.max_resource",
                            format!(
                                "max_resource ({m}) must be at least min_resource ({min_resource})"
                            ),
                        )),
                        Some((_, m)) => m as u64,
                        None => min_resource * reduction_factor.pow(3),
                    };
                PrunerKind::Hyperband {
                    min_resource,
                    max_resource,
                    reduction_factor,
                }
            }
            "median" => PrunerKind::Median {
                startup_trials: self
                    .int(s, "startup_trials", 0)?
                    .map_or(5, |(_, n)| n as usize),
                warmup_steps: self.int(s, "warmup_steps", 0)?.map_or(0, |(_, n)| n as u64),
            },
            _ => PrunerKind::None,
        })
    }

    /// `[worker]`: the built-in MLP (`kind = "mlp"`, the default, `None`)
    /// or the user's own script (`kind = "command"`).
    fn worker(&self, s: &Section) -> Result<Option<WorkerConfig>> {
        self.check_keys(
            s,
            &[
                "kind",
                "command",
                "cwd",
                "env",
                "memory",
                "report_every",
                "max_concurrency",
                "iterations",
                "heartbeat_timeout",
            ],
        )?;
        match self.one_of(s, "kind", &["mlp", "command"])? {
            None | Some((_, _)) if s.get("kind").is_none() && s.table.is_empty() => {
                return Ok(None);
            }
            Some((_, k)) if k == "mlp" => {
                if let Some((span, _)) = s
                    .table
                    .iter()
                    .find(|(k, _)| k.get_ref().as_ref() != "kind")
                    .map(|(k, v)| (k.span(), v))
                {
                    return Err(self.err(span, "worker", "these keys apply to kind = \"command\""));
                }
                return Ok(None);
            }
            None => {
                return Err(self.err(
                    s.span.clone(),
                    "worker.kind",
                    "say kind = \"command\" (or \"mlp\", the built-in model)",
                ));
            }
            Some(_) => {}
        }
        let command = match s.get("command") {
            None => {
                return Err(self.err(
                    s.span.clone(),
                    "worker.command",
                    "kind = \"command\" needs command = [\"program\", \"arg\", ...]",
                ));
            }
            Some((span, v)) => match v.get_ref() {
                DeValue::Array(items) if !items.is_empty() => items
                    .iter()
                    .map(|i| match i.get_ref() {
                        DeValue::String(t) => Ok(t.to_string()),
                        other => Err(self.err(
                            i.span(),
                            "worker.command",
                            format!("expected a string, found {}", type_name(other)),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?,
                other => {
                    return Err(self.err(
                        span,
                        "worker.command",
                        format!(
                            "expected a non-empty array of strings, found {}",
                            type_name(other)
                        ),
                    ));
                }
            },
        };
        let base = match self.cx.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let cwd = match self.string(s, "cwd")? {
            Some((_, c)) => base.join(c),
            None => base,
        };
        let mut env = BTreeMap::new();
        if let Some((span, v)) = s.get("env") {
            let DeValue::Table(t) = v.get_ref() else {
                return Err(self.err(
                    span,
                    "worker.env",
                    format!(
                        "expected a table of strings, found {}",
                        type_name(v.get_ref())
                    ),
                ));
            };
            for (k, val) in t.iter() {
                let DeValue::String(text) = val.get_ref() else {
                    return Err(self.err(
                        val.span(),
                        &format!("worker.env.{}", k.get_ref()),
                        format!("expected a string, found {}", type_name(val.get_ref())),
                    ));
                };
                env.insert(k.get_ref().to_string(), text.to_string());
            }
        }
        let memory_bytes = match s.get("memory") {
            None => 256 << 20,
            Some((span, v)) => match v.get_ref() {
                DeValue::Integer(_) => int_of(v.get_ref()).filter(|n| *n > 0).map(|n| n as u64),
                DeValue::String(t) => parse_bytes(t),
                _ => None,
            }
            .ok_or_else(|| {
                self.err(
                    span,
                    "worker.memory",
                    "expected a positive byte count or a size such as \"512MiB\"",
                )
            })?,
        };
        let heartbeat_timeout = match s.get("heartbeat_timeout") {
            None => Duration::from_secs(60),
            Some((span, v)) => match v.get_ref() {
                DeValue::Integer(_) => int_of(v.get_ref()).filter(|n| *n > 0).map(|n| n as f64),
                DeValue::Float(_) => float_of(v.get_ref()).filter(|f| *f > 0.0 && f.is_finite()),
                DeValue::String(t) => parse_duration(t),
                _ => None,
            }
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                self.err(
                    span,
                    "worker.heartbeat_timeout",
                    "expected a positive number of seconds or a duration such as \"30s\"",
                )
            })?,
        };
        Ok(Some(WorkerConfig {
            command,
            cwd,
            env,
            memory_bytes,
            report_every: self.int(s, "report_every", 1)?.map_or(1, |(_, n)| n as u64),
            max_concurrency: self.int(s, "max_concurrency", 1)?.map(|(_, n)| n as usize),
            iterations: self.int(s, "iterations", 1)?.map_or(100, |(_, n)| n as u64),
            heartbeat_timeout,
        }))
    }

    fn scheduler(&self, s: &Section) -> Result<SchedulerConfig> {
        self.check_keys(
            s,
            &[
                "policy",
                "lanes",
                "max_concurrent",
                "memory",
                "fuse",
                "graphs",
            ],
        )?;
        let names = Policy::ALL.map(Policy::name);
        let policy = self.one_of(s, "policy", &names)?.map(|(_, p)| {
            Policy::ALL
                .into_iter()
                .find(|q| q.name() == p)
                .expect("one_of accepts only these names")
        });
        let memory_bytes = match s.get("memory") {
            None => None,
            Some((span, v)) => {
                let bytes = match v.get_ref() {
                    DeValue::Integer(_) => int_of(v.get_ref()).filter(|n| *n > 0).map(|n| n as u64),
                    DeValue::String(t) => parse_bytes(t),
                    _ => None,
                };
                Some(bytes.ok_or_else(|| {
                    self.err(
                        span,
                        "scheduler.memory",
                        "expected a positive byte count or a size such as \"512MiB\" or \"8GiB\"",
                    )
                })?)
            }
        };
        Ok(SchedulerConfig {
            policy,
            lanes: self.int(s, "lanes", 1)?.map(|(_, n)| n as usize),
            max_concurrent: self.int(s, "max_concurrent", 1)?.map(|(_, n)| n as usize),
            memory_bytes,
            fuse: self.int(s, "fuse", 1)?.map(|(_, n)| n as usize),
            graphs: self
                .one_of(s, "graphs", &["auto", "off"])?
                .map(|(_, g)| match g.as_str() {
                    "off" => GraphsMode::Off,
                    _ => GraphsMode::Auto,
                }),
        })
    }
}

fn clone_spec(s: &KnobSpec) -> KnobSpec {
    match s {
        KnobSpec::Fixed(v) => KnobSpec::Fixed(v.clone()),
        KnobSpec::Dist(d) => KnobSpec::Dist(d.clone()),
    }
}

/// `"90s"`, `"30m"`, `"2h"`, `"1.5h"` or a bare number of seconds.
fn parse_duration(t: &str) -> Option<f64> {
    let t = t.trim();
    let (num, unit) = t
        .find(|c: char| c.is_alphabetic())
        .map_or((t, ""), |i| (&t[..i], &t[i..]));
    let n: f64 = num.trim().parse().ok()?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Some(n * scale).filter(|s| *s > 0.0 && s.is_finite())
}

/// `"512MiB"`, `"8GiB"`, `"2GB"` or a bare number of bytes.
fn parse_bytes(t: &str) -> Option<u64> {
    let t = t.trim();
    let (num, unit) = t
        .find(|c: char| c.is_alphabetic())
        .map_or((t, ""), |i| (&t[..i], &t[i..]));
    let n: f64 = num.trim().parse().ok()?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        _ => return None,
    };
    Some((n * scale) as u64).filter(|b| *b > 0)
}

/// A storage location from the study file: relative paths are relative to
/// the study file's folder; Optuna's `sqlite:///` form is kept.
fn resolve_storage(s: &str, study_path: &Path) -> String {
    let base = study_path.parent().unwrap_or(Path::new("."));
    let (prefix, rest) = match s.strip_prefix("sqlite:///") {
        Some(rest) => ("sqlite:///", rest),
        None => ("", s),
    };
    if rest.starts_with('/') || rest.starts_with(':') {
        return s.to_string();
    }
    format!("{prefix}{}", base.join(rest).display())
}
