//! What each CLI command does. `main.rs` only parses arguments.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use training::data::SplitData;

use crate::checkpoint::Checkpoints;
use crate::device::{self, OnDevices};
use crate::error::{Error, Result};
use crate::output::{self, Format};
use crate::progress::Reporter;
use crate::run_lock::RunLock;
use crate::runner::{RunOptions, RunSummary, Runner};
use crate::sampler::GridSampler;
use crate::storage::TrialState;
use crate::storage::{self, Store, Writer};
use crate::study::{self, DataSource, GraphsMode, PrunerKind, SamplerKind, Study};

/// Exit status of a run stopped by Ctrl-C.
pub const EXIT_INTERRUPTED: i32 = 130;
/// A run that ends with no COMPLETE trial in its study failed.
pub const EXIT_NO_COMPLETE_TRIAL: i32 = 1;

pub struct RunArgs {
    pub study: PathBuf,
    pub storage: Option<String>,
    /// `--device`; `None` takes `[scheduler] devices`, else `auto`.
    pub device: Option<String>,
    pub options: RunOptions,
    /// Progress bars (true), plain lines (false), or nothing (None).
    pub progress: Option<bool>,
    /// Show the live dashboard in this terminal while the study runs.
    pub dashboard: bool,
    /// Put FAIL trials back to WAITING first (`--retry-failed`).
    pub retry_failed: bool,
    /// Run the file as a new study of this name (`--fork`).
    pub fork: Option<String>,
}

