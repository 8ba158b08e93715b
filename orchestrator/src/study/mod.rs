//! A study: what `study.toml` describes, validated.
//!
//! Every tunable hyper-parameter is a [`Knob`]: a key in a section, a type,
//! a domain of valid values and a default. In the file each knob is either a
//! fixed value or a distribution (`{ float = [lo, hi] }`, `{ int = [lo, hi] }`,
//! `{ choices = [...] }`); the distributions form the [`SearchSpace`].
//! Optimizer-specific knobs live in `[train.sgd]`, `[train.adam]` and
//! `[train.adamw]`, and are active only when `optimizer` takes that value.

mod knobs;
mod locate;
pub mod parse;
mod raw;
mod replay;
pub use replay::replay_file;

pub use knobs::*;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use kernels::{Activation, PoolKind};
use training::data::{ImageLayout, ImageShape, SplitData, TaskKind};
use training::model::{Augment, ConvNetSpec};
use training::{Optimizer, SlotHparams, TrialConfig};

pub use parse::{load, parse_str};

use crate::error::Result;
use crate::sampler::Pending;
use crate::space::{Choice, Distribution, ParamValue, Params, SearchSpace};

pub use crate::objective::Direction;

/// `[study] liveness`'s default, in seconds: storage's
/// [`storage::STALE_AFTER_S`], which the dashboard also judges runs by.
pub const DEFAULT_LIVENESS_S: f64 = storage::STALE_AFTER_S;

/// What the built-in trainer trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// An MLP of `depth x width` (`kind = "mlp"`, the default).
    Mlp,
    /// A conv net whose head is a `depth x width` MLP (`kind = "cnn"`), or
    /// a preset that fixes the whole net.
    Cnn { preset: Option<CnnPreset> },
}

/// Conv nets of the papers, fixed but for the training knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CnnPreset {
    /// Hyperband's and ASHA's cuda-convnet on CIFAR-10: three 5x5
    /// convolutions of 32, 32 and 64 channels, each followed by ReLU and
    /// 2x2 max pooling, then the output layer.
    CudaConvnet,
}

impl CnnPreset {
    pub const NAMES: &[&str] = &["cuda-convnet"];

    pub fn from_name(s: &str) -> Option<Self> {
        (s == "cuda-convnet").then_some(CnnPreset::CudaConvnet)
    }

    pub fn name(self) -> &'static str {
        match self {
            CnnPreset::CudaConvnet => "cuda-convnet",
        }
    }

    /// The net (its image shape is the data's, set later).
    pub fn net(self) -> ConvNetSpec {
        match self {
            CnnPreset::CudaConvnet => ConvNetSpec {
                image: ImageShape { h: 0, w: 0, c: 0 },
                stages: vec![32, 32, 64],
                blocks_per_stage: 1,
                kernel: 5,
                residual: false,
                batch_norm: false,
                pool: PoolKind::Max,
                global_pool: false,
                augment: None,
            },
        }
    }
}

