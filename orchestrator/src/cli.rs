//! The command line's grammar: every command, flag and default, as clap
//! derives it. `main.rs` dispatches a parsed [`Cli`]; the docs' tests parse
//! every command line of the book with [`parse_args`], so the book and
//! `--help` cannot drift apart.
//!
//! Doc comments here are `--help` text, which names a study file's tables
//! as `[study]` and placeholders as `<study name>`; rustdoc would read
//! those as links and HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::bench::packing::Width;
use crate::commands::ReadArgs;
use crate::output::Format;

/// Hyper-parameter tuning that packs many training trials onto one device.
///
/// `salus-tune STUDY.toml` runs (or resumes) the study described in the
/// file and stores its results in Optuna's schema, in SQLite or PostgreSQL,
/// so that `optuna.load_study(storage=...)` reads them. Several processes
/// (one per GPU, one per machine) may run the same study at once.
///
/// Exit status: 0 success, 1 a run or command failed on good input (no
/// trial completed, a file the system refused, storage), 2 bad input (study
/// file, flag, storage), 130 stopped by Ctrl-C.
#[derive(Parser)]
#[command(
    name = "salus-tune",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run or resume a study (also: `salus-tune STUDY.toml`).
    Run {
        /// The study file.
        study: PathBuf,
        #[command(flatten)]
        run: RunFlags,
    },
    /// Validate a study file and print the resolved search space.
    Check {
        study: PathBuf,
        /// Storage URL to report (as `run` would use it).
        #[arg(long)]
        storage: Option<String>,
    },
    /// List a study's trials.
    Trials(ReadFlags),
    /// Show a study's best trial.
    Best {
        #[command(flatten)]
        read: ReadFlags,
        /// Of a PBT study: print the best member's schedule as a study
        /// file of its own (the study file's, with [pbt] gone, every knob
        /// fixed to where the member's weights started, and [train]
        /// schedule), to run without PBT. Needs STUDY.toml.
        #[arg(long)]
        schedule: bool,
    },
    /// Watch a study live in a terminal dashboard (running or finished).
    ///
    /// It rereads the database every 500 ms, so it follows a study that
    /// another process runs. `?` lists the keys; p, r and x pause, resume
    /// and prune the selected trial of a running study.
    Dash(StudyFlags),
    /// Add a trial that runs first, with the given values (the others are
    /// sampled), as Optuna's study.enqueue_trial does.
    Enqueue {
        study: PathBuf,
        /// NAME=VALUE of a searched parameter (repeat it); a choice by its text.
        #[arg(long = "param", value_name = "NAME=VALUE", required = true)]
        params: Vec<String>,
        /// Storage URL (as `run` would use it).
        #[arg(long, env = "SALUS_TUNE_STORAGE", hide_env_values = true)]
        storage: Option<String>,
    },
    /// Write a trial's kept model ([study] keep) to a folder: its weights
    /// as model.safetensors and model.json, which says how to run them.
    Export {
        #[command(flatten)]
        read: StudyFlags,
        /// The trial's number [default: the best trial].
        #[arg(long)]
        trial: Option<i64>,
        /// The folder to write (created when missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Benchmarks: sampler quality, packing, external workers, swap, storage,
    /// chaos, PBT's exploit and the scheduling policies (dated results in
    /// the docs book's Benchmarks section).
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
    /// List the compute devices this build can use.
    Devices,
}

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Sampler quality: random, qmc, tpe and gp (and Optuna's TPE and GP
    /// samplers, through Python, when available) on Branin, Hartmann-6, a
    /// 10-D Rosenbrock, Levy-5, a mixed space, four discrete ones and four
    /// tabulated MLP results: median best value over seeds at 50 and 100
    /// trials, time per proposal, and, where ours and Optuna's same sampler
    /// both ran, the seeds where ours is better / worse and the share of
    /// resamples of the seeds in which our median is at most Optuna's. Of
    /// several objectives, NSGA-II, NSGA-III and TPE (and Optuna's) on
    /// ZDT1, ZDT2, DTLZ2, BNH and the digits MLP: median hypervolume at 100
    /// and 300 trials, and the same comparison with Optuna's (the share of
    /// resamples in which our median hypervolume is at least Optuna's).
    Samplers {
        /// Print rows as JSON, with each seed's best values
        /// (`best_50_per_seed`, `best_100_per_seed`) beside the medians,
        /// and on ours beside Optuna's same sampler the seed-for-seed
        /// verdicts (`against_optuna`: `better`, `worse`, `met_share`).
        #[arg(long)]
        json: bool,
        /// How many seeds per sampler and problem: 0 to N-1, or F to F+N-1
        /// with --first-seed F.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
        seeds: u64,
        /// The first seed: the runs take seeds F to F+N-1, so that a
        /// comparison can grow in new seeds without rerunning the old ones.
        #[arg(long, default_value_t = 0)]
        first_seed: u64,
        /// Skip Optuna's samplers.
        #[arg(long)]
        no_optuna: bool,
        /// Trials in flight: each proposal is made while the N - 1 before
        /// it still run (their values unknown), as with N trials running at
        /// once; Optuna's run the same way (ask and tell), its TPE with
        /// constant_liar. Problems of one objective only.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
        in_flight: u64,
        /// Model the runner's default start for TPE and GP where it keeps
        /// N in flight on --lanes lanes: all N for the sampler's 10 random
        /// trials, then 2 until the study holds 30 trials, 4 (at most
        /// N / 2) until 60, and twice as many each time the trials double
        /// (8 until 120), up to N. Ours only; Optuna's keep N.
        #[arg(long, requires = "in_flight")]
        ramp: bool,
        /// The lanes --ramp models: N / 2 by default (a GPU, or a CPU with
        /// a pruner, PBT or external workers, two trials per lane); N for a
        /// CPU's one trial per lane, which has no start on 1 or 2 lanes.
        #[arg(long, requires = "ramp", value_parser = clap::value_parser!(u64).range(1..=64))]
        lanes: Option<u64>,
        /// Run only these samplers (comma-separated): random, qmc, tpe, gp,
        /// optuna-tpe, optuna-gp on the problems of one objective; random,
        /// nsga2, nsga3, tpe, optuna-nsga2, optuna-nsga3, optuna-tpe on those
        /// of several.
        /// Optuna's GPSampler takes 5-60 s per 100-trial run on 2 cores
        /// (longest on the discrete problems).
        #[arg(long, value_delimiter = ',')]
        samplers: Vec<String>,
        /// Run only these problems (comma-separated): branin, hartmann6,
        /// rosenbrock10, levy5, mixed, ordinal5, ordinal-hartmann6,
        /// int-styblinski4, int-categorical, and the tabulated MLP
        /// results tab-digits, tab-synthetic-a, tab-synthetic-b,
        /// tab-breast-cancer; of several objectives (scored by hypervolume
        /// at 100 and 300 trials): zdt1, zdt2, dtlz2, bnh (constrained),
        /// mlp-digits (tabulated: error against parameters).
        #[arg(long, value_delimiter = ',')]
        problems: Vec<String>,
    },
    /// K same-shape trials (784-h-h-10 MLPs, or conv nets) one at a time
    /// (seq), through the core's lanes and fused: aggregate TFLOP/s, images
    /// per second, ratio to seq and to PyTorch (conv nets), switch latency,
    /// the core's overhead against a bare loop, and the GEMM rate.
    Packing {
        /// auto, cpu or cuda:N.
        #[arg(long, default_value = "auto")]
        device: String,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
        /// A small configuration that runs in seconds (h=64, K in {1, 4}).
        #[arg(long)]
        quick: bool,
        /// Workloads to measure, comma-separated: an MLP's hidden width;
        /// `mixed`, K widths drawn log-uniformly from 64..1024 (fused: as
        /// groups of mixed widths); `mixed-depths`, the same widths with
        /// 1-3 hidden layers each; `cnn-digits`, a conv net on the digits
        /// as 1x8x8 images; `cnn-32`, the cuda-convnet preset on 32x32x3
        /// images [default: 256,1024,mixed].
        #[arg(long = "h", value_delimiter = ',', value_parser = parse_width)]
        widths: Vec<Width>,
        /// Trial counts to measure, comma-separated [default: 1,4,16,64].
        #[arg(long = "k", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..))]
        counts: Vec<u64>,
        /// Work per configuration, in GFLOP [default: 50; 0.5 with --quick].
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        gflop: Option<u64>,
        /// auto: on CUDA, replay each trial's iterations as a CUDA graph
        /// after the first; off: launch every op every time.
        #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
        graphs: String,
        /// per-layer: each layer's optimizer step as soon as the backward
        /// pass is done with the layer (on CUDA beside the next layers'
        /// GEMMs, on a second stream); after-backward: one step over all
        /// parameters at the end; auto: per-layer on CUDA, after-backward
        /// on the CPU. The same bits either way.
        #[arg(long, default_value = "auto", value_parser = ["auto", "per-layer", "after-backward"])]
        optimizer_order: String,
        /// Runs of each mode per configuration; the fastest counts.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        repeats: u64,
        /// Modes to run, comma-separated: seq, lanes, fused. Without seq the
        /// "vs seq" ratios are left out.
        #[arg(long, value_delimiter = ',', default_value = "seq,lanes,fused",
              value_parser = clap::builder::PossibleValuesParser::new(crate::bench::packing::MODES))]
        modes: Vec<String>,
        /// Lanes for the lanes mode [default: one per core on the CPU, 32
        /// streams on CUDA].
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        lanes: Option<u64>,
        /// Fused groups per configuration in the fused mode, each on its own
        /// lane [default: the groups the scheduler would form: one on a GPU].
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        fused_groups: Option<u64>,
        /// Skip the core's overhead and switch-latency measurements.
        #[arg(long)]
        no_overhead: bool,
        /// The cells' matrix-product arithmetic, as `[train] precision`:
        /// fp32; tf32 (CUDA only); bf16 (inputs rounded, fp32 accumulation).
        #[arg(long, default_value = "fp32", value_parser = ["fp32", "tf32", "bf16"])]
        precision: String,
        /// Skip the PyTorch anchor of the conv-net workloads (it runs on the
        /// CPU when SALUS_TUNE_PYTHON, or .venv/bin/python, imports torch).
        #[arg(long)]
        no_torch: bool,
    },
    /// External workers: the round trip of one gated iteration of a Python
    /// worker, and a study of K one-iteration trials of a small Python
    /// objective against calling it directly at the same concurrency.
    Workers {
        #[arg(long)]
        json: bool,
        /// The Python to run (default: $SALUS_TUNE_PYTHON, else python3).
        #[arg(long)]
        python: Option<String>,
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
        trials: u64,
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
        /// CPU time of one objective call, in milliseconds.
        #[arg(long, default_value_t = 500)]
        objective_ms: u64,
    },
    /// Pause-to-resume of a PyTorch trial (an MLP with Adam): swapped to
    /// host memory inside its process, against a checkpoint, an exit and a
    /// restart. Needs a Python with torch.
    Swap {
        #[arg(long)]
        json: bool,
        /// The Python to run (default: $SALUS_TUNE_PYTHON, else python3).
        #[arg(long)]
        python: Option<String>,
        /// Megabytes of float32 parameters (the state is four times that,
        /// with gradients and Adam's two moments).
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
        megabytes: u64,
        /// Pause-and-resume rounds each way.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
        /// Where the worker keeps its state: `cpu`, or `cuda` (host memory
        /// is then pinned, and a swap crosses PCIe).
        #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
        device: String,
    },
    /// P processes on one SQLite study with the smallest built-in trial:
    /// trials per second, errors, and the writer's time per trial.
    Storage {
        #[arg(long)]
        json: bool,
        /// Process counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = clap::value_parser!(u64).range(1..))]
        processes: Vec<u64>,
        /// Trials in each configuration's study.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
        trials: u64,
        /// Also measure on this PostgreSQL database (postgresql://...), with
        /// Optuna's processes on the same database beside salus-tune's.
        #[arg(long, value_name = "URL")]
        postgres: Option<String>,
        /// The Python with Optuna 5.0 and psycopg2 for Optuna's side
        /// [default: $SALUS_TUNE_PYTHON, else python3].
        #[arg(long)]
        python: Option<PathBuf>,
    },
    /// Many processes on one study while a seeded driver stops them past
    /// the liveness limit (SIGSTOP, SIGCONT), kills and restarts them, and
    /// sends dashboard commands; then checks that every trial ended once,
    /// by its final claim, with every step once and no checkpoint left.
    /// Exits 1 on any violation.
    Chaos {
        #[arg(long)]
        json: bool,
        /// Processes on the study at any time.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..))]
        processes: u64,
        /// How long the driver acts; then the study is let finish.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        /// The driver's seed: the same seed, the same actions at the same pace.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Trials in each study.
        #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..))]
        trials: u64,
        /// The studies' [study] liveness, in seconds (a stop lasts longer).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(5..))]
        liveness: u64,
        /// Studies to run, comma-separated: builtin (fused MLPs, ASHA,
        /// checkpoints, keep = "best") and external (the NumPy script as a
        /// worker per trial, ASHA, swaps).
        #[arg(long, value_delimiter = ',', default_value = "builtin,external",
              value_parser = clap::builder::PossibleValuesParser::new(crate::bench::chaos::Kind::NAMES))]
        studies: Vec<String>,
        /// Also run each study on this PostgreSQL database, which must not
        /// hold those studies yet.
        #[arg(long, value_name = "URL")]
        postgres: Option<String>,
        /// With --postgres: run on PostgreSQL only.
        #[arg(long, requires = "postgres")]
        no_sqlite: bool,
        /// The Python with NumPy for the external study's workers
        /// [default: $SALUS_TUNE_PYTHON, else python3].
        #[arg(long)]
        python: Option<PathBuf>,
    },
    /// PBT's exploit: one MLP trial (Adam) taking another's whole state in
    /// memory, device to device (two lone trials, and two members of one
    /// fused group, slot to slot), against checkpoint and restore (the
    /// donor's state written to a synced file, read back and loaded into
    /// a trial built anew), for each size.
    Pbt {
        /// auto, cpu or cuda:N.
        #[arg(long, default_value = "auto")]
        device: String,
        #[arg(long)]
        json: bool,
        /// Trial sizes, in parameters, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1000000,10000000",
              value_parser = clap::value_parser!(u64).range(1000..))]
        params: Vec<u64>,
        /// Exploits each way per size.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
    /// A seeded trace of real trials with heavy-tailed lengths and staggered
    /// arrivals, replayed under fifo, pack, fair and srtf: average job
    /// completion time, makespan, busy fraction, ratio to fifo.
    Policies {
        /// auto, cpu or cuda:N.
        #[arg(long, default_value = "auto")]
        device: String,
        #[arg(long)]
        json: bool,
        /// Trials in the trace (at least 2).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(2..))]
        jobs: u64,
        /// The first seed; the seeded traces use SEED..SEED+SEEDS.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Seeded traces (lengths and arrival order drawn from each seed);
        /// each figure is the median over them.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        seeds: u64,
        /// Rounds over the policies per trace; each trace's figure is the median.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
}

