//! The `salus-tune` binary: parses the command line (`salus_tune::cli`) and
//! dispatches to `salus_tune::commands` and the benchmarks.

use std::path::PathBuf;

use salus_tune::bench::packing::Width;
use salus_tune::cli::{self, BenchCmd, Command};
use salus_tune::commands::{self, ReadArgs, RunArgs};
use salus_tune::device::{self, OnBackend};
use salus_tune::error::Result;
use salus_tune::output::Format;
use salus_tune::runner::RunOptions;

struct Packing {
    hs: Vec<Width>,
    ks: Vec<usize>,
    plan: salus_tune::bench::packing::Plan,
}

impl OnBackend for Packing {
    type Output = salus_tune::bench::packing::Results;
    fn run<B: kernels::Backend>(self, backend: std::sync::Arc<B>) -> Result<Self::Output> {
        let progress = &mut |l: &str| eprintln!("{l}");
        let (hs, ks) = (&self.hs, &self.ks);
        salus_tune::bench::packing::run(&backend, hs, ks, &self.plan, progress)
    }
}

/// `bench policies` on whichever device `--device` opened.
struct Policies {
    jobs: usize,
    seed: u64,
    seeds: usize,
    rounds: usize,
}

impl OnBackend for Policies {
    type Output = salus_tune::bench::policies::Results;
    fn run<B: kernels::Backend>(self, backend: std::sync::Arc<B>) -> Result<Self::Output> {
        let progress = &mut |l: &str| eprintln!("{l}");
        let (jobs, seed, seeds, rounds) = (self.jobs, self.seed, self.seeds, self.rounds);
        salus_tune::bench::policies::run(&backend, jobs, seed, seeds, rounds, progress)
    }
}

/// `bench pbt` on whichever device `--device` opened.
struct Pbt {
    sizes: Vec<usize>,
    rounds: usize,
}

impl OnBackend for Pbt {
    type Output = salus_tune::bench::pbt::Results;
    fn run<B: kernels::Backend>(self, backend: std::sync::Arc<B>) -> Result<Self::Output> {
        let progress = &mut |l: &str| eprintln!("{l}");
        salus_tune::bench::pbt::run(&backend, &self.sizes, self.rounds, progress)
    }
}

/// A benchmark's results: its JSON (`--json`), else its table.
fn print_bench(
    json: bool,
    value: impl FnOnce() -> serde_json::Value,
    table: impl FnOnce() -> String,
) {
    if json {
        println!("{}", serde_json::to_string_pretty(&value()).expect("JSON"));
    } else {
        print!("{}", table());
    }
}

