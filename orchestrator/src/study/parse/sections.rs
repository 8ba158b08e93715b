//! The sections beside the search space: `[sampler]`, `[pruner]`,
//! `[data]`, `[worker]` and `[scheduler]`.

use toml::Spanned;

use super::*;

impl Checker<'_> {
    pub(super) fn sampler(
        &self,
        section: Option<Spanned<raw::Table<raw::SamplerSection>>>,
        space: &SearchSpace,
        study_seed: u64,
        objectives: usize,
    ) -> Result<SamplerConfig> {
        let (_, s) = inner(section);
        let kind_field = self.one_of(
            &s.kind,
            "sampler.kind",
            &["random", "grid", "tpe", "qmc", "gp", "nsga2", "nsga3"],
        )?;
        let several = objectives > 1;
        match &kind_field {
            Some(k) if several && k.get_ref() == "gp" => {
                return Err(self.err(
                    k.span(),
                    "sampler.kind",
                    format!(
                        "kind = \"gp\" models one objective, and this study has {objectives}; \
                         use \"nsga2\" (the default for several), \"tpe\", \"random\", \"qmc\" or \"grid\""
                    ),
                ));
            }
            Some(k) if !several && matches!(k.get_ref().as_str(), "nsga2" | "nsga3") => {
                return Err(self.err(
                    k.span(),
                    "sampler.kind",
                    format!(
                        "kind = \"{}\" searches for the trade-offs between several objectives, \
                         and this study has one: give study.metric a list, or use \"tpe\"",
                        k.get_ref()
                    ),
                ));
            }
            _ => {}
        }
        let population = || {
            Ok::<_, Error>(
                self.at_least(&s.population, "sampler.population", 2)?
                    .map_or(crate::sampler::NSGA2_POPULATION, |n| n as usize),
            )
        };
        let kind = match kind_field {
            None if several => SamplerKind::Nsga2 {
                population: population()?,
            },
            Some(k) if k.get_ref() == "nsga2" => SamplerKind::Nsga2 {
                population: population()?,
            },
            Some(k) if k.get_ref() == "nsga3" => SamplerKind::Nsga3 {
                population: population()?,
            },
            Some(k) if k.get_ref() == "grid" => {
                GridSampler::new(space, 0).map_err(|e| self.err(k.span(), "sampler.kind", e))?;
                SamplerKind::Grid
            }
            Some(k) if k.get_ref() == "tpe" => SamplerKind::Tpe {
                startup_trials: self
                    .at_least(&s.startup_trials, "sampler.startup_trials", 0)?
                    .map_or(10, |n| n as usize),
                // Optuna's defaults: joint for one objective, one
                // parameter at a time for several (measured better there:
                // docs/benchmarks/fronts.md).
                multivariate: s.multivariate.as_ref().map_or(!several, |b| b.get_ref().0),
                pending: match self.one_of(
                    &s.pending,
                    "sampler.pending",
                    &["auto", "believe", "lie"],
                )? {
                    Some(p) if p.get_ref() == "believe" && several => {
                        return Err(self.err(
                            p.span(),
                            "sampler.pending",
                            format!(
                                "pending = \"believe\" predicts a pending trial's value with a \
                                 regressor of one objective, and this study has {objectives}; \
                                 use \"lie\" or \"auto\""
                            ),
                        ));
                    }
                    Some(p) if p.get_ref() == "believe" => Pending::Believe,
                    Some(p) if p.get_ref() == "lie" => Pending::Lie,
                    _ => Pending::Auto,
                },
            },
            Some(k) if k.get_ref() == "gp" => SamplerKind::Gp {
                startup_trials: self
                    .at_least(&s.startup_trials, "sampler.startup_trials", 0)?
                    .map_or(10, |n| n as usize),
            },
            Some(k) if k.get_ref() == "qmc" => SamplerKind::Qmc,
            _ => SamplerKind::Random,
        };
        let model_based = matches!(kind, SamplerKind::Tpe { .. } | SamplerKind::Gp { .. });
        for (key, span, applies, to) in [
            (
                "population",
                span_of(&s.population),
                matches!(kind, SamplerKind::Nsga2 { .. } | SamplerKind::Nsga3 { .. }),
                "kind = \"nsga2\" and \"nsga3\"",
            ),
            (
                "startup_trials",
                span_of(&s.startup_trials),
                model_based,
                "kind = \"tpe\" and \"gp\"",
            ),
            (
                "multivariate",
                span_of(&s.multivariate),
                matches!(kind, SamplerKind::Tpe { .. }),
                "kind = \"tpe\"",
            ),
            (
                "pending",
                span_of(&s.pending),
                matches!(kind, SamplerKind::Tpe { .. }),
                "kind = \"tpe\"",
            ),
        ] {
            if let Some(span) = span.filter(|_| !applies) {
                return Err(self.err(
                    span,
                    &format!("sampler.{key}"),
                    format!("{key} applies only to {to}"),
                ));
            }
        }
        Ok(SamplerConfig {
            kind,
            seed: self
                .at_least(&s.seed, "sampler.seed", 0)?
                .map_or(study_seed, |n| n as u64),
        })
    }

    pub(super) fn pruner(
        &self,
        section: Option<Spanned<raw::Table<raw::PrunerSection>>>,
        objectives: usize,
    ) -> Result<PrunerKind> {
        let (_, s) = inner(section);
        if let Some(k) = s
            .kind
            .as_ref()
            .filter(|k| objectives > 1 && k.get_ref().0 != "none")
        {
            return Err(self.err(
                k.span(),
                "pruner.kind",
                format!(
                    "a pruner compares one value per step, and this study has {objectives} objectives \
                     (Optuna refuses to prune them too): remove [pruner] or set kind = \"none\""
                ),
            ));
        }
        let kind = self
            .one_of(
                &s.kind,
                "pruner.kind",
                &["none", "asha", "hyperband", "median"],
            )?
            .map_or("none".to_string(), Spanned::into_inner);
        let applies: &[&str] = match kind.as_str() {
            "asha" => &["min_resource", "reduction_factor"],
            "hyperband" => &["min_resource", "reduction_factor", "max_resource"],
            "median" => &["startup_trials", "warmup_steps"],
            _ => &[],
        };
        for (key, field) in [
            ("min_resource", &s.min_resource),
            ("reduction_factor", &s.reduction_factor),
            ("max_resource", &s.max_resource),
            ("startup_trials", &s.startup_trials),
            ("warmup_steps", &s.warmup_steps),
        ] {
            if let Some(v) = field
                && !applies.contains(&key)
            {
                return Err(self.err(
                    v.span(),
                    &format!("pruner.{key}"),
                    format!("'{key}' does not apply to kind = \"{kind}\""),
                ));
            }
        }
        let min_resource = self
            .at_least(&s.min_resource, "pruner.min_resource", 1)?
            .map_or(1, |n| n as u64);
        let reduction_factor = self
            .at_least(&s.reduction_factor, "pruner.reduction_factor", 2)?
            .map_or(3, |n| n as u64);
        Ok(match kind.as_str() {
            "asha" => PrunerKind::Asha {
                min_resource,
                reduction_factor,
            },
            "hyperband" => {
                let max = self.at_least(&s.max_resource, "pruner.max_resource", 1)?;
                let max_resource = match (max, &s.max_resource) {
                    (Some(m), Some(v)) if (m as u64) < min_resource => {
                        return Err(self.err(
                            v.span(),
                            "pruner.max_resource",
                            format!(
                                "max_resource ({m}) must be at least min_resource ({min_resource})"
                            ),
                        ));
                    }
                    (Some(m), _) => m as u64,
                    _ => min_resource * reduction_factor.pow(3),
                };
                PrunerKind::Hyperband {
                    min_resource,
                    max_resource,
                    reduction_factor,
                }
            }
            "median" => PrunerKind::Median {
                startup_trials: self
                    .at_least(&s.startup_trials, "pruner.startup_trials", 0)?
                    .map_or(5, |n| n as usize),
                warmup_steps: self
                    .at_least(&s.warmup_steps, "pruner.warmup_steps", 0)?
                    .map_or(0, |n| n as u64),
            },
            _ => PrunerKind::None,
        })
    }

    pub(super) fn data(
        &self,
        section: Option<Spanned<raw::Table<raw::DataSection>>>,
        study_seed: u64,
    ) -> Result<(DataConfig, Option<KeySpan>)> {
        let (section_span, s) = inner(section);
        let sources = [
            "digits",
            "csv",
            "npy",
            "idx",
            "cifar10",
            "synthetic-classification",
            "synthetic-regression",
        ];
        let source = self
            .one_of(&s.source, "data.source", &sources)?
            .unwrap_or_else(|| Spanned::new(section_span, "digits".into()));
        let applies: &[&str] = match source.get_ref().as_str() {
            "digits" => &["crop", "flip"],
            "csv" => &["path", "target", "task"],
            "npy" => &["path", "targets", "task", "layout", "crop", "flip"],
            "idx" => &["path", "targets", "crop", "flip"],
            "cifar10" => &["path", "crop", "flip"],
            "synthetic-classification" => &["rows", "features", "classes", "informative"],
            _ => &["rows", "features", "informative", "noise"],
        };
        let name = source.get_ref();
        if let Some((key, span)) = s
            .source_keys()
            .into_iter()
            .find(|(k, _)| !applies.contains(k))
        {
            return Err(self.err(
                span,
                &format!("data.{key}"),
                format!("'{key}' does not apply to source = \"{name}\""),
            ));
        }
        let required = |key: &str| {
            self.err(
                source.span(),
                &format!("data.{key}"),
                format!("source = \"{name}\" needs '{key}'"),
            )
        };
        let task = match self.one_of(&s.task, "data.task", &["classification", "regression"])? {
            Some(t) if t.get_ref() == "regression" => TaskKind::Regression,
            _ if name == "synthetic-regression" => TaskKind::Regression,
            _ => TaskKind::Classification,
        };
        let count = |field: &Option<Spanned<Int>>, key: &str, min: i64, default: usize| {
            Ok::<_, Error>(
                self.at_least(field, &format!("data.{key}"), min)?
                    .map_or(default, |n| n as usize),
            )
        };
        let source = match name.as_str() {
            "digits" => DataSource::Digits,
            "csv" => DataSource::Csv {
                path: self
                    .data_file(&s.path, "data.path")?
                    .ok_or_else(|| required("path"))?,
                target: s
                    .target
                    .as_ref()
                    .map(|t| t.get_ref().0.clone())
                    .ok_or_else(|| required("target"))?,
            },
            "npy" => DataSource::Npy {
                path: self
                    .data_file(&s.path, "data.path")?
                    .ok_or_else(|| required("path"))?,
                targets: self
                    .data_file(&s.targets, "data.targets")?
                    .ok_or_else(|| required("targets"))?,
                layout: match self.one_of(&s.layout, "data.layout", &["NCHW", "NHWC"])? {
                    Some(l) if task == TaskKind::Regression => {
                        return Err(self.err(
                            l.span(),
                            "data.layout",
                            "images are classified: a layout needs task = \"classification\"",
                        ));
                    }
                    l => l.map(|l| ImageLayout::from_name(l.get_ref()).expect("checked")),
                },
            },
            "idx" => DataSource::Idx {
                images: self
                    .data_file(&s.path, "data.path")?
                    .ok_or_else(|| required("path"))?,
                labels: self
                    .data_file(&s.targets, "data.targets")?
                    .ok_or_else(|| required("targets"))?,
            },
            "cifar10" => DataSource::Cifar10 {
                path: self
                    .data_path(&s.path, "data.path", true)?
                    .ok_or_else(|| required("path"))?,
            },
            "synthetic-classification" => DataSource::SyntheticClassification {
                rows: count(&s.rows, "rows", 4, 1000)?,
                features: count(&s.features, "features", 1, 20)?,
                classes: count(&s.classes, "classes", 2, 2)?,
                informative: count(&s.informative, "informative", 1, 5)?,
            },
            _ => DataSource::SyntheticRegression {
                rows: count(&s.rows, "rows", 4, 1000)?,
                features: count(&s.features, "features", 1, 20)?,
                informative: count(&s.informative, "informative", 1, 5)?,
                noise: match &s.noise {
                    Some(n) if n.get_ref().0 < 0.0 => {
                        return Err(self.err(n.span(), "data.noise", "noise must be >= 0"));
                    }
                    Some(n) => n.get_ref().0 as f32,
                    None => 0.1,
                },
            },
        };
        let validation = match &s.validation {
            Some(v) if !(v.get_ref().0 > 0.0 && v.get_ref().0 < 1.0) => {
                return Err(self.err(
                    v.span(),
                    "data.validation",
                    format!(
                        "validation must be a fraction in (0, 1), got {}",
                        v.get_ref().0
                    ),
                ));
            }
            Some(v) => v.get_ref().0,
            None => 0.2,
        };
        let split_seed = self
            .at_least(&s.split_seed, "data.split_seed", 0)?
            .map_or(study_seed, |n| n as u64);
        let crop = self.at_least(&s.crop, "data.crop", 0)?.unwrap_or(0) as usize;
        let flip = s.flip.as_ref().is_some_and(|b| b.get_ref().0);
        let augment = (crop > 0 || flip).then_some(Augment { crop, flip });
        // Where an augmentation is set, for the error when the model is no conv net.
        let augment_span = match (&s.crop, &s.flip) {
            (Some(c), _) if crop > 0 => Some((c.span(), "data.crop")),
            (_, Some(f)) => Some((f.span(), "data.flip")),
            _ => None,
        };
        Ok((
            DataConfig {
                source,
                images: false,
                augment,
                task,
                validation,
                split_seed,
            },
            augment_span.filter(|_| augment.is_some()),
        ))
    }

    /// `[worker]`: the built-in MLP (`kind = "mlp"`, the default, `None`)
    /// or the user's own script (`kind = "command"`).
    pub(super) fn worker(
        &self,
        section: Option<Spanned<raw::Table<raw::WorkerSection>>>,
    ) -> Result<Option<WorkerConfig>> {
        let (span, s) = inner(section);
        match self.one_of(&s.kind, "worker.kind", &["mlp", "command"])? {
            None if !s.has_command_keys() => return Ok(None),
            Some(k) if k.get_ref() == "mlp" => {
                if let Some((_, key_span)) = self
                    .src
                    .keys("worker")
                    .into_iter()
                    .find(|(k, _)| k != "kind")
                {
                    return Err(self.err(
                        key_span,
                        "worker",
                        "these keys apply to kind = \"command\"",
                    ));
                }
                return Ok(None);
            }
            None => {
                return Err(self.err(
                    span,
                    "worker.kind",
                    "say kind = \"command\" (or \"mlp\", the built-in model)",
                ));
            }
            Some(_) => {}
        }
        let command = s.command.map(Spanned::into_inner).ok_or_else(|| {
            self.err(
                span.clone(),
                "worker.command",
                "kind = \"command\" needs command = [\"program\", \"arg\", ...]",
            )
        })?;
        let command = command
            .0
            .into_iter()
            .map(|word| match word.get_ref() {
                Scalar::Str(w) => Ok(w.clone()),
                other => Err(self.err(
                    word.span(),
                    "worker.command",
                    format!("expected a string, found {}", other.type_name()),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let base = match self.src.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let cwd = match &s.cwd {
            Some(c) => base.join(&c.get_ref().0),
            None => base,
        };
        let env = s
            .env
            .map(|e| e.into_inner().0.into_iter().collect())
            .unwrap_or_default();
        let memory_bytes = match &s.memory {
            Some(m) if matches!(m.get_ref(), Scalar::Str(t) if t == "auto") => None,
            _ => Some(
                self.bytes(
                    &s.memory,
                    "worker.memory",
                    "expected \"auto\", a positive byte count or a size such as \"512MiB\"",
                )?
                .unwrap_or(256 << 20),
            ),
        };
        let heartbeat_timeout = self
            .duration(
                &s.heartbeat_timeout,
                "worker.heartbeat_timeout",
                "expected a positive number of seconds or a duration such as \"30s\"",
            )?
            .unwrap_or(Duration::from_secs(60));
        Ok(Some(WorkerConfig {
            command,
            cwd,
            env,
            memory_bytes,
            report_every: self
                .at_least(&s.report_every, "worker.report_every", 1)?
                .map_or(1, |n| n as u64),
            max_concurrency: self
                .at_least(&s.max_concurrency, "worker.max_concurrency", 1)?
                .map(|n| n as usize),
            iterations: self
                .at_least(&s.iterations, "worker.iterations", 1)?
                .map_or(100, |n| n as u64),
            heartbeat_timeout,
        }))
    }

    pub(super) fn scheduler(
        &self,
        section: Option<Spanned<raw::Table<raw::SchedulerSection>>>,
        command_worker: bool,
    ) -> Result<SchedulerConfig> {
        let (_, s) = inner(section);
        let mps = s.mps.as_ref().is_some_and(|b| b.get_ref().0);
        if mps && !command_worker {
            return Err(self.err(
                span_of(&s.mps).unwrap_or_default(),
                "scheduler.mps",
                "mps = true shares the GPU between worker processes: it needs [worker] kind = \"command\" (built-in trials already share one process)",
            ));
        }
        let count = |field: &Option<Spanned<Int>>, key: &str| {
            Ok::<_, Error>(
                self.at_least(field, &format!("scheduler.{key}"), 1)?
                    .map(|n| n as usize),
            )
        };
        let devices = match &s.devices {
            Some(d) => {
                let joined = d.get_ref().0.join(",");
                crate::device::parse(&joined).map_err(|e| {
                    let why = e.to_string().replacen("--device ", "", 1);
                    self.err(d.span(), "scheduler.devices", why)
                })?;
                Some(joined)
            }
            None => None,
        };
        Ok(SchedulerConfig {
            devices,
            policy: s.policy.map(|p| p.into_inner().0),
            lanes: count(&s.lanes, "lanes")?,
            max_concurrent: count(&s.max_concurrent, "max_concurrent")?,
            memory_bytes: self.bytes(
                &s.memory,
                "scheduler.memory",
                "expected a positive byte count or a size such as \"512MiB\" or \"8GiB\"",
            )?,
            fuse: count(&s.fuse, "fuse")?,
            mix_widths: s.mix_widths.map(|m| m.into_inner().0),
            graphs: s.graphs.map(|g| g.into_inner().0),
            mps,
        })
    }
}