#[derive(clap::Args)]
pub struct RunFlags {
    /// Where results go: a path, sqlite:///path.db or postgresql://user@host/db
    /// (the password from PGPASSWORD or ~/.pgpass). Default: <study name>.db
    /// beside the study file.
    #[arg(long, env = "SALUS_TUNE_STORAGE", hide_env_values = true)]
    pub storage: Option<String>,
    /// auto, all, cpu, cuda:N, or a list of one kind (cuda:0,cuda:1;
    /// cpu:0,cpu:1): one Salus core per device. Default: [scheduler]
    /// devices, else auto (CUDA device 0 where CUDA works, else the CPU).
    #[arg(long)]
    pub device: Option<String>,
    /// Total number of finished trials to reach (overrides [study] trials).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "more")]
    pub trials: Option<u64>,
    /// Run N more trials than the study has finished (Optuna's n_trials).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub more: Option<u64>,
    /// Run the study's FAIL trials again first, with their parameters.
    #[arg(long)]
    pub retry_failed: bool,
    /// Run the file as a new study named NEW_NAME in the same storage, and
    /// leave the stored study as it is (after changing a fixed value or the
    /// space of a study that has trials). Rerun with it to resume the fork.
    #[arg(long, value_name = "NEW_NAME")]
    pub fork: Option<String>,
    /// Seed for sampling and training (overrides [study] seed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Plain log lines even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
    /// Show the live dashboard instead of progress lines; quitting it stops
    /// the study at the next iteration boundary (rerun to resume).
    #[arg(long)]
    pub dashboard: bool,
}