/// Where the data comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum DataSource {
    /// The built-in digits: 64 features, or `1 x 8 x 8` images for a conv net.
    Digits,
    Csv {
        path: PathBuf,
        target: String,
    },
    /// A feature matrix, or images when a layout is given.
    Npy {
        path: PathBuf,
        targets: PathBuf,
        layout: Option<ImageLayout>,
    },
    /// MNIST's or Fashion-MNIST's IDX files.
    Idx {
        images: PathBuf,
        labels: PathBuf,
    },
    /// CIFAR-10's binary batches: one file, or a directory of them.
    Cifar10 {
        path: PathBuf,
    },
    SyntheticClassification {
        rows: usize,
        features: usize,
        classes: usize,
        informative: usize,
    },
    SyntheticRegression {
        rows: usize,
        features: usize,
        informative: usize,
        noise: f32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataConfig {
    pub source: DataSource,
    /// Rows are images for a conv net (the built-in digits become `1 x 8 x 8`).
    pub images: bool,
    /// Random crops and flips of the training images (`crop`, `flip`).
    pub augment: Option<Augment>,
    pub task: TaskKind,
    pub validation: f64,
    pub split_seed: u64,
}

impl DataConfig {
    pub fn load(&self) -> Result<SplitData> {
        use training::data::*;
        let ds = match &self.source {
            DataSource::Digits if self.images => digit_images(),
            DataSource::Digits => digits(),
            DataSource::Csv { path, target } => load_csv(path, target, self.task)?,
            DataSource::Npy {
                path,
                targets,
                layout: Some(layout),
            } => load_npy_images(path, targets, *layout)?,
            DataSource::Npy { path, targets, .. } => load_npy_pair(path, targets, self.task)?,
            DataSource::Idx { images, labels } => load_idx(images, labels)?,
            DataSource::Cifar10 { path } => load_cifar10(path)?,
            DataSource::SyntheticClassification {
                rows,
                features,
                classes,
                informative,
            } => {
                synthetic_classification(*rows, *features, *classes, *informative, self.split_seed)
            }
            DataSource::SyntheticRegression {
                rows,
                features,
                informative,
                noise,
            } => synthetic_regression(*rows, *features, *informative, *noise, self.split_seed),
        };
        Ok(split(&ds, self.validation, self.split_seed)?)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerKind {
    Random,
    Grid,
    /// TPE after `startup_trials` random proposals.
    Tpe {
        startup_trials: usize,
        multivariate: bool,
        /// How trials still pending are judged.
        pending: Pending,
    },
    /// Scrambled Sobol quasi-random points.
    Qmc,
    /// NSGA-II, for several objectives, in generations of `population`.
    Nsga2 {
        population: usize,
    },
    /// NSGA-III (reference-point niching), for three or more objectives,
    /// in generations of `population`.
    Nsga3 {
        population: usize,
    },
    /// Gaussian-process Bayesian optimisation after `startup_trials`
    /// random proposals.
    Gp {
        startup_trials: usize,
    },
}

impl std::fmt::Display for SamplerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SamplerKind::Random => write!(f, "random"),
            SamplerKind::Grid => write!(f, "grid"),
            SamplerKind::Tpe {
                startup_trials,
                multivariate,
                pending,
            } => write!(
                f,
                "tpe (startup_trials {startup_trials}, multivariate {multivariate}, pending {})",
                match pending {
                    Pending::Auto => "auto",
                    Pending::Believe => "believe",
                    Pending::Lie => "lie",
                }
            ),
            SamplerKind::Qmc => write!(f, "qmc"),
            SamplerKind::Gp { startup_trials } => write!(f, "gp (startup_trials {startup_trials})"),
            SamplerKind::Nsga2 { population } => write!(f, "nsga2 (population {population})"),
            SamplerKind::Nsga3 { population } => write!(f, "nsga3 (population {population})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    pub kind: SamplerKind,
    pub seed: u64,
}

impl std::fmt::Display for PrunerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            PrunerKind::None => write!(f, "none"),
            PrunerKind::Asha {
                min_resource,
                reduction_factor,
            } => write!(
                f,
                "asha (min_resource {min_resource}, reduction_factor {reduction_factor})"
            ),
            PrunerKind::Hyperband {
                min_resource,
                max_resource,
                reduction_factor,
            } => write!(
                f,
                "hyperband (min_resource {min_resource}, max_resource {max_resource}, reduction_factor {reduction_factor})"
            ),
            PrunerKind::Median {
                startup_trials,
                warmup_steps,
            } => write!(
                f,
                "median (startup_trials {startup_trials}, warmup_steps {warmup_steps})"
            ),
        }
    }
}

/// `[study] keep`: which finished trials' models the database keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    None,
    /// The best COMPLETE trial's, replaced when a better one finishes.
    Best,
    /// Every COMPLETE trial's.
    All,
}