/// `salus-tune STUDY.toml`: runs or resumes the study; returns the exit status.
pub async fn run(args: RunArgs) -> Result<i32> {
    // A bad --device is refused before the study file is read.
    let flag = args.device.as_deref().map(device::parse).transpose()?;
    let mut study = study::load(&args.study)?;
    let request = match (flag, &study.scheduler.devices) {
        (Some(r), _) => r,
        (None, Some(list)) => device::parse(list)?,
        (None, None) => device::Request::Auto,
    };
    // A fork lives in the storage of the study it starts from.
    let url = study.storage_url(args.storage.as_deref());
    if let Some(name) = args.fork {
        fork(&mut study, name)?;
    }
    let backend = device::open_all(request)?;
    study.check_precision(matches!(backend, device::OpenedDevices::Cpu(_)))?;
    // The data is loaded and checked before the database is opened: a data
    // mistake leaves no study behind, and a new database gets its study
    // right after its tables.
    let data = study.load_data()?;
    let (mut store, info, opened) = open_study(&url, &study).await?;
    if let storage::StudyOpened::Redefined(why) = &opened {
        eprintln!("{why}; it has no trial yet, so the file redefines it");
    }
    let resumed = opened != storage::StudyOpened::Created;
    if args.retry_failed {
        let n = store.retry_failed(info.id).await?;
        eprintln!("requeued {n} failed trials: they run first, with their parameters");
    }
    let existing = store.trials(info.id).await?;
    if resumed {
        eprintln!(
            "resuming study '{}' from {} ({} trials stored)",
            study.name,
            store.url,
            existing.len()
        );
        if let (Some(seed), false) = (args.options.seed, existing.is_empty()) {
            eprintln!(
                "warning: --seed {seed} on a resumed study: its new trials and the sampler use seed {seed}, \
                 the {} stored trials keep the seed they ran with",
                existing.len()
            );
        }
    }
    let [conn, reader, beat] = store.writer_connections().await?;
    let (writer, writer_task) = Writer::spawn(conn, reader, beat, &url);

    let checkpoint_dir = Checkpoints::for_study(&study, store.location());
    let checkpoints = Some(checkpoint_dir.clone());
    // Held while this process runs studies on a SQLite file, and removed
    // when it ends (see `run_lock`): a fast sign of a live run on this
    // host. Which trials are whose is in the database (`storage::claims`).
    let lock = match store.location() {
        storage::Location::Sqlite(db_path) => Some(RunLock::take(db_path)),
        storage::Location::Postgres(_) => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        if stop_signal().await {
            flag.store(true, Ordering::SeqCst);
            eprintln!(
                "\nstopping at the next iteration boundary, writing checkpoints (Ctrl-C again to stop at once)"
            );
            if stop_signal().await {
                // Every write is a committed transaction or none: the database
                // stays consistent, and the next run resumes from checkpoints.
                std::process::exit(EXIT_INTERRUPTED);
            }
        }
    });

    let mut reporter = match args.progress {
        _ if args.dashboard => Reporter::Quiet,
        None => Reporter::Quiet,
        Some(bars) => Reporter::new(bars && std::io::stderr().is_terminal()),
    };
    let runner_study = study.clone();
    let options = args.options;
    let dash_stop = stop.clone();
    let running = tokio::task::spawn_blocking(move || {
        backend.run(RunOnDevice {
            runner: Runner {
                study: &runner_study,
                info,
                writer,
                reporter: &mut reporter,
                stop,
                options,
                checkpoints,
            },
            data,
        })
    });
    if args.dashboard {
        // Quitting the dashboard stops the study at the next boundary.
        crate::dash::run(&url, Some(&study.name), Some(dash_stop)).await?;
    }
    let summary = running.await.map_err(|source| Error::Panicked {
        task: "runner",
        source,
    })??;
    writer_task.await.map_err(|source| Error::Panicked {
        task: "writer",
        source,
    })?;

    let study_id = store.pick_study(Some(&study.name)).await?.id;
    let trials = store.trials(study_id).await?;
    if study.objectives.len() > 1 {
        let directions: Vec<_> = study.objectives.iter().map(|(_, d)| *d).collect();
        let names: Vec<String> = study.objectives.iter().map(|(m, _)| m.clone()).collect();
        let front = output::pareto_front(&trials, &directions);
        match front.is_empty() {
            false => print!("{}", output::render_front(&front, &names, Format::Table)),
            true => println!("no trial completed"),
        }
    } else {
        match output::best(&trials, study.direction) {
            Some(best) => print!(
                "{}",
                output::render_best(best, Some(&study.metric), Format::Table)
            ),
            None => println!("no trial completed"),
        }
    }
    println!("results: {}", storage::masked(&url));
    let completed = trials.iter().any(|t| t.state == TrialState::Complete);
    // Nothing waits for a checkpoint any more when none is left and no
    // other process runs the study (a peer that starts meanwhile makes the
    // folder again: see `storage::files::write_synced`).
    let others = storage::live_runs(store.conn(), study_id, study.liveness.as_secs_f64())
        .await
        .map_err(|e| Error::storage(&store.url, e))?;
    store.close().await?;
    if others.is_empty() {
        let _ = std::fs::remove_dir(checkpoint_dir.dir());
    }
    drop(lock);
    Ok(if summary.interrupted {
        EXIT_INTERRUPTED
    } else if !completed || summary.halted.is_some() {
        EXIT_NO_COMPLETE_TRIAL
    } else {
        0
    })
}

/// Opens the database and creates or resumes the study. Processes started
/// at the same instant on a new file can find it locked while one of them
/// sets it up (SQLite then answers at once, not after its busy timeout):
/// they try again, a little later each.
async fn open_study(
    url: &str,
    study: &Study,
) -> Result<(Store, storage::StudyInfo, storage::StudyOpened)> {
    let mut tries = 0u64;
    loop {
        let opened = async {
            let mut store = Store::open(url).await?;
            let (info, opened) = store.create_or_resume(&study.record()).await?;
            Ok((store, info, opened))
        }
        .await;
        match opened {
            Err(Error::Storage(e)) if e.is_locked() && tries < 60 => {
                tries += 1;
                let jitter = u64::from(std::process::id()) % 50;
                tokio::time::sleep(std::time::Duration::from_millis(
                    20 * tries.min(10) + jitter,
                ))
                .await;
            }
            other => return other,
        }
    }
}

/// `--fork NEW_NAME`: the file's definition under a new study name, so the
/// study stored under the file's name stays as it is. Rerunning the same
/// command resumes the fork.
fn fork(study: &mut Study, name: String) -> Result<()> {
    if name.trim().is_empty() || name == study.name {
        return Err(Error::Input(format!(
            "--fork needs a study name other than '{}', the one in {}",
            study.name,
            study.path.display()
        )));
    }
    eprintln!(
        "forking: this run is study '{name}', started from {}; study '{}' stays as it is",
        study.path.display(),
        study.name
    );
    study.forked_from = Some(std::mem::replace(&mut study.name, name));
    Ok(())
}