fn bench(which: BenchCmd) -> salus_tune::error::Result<i32> {
    use salus_tune::bench;
    let mut progress = |line: &str| eprintln!("{line}");
    match which {
        BenchCmd::Packing {
            device,
            json,
            quick,
            widths,
            counts,
            gflop,
            graphs,
            optimizer_order,
            repeats,
            modes,
            lanes,
            fused_groups,
            no_overhead,
            no_torch,
            precision,
        } => {
            fn pick<T: Clone>(given: Vec<T>, quick: bool, short: &[T], full: &[T]) -> Vec<T> {
                match (given.is_empty(), quick) {
                    (false, _) => given,
                    (true, true) => short.to_vec(),
                    (true, false) => full.to_vec(),
                }
            }
            let plan = bench::packing::Plan {
                target_gflop: gflop.map_or(if quick { 0.5 } else { 50.0 }, |g| g as f64),
                repeats: repeats as usize,
                modes: bench::packing::MODES
                    .into_iter()
                    .filter(|m| modes.iter().any(|given| given == m))
                    .collect(),
                graphs: graphs == "auto",
                // `auto` (no name): the backend's default.
                optimizer_order: training::OptimizerOrder::from_name(&optimizer_order),
                lanes: lanes.map(|l| l as usize),
                fused_groups: fused_groups.map(|g| g as usize),
                overhead: !no_overhead,
                torch: !no_torch,
                precision: kernels::Precision::from_name(&precision).unwrap_or_default(),
            };
            let job = Packing {
                plan,
                hs: pick(
                    widths,
                    quick,
                    &[Width::Fixed(64)],
                    &[Width::Fixed(256), Width::Fixed(1024), Width::Mixed],
                ),
                ks: pick(
                    counts.into_iter().map(|k| k as usize).collect(),
                    quick,
                    &[1, 4],
                    &[1, 4, 16, 64],
                ),
            };
            let r = device::open(device::parse(&device)?)?.run(job)?;
            print_bench(json, || r.json(), || r.table());
        }
        BenchCmd::Samplers {
            json,
            seeds,
            first_seed,
            no_optuna,
            in_flight,
            ramp,
            lanes,
            samplers,
            problems,
        } => {
            let in_flight = in_flight as usize;
            let plan = bench::samplers::Plan {
                seeds,
                first_seed,
                samplers,
                problems,
                optuna: !no_optuna,
                in_flight,
                // As the runner's default on in_flight / 2 lanes (or
                // --lanes: in_flight of them is a CPU's one per lane), for
                // the bench's TPE and GP (10 random proposals each).
                ramp: if ramp {
                    let lanes = lanes.map_or(in_flight.div_ceil(2), |l| l as usize);
                    salus_tune::runner::InFlight {
                        lanes,
                        cpu_only: lanes >= in_flight,
                        prioritised: lanes < in_flight,
                        external: false,
                        model_after: Some(salus_tune::bench::samplers::RANDOM_START),
                    }
                    .ramp()
                } else {
                    None
                },
            };
            let (rows, mut notes) = bench::samplers::run(&plan, &mut progress)?;
            let (fronts, more) = if plan.in_flight > 1 {
                notes.push("several objectives: skipped, --in-flight applies to the problems of one objective".into());
                (Vec::new(), Vec::new())
            } else {
                bench::fronts::run(&plan, &mut progress)?
            };
            notes.extend(more);
            for n in notes {
                eprintln!("{n}");
            }
            if json {
                // One array: the rows of one objective, then of several.
                let mut all = bench::samplers::json(&rows, plan.in_flight, plan.ramp);
                if let (Some(a), serde_json::Value::Array(b)) =
                    (all.as_array_mut(), bench::fronts::json(&fronts))
                {
                    a.extend(b);
                }
                println!("{}", serde_json::to_string_pretty(&all).expect("JSON"));
            } else {
                if !rows.is_empty() {
                    print!(
                        "{}",
                        bench::samplers::table(&rows, seeds, first_seed, plan.in_flight, plan.ramp)
                    );
                }
                if !fronts.is_empty() {
                    print!("{}", bench::fronts::table(&fronts, seeds));
                }
            }
        }
        BenchCmd::Workers {
            json,
            python,
            trials,
            concurrency,
            objective_ms,
        } => {
            let python = bench::flag_python(python.map(PathBuf::from));
            let r = bench::external_workers::run(
                &python.to_string_lossy(),
                trials as usize,
                concurrency as usize,
                objective_ms as f64,
                &mut progress,
            )?;
            print_bench(json, || r.json(), || r.table());
        }
        BenchCmd::Swap {
            json,
            python,
            megabytes,
            rounds,
            device,
        } => {
            let python = bench::flag_python(python.map(PathBuf::from));
            let r = bench::swap::run(
                &python.to_string_lossy(),
                megabytes,
                rounds as usize,
                if device == "cuda" { "cuda" } else { "cpu" },
                &mut progress,
            )?;
            print_bench(json, || r.json(), || r.table());
        }
        BenchCmd::Chaos {
            json,
            processes,
            seconds,
            seed,
            trials,
            liveness,
            studies,
            postgres,
            no_sqlite,
            python,
        } => {
            let options = bench::chaos::Options {
                no_sqlite,
                processes: processes as usize,
                seconds,
                seed,
                trials,
                liveness_s: liveness,
                kinds: studies
                    .iter()
                    .filter_map(|s| bench::chaos::Kind::parse(s))
                    .collect(),
                postgres,
                python: bench::flag_python(python),
            };
            let reports = bench::chaos::run(&options, &mut progress)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&bench::chaos::json(&reports)).expect("JSON")
                );
            } else {
                print!("{}", bench::chaos::table(&reports));
            }
            if reports.iter().any(|r| !r.violations.is_empty()) {
                return Ok(1);
            }
        }
        BenchCmd::Storage {
            json,
            processes,
            trials,
            postgres,
            python,
        } => {
            let counts: Vec<usize> = processes.iter().map(|&p| p as usize).collect();
            let python = bench::flag_python(python);
            let options = bench::storage::Options {
                processes: &counts,
                trials,
                python: postgres.is_some().then_some(python),
                postgres,
            };
            let rows = bench::storage::run(&options, &mut progress)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&bench::storage::json(&rows)).expect("JSON")
                );
            } else {
                print!("{}", bench::storage::table(&rows));
            }
        }
        BenchCmd::Pbt {
            device,
            json,
            params,
            rounds,
        } => {
            let r = device::open(device::parse(&device)?)?.run(Pbt {
                sizes: params.into_iter().map(|p| p as usize).collect(),
                rounds: rounds as usize,
            })?;
            print_bench(json, || r.json(), || r.table());
        }
        BenchCmd::Policies {
            device,
            json,
            jobs,
            seed,
            seeds,
            rounds,
        } => {
            let r = device::open(device::parse(&device)?)?.run(Policies {
                jobs: jobs as usize,
                seed,
                seeds: seeds as usize,
                rounds: rounds as usize,
            })?;
            print_bench(json, || r.json(), || r.table());
        }
    }
    Ok(0)
}

fn main() {
    // SAFETY: the first statement of main, before any thread is started.
    unsafe { kernels::cuda::prefer_device_connections() };
    let cli = cli::parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    if matches!(cli.command, Command::Run { .. } | Command::Bench { .. }) {
        salus_tune::temp_folders::sweep_once();
    }
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
                    more: run.more,
                    seed: run.seed,
                };
                commands::run(RunArgs {
                    study,
                    storage: run.storage,
                    device: run.device,
                    options,
                    progress: Some(!run.no_progress),
                    dashboard: run.dashboard,
                    retry_failed: run.retry_failed,
                    fork: run.fork,
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
            Command::Best { read, schedule } => {
                let found = if schedule {
                    commands::best_schedule(read.into()).await
                } else {
                    commands::best(read.into()).await
                };
                found.map(|s| {
                    print!("{s}");
                    0
                })
            }
            Command::Dash(f) => {
                commands::dash(ReadArgs {
                    study_file: f.study_file,
                    storage: f.storage,
                    study: f.study,
                    format: Format::Table,
                })
                .await
            }
            Command::Enqueue {
                study,
                params,
                storage,
            } => commands::enqueue(&study, storage.as_deref(), &params)
                .await
                .map(|s| {
                    print!("{s}");
                    0
                }),
            Command::Export { read, trial, out } => {
                let args = ReadArgs {
                    study_file: read.study_file,
                    storage: read.storage,
                    study: read.study,
                    format: Format::Table,
                };
                commands::export(args, trial, &out).await.map(|s| {
                    print!("{s}");
                    0
                })
            }
            Command::Bench { which } => bench(which),
            Command::Devices => {
                device::report().iter().for_each(|l| println!("{l}"));
                println!("{}", salus_tune::external::nvml::describe());
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