impl Keep {
    pub const NAMES: [&'static str; 3] = ["none", "best", "all"];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// `[pruner]`; resources count report steps (epochs by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrunerKind {
    None,
    Asha {
        min_resource: u64,
        reduction_factor: u64,
    },
    Hyperband {
        min_resource: u64,
        max_resource: u64,
        reduction_factor: u64,
    },
    Median {
        startup_trials: usize,
        warmup_steps: u64,
    },
}

impl PrunerKind {
    /// Whether the pruner pauses trials at rungs (ASHA, Hyperband) rather
    /// than only stopping them. Paused trials run alone, unfused.
    pub fn pauses(&self) -> bool {
        matches!(self, PrunerKind::Asha { .. } | PrunerKind::Hyperband { .. })
    }
}

impl PrunerKind {
    /// The pruner this describes.
    pub fn build(self) -> Box<dyn crate::pruner::Pruner> {
        use crate::pruner::*;
        match self {
            PrunerKind::None => Box::new(NoPruner),
            PrunerKind::Asha {
                min_resource,
                reduction_factor,
            } => Box::new(Asha::new(min_resource, reduction_factor)),
            PrunerKind::Hyperband {
                min_resource,
                max_resource,
                reduction_factor,
            } => Box::new(Hyperband::new(min_resource, max_resource, reduction_factor)),
            PrunerKind::Median {
                startup_trials,
                warmup_steps,
            } => Box::new(Median {
                startup_trials,
                warmup_steps,
            }),
        }
    }
}

pub use crate::salus::fusion::MixWidths;
pub use crate::salus::policy::Policy;

/// `[scheduler]`: parsed and checked; trials run one at a time until the
/// Salus core lands.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SchedulerConfig {
    pub policy: Option<Policy>,
    pub lanes: Option<usize>,
    pub max_concurrent: Option<usize>,
    pub memory_bytes: Option<u64>,
    /// Most trials per fused group; 1 turns fusion off.
    pub fuse: Option<usize>,
    /// Whether trials of different widths share groups (`auto`: where the
    /// cost model says it pays).
    pub mix_widths: Option<MixWidths>,
    /// Whether iterations are captured and replayed as CUDA graphs.
    pub graphs: Option<GraphsMode>,
    /// `mps = true`: external workers share the GPU through an MPS daemon
    /// of the run's own, each capped by its grant.
    pub mps: bool,
    /// `devices`: what `--device` takes when the command line does not
    /// say, as one comma-separated list (checked when the file is read).
    pub devices: Option<String>,
}

/// `[scheduler] graphs`: `auto` replays each trial's iterations as a CUDA
/// graph after the first (on CUDA only); `off` launches every op every time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GraphsMode {
    Auto,
    Off,
}

/// `[worker] kind = "command"`: the user's script, run once per trial.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    pub command: Vec<String>,
    /// Where it runs (relative paths are relative to the study file).
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    /// Device memory one trial declares, for the ledger, until its client
    /// measures its own; `None` (`memory = "auto"`): the first iteration of
    /// the first trial is measured alone, and the others plan with that.
    pub memory_bytes: Option<u64>,
    /// Iterations between reports, passed to the script.
    pub report_every: u64,
    /// Workers alive at once (default: the scheduler's `max_concurrent`).
    pub max_concurrency: Option<usize>,
    /// Iterations a trial runs at most, for scheduling estimates and the
    /// pruners' resource.
    pub iterations: u64,
    /// A worker silent this long is killed and its trial FAILs.
    pub heartbeat_timeout: std::time::Duration,
}

/// Objectives a built-in trial has besides the metrics it reports, each
/// minimised: its parameter count, forward FLOPs per example, seconds of
/// device time (the core's own accounting), the device bytes the ledger
/// held for it, and the seconds per batch of its final validation pass
/// on the device (inference latency; measured with fusion off).
pub const BUILT_IN_OBJECTIVES: &[&str] = &["params", "flops", "train_time", "memory", "latency"];

impl Study {
    /// Whether an objective or a constraint needs the trials' inference
    /// latency measured.
    pub fn measures_latency(&self) -> bool {
        self.worker.is_none()
            && (self.objectives.iter().any(|(m, _)| m == "latency")
                || self.constraints.iter().any(|c| c.metric == "latency"))
    }
}

/// `[study] constraints`: a bound on a value known at a trial's end, in
/// Optuna's constrained-optimisation sense: the trial is feasible when
/// every constraint's value ([`Constraint::value`]) is at most 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    /// As written, normalised (`params <= 5000`): its key in storage.
    pub text: String,
    pub metric: String,
    /// `<=` (true) or `>=`.
    pub at_most: bool,
    pub bound: f64,
}

impl Constraint {
    /// Optuna's constraint value: at most 0 when the bound holds, else by
    /// how much it is broken.
    pub fn value(&self, x: f64) -> f64 {
        if self.at_most {
            x - self.bound
        } else {
            self.bound - x
        }
    }
}