/// Waits for Ctrl-C or SIGTERM; `false` if signals cannot be watched.
async fn stop_signal() -> bool {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            return tokio::signal::ctrl_c().await.is_ok();
        };
        tokio::select! {
            c = tokio::signal::ctrl_c() => c.is_ok(),
            t = term.recv() => t.is_some(),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.is_ok()
    }
}

/// `salus-tune check STUDY.toml`: validates and prints the resolved study.
pub fn check(path: &Path, storage_flag: Option<&str>) -> Result<String> {
    let s = study::load(path)?;
    let mut out = format!("{}: ok\n", path.display());
    out += &format!("study      {}\n", s.name);
    out += &format!(
        "objective  {} {}\n",
        s.direction.optuna().to_lowercase(),
        s.metric
    );
    out += &format!(
        "trials     {}{}\n",
        s.trials,
        s.timeout
            .map_or(String::new(), |t| format!(" (timeout {t:?})"))
    );
    let data = match &s.data.source {
        DataSource::Digits if s.data.images => "digits (built in), as 1x8x8 images".to_string(),
        DataSource::Digits => "digits (built in)".to_string(),
        DataSource::Csv { path, target } => format!("csv {} (target '{target}')", path.display()),
        DataSource::Npy {
            path,
            targets,
            layout,
        } => {
            let images = match layout {
                Some(training::data::ImageLayout::Nchw) => ", NCHW images",
                Some(training::data::ImageLayout::Nhwc) => ", NHWC images",
                None => "",
            };
            format!("npy {} / {}{images}", path.display(), targets.display())
        }
        DataSource::Idx { images, labels } => {
            format!("idx {} / {}", images.display(), labels.display())
        }
        DataSource::Cifar10 { path } => format!("cifar10 {}", path.display()),
        DataSource::SyntheticClassification {
            rows,
            features,
            classes,
            ..
        } => format!("synthetic-classification {rows} x {features}, {classes} classes"),
        DataSource::SyntheticRegression { rows, features, .. } => {
            format!("synthetic-regression {rows} x {features}")
        }
    };
    match &s.worker {
        Some(w) => {
            out += &format!("worker     {:?} in {}\n", w.command, w.cwd.display());
            out += &format!(
                "           {} iterations, {} per trial, heartbeat timeout {:?}\n",
                w.iterations,
                w.memory_bytes
                    .map_or("memory measured (auto)".into(), |b| format!(
                        "{} declared",
                        crate::dash::view::bytes(b as i64)
                    )),
                w.heartbeat_timeout
            );
        }
        None => {
            // The same load and checks a run makes before it creates the study.
            let split = s.load_data()?;
            let task = match split.task {
                training::data::Task::Classification { classes } => {
                    format!("classification, {classes} classes")
                }
                training::data::Task::Regression { targets: 1 } => "regression".to_string(),
                training::data::Task::Regression { targets } => {
                    format!("regression, {targets} targets")
                }
            };
            out += &format!("data       {data}\n");
            let features = match split.image {
                Some(shape) => format!("{shape} images"),
                None => format!("{} features", split.features),
            };
            out += &format!(
                "           {features}, {task}; {} training rows, {} validation rows ({})\n",
                split.n_train, split.n_val, s.data.validation
            );
        }
    }
    out += &format!("sampler    {} (seed {})\n", s.sampler.kind, s.sampler.seed);
    if s.sampler.kind == SamplerKind::Grid {
        let points = GridSampler::points(&s.space).len();
        let note = match points.cmp(&(s.trials as usize)) {
            std::cmp::Ordering::Less => format!("; the study stops after {points} trials"),
            std::cmp::Ordering::Equal => String::new(),
            std::cmp::Ordering::Greater => {
                format!("; {} trials cover part of it", s.trials)
            }
        };
        out += &format!("grid       {points} points{note}\n");
    }
    out += &format!("pruner     {}\n", s.pruner);
    if let Some(p) = &s.pbt {
        let every = match p.interval {
            Some(i) => format!("every {i} iterations"),
            None => "at every report point".to_string(),
        };
        out += &format!(
            "pbt        population {}, exploit {every}: the worst {} copy one of the best {}; \
             explore {} (resampled with probability {}, else times one of {:?})\n",
            p.population,
            tuning::pbt::quantile_size(p.population, p.exploit_quantile),
            tuning::pbt::quantile_size(p.population, p.donor_quantile),
            p.mutate.join(", "),
            p.resample_probability,
            p.factors
        );
    }
    for (step, values) in &s.schedule {
        let set: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out += &format!("schedule   from step {step}: {}\n", set.join(" "));
    }
    out += &format!("keep       {}\n", s.keep.name());
    out += &format!("scheduler  {}\n", scheduler_text(&s));
    out += &format!(
        "storage    {}\n",
        storage::masked(&s.storage_url(storage_flag))
    );
    out += &format!("search space ({} parameters):\n", s.space.params().len());
    for p in s.space.params() {
        let dist = p.dist.to_string();
        let when = p.condition.as_ref().map_or(String::new(), |c| {
            format!(
                "  (when {} = {})",
                c.parent,
                c.values
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        });
        out += &format!("  {:<14} {dist}{when}\n", p.name);
    }
    if !s.fixed.is_empty() {
        out += "fixed:\n";
        for (k, v) in &s.fixed {
            out += &format!("  {k:<14} {v}\n");
        }
    }
    Ok(out)
}

/// `[scheduler]` as `check` prints it: the values set, the defaults named.
fn scheduler_text(s: &Study) -> String {
    let c = &s.scheduler;
    let policy = match c.policy {
        Some(p) => p.name().to_string(),
        None if s.pruner != PrunerKind::None => "priority (default with a pruner)".into(),
        None if s.pbt.is_some() => "priority (default with [pbt])".into(),
        None => "pack (default)".into(),
    };
    let or_auto = |v: Option<usize>| v.map_or("auto".to_string(), |n| n.to_string());
    let memory = c
        .memory_bytes
        .map_or("auto".to_string(), |b| crate::dash::view::bytes(b as i64));
    let graphs = match c.graphs {
        Some(GraphsMode::Off) => "off",
        _ => "auto",
    };
    // The default per lane on a CPU (a GPU always takes two).
    let cpu_per_lane = crate::runner::InFlight::of(s, 1, true).default_max();
    // Where more than 2 would run, TPE and GP start with fewer.
    let ramp = match crate::runner::InFlight::of(s, 1, false).ramp() {
        Some(r) => format!(
            "{}over every process on the study 2 until {} trials, 4 (at most half of it) \
             until {}, twice as many each time the trials double, up to ",
            match r.random_start {
                0 => String::new(),
                n => format!("all for the random start's {n} trials, then "),
            },
            r.first_until,
            r.until_trials
        ),
        None => String::new(),
    };
    let in_flight = match s.max_concurrent_set() {
        Some(n) => n.to_string(),
        None if cpu_per_lane == 2 => format!("{ramp}2 x lanes (default)"),
        None if ramp.is_empty() => "lanes on a CPU, 2 x lanes on a GPU (default)".into(),
        None => {
            format!("{ramp}lanes on a CPU (no start on 1 or 2 lanes), 2 x lanes on a GPU (default)")
        }
    };
    format!(
        "policy {policy}, lanes {}, max_concurrent {in_flight}, memory {memory}, fuse {}, graphs {graphs}",
        or_auto(c.lanes),
        c.fuse.unwrap_or(crate::runner::DEFAULT_FUSE),
    )
}

/// Where `trials` and `best` read from: a study file, or `--storage` and `--study`.
pub struct ReadArgs {
    pub study_file: Option<PathBuf>,
    pub storage: Option<String>,
    pub study: Option<String>,
    pub format: Format,
}

async fn open_for_reading(args: &ReadArgs) -> Result<(Store, storage::StudyInfo, Option<String>)> {
    let (url, name, metric) = match &args.study_file {
        Some(path) => {
            let s = study::load(path)?;
            (
                s.storage_url(args.storage.as_deref()),
                args.study.clone().or(Some(s.name.clone())),
                Some(s.metric),
            )
        }
        None => {
            let url = args.storage.clone().or_else(|| std::env::var("SALUS_TUNE_STORAGE").ok().filter(|s| !s.is_empty())).ok_or_else(|| {
                Error::Input("say which results to read: give a study file, or --storage URL (or set SALUS_TUNE_STORAGE)".into())
            })?;
            (url, args.study.clone(), None)
        }
    };
    let mut store = Store::open_existing(&url).await?;
    let info = store.pick_study(name.as_deref()).await?;
    Ok((store, info, metric))
}

pub async fn trials(args: ReadArgs) -> Result<String> {
    let (mut store, info, _) = open_for_reading(&args).await?;
    let lineage = store.pbt_lineage(info.id).await?;
    Ok(output::render_trials(
        &store.trials(info.id).await?,
        &lineage,
        args.format,
    ))
}

pub async fn best(args: ReadArgs) -> Result<String> {
    let (mut store, info, metric) = open_for_reading(&args).await?;
    let trials = store.trials(info.id).await?;
    let objectives = store.objectives(info.id).await?;
    if objectives.len() > 1 {
        // A study of several objectives has no one best trial: its front.
        let directions: Vec<_> = objectives.iter().map(|(_, d)| *d).collect();
        let names: Vec<String> = objectives
            .iter()
            .enumerate()
            .map(|(i, (n, _))| n.clone().unwrap_or(format!("value{i}")))
            .collect();
        let front = output::pareto_front(&trials, &directions);
        if front.is_empty() {
            return Err(Error::NoCompleteTrial {
                study: info.name.clone(),
            });
        }
        return Ok(output::render_front(&front, &names, args.format));
    }
    let best = output::best(&trials, info.direction).ok_or_else(|| Error::NoCompleteTrial {
        study: info.name.clone(),
    })?;
    Ok(output::render_best(best, metric.as_deref(), args.format))
}

/// `salus-tune best STUDY.toml --schedule`: the best member of a PBT study
/// as a study file of its own that replays its schedule without PBT.
pub async fn best_schedule(args: ReadArgs) -> Result<String> {
    let Some(path) = args.study_file.clone() else {
        return Err(Error::Input(
            "best --schedule writes a study file from the PBT study's own: name it \
             (salus-tune best STUDY.toml --schedule)"
                .into(),
        ));
    };
    let s = study::load(&path)?;
    if s.pbt.is_none() {
        return Err(Error::Input(format!(
            "{}: best --schedule replays a PBT member's schedule, and this study has no [pbt]",
            path.display()
        )));
    }
    let (mut store, info, _) = open_for_reading(&args).await?;
    let trials = store.trials(info.id).await?;
    let best = output::best(&trials, info.direction).ok_or_else(|| Error::NoCompleteTrial {
        study: info.name.clone(),
    })?;
    let json = store
        .trial_user_attr(info.id, best.number, "pbt:schedule")
        .await?
        .ok_or_else(|| {
            Error::Input(format!(
                "trial {} of '{}' has no pbt:schedule (written as a member ends)",
                best.number, info.name
            ))
        })?;
    let schedule: serde_json::Value = serde_json::from_str(&json)
        .map_err(|e| Error::Input(format!("trial {}'s pbt:schedule: {e}", best.number)))?;
    let text =
        std::fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    let replay = study::replay_file(&text, &s, &schedule).map_err(Error::Input)?;
    Ok(format!(
        "# The schedule of trial {} of study '{}' ({} {}), found by population-based\n\
         # training, as a study of its own. Save it beside {} (its paths are\n\
         # relative to that folder) and run it: salus-tune FILE.toml\n{replay}",
        best.number,
        info.name,
        s.metric,
        best.value.map_or(String::new(), |v| v.to_string()),
        path.display()
    ))
}

/// `salus-tune enqueue STUDY.toml --param NAME=VALUE ...`: a trial that
/// runs first, with these values (the others sampled), as Optuna's
/// `study.enqueue_trial` makes one. The study is created if needed.
pub async fn enqueue(path: &Path, storage_flag: Option<&str>, pairs: &[String]) -> Result<String> {
    let study = study::load(path)?;
    let url = study.storage_url(storage_flag);
    let mut fixed = serde_json::Map::new();
    for pair in pairs {
        let (name, text) = pair.split_once('=').ok_or_else(|| {
            Error::Input(format!(
                "--param {pair}: expected NAME=VALUE, say --param lr=0.01"
            ))
        })?;
        let param = study
            .space
            .params()
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = study
                    .space
                    .params()
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect();
                Error::Input(format!(
                    "--param {pair}: '{name}' is not a searched parameter of {} (they are: {})",
                    path.display(),
                    names.join(", ")
                ))
            })?;
        fixed.insert(
            name.to_string(),
            param.dist.json_of_text(text).ok_or_else(|| {
                Error::Input(format!(
                    "--param {pair}: '{text}' is not a value of {}",
                    param.dist
                ))
            })?,
        );
    }
    // Refused here, before anything is stored, as a run would refuse it.
    study
        .space
        .with_fixed(&fixed, |p| {
            p.dist
                .grid()
                .and_then(|g| g.first().copied())
                .unwrap_or(crate::space::ParamValue::Float(f64::NAN))
        })
        .map_err(|why| Error::Input(format!("--param: {why}")))?;
    let (mut store, info, _) = open_study(&url, &study).await?;
    let number = store.enqueue(info.id, &fixed).await?;
    store.close().await?;
    let given: Vec<String> = fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(format!(
        "enqueued trial {number} of study '{}' in {}: {}; it runs first on the next run, \
         the parameters not given sampled\n",
        study.name,
        storage::masked(&url),
        given.join(" ")
    ))
}