#[derive(clap::Args)]
pub struct StudyFlags {
    /// A study file: its storage and study name are used.
    pub study_file: Option<PathBuf>,
    /// A path, sqlite:///path.db or postgresql://user@host/db.
    #[arg(long, env = "SALUS_TUNE_STORAGE", hide_env_values = true)]
    pub storage: Option<String>,
    /// The study's name (needed when the storage holds several).
    #[arg(long)]
    pub study: Option<String>,
}

#[derive(clap::Args)]
pub struct ReadFlags {
    /// A study file: its storage and study name are used.
    pub study_file: Option<PathBuf>,
    /// A path, sqlite:///path.db or postgresql://user@host/db.
    #[arg(long)]
    pub storage: Option<String>,
    /// The study's name (needed when the storage holds several).
    #[arg(long)]
    pub study: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

impl From<ReadFlags> for ReadArgs {
    fn from(f: ReadFlags) -> Self {
        ReadArgs {
            study_file: f.study_file,
            storage: f.storage,
            study: f.study,
            format: f.format,
        }
    }
}

pub const COMMANDS: &[&str] = &[
    "run", "check", "trials", "best", "dash", "enqueue", "export", "bench", "devices", "help",
];

fn parse_width(s: &str) -> std::result::Result<Width, String> {
    Width::parse(s).ok_or_else(|| {
        format!(
            "expected a positive width, `mixed`, `mixed-depths`, `cnn-digits` or `cnn-32`, got `{s}`"
        )
    })
}

/// Parses a whole command line (the program's name first). `salus-tune
/// STUDY.toml ...` is short for `salus-tune run STUDY.toml ...`.
pub fn parse_args<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    if argv.get(1).is_some_and(|a| {
        let a = a.to_string_lossy();
        !a.starts_with('-') && !COMMANDS.contains(&a.as_ref())
    }) {
        argv.insert(1, "run".into());
    }
    Cli::try_parse_from(argv)
}
