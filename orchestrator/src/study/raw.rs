//! The study file as written: one serde struct per section, every value
//! [`Spanned`] so that a later check can point at it.
//!
//! Unknown keys are refused by `deny_unknown_fields`. The leaf types
//! ([`Str`], [`Int`], [`Bool`], [`Num`]) refuse a wrong type with the
//! message users read ("expected an integer, found a string"); values whose
//! type depends on other keys (a knob, a duration, a size) arrive as a
//! [`Scalar`] and are checked in `parse.rs`. Field order is the order in
//! which "expected one of" lists keys.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use toml::Spanned;

/// How toml hands a datetime to `deserialize_any`: a one-key table.
const DATETIME_KEY: &str = "$__toml_private_datetime";

type Field<T> = Option<Spanned<T>>;
/// An optional table: `[name]` or `name = { ... }`.
type Section<T> = Option<Spanned<Table<T>>>;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Root {
    pub study: Section<StudySection>,
    pub data: Section<DataSection>,
    pub model: Section<ModelSection>,
    pub train: Section<TrainSection>,
    pub sampler: Section<SamplerSection>,
    pub pruner: Section<PrunerSection>,
    pub scheduler: Section<SchedulerSection>,
    pub worker: Section<WorkerSection>,
    pub pbt: Section<PbtSection>,
    pub params: Field<ParamsSection>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StudySection {
    pub name: Field<Str>,
    pub direction: Field<OneOrMany<Named<super::Direction>>>,
    pub metric: Field<OneOrMany<Str>>,
    pub constraints: Field<OneOrMany<Str>>,
    pub trials: Field<Int>,
    pub seed: Field<Int>,
    pub storage: Field<Str>,
    pub timeout: Field<Scalar>,
    pub max_consecutive_failures: Field<Int>,
    pub keep: Field<Str>,
    pub checkpoints: Field<Str>,
    pub liveness: Field<Scalar>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    pub source: Field<Str>,
    pub path: Field<Str>,
    pub target: Field<Str>,
    pub targets: Field<Str>,
    pub layout: Field<Str>,
    pub crop: Field<Int>,
    pub flip: Field<Bool>,
    pub task: Field<Str>,
    pub validation: Field<Num>,
    pub split_seed: Field<Int>,
    pub rows: Field<Int>,
    pub features: Field<Int>,
    pub classes: Field<Int>,
    pub informative: Field<Int>,
    pub noise: Field<Num>,
}

impl DataSection {
    /// The keys that only some sources take, with their spans, in key order.
    pub fn source_keys(&self) -> Vec<(&'static str, std::ops::Range<usize>)> {
        let spans = [
            ("path", self.path.as_ref().map(Spanned::span)),
            ("target", self.target.as_ref().map(Spanned::span)),
            ("targets", self.targets.as_ref().map(Spanned::span)),
            ("layout", self.layout.as_ref().map(Spanned::span)),
            ("crop", self.crop.as_ref().map(Spanned::span)),
            ("flip", self.flip.as_ref().map(Spanned::span)),
            ("task", self.task.as_ref().map(Spanned::span)),
            ("rows", self.rows.as_ref().map(Spanned::span)),
            ("features", self.features.as_ref().map(Spanned::span)),
            ("classes", self.classes.as_ref().map(Spanned::span)),
            ("informative", self.informative.as_ref().map(Spanned::span)),
            ("noise", self.noise.as_ref().map(Spanned::span)),
        ];
        spans
            .into_iter()
            .filter_map(|(k, s)| s.map(|s| (k, s)))
            .collect()
    }
}

/// A section whose keys include knobs (see `study::KNOBS`).
pub trait KnobSection {
    fn knob(&self, key: &str) -> Option<&Spanned<KnobRaw>>;
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub kind: Field<Str>,
    pub preset: Field<Str>,
    pub depth: Field<KnobRaw>,
    pub width: Field<KnobRaw>,
    pub activation: Field<KnobRaw>,
    pub channels: Field<KnobRaw>,
    pub stages: Field<KnobRaw>,
    pub blocks_per_stage: Field<KnobRaw>,
    pub kernel: Field<KnobRaw>,
    pub residual: Field<KnobRaw>,
    pub batch_norm: Field<KnobRaw>,
    pub pool: Field<KnobRaw>,
    pub global_pool: Field<KnobRaw>,
}

impl KnobSection for ModelSection {
    fn knob(&self, key: &str) -> Option<&Spanned<KnobRaw>> {
        match key {
            "depth" => self.depth.as_ref(),
            "width" => self.width.as_ref(),
            "activation" => self.activation.as_ref(),
            "channels" => self.channels.as_ref(),
            "stages" => self.stages.as_ref(),
            "blocks_per_stage" => self.blocks_per_stage.as_ref(),
            "kernel" => self.kernel.as_ref(),
            "residual" => self.residual.as_ref(),
            "batch_norm" => self.batch_norm.as_ref(),
            "pool" => self.pool.as_ref(),
            "global_pool" => self.global_pool.as_ref(),
            _ => None,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TrainSection {
    pub optimizer: Field<KnobRaw>,
    pub lr: Field<KnobRaw>,
    pub batch_size: Field<KnobRaw>,
    pub epochs: Field<KnobRaw>,
    pub weight_decay: Field<KnobRaw>,
    pub dropout: Field<KnobRaw>,
    pub precision: Field<KnobRaw>,
    pub report_every: Field<Int>,
    /// Values that change at report steps: `[{ step = 3, lr = 0.004 }]`.
    pub schedule: Field<Vec<toml::Table>>,
    pub sgd: Section<SgdSection>,
    pub adam: Section<AdamSection>,
    pub adamw: Section<AdamSection>,
}

impl KnobSection for TrainSection {
    fn knob(&self, key: &str) -> Option<&Spanned<KnobRaw>> {
        match key {
            "optimizer" => self.optimizer.as_ref(),
            "lr" => self.lr.as_ref(),
            "batch_size" => self.batch_size.as_ref(),
            "epochs" => self.epochs.as_ref(),
            "weight_decay" => self.weight_decay.as_ref(),
            "dropout" => self.dropout.as_ref(),
            "precision" => self.precision.as_ref(),
            _ => None,
        }
    }
}

/// One optimizer's section that is present: its name, span and knobs.
pub type OptimizerSection<'a> = (&'static str, std::ops::Range<usize>, &'a dyn KnobSection);

impl TrainSection {
    /// `[train.sgd]`, `[train.adam]` and `[train.adamw]`, those present.
    pub fn optimizer_sections(&self) -> Vec<OptimizerSection<'_>> {
        let sgd = self
            .sgd
            .as_ref()
            .map(|s| ("sgd", s.span(), &s.get_ref().0 as &dyn KnobSection));
        let adams = [("adam", &self.adam), ("adamw", &self.adamw)]
            .map(|(name, s)| s.as_ref().map(|s| (name, s.span(), &s.get_ref().0 as _)));
        sgd.into_iter().chain(adams.into_iter().flatten()).collect()
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SgdSection {
    pub momentum: Field<KnobRaw>,
    pub nesterov: Field<KnobRaw>,
}

impl KnobSection for SgdSection {
    fn knob(&self, key: &str) -> Option<&Spanned<KnobRaw>> {
        match key {
            "momentum" => self.momentum.as_ref(),
            "nesterov" => self.nesterov.as_ref(),
            _ => None,
        }
    }
}

/// `[train.adam]` and `[train.adamw]`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AdamSection {
    pub beta1: Field<KnobRaw>,
    pub beta2: Field<KnobRaw>,
    pub eps: Field<KnobRaw>,
}

impl KnobSection for AdamSection {
    fn knob(&self, key: &str) -> Option<&Spanned<KnobRaw>> {
        match key {
            "beta1" => self.beta1.as_ref(),
            "beta2" => self.beta2.as_ref(),
            "eps" => self.eps.as_ref(),
            _ => None,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SamplerSection {
    pub kind: Field<Str>,
    pub seed: Field<Int>,
    pub startup_trials: Field<Int>,
    pub multivariate: Field<Bool>,
    pub pending: Field<Str>,
    pub population: Field<Int>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PrunerSection {
    pub kind: Field<Str>,
    pub min_resource: Field<Int>,
    pub reduction_factor: Field<Int>,
    pub max_resource: Field<Int>,
    pub startup_trials: Field<Int>,
    pub warmup_steps: Field<Int>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PbtSection {
    pub population: Field<Int>,
    pub interval: Field<Int>,
    pub quantile: Field<Num>,
    pub donor_quantile: Field<Num>,
    pub resample_probability: Field<Num>,
    pub factors: Field<Vec<Num>>,
    pub mutate: Field<OneOrMany<Str>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSection {
    pub policy: Field<Named<super::Policy>>,
    pub lanes: Field<Int>,
    pub max_concurrent: Field<Int>,
    pub memory: Field<Scalar>,
    pub fuse: Field<Int>,
    pub mix_widths: Field<Named<super::MixWidths>>,
    pub graphs: Field<Named<super::GraphsMode>>,
    pub mps: Field<Bool>,
    pub devices: Field<DeviceList>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    pub kind: Field<Str>,
    pub command: Field<CommandLine>,
    pub cwd: Field<Str>,
    pub env: Field<Env>,
    pub memory: Field<Scalar>,
    pub report_every: Field<Int>,
    pub max_concurrency: Field<Int>,
    pub iterations: Field<Int>,
    pub heartbeat_timeout: Field<Scalar>,
}

impl WorkerSection {
    /// Whether any key other than `kind` is set.
    pub fn has_command_keys(&self) -> bool {
        self.command.is_some()
            || self.cwd.is_some()
            || self.env.is_some()
            || self.memory.is_some()
            || self.report_every.is_some()
            || self.max_concurrency.is_some()
            || self.iterations.is_some()
            || self.heartbeat_timeout.is_some()
    }
}

/// The scalar `visit_*` methods of a visitor that takes no scalar: each
/// refuses what it found through the visitor's own `refuse(&self, Scalar)`.
macro_rules! refuse_scalars {
    ($value:ty) => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<$value, E> {
            Err(self.refuse(Scalar::Bool(v)))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<$value, E> {
            Err(self.refuse(Scalar::Int(v)))
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<$value, E> {
            Err(self.refuse(Scalar::Int(0)))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<$value, E> {
            Err(self.refuse(Scalar::Float(v)))
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<$value, E> {
            Err(self.refuse(Scalar::Str(String::new())))
        }
    };
}

/// A table read into `T`. Serde's derived structs also accept an array,
/// field by field; a section never does.
pub struct Table<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Table<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Only<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Only<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
                let found = ScalarVisitor.visit_seq(seq)?;
                Err(self.refuse(found))
            }
            refuse_scalars!(T);
        }
        impl<T> Only<T> {
            /// `locate.rs` adds the section's name.
            fn refuse<E: de::Error>(&self, found: Scalar) -> E {
                E::custom(format!("{NOT_A_TABLE}{}", found.type_name()))
            }
        }
        d.deserialize_any(Only(std::marker::PhantomData)).map(Table)
    }
}

/// How a [`Table`] refuses another type; followed by what it found.
pub const NOT_A_TABLE: &str = "expected a table, found ";

/// A knob as written: a fixed scalar, or a distribution table.
pub enum KnobRaw {
    Fixed(Scalar),
    Dist(Box<DistTable>),
}

/// `{ float = [low, high] }`, `{ int = [low, high] }` or `{ choices = [...] }`,
/// with `log` and `step`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistTable {
    pub float: Field<Pair>,
    pub int: Field<Pair>,
    pub choices: Field<Choices>,
    pub log: Field<Bool>,
    pub step: Field<Scalar>,
    /// Present only when the "table" is really a datetime.
    #[serde(default, rename = "$__toml_private_datetime")]
    datetime: Seen,
}

/// Whether a key was present, whatever its value (toml gives a datetime's
/// text to a plain string visitor, so `Option` would refuse it).
#[derive(Default)]
struct Seen(bool);

impl<'de> Deserialize<'de> for Seen {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Seen(true))
    }
}

/// `[low, high]`.
pub struct Pair(pub [Spanned<Scalar>; 2]);

/// `choices = [...]`: any scalars, checked against the knob later.
pub struct Choices(pub Vec<Spanned<Scalar>>);

/// `command = ["program", "arg", ...]`, never empty; `parse.rs` checks that
/// each element is a string, as toml gives an element's own span only to
/// errors raised outside its deserializer.
pub struct CommandLine(pub Vec<Spanned<Scalar>>);

/// One value, or an array of them (`metric = ["val_accuracy", "params"]`).
pub struct OneOrMany<T>(pub Vec<T>);

impl<'de, T: de::DeserializeOwned> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<T> V<T> {
            fn refuse<E: de::Error>(found: Scalar) -> E {
                E::custom(format!(
                    "expected a string or an array of strings, found {}",
                    found.type_name()
                ))
            }
        }
        impl<'de, T: de::DeserializeOwned> Visitor<'de> for V<T> {
            type Value = OneOrMany<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<OneOrMany<T>, E> {
                Err(Self::refuse(Scalar::Bool(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<OneOrMany<T>, E> {
                Err(Self::refuse(Scalar::Int(v)))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<OneOrMany<T>, E> {
                Err(Self::refuse(Scalar::Int(0)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<OneOrMany<T>, E> {
                Err(Self::refuse(Scalar::Float(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<OneOrMany<T>, A::Error> {
                Err(Self::refuse(ScalarVisitor.visit_map(map)?))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany<T>, E> {
                let one: Result<T, de::value::Error> =
                    T::deserialize(de::IntoDeserializer::into_deserializer(v));
                one.map(|t| OneOrMany(vec![t]))
                    .map_err(|e| E::custom(e.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany<T>, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<T>()? {
                    items.push(item);
                }
                if items.is_empty() {
                    return Err(de::Error::custom(
                        "expected a string or an array of strings, found an empty array",
                    ));
                }
                Ok(OneOrMany(items))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// `devices = "all"` or `devices = ["cuda:0", "cuda:1"]`, as written.
pub struct DeviceList(pub Vec<String>);

/// `env = { NAME = "value" }`.
pub struct Env(pub Vec<(String, String)>);

/// A table whose keys are the user's own, in file order (toml's order).
pub struct Ordered<T>(pub Vec<(String, Spanned<T>)>);

/// Any TOML value, reduced to what a check needs to say about it.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Array,
    Table,
    Datetime,
}

impl Scalar {
    /// "a string", "an integer", ...: how messages name the type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Scalar::Str(_) => "a string",
            Scalar::Int(_) => "an integer",
            Scalar::Float(_) => "a float",
            Scalar::Bool(_) => "a boolean",
            Scalar::Array => "an array",
            Scalar::Table => "a table",
            Scalar::Datetime => "a datetime",
        }
    }

    /// A number, from a float or an integer.
    pub fn number(&self) -> Option<f64> {
        match *self {
            Scalar::Float(f) => Some(f),
            Scalar::Int(i) => Some(i as f64),
            _ => None,
        }
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        i64::try_from(v)
            .map(Scalar::Int)
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_string()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        let mut kind = Scalar::Table;
        while let Some(key) = map.next_key::<String>()? {
            if key == DATETIME_KEY {
                kind = Scalar::Datetime;
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(kind)
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

/// Leaf types that take one TOML type and name it when refusing another.
macro_rules! leaf {
    ($(#[$doc:meta])* $name:ident($ty:ty), $want:literal, $pat:pat => $val:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct $name(pub $ty);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                match Scalar::deserialize(d)? {
                    $pat => Ok($name($val)),
                    other => Err(de::Error::custom(format!(
                        concat!("expected ", $want, ", found {}"),
                        other.type_name()
                    ))),
                }
            }
        }
    };
}

leaf!(
    /// A string.
    Str(String), "a string", Scalar::Str(s) => s
);
leaf!(
    /// An integer (range checks are the caller's).
    Int(i64), "an integer", Scalar::Int(i) => i
);
leaf!(
    /// `true` or `false`.
    Bool(bool), "true or false", Scalar::Bool(b) => b
);

/// A finite number; an integer is taken as a float.
#[derive(Debug, Clone, PartialEq)]
pub struct Num(pub f64);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Scalar::deserialize(d)?;
        match value.number() {
            Some(f) if f.is_finite() => Ok(Num(f)),
            _ => Err(de::Error::custom(format!(
                "expected a finite number, found {}",
                value.type_name()
            ))),
        }
    }
}

/// A string naming one variant of `T`, which derives `Deserialize` with
/// the names users write.
#[derive(Debug, Clone, PartialEq)]
pub struct Named<T>(pub T);

impl<'de, T: de::DeserializeOwned> Deserialize<'de> for Named<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let word = Str::deserialize(d)?.0;
        let named: Result<T, de::value::Error> =
            T::deserialize(de::IntoDeserializer::into_deserializer(word.as_str()));
        named.map(Named).map_err(|e| {
            // serde: "unknown variant `x`, expected one of `a`, `b`".
            let e = e.to_string();
            let (_, expected) = e.split_once("expected").unwrap_or_default();
            let allowed: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
            let hint = super::locate::suggest(&word, &allowed)
                .map_or(String::new(), |k| format!("; did you mean '{k}'?"));
            de::Error::custom(format!(
                "unknown value '{word}'; expected one of: {}{hint}",
                allowed.join(", ")
            ))
        })
    }
}

struct KnobVisitor;

impl<'de> Visitor<'de> for KnobVisitor {
    type Value = KnobRaw;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value or a distribution table")
    }
    fn visit_bool<E>(self, v: bool) -> Result<KnobRaw, E> {
        Ok(KnobRaw::Fixed(Scalar::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<KnobRaw, E> {
        Ok(KnobRaw::Fixed(Scalar::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<KnobRaw, E> {
        ScalarVisitor.visit_u64(v).map(KnobRaw::Fixed)
    }
    fn visit_f64<E>(self, v: f64) -> Result<KnobRaw, E> {
        Ok(KnobRaw::Fixed(Scalar::Float(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<KnobRaw, E> {
        Ok(KnobRaw::Fixed(Scalar::Str(v.to_string())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<KnobRaw, A::Error> {
        ScalarVisitor.visit_seq(seq).map(KnobRaw::Fixed)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<KnobRaw, A::Error> {
        let table = DistTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(match table.datetime {
            Seen(true) => KnobRaw::Fixed(Scalar::Datetime),
            Seen(false) => KnobRaw::Dist(Box::new(table)),
        })
    }
}

impl<'de> Deserialize<'de> for KnobRaw {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KnobVisitor)
    }
}

/// Reads an array's elements, or refuses a non-array as "expected `want`".
struct ArrayVisitor<T> {
    want: &'static str,
    element: std::marker::PhantomData<T>,
}

impl<T> ArrayVisitor<T> {
    fn new(want: &'static str) -> Self {
        ArrayVisitor {
            want,
            element: std::marker::PhantomData,
        }
    }
    fn refuse<E: de::Error>(&self, found: Scalar) -> E {
        E::custom(format!(
            "expected {}, found {}",
            self.want,
            found.type_name()
        ))
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for ArrayVisitor<T> {
    type Value = Vec<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.want)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(items)
    }
    refuse_scalars!(Vec<T>);
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
        let found = ScalarVisitor.visit_map(map)?;
        Err(self.refuse(found))
    }
}

impl<'de> Deserialize<'de> for Pair {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const WANT: &str = "[low, high]";
        let items: Vec<Spanned<Scalar>> = d.deserialize_any(ArrayVisitor::new(WANT))?;
        let pair: [Spanned<Scalar>; 2] = items
            .try_into()
            .map_err(|_| de::Error::custom(format!("expected {WANT}, found an array")))?;
        Ok(Pair(pair))
    }
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ArrayVisitor::new("an array"))
            .map(Choices)
    }
}

impl<'de> Deserialize<'de> for DeviceList {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DeviceList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a device or an array of devices, such as \"all\" or [\"cuda:0\", \"cuda:1\"]",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DeviceList, E> {
                Ok(DeviceList(vec![v.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<DeviceList, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<String>()? {
                    items.push(item);
                }
                if items.is_empty() {
                    return Err(de::Error::custom(
                        "expected at least one device, found an empty array",
                    ));
                }
                Ok(DeviceList(items))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for CommandLine {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const WANT: &str = "a non-empty array of strings";
        let items: Vec<Spanned<Scalar>> = d.deserialize_any(ArrayVisitor::new(WANT))?;
        if items.is_empty() {
            return Err(de::Error::custom(format!(
                "expected {WANT}, found an array"
            )));
        }
        Ok(CommandLine(items))
    }
}

/// Reads a table's entries in order, or refuses a non-table as "expected `want`".
struct TableVisitor<T> {
    want: &'static str,
    value: std::marker::PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for TableVisitor<T> {
    type Value = Vec<(String, T)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.want)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            // toml hands a datetime over as a table of this one key.
            if key == "$__toml_private_datetime" {
                return Err(self.refuse(Scalar::Datetime));
            }
            entries.push((key, map.next_value()?));
        }
        Ok(entries)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        ScalarVisitor.visit_seq(seq)?;
        Err(self.refuse(Scalar::Array))
    }
    refuse_scalars!(Vec<(String, T)>);
}

impl<T> TableVisitor<T> {
    fn new(want: &'static str) -> Self {
        TableVisitor {
            want,
            value: std::marker::PhantomData,
        }
    }
    fn refuse<E: de::Error>(&self, found: Scalar) -> E {
        E::custom(format!(
            "expected {}, found {}",
            self.want,
            found.type_name()
        ))
    }
}

impl<'de> Deserialize<'de> for Env {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let entries: Vec<(String, Str)> =
            d.deserialize_any(TableVisitor::new("a table of strings"))?;
        Ok(Env(entries.into_iter().map(|(k, v)| (k, v.0)).collect()))
    }
}

/// `[params]`: the user's own keys in file order, and `[params.when.P.V]`
/// tables of parameters that apply only when parameter `P` takes value `V`.
#[derive(Default)]
pub struct ParamsSection {
    pub params: Vec<(String, Spanned<KnobRaw>)>,
    pub when: Option<Spanned<Ordered<Ordered<Ordered<KnobRaw>>>>>,
}

struct ParamsVisitor;

impl ParamsVisitor {
    fn refuse<E: de::Error>(&self, found: Scalar) -> E {
        TableVisitor::<KnobRaw>::new("a table ([params])").refuse(found)
    }
}

impl<'de> Visitor<'de> for ParamsVisitor {
    type Value = ParamsSection;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a table ([params])")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ParamsSection, A::Error> {
        let mut section = ParamsSection::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == "when" {
                section.when = Some(map.next_value()?);
            } else {
                section.params.push((key, map.next_value()?));
            }
        }
        Ok(section)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ParamsSection, A::Error> {
        ScalarVisitor.visit_seq(seq)?;
        Err(self.refuse(Scalar::Array))
    }
    refuse_scalars!(ParamsSection);
}

impl<'de> Deserialize<'de> for ParamsSection {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ParamsVisitor)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Ordered<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Only `[params.when.PARAM.VALUE]` tables have the user's own keys
        // at several levels.
        d.deserialize_any(TableVisitor::new(
            "a table of conditional parameters ([params.when.PARAM.VALUE])",
        ))
        .map(Ordered)
    }
}