/// `salus-tune export`: a trial's kept model as `DIR/model.safetensors` and
/// `DIR/model.json`; the best trial's when `trial` is `None`. Returns what
/// it wrote, for the user.
pub async fn export(args: ReadArgs, trial: Option<i64>, out: &Path) -> Result<String> {
    let (mut store, info, _) = open_for_reading(&args).await?;
    let kept = store.kept_models(info.id).await?;
    let number = match trial {
        Some(n) => storage::TrialNumber(n),
        None => {
            let trials = store.trials(info.id).await?;
            output::best(&trials, info.direction)
                .ok_or_else(|| Error::NoCompleteTrial {
                    study: info.name.clone(),
                })?
                .number
        }
    };
    let Some(model) = store.kept_model(info.id, number).await? else {
        let list = if kept.is_empty() {
            "none has one (set [study] keep = \"best\" or \"all\" and run trials)".to_string()
        } else {
            let numbers: Vec<String> = kept.iter().map(|n| n.to_string()).collect();
            format!("trials with one: {}", numbers.join(", "))
        };
        return Err(Error::Input(format!(
            "trial {number} of study '{}' has no kept model; {list}",
            info.name
        )));
    };
    std::fs::create_dir_all(out).map_err(Error::io(format!("creating {}", out.display())))?;
    let write = |name: &str, bytes: &[u8]| {
        let path = out.join(name);
        std::fs::write(&path, bytes)
            .map(|_| path)
            .map_err(Error::io(format!("writing {}", out.join(name).display())))
    };
    let architecture: serde_json::Value =
        serde_json::from_str(&model.architecture).unwrap_or(serde_json::Value::Null);
    let json = serde_json::to_string_pretty(&architecture).expect("JSON") + "\n";
    let weights = write("model.safetensors", &model.weights)?;
    let card = write("model.json", json.as_bytes())?;
    Ok(format!(
        "trial {} of study '{}':\n  {}\n  {}\n",
        model.number,
        info.name,
        weights.display(),
        card.display()
    ))
}

/// `salus-tune dash`: the live dashboard of a stored study.
pub async fn dash(args: ReadArgs) -> Result<i32> {
    let (store, info, _) = open_for_reading(&args).await?;
    let url = store.url.clone();
    drop(store);
    crate::dash::run(&url, Some(&info.name), None).await?;
    Ok(0)
}

/// A study run, handed to whichever backend `--device` opened.
struct RunOnDevice<'a> {
    runner: Runner<'a>,
    data: SplitData,
}

impl OnDevices for RunOnDevice<'_> {
    type Output = RunSummary;
    fn run<B: kernels::Backend>(self, backends: Vec<std::sync::Arc<B>>) -> Result<RunSummary> {
        self.runner.run(backends, self.data)
    }
}
