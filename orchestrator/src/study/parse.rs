//! Reading `study.toml` into a [`Study`], with errors that point at the
//! file, line, column and key.
//!
//! Three steps, each in its own file:
//! - `locate.rs` parses the text and owns every error's position and key;
//! - `raw.rs` is the file's shape as serde structs: unknown keys and wrong
//!   types stop there;
//! - this file checks what serde cannot (ranges, keys that apply only with
//!   others, distributions) and builds the [`Study`].

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;
use training::data::TaskKind;

use super::locate::{Source, suggest};
use super::raw::{self, Int, KnobRaw, KnobSection, Named, Scalar, Str};
use super::*;
use crate::error::{Error, Result};
use crate::sampler::GridSampler;
use crate::space::{Choice, Condition, Distribution, Param, SearchSpace};

mod knobs;
mod pbt;
mod sections;
pub use pbt::{MUTABLE_KNOBS, Schedule};

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
    let source = Source::parse(src, path)?;
    let root: raw::Root = source.deserialize()?;
    Checker {
        src: &source,
        positions: BTreeMap::new(),
    }
    .study(root)
}

/// A parsed knob: fixed, or a distribution.
#[derive(Clone)]
enum KnobSpec {
    Fixed(KnobValue),
    Dist(Distribution),
}

/// The knobs found so far: fixed values and the search space's parameters.
#[derive(Default)]
struct Knobs {
    fixed: BTreeMap<String, KnobValue>,
    params: Vec<Param>,
}

impl Knobs {
    fn place(&mut self, knob: &Knob, spec: KnobSpec, condition: Option<Condition>) {
        match spec {
            KnobSpec::Fixed(v) => {
                self.fixed.insert(knob.name.to_string(), v);
            }
            KnobSpec::Dist(dist) => self.params.push(Param {
                name: knob.name.to_string(),
                dist,
                condition,
            }),
        }
    }
}

/// Where a key was written, and its full name.
type KeySpan = (Range<usize>, &'static str);

/// The span of an optional section, or nothing.
fn span_of<T>(field: &Option<Spanned<T>>) -> Option<Range<usize>> {
    field.as_ref().map(Spanned::span)
}

/// An optional section's span and contents, or its defaults.
fn inner<T: Default>(field: Option<Spanned<raw::Table<T>>>) -> (Range<usize>, T) {
    field.map_or((0..0, T::default()), |s| (s.span(), s.into_inner().0))
}

struct Checker<'a> {
    src: &'a Source<'a>,
    positions: BTreeMap<String, (usize, usize)>,
}