/// A validated study file.
#[derive(Debug, Clone, PartialEq)]
pub struct Study {
    pub path: PathBuf,
    pub name: String,
    /// The first objective's direction and metric (the only one, mostly).
    pub direction: Direction,
    pub metric: String,
    /// Every objective, in order: `metric = ["val_accuracy", "params"]`
    /// makes a study of several, stored as Optuna stores them.
    pub objectives: Vec<(String, Direction)>,
    /// `[study] constraints`, in order.
    pub constraints: Vec<Constraint>,
    pub trials: u64,
    pub seed: u64,
    /// As written in the file, resolved against the file's folder.
    pub storage: Option<String>,
    /// `[study] checkpoints`: the folder for trial checkpoints, resolved
    /// against the file's folder (one that every process can reach).
    pub checkpoints: Option<PathBuf>,
    pub timeout: Option<Duration>,
    /// `[study] liveness`: a process whose heartbeat is older than this is
    /// taken for dead, and its trials are requeued (every process of the
    /// study should use the same).
    pub liveness: Duration,
    /// The run stops starting trials after this many FAIL in a row.
    pub max_consecutive_failures: u64,
    /// Whose final models are kept (built-in MLP trials only).
    pub keep: Keep,
    pub data: DataConfig,
    pub model: ModelKind,
    pub space: SearchSpace,
    /// Knobs given a fixed value, by parameter name.
    pub fixed: BTreeMap<String, KnobValue>,
    pub report_every: Option<u64>,
    pub sampler: SamplerConfig,
    pub pruner: PrunerKind,
    /// `[pbt]`: the trials are one population, trained together.
    pub pbt: Option<crate::pbt::PbtConfig>,
    /// `[train] schedule`: values that change at report steps.
    pub schedule: parse::Schedule,
    pub scheduler: SchedulerConfig,
    /// The user's own training script; `None` trains the built-in MLP.
    pub worker: Option<WorkerConfig>,
    /// Set by `run --fork`: the study this one was started from.
    pub forked_from: Option<String>,
    /// `(line, column)` of each knob given in the file, for later errors.
    pub positions: BTreeMap<String, (usize, usize)>,
}

impl Study {
    /// Whether something decides between trials as they report (a pruner
    /// or PBT): the core then holds trials at reports, the default policy
    /// orders them by priority, and two trials per lane are in flight.
    pub fn decides_at_reports(&self) -> bool {
        self.pruner != PrunerKind::None || self.pbt.is_some()
    }

    /// Trials in flight as the study file sets them: `[worker]
    /// max_concurrency`, else `[scheduler] max_concurrent`; `None` for the
    /// runner's default.
    pub fn max_concurrent_set(&self) -> Option<usize> {
        self.worker
            .as_ref()
            .and_then(|w| w.max_concurrency)
            .or(self.scheduler.max_concurrent)
    }

    /// Loads and splits the study's data, and checks that every batch size
    /// the space allows fits the training split; before a study is created,
    /// so that a data mistake does not leave a study behind.
    pub fn load_data(&self) -> crate::error::Result<SplitData> {
        let data = self.data.load()?;
        if let Some(max) = self.max_batch_size()
            && max as usize > data.n_train
        {
            return Err(self.knob_error(
                "batch_size",
                "train.batch_size",
                format!(
                    "batch_size can be {max}, but the training split has only {} rows",
                    data.n_train
                ),
            ));
        }
        Ok(data)
    }

