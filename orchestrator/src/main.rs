//! The `salus-tune` command line. Commands live in `salus_tune::commands`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use salus_tune::commands::{self, ReadArgs, RunArgs};
use salus_tune::output::Format;
use salus_tune::runner::RunOptions;

/// Hyper-parameter tuning that packs many training trials onto one device.
///
/// `salus-tune STUDY.toml` runs (or resumes) the study described in the
/// file and stores its results in SQLite in Optuna's schema, so that
/// `optuna.load_study(storage="sqlite:///...")` reads them.
///
/// Exit status: 0 success, 1 a run failed, 2 bad input (study file, flag,
/// storage), 130 stopped by Ctrl-C.
#[derive(Parser)]
#[command(
    name = "salus-tune",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    Best(ReadFlags),
    /// List the compute devices this build can use.
    Devices,
}

#[derive(clap::Args)]
struct RunFlags {
    /// Where results go: a path or sqlite:///path.db. Default: <study name>.db beside the study file.
    #[arg(long, env = "SALUS_TUNE_STORAGE")]
    storage: Option<String>,
    /// auto, cpu or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Total number of finished trials to reach (overrides [study] trials).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    trials: Option<u64>,
    /// Seed for sampling and training (overrides [study] seed).
    #[arg(long)]
    seed: Option<u64>,
    /// Plain log lines even on a terminal.
    #[arg(long)]
    no_progress: bool,
}

#[derive(clap::Args)]
struct ReadFlags {
    /// A study file: its storage and study name are used.
    study_file: Option<PathBuf>,
    /// A path or sqlite:///path.db.
    #[arg(long)]
    storage: Option<String>,
    /// The study's name (needed when the storage holds several).
    #[arg(long)]
    study: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
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

const COMMANDS: &[&str] = &["run", "check", "trials", "best", "devices", "help"];

fn main() {
    let mut argv: Vec<String> = std::env::args().collect();
    // `salus-tune STUDY.toml ...` is short for `salus-tune run STUDY.toml ...`.
    if argv
        .get(1)
        .is_some_and(|a| !a.starts_with('-') && !COMMANDS.contains(&a.as_str()))
    {
        argv.insert(1, "run".into());
    }
    let cli = Cli::parse_from(argv);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run { study, run } => {
                let options = RunOptions {
                    trials: run.trials,
                    seed: run.seed,
                };
                commands::run(RunArgs {
                    study,
                    storage: run.storage,
                    device: run.device,
                    options,
                    progress: Some(!run.no_progress),
                })
                .await
            }
            Command::Check { study, storage } => {
                commands::check(&study, storage.as_deref()).map(|s| {
                    print!("{s}");
                    0
                })
            }
            Command::Trials(f) => commands::trials(f.into()).await.map(|s| {
                print!("{s}");
                0
            }),
            Command::Best(f) => commands::best(f.into()).await.map(|s| {
                print!("{s}");
                0
            }),
            Command::Devices => {
                salus_tune::device_report()
                    .iter()
                    .for_each(|l| println!("{l}"));
                Ok(0)
            }
        }
    });
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}