impl Checker<'_> {
    fn err(&self, span: Range<usize>, key: &str, msg: impl Into<String>) -> Error {
        self.src.err(span, key, msg)
    }

    /// An integer of at least `min`.
    fn at_least(&self, field: &Option<Spanned<Int>>, key: &str, min: i64) -> Result<Option<i64>> {
        let Some(v) = field else { return Ok(None) };
        let n = v.get_ref().0;
        if n < min {
            return Err(self.err(
                v.span(),
                key,
                format!("expected an integer >= {min}, found {n}"),
            ));
        }
        Ok(Some(n))
    }

    /// A string that is one of `allowed`.
    fn one_of(
        &self,
        field: &Option<Spanned<Str>>,
        key: &str,
        allowed: &[&str],
    ) -> Result<Option<Spanned<String>>> {
        let Some(v) = field else { return Ok(None) };
        let word = &v.get_ref().0;
        if !allowed.contains(&word.as_str()) {
            let hint =
                suggest(word, allowed).map_or(String::new(), |k| format!("; did you mean '{k}'?"));
            return Err(self.err(
                v.span(),
                key,
                format!(
                    "unknown value '{word}'; expected one of: {}{hint}",
                    allowed.join(", ")
                ),
            ));
        }
        Ok(Some(Spanned::new(v.span(), word.clone())))
    }

    /// A positive duration: seconds, or a string such as "90s".
    fn duration(
        &self,
        field: &Option<Spanned<Scalar>>,
        key: &str,
        msg: &str,
    ) -> Result<Option<Duration>> {
        let Some(v) = field else { return Ok(None) };
        let secs = match v.get_ref() {
            Scalar::Int(n) => Some(*n as f64).filter(|s| *s > 0.0),
            Scalar::Float(f) => Some(*f).filter(|f| *f > 0.0 && f.is_finite()),
            Scalar::Str(t) => parse_duration(t),
            _ => None,
        };
        secs.map(|s| Some(Duration::from_secs_f64(s)))
            .ok_or_else(|| self.err(v.span(), key, msg))
    }

    /// A positive size: bytes, or a string such as "512MiB".
    fn bytes(&self, field: &Option<Spanned<Scalar>>, key: &str, msg: &str) -> Result<Option<u64>> {
        let Some(v) = field else { return Ok(None) };
        let bytes = match v.get_ref() {
            Scalar::Int(n) => u64::try_from(*n).ok().filter(|n| *n > 0),
            Scalar::Str(t) => parse_bytes(t),
            _ => None,
        };
        bytes.map(Some).ok_or_else(|| self.err(v.span(), key, msg))
    }

    /// `study.keep`: `best` by default for the built-in MLP; a command
    /// worker saves its own model, so only `none` applies to one.
    fn keep(&self, field: &Option<Spanned<Str>>, worker: bool) -> Result<Keep> {
        let Some(word) = self.one_of(field, "study.keep", &Keep::NAMES)? else {
            return Ok(if worker { Keep::None } else { Keep::Best });
        };
        let keep = match word.get_ref().as_str() {
            "none" => Keep::None,
            "best" => Keep::Best,
            _ => Keep::All,
        };
        if worker && keep != Keep::None {
            return Err(self.err(
                word.span(),
                "study.keep",
                "keep applies to the built-in MLP; a command worker saves its own model",
            ));
        }
        Ok(keep)
    }

    /// A data file, relative to the study file's folder.
    fn data_file(&self, field: &Option<Spanned<Str>>, key: &str) -> Result<Option<PathBuf>> {
        self.data_path(field, key, false)
    }

    /// A data file, or a directory too when `dir` says so, relative to the study file.
    fn data_path(
        &self,
        field: &Option<Spanned<Str>>,
        key: &str,
        dir: bool,
    ) -> Result<Option<PathBuf>> {
        let Some(v) = field else { return Ok(None) };
        let p = Path::new(&v.get_ref().0);
        let base = self.src.path.parent().unwrap_or(Path::new("."));
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        };
        if !(full.is_file() || dir && full.is_dir()) {
            let what = if dir {
                "data file or directory"
            } else {
                "data file"
            };
            return Err(self.err(
                v.span(),
                key,
                format!("{what} not found: {}", full.display()),
            ));
        }
        Ok(Some(full))
    }

    fn study(mut self, root: raw::Root) -> Result<Study> {
        let worker = self.worker(root.worker)?;
        if worker.is_some() {
            for (name, what, span) in [
                ("model", "[model]", span_of(&root.model)),
                ("train", "[train]", span_of(&root.train)),
                ("data", "[data]", span_of(&root.data)),
            ] {
                if let Some(span) = span {
                    return Err(self.err(span, name, format!("{what} configures the built-in MLP; a kind = \"command\" worker's parameters go in [params]")));
                }
            }
        } else if let Some(span) = span_of(&root.params) {
            return Err(self.err(span, "params", "[params] applies to [worker] kind = \"command\"; the built-in MLP's knobs go in [model] and [train]"));
        }

        let (_, study) = inner(root.study);
        let seed = self
            .at_least(&study.seed, "study.seed", 0)?
            .map_or(0, |n| n as u64);
        let (data, augment_span) = self.data(root.data, seed)?;
        let name = match &study.name {
            Some(n) if n.get_ref().0.trim().is_empty() => {
                return Err(self.err(n.span(), "study.name", "the name must not be empty"));
            }
            Some(n) => n.get_ref().0.clone(),
            None => self
                .src
                .path
                .file_stem()
                .map_or("study".into(), |s| s.to_string_lossy().into_owned()),
        };
        let metrics = self.metrics(&study.metric, worker.is_some(), data.task)?;
        let objectives = self.directions(&study.direction, metrics, worker.is_some())?;
        let (metric, direction) = objectives[0].clone();
        let constraints =
            self.constraints(&study.constraints, &objectives, worker.is_some(), data.task)?;
        let trials = self
            .at_least(&study.trials, "study.trials", 1)?
            .map_or(20, |n| n as u64);
        let storage = study
            .storage
            .as_ref()
            .map(|s| resolve_storage(&s.get_ref().0, self.src.path));
        let checkpoints = study.checkpoints.as_ref().map(|s| {
            let base = self.src.path.parent().unwrap_or(Path::new("."));
            base.join(&s.get_ref().0)
        });
        let timeout = self.duration(
            &study.timeout,
            "study.timeout",
            "expected a positive number of seconds or a duration such as \"90s\", \"30m\" or \"2h\"",
        )?;
        let liveness_msg = "expected a duration of at least 5 s (two heartbeats and a margin), \
                            such as \"10s\" or \"1m\"";
        let liveness = self
            .duration(&study.liveness, "study.liveness", liveness_msg)?
            .unwrap_or(Duration::from_secs_f64(DEFAULT_LIVENESS_S));
        if let Some(v) = &study.liveness
            && liveness < Duration::from_secs(5)
        {
            return Err(self.err(v.span(), "study.liveness", liveness_msg));
        }

        let max_consecutive_failures = self
            .at_least(
                &study.max_consecutive_failures,
                "study.max_consecutive_failures",
                1,
            )?
            .map_or(5, |n| n as u64);
        let keep = self.keep(&study.keep, worker.is_some())?;

        let (_, model) = inner(root.model);
        let model_kind = self.model_kind(&model, &data)?;
        // Kept models are MLPs: the export has no convolution layers yet.
        let keep = match (model_kind, &study.keep) {
            (ModelKind::Mlp, _) => keep,
            (_, Some(k)) if keep != Keep::None => {
                return Err(self.err(k.span(), "study.keep", "keeping a conv net's model is not supported yet; use keep = \"none\" (the default for kind = \"cnn\")"));
            }
            _ => Keep::None,
        };
        if let (Some((span, key)), ModelKind::Mlp) = (augment_span, model_kind) {
            return Err(self.err(
                span,
                key,
                "crop and flip augment images for a conv net: they need [model] kind = \"cnn\"",
            ));
        }
        let mut data = data;
        data.images = matches!(model_kind, ModelKind::Cnn { .. });
        let (_, train) = inner(root.train);
        let mut report_every = self
            .at_least(&train.report_every, "train.report_every", 1)?
            .map(|n| n as u64);

        let mut knobs = Knobs::default();
        if worker.is_some() {
            self.command_params(root.params, &mut knobs)?;
        } else {
            self.builtin_knobs(&model, &train, &mut knobs)?;
            if let ModelKind::Cnn { preset } = model_kind {
                // Stored with the study, so that a resume under another model is refused.
                knobs
                    .fixed
                    .insert("model".into(), KnobValue::Str("cnn".into()));
                if let Some(p) = preset {
                    knobs
                        .fixed
                        .insert("preset".into(), KnobValue::Str(p.name().into()));
                }
            }
        }
        let schedule = self.schedule(&train.schedule, &knobs)?;
        let schedule_span = span_of(&train.schedule);
        if let (Some(span), true) = (&schedule_span, worker.is_some()) {
            return Err(self.err(
                span.clone(),
                "train.schedule",
                "a schedule changes a built-in trial's values as it trains: an external worker's \
                 script schedules its own",
            ));
        }
        let space = SearchSpace::new(knobs.params)
            .map_err(|e| Error::Input(format!("{}: {e}", self.src.path.display())))?;
        let sampler = self.sampler(root.sampler, &space, seed, objectives.len())?;
        if let (false, SamplerKind::Gp { .. }) = (constraints.is_empty(), &sampler.kind) {
            return Err(self.err(
                span_of(&study.constraints).unwrap_or_default(),
                "study.constraints",
                format!(
                    "the {} sampler does not take constraints into account yet: use \"tpe\", \
                     \"nsga2\" (several objectives), \"random\" or \"qmc\", or drop the constraints",
                    sampler.kind
                ),
            ));
        }
        let pruner_span = root
            .pruner
            .as_ref()
            .and_then(|t| span_of(&t.get_ref().0.kind));
        let pruner = self.pruner(root.pruner, objectives.len())?;
        let pbt = self.pbt(
            root.pbt,
            pbt::PbtContext {
                space: &space,
                objectives: objectives.len(),
                worker: worker.is_some(),
                pruner: &pruner,
                pruner_span,
                trials: study
                    .trials
                    .as_ref()
                    .map(|t| Spanned::new(t.span(), t.get_ref().0)),
                // A worker reports as its `[worker] report_every` says.
                report_every: worker
                    .as_ref()
                    .map_or(report_every, |w| Some(w.report_every)),
                report_every_span: match &worker {
                    Some(_) => None,
                    None => span_of(&train.report_every),
                },
            },
        )?;
        let (trials, pbt) = match pbt {
            Some((cfg, every)) => {
                report_every = every;
                (cfg.population as u64, Some(cfg))
            }
            None => (trials, None),
        };
        let fuse_span = root
            .scheduler
            .as_ref()
            .and_then(|t| span_of(&t.get_ref().0.fuse));
        let mut scheduler = self.scheduler(root.scheduler, worker.is_some())?;
        // Latency is a trial's own inference time: it runs alone, unfused.
        let latency = objectives.iter().any(|(m, _)| m == "latency")
            || constraints.iter().any(|c| c.metric == "latency");
        if let (Some(span), true) = (&schedule_span, pbt.is_some()) {
            return Err(self.err(
                span.clone(),
                "train.schedule",
                "a PBT study finds its own schedule: remove [train] schedule or [pbt]",
            ));
        }
        if !schedule.is_empty() {
            // A schedule changes one lone trial's values.
            match scheduler.fuse {
                Some(n) if n > 1 => {
                    return Err(self.err(
                        fuse_span.unwrap_or_default(),
                        "scheduler.fuse",
                        "scheduled trials train unfused for now: set fuse = 1 or leave it out",
                    ));
                }
                _ => scheduler.fuse = Some(1),
            }
        }
        if latency && worker.is_none() {
            match scheduler.fuse {
                Some(n) if n > 1 => {
                    return Err(self.err(
                        fuse_span.unwrap_or_default(),
                        "scheduler.fuse",
                        "latency times each trial's own validation pass, so trials run unfused: \
                         set fuse = 1 or leave it out",
                    ));
                }
                _ => scheduler.fuse = Some(1),
            }
        }

        Ok(Study {
            path: self.src.path.to_path_buf(),
            name,
            direction,
            metric,
            objectives,
            constraints,
            trials,
            seed,
            storage,
            checkpoints,
            timeout,
            liveness,
            max_consecutive_failures,
            keep,
            data,
            model: model_kind,
            space,
            fixed: knobs.fixed,
            report_every,
            sampler,
            pruner,
            pbt,
            schedule,
            scheduler,
            worker,
            forked_from: None,
            positions: std::mem::take(&mut self.positions),
        })
    }

    /// `study.metric`: one the task reports (or, beside it, a built-in
    /// objective: [`BUILT_IN_OBJECTIVES`]), or any names for a command
    /// worker (whose `done()` then sends a value for each, in order);
    /// several for a study of several objectives.
    fn metrics(
        &self,
        field: &Option<Spanned<raw::OneOrMany<Str>>>,
        command: bool,
        task: TaskKind,
    ) -> Result<Vec<String>> {
        let regression = task == TaskKind::Regression;
        let reported: &[&str] = if regression {
            &["val_rmse", "val_r2", "val_loss", "train_loss"]
        } else {
            &["val_accuracy", "val_loss", "train_loss"]
        };
        let Some(field) = field else {
            return Ok(vec![
                if command { "value" } else { reported[0] }.to_string(),
            ]);
        };
        let names: Vec<String> = field.get_ref().0.iter().map(|m| m.0.clone()).collect();
        if !command && BUILT_IN_OBJECTIVES.contains(&names[0].as_str()) {
            return Err(self.err(
                field.span(),
                "study.metric",
                format!(
                    "the first metric is the one trials report as they train; '{}' is known only at a \
                     trial's end: list a reported metric first ({}), then '{}'",
                    names[0],
                    reported.join(", "),
                    names[0]
                ),
            ));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(self.err(
                    field.span(),
                    "study.metric",
                    format!("'{name}' is named twice; each objective once"),
                ));
            }
            if command
                || reported.contains(&name.as_str())
                || BUILT_IN_OBJECTIVES.contains(&name.as_str())
            {
                continue;
            }
            let task = if regression {
                "regression"
            } else {
                "classification"
            };
            let built_in: &[&str] = if names.len() > 1 {
                BUILT_IN_OBJECTIVES
            } else {
                &[]
            };
            let allowed: Vec<&str> = reported.iter().chain(built_in).copied().collect();
            let hint =
                suggest(name, &allowed).map_or(String::new(), |k| format!("; did you mean '{k}'?"));
            return Err(self.err(
                field.span(),
                "study.metric",
                format!(
                    "'{name}' is not a metric of {task}; expected one of: {}{hint}",
                    allowed.join(", ")
                ),
            ));
        }
        Ok(names)
    }

    /// `study.constraints`: `"NAME <= BOUND"` or `"NAME >= BOUND"`, on a
    /// value known at a trial's end: a metric the trial reports or a
    /// built-in objective (a command worker: one of the study's metrics).
    /// The bound is a number, a size (`"64MiB"`) or a duration (`"30s"`).
    fn constraints(
        &self,
        field: &Option<Spanned<raw::OneOrMany<Str>>>,
        objectives: &[(String, Direction)],
        command: bool,
        task: TaskKind,
    ) -> Result<Vec<Constraint>> {
        let Some(field) = field else {
            return Ok(Vec::new());
        };
        let known: Vec<&str> = if command {
            objectives.iter().map(|(m, _)| m.as_str()).collect()
        } else if task == TaskKind::Regression {
            ["val_rmse", "val_r2", "val_loss", "train_loss"]
                .iter()
                .chain(BUILT_IN_OBJECTIVES)
                .copied()
                .collect()
        } else {
            ["val_accuracy", "val_loss", "train_loss"]
                .iter()
                .chain(BUILT_IN_OBJECTIVES)
                .copied()
                .collect()
        };
        let mut out = Vec::new();
        for c in &field.get_ref().0 {
            let text = c.0.trim();
            let bad = |why: String| {
                self.err(
                    field.span(),
                    "study.constraints",
                    format!("'{text}': {why}"),
                )
            };
            let (metric, at_most, bound) = match (text.split_once("<="), text.split_once(">=")) {
                (Some((m, b)), None) => (m.trim(), true, b.trim()),
                (None, Some((m, b))) => (m.trim(), false, b.trim()),
                _ => {
                    return Err(bad(
                        "expected NAME <= BOUND or NAME >= BOUND, such as \"params <= 5000\""
                            .into(),
                    ));
                }
            };
            if !known.contains(&metric) {
                let what = if command {
                    "the study's metrics"
                } else {
                    "values known at a trial's end"
                };
                return Err(bad(format!(
                    "'{metric}' is not one of {what}: expected one of: {}",
                    known.join(", ")
                )));
            }
            let bound = bound
                .parse::<f64>()
                .ok()
                .filter(|b| b.is_finite())
                .or_else(|| parse_bytes(bound).map(|b| b as f64))
                .or_else(|| parse_duration(bound))
                .ok_or_else(|| {
                    bad(format!(
                        "'{bound}' is not a number, a size (\"64MiB\") or a duration (\"30s\")"
                    ))
                })?;
            out.push(Constraint {
                text: format!("{metric} {} {bound}", if at_most { "<=" } else { ">=" }),
                metric: metric.to_string(),
                at_most,
                bound,
            });
        }
        Ok(out)
    }

    /// `study.direction`, one per metric: built-in metrics have a right
    /// direction, a command worker's own metric takes the one given
    /// (minimize by default).
    fn directions(
        &self,
        field: &Option<Spanned<raw::OneOrMany<Named<Direction>>>>,
        metrics: Vec<String>,
        command: bool,
    ) -> Result<Vec<(String, Direction)>> {
        let given: Option<Vec<Direction>> = field
            .as_ref()
            .map(|d| d.get_ref().0.iter().map(|n| n.0).collect());
        let span = span_of(field).unwrap_or_default();
        if let Some(g) = &given
            && g.len() != metrics.len()
        {
            return Err(self.err(
                span,
                "study.direction",
                format!(
                    "{} directions for {} metrics ({}): give one per metric, in the same order",
                    g.len(),
                    metrics.len(),
                    metrics.join(", ")
                ),
            ));
        }
        let mut out = Vec::new();
        for (i, metric) in metrics.into_iter().enumerate() {
            let natural = match metric.as_str() {
                _ if command => None,
                "val_accuracy" | "val_r2" => Some(Direction::Maximize),
                _ => Some(Direction::Minimize),
            };
            let direction = match (given.as_ref().map(|g| g[i]), natural) {
                (Some(d), Some(n)) if d != n => {
                    let word = |d: Direction| d.optuna().to_lowercase();
                    return Err(self.err(
                        span,
                        "study.direction",
                        format!(
                            "{metric} is to {}, so direction = \"{}\" would search for the worst trials; \
                             remove direction or set it to \"{}\"",
                            word(n),
                            word(d),
                            word(n)
                        ),
                    ));
                }
                (Some(d), _) => d,
                (None, Some(n)) => n,
                (None, None) => Direction::Minimize,
            };
            out.push((metric, direction));
        }
        Ok(out)
    }

    /// `[params]` of a command worker: any names, any scalar or
    /// distribution; then its `[params.when.P.V]` tables, whose parameters
    /// are sampled only when `P` is `V` and are named `V.name`, as the
    /// built-in optimizer sections' are (`sgd.momentum`).
    fn command_params(
        &mut self,
        params: Option<Spanned<raw::ParamsSection>>,
        knobs: &mut Knobs,
    ) -> Result<()> {
        let Some(params) = params else { return Ok(()) };
        let section = params.into_inner();
        for (key, v) in &section.params {
            self.command_param("params", key, key, v, None, knobs)?;
        }
        let Some(when) = section.when else {
            return Ok(());
        };
        for (parent, values) in &when.get_ref().0 {
            let at = format!("params.when.{parent}");
            let choices = match knobs.params.iter().find(|p| p.name == *parent) {
                Some(Param {
                    dist: Distribution::Categorical { choices },
                    ..
                }) => choices.clone(),
                _ => {
                    return Err(self.err(
                        values.span(),
                        &at,
                        format!(
                            "[{at}.*] needs '{parent}' in [params], searched with choices = [...]"
                        ),
                    ));
                }
            };
            for (value, table) in &values.get_ref().0 {
                let Some(choice) = choices.iter().find(|c| c.to_string() == *value) else {
                    let known: Vec<String> = choices.iter().map(|c| c.to_string()).collect();
                    return Err(self.err(
                        table.span(),
                        &format!("{at}.{value}"),
                        format!(
                            "'{value}' is not among the choices of '{parent}' ({})",
                            known.join(", ")
                        ),
                    ));
                };
                let condition = Condition {
                    parent: parent.clone(),
                    values: vec![choice.clone()],
                };
                let section = format!("{at}.{value}");
                for (key, v) in &table.get_ref().0 {
                    let name = format!("{value}.{key}");
                    if matches!(v.get_ref(), KnobRaw::Fixed(_)) {
                        return Err(self.err(
                            v.span(),
                            &format!("{section}.{key}"),
                            "a fixed value is passed to every trial: put it in [params]; \
                             [params.when...] holds distributions",
                        ));
                    }
                    if knobs.params.iter().any(|p| p.name == name)
                        || knobs.fixed.contains_key(&name)
                    {
                        return Err(self.err(
                            v.span(),
                            &format!("{section}.{key}"),
                            format!("'{name}' is defined twice"),
                        ));
                    }
                    self.command_param(&section, key, &name, v, Some(condition.clone()), knobs)?;
                }
            }
        }
        Ok(())
    }

    /// One parameter of a command worker, named `name`, written as `key`
    /// in `section`.
    fn command_param(
        &mut self,
        section: &str,
        key: &str,
        name: &str,
        v: &Spanned<KnobRaw>,
        condition: Option<Condition>,
        knobs: &mut Knobs,
    ) -> Result<()> {
        let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
        let kind = match v.get_ref() {
            KnobRaw::Dist(t) if t.float.is_some() => KnobKind::Float {
                min: f64::NEG_INFINITY,
                min_inclusive: true,
                max: None,
            },
            KnobRaw::Dist(t) if t.int.is_some() => KnobKind::Int { min: i64::MIN },
            _ => KnobKind::Free,
        };
        let knob = Knob {
            name: leak(name),
            section: leak(section),
            key: leak(key),
            kind,
            default: KnobDefault::Int(0),
            optimizer: None,
        };
        let spec = self.knob(&knob, v)?;
        knobs.place(&knob, spec, condition);
        Ok(())
    }

    /// `[model] kind` and `preset`, with the knobs each allows, and image
    /// data for a conv net.
    fn model_kind(&self, model: &raw::ModelSection, data: &DataConfig) -> Result<ModelKind> {
        let kind = self.one_of(&model.kind, "model.kind", &["mlp", "cnn"])?;
        let cnn = kind.as_ref().is_some_and(|k| k.get_ref() == "cnn");
        let preset = self.one_of(&model.preset, "model.preset", CnnPreset::NAMES)?;
        if !cnn {
            if let Some(p) = &preset {
                return Err(self.err(
                    p.span(),
                    "model.preset",
                    "a preset is a conv net: it needs kind = \"cnn\"",
                ));
            }
            if let Some((key, v)) = CNN_KNOBS.iter().find_map(|k| model.knob(k).map(|v| (k, v))) {
                return Err(self.err(
                    v.span(),
                    &format!("model.{key}"),
                    format!(
                        "'{key}' applies only to kind = \"cnn\" (a conv net); this model is an MLP"
                    ),
                ));
            }
            return Ok(ModelKind::Mlp);
        }
        let preset = preset.map(|p| CnnPreset::from_name(p.get_ref()).expect("a known preset"));
        if let Some(p) = preset {
            let fixed = CNN_KNOBS.iter().chain(&["depth", "width", "activation"]);
            if let Some((key, v)) = fixed
                .into_iter()
                .find_map(|k| model.knob(k).map(|v| (k, v)))
            {
                return Err(self.err(
                    v.span(),
                    &format!("model.{key}"),
                    format!(
                        "'{key}' is fixed by preset = \"{}\"; remove it, or the preset",
                        p.name()
                    ),
                ));
            }
        }
        let images = match &data.source {
            DataSource::Digits | DataSource::Idx { .. } | DataSource::Cifar10 { .. } => true,
            DataSource::Npy { layout, .. } => layout.is_some(),
            _ => false,
        };
        if !images {
            let span = kind.map_or(0..0, |k| k.span());
            return Err(self.err(span, "model.kind", "kind = \"cnn\" needs image data: [data] source = \"digits\", \"idx\", \"cifar10\", or \"npy\" with a layout"));
        }
        Ok(ModelKind::Cnn { preset })
    }
}

/// Splits `"1.5h"` into its number and its unit.
fn number_and_unit(t: &str) -> Option<(f64, &str)> {
    let t = t.trim();
    let (num, unit) = t
        .find(|c: char| c.is_alphabetic())
        .map_or((t, ""), |i| (&t[..i], &t[i..]));
    Some((num.trim().parse().ok()?, unit.trim()))
}

/// `"90s"`, `"30m"`, `"2h"`, `"1.5h"` or a bare number of seconds.
fn parse_duration(t: &str) -> Option<f64> {
    let (n, unit) = number_and_unit(t)?;
    let scale = match unit {
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Some(n * scale).filter(|s| *s > 0.0 && s.is_finite())
}

/// `"512MiB"`, `"8GiB"`, `"2GB"` or a bare number of bytes.
fn parse_bytes(t: &str) -> Option<u64> {
    let (n, unit) = number_and_unit(t)?;
    let scale = match unit.to_ascii_lowercase().as_str() {
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
    // An absolute path, SQLite's `:memory:`, or a server's URL.
    if rest.starts_with('/') || rest.starts_with(':') || (prefix.is_empty() && rest.contains("://"))
    {
        return s.to_string();
    }
    format!("{prefix}{}", base.join(rest).display())
}