    /// Refuses `[train] precision` values the run's devices do not offer:
    /// TF32 is CUDA's alone (the CPU runs fp32 and bf16). A searched
    /// precision is refused if any of its choices is.
    pub fn check_precision(&self, on_cpu: bool) -> crate::error::Result<()> {
        let choices: Vec<String> = match (
            self.fixed.get("precision"),
            self.space.params().iter().find(|p| p.name == "precision"),
        ) {
            (Some(v), _) => vec![v.as_str().to_string()],
            (None, Some(p)) => match &p.dist {
                Distribution::Categorical { choices } => choices
                    .iter()
                    .filter_map(|c| match c {
                        Choice::Str(s) => Some(s.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            },
            (None, None) => Vec::new(),
        };
        if on_cpu && choices.iter().any(|c| c == "tf32") {
            return Err(self.knob_error(
                "precision",
                "train.precision",
                "precision \"tf32\" needs a CUDA device, and this run is on the CPU: \
                 the CPU runs \"fp32\" and \"bf16\" (see `salus-tune devices`)",
            ));
        }
        Ok(())
    }

    /// A study-file error at knob `name`'s place in the file, under `key`:
    /// for checks that need what only a run knows (its data, its devices).
    fn knob_error(&self, name: &str, key: &str, msg: impl Into<String>) -> crate::error::Error {
        let (line, col) = self.positions.get(name).copied().unwrap_or((0, 0));
        crate::error::Error::Study {
            path: self.path.display().to_string(),
            line,
            col,
            key: key.into(),
            msg: msg.into(),
        }
    }

    /// The largest batch size the space allows.
    fn max_batch_size(&self) -> Option<i64> {
        match self
            .space
            .params()
            .iter()
            .find(|p| p.name == "batch_size")
            .map(|p| &p.dist)
        {
            Some(Distribution::Int { high, .. }) => Some(*high),
            Some(Distribution::Categorical { choices }) => choices
                .iter()
                .filter_map(|c| match c {
                    Choice::Int(i) => Some(*i),
                    _ => None,
                })
                .max(),
            _ => Some(match self.value(&Params::new(), "batch_size") {
                KnobValue::Int(i) => i,
                _ => 0,
            }),
        }
    }

    /// A knob's value in a trial: sampled, else fixed, else its default.
    pub fn value(&self, params: &Params, name: &str) -> KnobValue {
        if let Some(v) = params.get(name) {
            let p = self
                .space
                .params()
                .iter()
                .find(|p| p.name == name)
                .expect("sampled params are in the space");
            return match (*v, &p.dist) {
                (ParamValue::Float(f), _) => KnobValue::Float(f),
                (ParamValue::Int(i), _) => KnobValue::Int(i),
                (ParamValue::Choice(i), Distribution::Categorical { choices }) => {
                    KnobValue::from_choice(&choices[i])
                }
                (ParamValue::Choice(_), _) => unreachable!("a choice comes from a categorical"),
            };
        }
        if let Some(v) = self.fixed.get(name) {
            return v.clone();
        }
        let k = KNOBS.iter().find(|k| k.name == name).expect("a known knob");
        match k.default {
            KnobDefault::Float(f) => KnobValue::Float(f),
            KnobDefault::Int(i) => KnobValue::Int(i),
            KnobDefault::Str(s) => KnobValue::Str(s.into()),
            KnobDefault::Bool(b) => KnobValue::Bool(b),
        }
    }

    /// A trial's optimizer and regularisation values, each knob's value
    /// given by `v`, seeded by `seed`.
    fn hparams(v: impl Fn(&str) -> KnobValue, seed: u64) -> SlotHparams {
        let optimizer = match v("optimizer").as_str() {
            "sgd" => Optimizer::Sgd {
                momentum: v("sgd.momentum").as_f64() as f32,
                nesterov: v("sgd.nesterov") == KnobValue::Bool(true),
            },
            o => {
                let (b1, b2, eps) = (
                    v(&format!("{o}.beta1")).as_f64() as f32,
                    v(&format!("{o}.beta2")).as_f64() as f32,
                    v(&format!("{o}.eps")).as_f64() as f32,
                );
                if o == "adamw" {
                    Optimizer::AdamW {
                        beta1: b1,
                        beta2: b2,
                        eps,
                    }
                } else {
                    Optimizer::Adam {
                        beta1: b1,
                        beta2: b2,
                        eps,
                    }
                }
            }
        };
        SlotHparams {
            optimizer,
            lr: v("lr").as_f64() as f32,
            weight_decay: v("weight_decay").as_f64() as f32,
            dropout: v("dropout").as_f64() as f32,
            seed,
        }
    }

    /// What `[train] schedule` sets a trial with `params` to, from each
    /// step on: its values with the entry's (and the entries' before it)
    /// in place of the fixed ones.
    pub fn schedule_hparams(&self, params: &Params, seed: u64) -> Vec<(u64, SlotHparams)> {
        let mut set: BTreeMap<String, KnobValue> = BTreeMap::new();
        self.schedule
            .iter()
            .map(|(step, values)| {
                set.extend(values.clone());
                let v = |name: &str| {
                    set.get(name)
                        .cloned()
                        .unwrap_or_else(|| self.value(params, name))
                };
                (*step, Self::hparams(v, seed))
            })
            .collect()
    }

    /// The worker configuration of a trial with `params`, seeded by `seed`.
    pub fn trial_config(&self, params: &Params, seed: u64) -> TrialConfig {
        let v = |name: &str| self.value(params, name);
        let (hidden, conv) = match self.model {
            ModelKind::Mlp => (
                vec![v("width").as_i64() as usize; v("depth").as_i64() as usize],
                None,
            ),
            ModelKind::Cnn { preset: None } => {
                let channels = v("channels").as_i64() as usize;
                let conv = ConvNetSpec {
                    // The data's shape is set when a trial is bound to it.
                    image: ImageShape { h: 0, w: 0, c: 0 },
                    // Each stage doubles the channels, as ResNet's and VGG's do.
                    stages: (0..v("stages").as_i64() as u32)
                        .map(|s| channels << s)
                        .collect(),
                    blocks_per_stage: v("blocks_per_stage").as_i64() as usize,
                    kernel: v("kernel").as_i64() as usize,
                    residual: v("residual") == KnobValue::Bool(true),
                    batch_norm: v("batch_norm") == KnobValue::Bool(true),
                    pool: if v("pool").as_str() == "avg" {
                        PoolKind::Avg
                    } else {
                        PoolKind::Max
                    },
                    global_pool: v("global_pool") == KnobValue::Bool(true),
                    augment: self.data.augment,
                };
                (
                    vec![v("width").as_i64() as usize; v("depth").as_i64() as usize],
                    Some(conv),
                )
            }
            ModelKind::Cnn {
                preset: Some(CnnPreset::CudaConvnet),
            } => {
                let net = ConvNetSpec {
                    augment: self.data.augment,
                    ..CnnPreset::CudaConvnet.net()
                };
                (Vec::new(), Some(net))
            }
        };
        TrialConfig {
            precision: kernels::Precision::from_name(v("precision").as_str()).unwrap_or_default(),
            hidden,
            conv,
            activation: Activation::from_name(v("activation").as_str()).unwrap_or(Activation::Relu),
            batch_size: v("batch_size").as_i64() as usize,
            epochs: v("epochs").as_i64() as u64,
            hparams: Self::hparams(v, seed),
            report_every: self.report_every,
        }
    }

    /// The fixed knobs as a typed JSON object (integers stay integers):
    /// stored with the study and with each trial, and compared on resume.
    pub fn fixed_json(&self) -> serde_json::Value {
        self.fixed
            .iter()
            .map(|(k, v)| (k.clone(), v.to_json()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// Where the study's results go: `--storage` (`flag`), else
    /// `SALUS_TUNE_STORAGE`, else the study file's `storage`, else
    /// `<name>.db` beside the study file.
    pub fn storage_url(&self, flag: Option<&str>) -> String {
        if let Some(url) = flag.map(str::to_string).or_else(|| {
            std::env::var("SALUS_TUNE_STORAGE")
                .ok()
                .filter(|s| !s.is_empty())
        }) {
            return url;
        }
        self.storage.clone().unwrap_or_else(|| {
            let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
            dir.join(format!("{}.db", self.name)).display().to_string()
        })
    }

    /// What the database keeps of this study's definition.
    pub fn record(&self) -> storage::StudyRecord {
        storage::StudyRecord {
            name: self.name.clone(),
            file: self.path.clone(),
            direction: self.direction,
            metric: self.metric.clone(),
            objectives: self.objectives.clone(),
            space: self.space_json(),
            fixed: self
                .fixed
                .iter()
                .map(|(k, v)| (k.clone(), (v.to_json(), v.to_string())))
                .collect(),
            forked_from: self.forked_from.clone(),
        }
    }

    /// The search space in Optuna's `distribution_json` form, by name: what
    /// resuming compares.
    pub fn space_json(&self) -> BTreeMap<String, String> {
        self.space
            .params()
            .iter()
            .map(|p| (p.name.clone(), crate::space::distribution_json(&p.dist)))
            .collect()
    }
}
