//! `salus-tune bench packing`. See the module docs of [`super`].

use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::Instant;

use kernels::{Backend, DeviceKind, Gemm, at, at_mut};
use serde_json::json;
use training::data::ImageShape;
use training::model::ConvNetSpec;
use training::{
    DeviceData, FusedTrials, Job, Lane, MemberOutcome, StepOutcome, TrainTrial, TrialConfig,
};

use crate::study::CnnPreset;

use crate::error::Result;
use crate::salus::core::{CoreConfig, CoreEvent, SalusCore};
use crate::salus::fusion;
use crate::salus::policy::Policy;

const BATCH: usize = 128;

/// The ways K trials are run, each a row of the table.
pub const MODES: [&str; 3] = ["seq", "lanes", "fused"];

/// Lanes (streams, each with its host thread) on CUDA by default: as many as
/// the driver's hardware queues (see `kernels::cuda::DEVICE_CONNECTIONS`).
pub const CUDA_LANES: usize = 32;

/// Trials taking turns on one lane for [`switching`].
const SWITCH_TRIALS: usize = 4;

/// What to measure besides the cells' sizes.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Work per cell, in GFLOP.
    pub target_gflop: f64,
    /// Runs of each mode per cell; the fastest counts.
    pub repeats: usize,
    /// Which of [`MODES`] to run. Without `seq` the ratios are left out.
    pub modes: Vec<&'static str>,
    /// On CUDA, lanes replay captured iterations (graphs).
    pub graphs: bool,
    /// When trials run their optimizer steps (`--optimizer-order`);
    /// `None`: the backend's default.
    pub optimizer_order: Option<training::OptimizerOrder>,
    /// Lanes for the `lanes` mode; `None`: one per core on the CPU, and
    /// [`CUDA_LANES`] streams on CUDA.
    pub lanes: Option<usize>,
    /// Fused groups per cell in the `fused` mode, each on its own lane;
    /// `None`: the groups the scheduler would form (`salus::fusion`).
    pub fused_groups: Option<usize>,
    /// Measure the core's overhead against a bare loop (14 runs of one
    /// trial) and its switch latency.
    pub overhead: bool,
    /// Run the PyTorch anchor for conv-net cells on the CPU, when a Python
    /// with torch is found (`SALUS_TUNE_PYTHON`, else `.venv/bin/python`).
    pub torch: bool,
    /// The cells' GEMM arithmetic (`[train] precision`); the core's
    /// overhead and switches are measured in fp32.
    pub precision: kernels::Precision,
}

/// A cell's workload: 784-h-h-10 MLPs of one hidden width for all K
/// trials, or of widths drawn log-uniformly from 64..1024 (seeded), one per
/// trial, and with `MixedDepths` of 1-3 hidden layers each; or a conv net
/// ([`ImageWorkload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    Fixed(usize),
    Mixed,
    MixedDepths,
    Cnn(ImageWorkload),
}

/// The conv-net workloads, mirrored in `scripts/anchors/torch_cnn.py`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageWorkload {
    /// The built-in digits as 1x8x8 images: two 3x3 stages of 16 and 32
    /// channels with batch norm and max pooling, a 64-wide head.
    Digits,
    /// 32x32x3 synthetic images through the cuda-convnet preset.
    Synthetic32,
}

/// The batch of the conv-net workloads.
const CNN_BATCH: usize = 64;

impl ImageWorkload {
    fn name(self) -> &'static str {
        match self {
            ImageWorkload::Digits => "cnn-digits",
            ImageWorkload::Synthetic32 => "cnn-32",
        }
    }

    fn config(self, iterations: u64, seed: u64) -> TrialConfig {
        let (hidden, conv) = match self {
            ImageWorkload::Digits => (
                vec![64],
                ConvNetSpec {
                    image: ImageShape { h: 0, w: 0, c: 0 },
                    stages: vec![16, 32],
                    blocks_per_stage: 1,
                    kernel: 3,
                    residual: false,
                    batch_norm: true,
                    pool: kernels::PoolKind::Max,
                    global_pool: false,
                    augment: None,
                },
            ),
            ImageWorkload::Synthetic32 => (Vec::new(), CnnPreset::CudaConvnet.net()),
        };
        TrialConfig {
            conv: Some(conv),
            ..super::trial_config(hidden, CNN_BATCH, iterations, seed)
        }
    }

    /// About 1.5 batches of training images, so that an epoch is one
    /// iteration, and a small validation part.
    fn data<B: Backend>(self, backend: &Arc<B>) -> Result<Arc<DeviceData<B>>> {
        let rows = CNN_BATCH + CNN_BATCH / 2 + 64;
        let mut ds = match self {
            ImageWorkload::Digits => training::data::digit_images(),
            ImageWorkload::Synthetic32 => {
                training::data::synthetic_images(rows, ImageShape { h: 32, w: 32, c: 3 }, 10, 7)
            }
        };
        ds.rows = rows;
        ds.x.truncate(rows * ds.features);
        ds.y.truncate(rows);
        let data = training::data::split(&ds, 64.0 / rows as f64, 7)?;
        let mut lane = Lane::new(backend.clone(), 0, 1)?;
        Ok(DeviceData::upload(&mut lane, &data)?)
    }
}

impl Width {
    /// `256`, `mixed`, `mixed-depths`, `cnn-digits` or `cnn-32`.
    pub fn parse(s: &str) -> Option<Width> {
        match s {
            "mixed" => Some(Width::Mixed),
            "mixed-depths" => Some(Width::MixedDepths),
            "cnn-digits" => Some(Width::Cnn(ImageWorkload::Digits)),
            "cnn-32" => Some(Width::Cnn(ImageWorkload::Synthetic32)),
            n => n.parse().ok().filter(|&n| n > 0).map(Width::Fixed),
        }
    }

    /// The K MLP trials' hidden layers: seeded, so every mode trains the
    /// same ones.
    pub fn hidden(self, k: usize) -> Vec<Vec<usize>> {
        let width = |i: u64| {
            let u = kernels::rng::uniform(0x006d_6978_6564, 0, i) as f64;
            (64.0 * 16f64.powf(u)).round() as usize
        };
        match self {
            Width::Fixed(h) => vec![vec![h, h]; k],
            Width::Cnn(_) => vec![Vec::new(); k],
            Width::Mixed => (0..k as u64).map(|i| vec![width(i); 2]).collect(),
            Width::MixedDepths => (0..k as u64)
                .map(|i| {
                    let u = kernels::rng::uniform(0x0064_6570_7468, 0, i);
                    vec![width(i); 1 + ((3.0 * u) as usize).min(2)]
                })
                .collect(),
        }
    }

    /// Whether the K trials' shapes differ.
    fn is_mixed(self) -> bool {
        matches!(self, Width::Mixed | Width::MixedDepths)
    }

    fn json(self) -> serde_json::Value {
        match self {
            Width::Fixed(h) => json!(h),
            Width::Mixed => json!("mixed"),
            Width::MixedDepths => json!("mixed-depths"),
            Width::Cnn(w) => json!(w.name()),
        }
    }
}

impl std::fmt::Display for Width {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Width::Fixed(h) => write!(f, "{h}"),
            Width::Mixed => write!(f, "mixed"),
            Width::MixedDepths => write!(f, "mixed-depths"),
            Width::Cnn(w) => write!(f, "{}", w.name()),
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone)]
pub struct Row {
    pub h: Width,
    pub k: usize,
    pub mode: &'static str,
    pub tflops: f64,
    pub ratio_vs_seq: f64,
    pub seconds: f64,
    pub iterations: u64,
    /// Training images (samples) per second, all trials together.
    pub images_per_s: f64,
    /// PyTorch's seconds for the same K trials one after another over
    /// this row's (conv-net cells on the CPU, when PyTorch is there).
    pub vs_torch: f64,
}

pub struct Results {
    pub rows: Vec<Row>,
    pub overhead_pct: Option<f64>,
    /// Between two resident trials' iterations on one lane, from the end of
    /// one to the start of the next (see `Switching`).
    pub switch_mean_us: Option<f64>,
    pub switch_median_us: Option<f64>,
    /// Device time lost per switch (see `Switching`).
    pub switch_cost_us: Option<f64>,
    pub gemm_gflops: f64,
    /// The cells' GEMM arithmetic.
    pub precision: kernels::Precision,
    pub device: String,
    pub kind: DeviceKind,
    pub lanes: usize,
    pub cores: usize,
    /// Whether lanes replayed captured iterations (CUDA graphs).
    pub graphs: bool,
    pub optimizer_order: training::OptimizerOrder,
    /// For each `mixed` cell: K, the bands of similar sizes the runner
    /// cuts the K trials into ([`fusion::width_bands`]), and how many of
    /// them its cost model ([`fusion::mixing_pays`]) would run as a group
    /// of mixed widths here rather than through lanes.
    pub mix_predictions: Vec<(Width, usize, usize, usize)>,
}

fn config(hidden: Vec<usize>, iterations: u64, seed: u64) -> TrialConfig {
    super::trial_config(hidden, BATCH, iterations, seed)
}

/// A ratio to two places, or `-` where its reference was not run.
fn ratio(x: f64) -> String {
    if x.is_nan() {
        "-".to_string()
    } else {
        format!("{x:.2}")
    }
}

/// A lane for the bench, set up as the plan says (graphs are ignored on
/// the CPU).
fn lane<B: Backend>(backend: &Arc<B>, id: usize, threads: usize, plan: &Plan) -> Result<Lane<B>> {
    let mut lane = Lane::new(backend.clone(), id, threads)?;
    lane.set_graphs(plan.graphs);
    if let Some(order) = plan.optimizer_order {
        lane.set_optimizer_order(order);
    }
    Ok(lane)
}

/// The core's configuration for the bench: no memory limit.
fn core_config(kind: DeviceKind, policy: Policy, lanes: usize, plan: &Plan) -> CoreConfig {
    CoreConfig {
        graphs: plan.graphs,
        optimizer_order: plan.optimizer_order,
        ..CoreConfig::for_device(kind, policy, lanes, u64::MAX / 4)
    }
}

/// Moves jobs' initial state onto the device before the clock starts, as
/// the PyTorch anchors build their models on the GPU before timing: what is
/// timed is training, not the first upload.
fn place<B: Backend>(backend: &Arc<B>, jobs: &mut [impl Job<B>]) -> Result<()> {
    let mut lane = Lane::new(backend.clone(), 0, 1)?;
    lane.run(|lane| -> Result<()> {
        for j in jobs.iter_mut() {
            j.swap_in(lane)?;
        }
        Ok(lane.sync()?)
    })
}

/// Trains each trial to the end on one lane, one after another.
fn run_bare<B: Backend>(
    backend: &Arc<B>,
    lane: &mut Lane<B>,
    mut trials: Vec<TrainTrial<B>>,
) -> Result<f64> {
    place(backend, &mut trials)?;
    let start = Instant::now();
    lane.run(|lane| -> Result<()> {
        for mut t in trials {
            while !matches!(t.step(lane)?, StepOutcome::Finished(_)) {}
        }
        Ok(())
    })?;
    Ok(start.elapsed().as_secs_f64())
}

/// Trains all trials through the core; returns seconds and switch latencies.
fn run_core<B: Backend>(
    backend: &Arc<B>,
    mut trials: Vec<TrainTrial<B>>,
    config: CoreConfig,
) -> Result<(f64, Vec<f64>)> {
    place(backend, &mut trials)?;
    let jobs = trials
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Job<B>>)
        .collect();
    run_core_jobs(backend, jobs, config)
}

/// Runs jobs (lone trials or fused groups) through the core to their end.
fn run_core_jobs<B: Backend>(
    backend: &Arc<B>,
    jobs: Vec<Box<dyn Job<B>>>,
    config: CoreConfig,
) -> Result<(f64, Vec<f64>)> {
    let (tx, rx) = channel();
    let core = SalusCore::start(backend.clone(), config, tx)?;
    let n = jobs.len();
    let start = Instant::now();
    for j in jobs {
        core.submit(j, 0.0, "bench");
    }
    let (mut ended, mut switches) = (0, Vec::new());
    while ended < n {
        match rx.recv().map_err(|_| crate::error::Error::CoreStopped)? {
            CoreEvent::Finished { .. } | CoreEvent::GroupEnded { .. } => ended += 1,
            CoreEvent::Failed { error, .. } => return Err(error.into()),
            CoreEvent::Members { steps, .. } => {
                if let Some(MemberOutcome::Failed(e)) = steps
                    .into_iter()
                    .map(|m| m.outcome)
                    .find(|o| matches!(o, MemberOutcome::Failed(_)))
                {
                    return Err(crate::error::Error::Bench(format!(
                        "a fused trial failed: {e}"
                    )));
                }
            }
            CoreEvent::Switch { seconds, .. } => switches.push(seconds),
            _ => {}
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    core.shutdown();
    Ok((seconds, switches))
}

/// The device's GEMM rate on one large product (2048^3): on the CPU with
/// all cores, the practical limit the packing goals are measured against.
pub fn gemm_gflops<B: Backend>(backend: &B) -> Result<f64> {
    let n = 2048;
    let mut ctx = backend.new_ctx(super::cores())?;
    let host = backend.host_threads(&ctx);
    let a = backend.alloc_zeroed(n * n)?;
    let b = backend.alloc_zeroed(n * n)?;
    let mut c = backend.alloc_zeroed(n * n)?;
    let g = Gemm::new(n, n, n);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        backend.enter(&host, || {
            backend.gemm(&mut ctx, &g, at(&a, 0), at(&b, 0), at_mut(&mut c, 0))
        })?;
        backend.sync(&mut ctx)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(g.flops() / best / 1e9)
}

/// The K `trials` as fused groups of the size the scheduler would form,
/// over the lanes; the seconds they take.
fn run_fused<B: Backend>(
    backend: &Arc<B>,
    trials: Vec<TrainTrial<B>>,
    kind: DeviceKind,
    lanes: usize,
    plan: &Plan,
) -> Result<f64> {
    let k = trials.len();
    let mixed = trials
        .iter()
        .any(|t| t.fusion_key() != trials[0].fusion_key());
    // Trials of mixed widths: each group takes neighbours in width, so that
    // its layout (the widest member's) wastes little; the cap is the widest's.
    let mut trials = trials;
    trials.sort_by_key(|t| t.spec().n_params());
    // The runner's cut: bands of similar sizes (for mixed widths), then
    // groups of the cap; `--fused-groups` cuts evenly instead.
    let bands = match (mixed, plan.fused_groups) {
        (true, None) => {
            let sizes: Vec<usize> = trials.iter().map(|t| t.spec().n_params()).collect();
            fusion::width_bands(&sizes)
        }
        _ => vec![k],
    };
    let mut cut = Vec::new();
    for n in bands {
        let rest = trials.split_off(n);
        let band = std::mem::replace(&mut trials, rest);
        let cap = match plan.fused_groups {
            Some(g) => k.div_ceil(g.max(1)),
            None => fusion::group_cap(
                kind,
                k,
                u64::MAX / 4,
                &band[band.len() - 1].footprint(),
                k.div_ceil(lanes),
            ),
        };
        cut.extend(fusion::groups_of(band, cap));
    }
    let mut groups = cut
        .into_iter()
        .map(|group| {
            let tagged: Vec<_> = group
                .into_iter()
                .enumerate()
                .map(|(i, t)| (i as u64, t))
                .collect();
            let n = tagged.len();
            let widths: std::collections::BTreeSet<_> = tagged
                .iter()
                .map(|(_, t)| t.spec().hidden.clone())
                .collect();
            match widths.len() > 1 {
                true => FusedTrials::mixed(tagged, n),
                false => FusedTrials::new(tagged),
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    place(backend, &mut groups)?;
    let cfg = core_config(kind, Policy::Fifo, groups.len().min(lanes), plan);
    let jobs = groups
        .into_iter()
        .map(|g| Box::new(g) as Box<dyn Job<B>>)
        .collect();
    Ok(run_core_jobs(backend, jobs, cfg)?.0)
}

/// Builds trials on every core: a K=64 cell at h=4096 holds about 15 GB of
/// initial weights and optimiser state, which one thread takes long to fill.
fn build_parallel<T: Send>(n: usize, make: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
    let threads = super::cores().clamp(1, n.max(1));
    let chunk = n.div_ceil(threads).max(1);
    let made: Vec<Result<Vec<T>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|lo| {
                let make = &make;
                s.spawn(move || (lo..(lo + chunk).min(n)).map(make).collect())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a trial-building thread panicked"))
            .collect()
    });
    let mut all = Vec::with_capacity(n);
    for part in made {
        all.extend(part?);
    }
    Ok(all)
}

/// Runs the benchmark: `ks` x `hs`, each in the plan's modes (`fused` for
/// one width only), each mode the fastest of `plan.repeats` runs. With
/// `plan.graphs`, trials replay captured iterations where the backend can
/// (CUDA).
pub fn run<B: Backend>(
    backend: &Arc<B>,
    hs: &[Width],
    ks: &[usize],
    plan: &Plan,
    progress: &mut dyn FnMut(&str),
) -> Result<Results> {
    let (target_gflop, graphs) = (plan.target_gflop, plan.graphs);
    let lane_of = |id, threads| lane(backend, id, threads, plan);
    let core_cfg = |policy, lanes| core_config(backend.kind(), policy, lanes, plan);
    let cores = super::cores();
    let kind = backend.kind();
    if kind == DeviceKind::Cpu && plan.precision == kernels::Precision::Tf32 {
        return Err(crate::error::Error::Input(
            "bench packing --precision tf32 needs a CUDA device (--device cuda:N); the CPU runs fp32 and bf16"
                .into(),
        ));
    }
    // A lane per core on the CPU; on CUDA a stream per trial, up to CUDA_LANES.
    let lanes = plan.lanes.unwrap_or(match kind {
        DeviceKind::Cpu => cores,
        DeviceKind::Cuda(_) => CUDA_LANES,
    });
    let (_, mlp_dev) = super::bench_data(backend, 784, 10, BATCH, 7)?;
    let mut rows = Vec::new();
    let mut mix_predictions = Vec::new();
    let mut gemm_best: f64 = 0.0;
    for &h in hs {
        let dev = match h {
            Width::Cnn(w) => w.data(backend)?,
            _ => mlp_dev.clone(),
        };
        for &k in ks {
            let widths = h.hidden(k);
            let trial_config = |s: usize, iterations| TrialConfig {
                precision: plan.precision,
                ..match h {
                    Width::Cnn(w) => w.config(iterations, s as u64),
                    _ => config(widths[s].clone(), iterations, s as u64),
                }
            };
            let flops_round: f64 = (0..k)
                .map(|s| Ok(trial_config(s, 1).flops_per_iteration(&dev)?))
                .sum::<Result<f64>>()?;
            let iterations = ((target_gflop * 1e9 / flops_round).ceil() as u64).max(2);
            let make = |dev: &Arc<DeviceData<B>>| -> Result<Vec<TrainTrial<B>>> {
                build_parallel(widths.len(), |s| {
                    Ok(TrainTrial::new_on_host(
                        dev.clone(),
                        trial_config(s, iterations),
                    )?)
                })
            };
            let total_flops = flops_round * iterations as f64;
            if h.is_mixed() && k > 1 {
                // The runner's choice for each band of similar sizes (as
                // `run_fused` cuts them; a GPU group takes a whole band).
                let mut trials = make(&dev)?;
                trials.sort_by_key(|t| t.spec().n_params());
                let sizes: Vec<usize> = trials.iter().map(|t| t.spec().n_params()).collect();
                let (mut at, mut paying) = (0, 0);
                let bands = fusion::width_bands(&sizes);
                for &n in &bands {
                    let band: Vec<_> = trials[at..at + n].iter().collect();
                    let hidden: Vec<&[usize]> =
                        band.iter().map(|t| t.spec().hidden.as_slice()).collect();
                    let layout = training::mixed_hidden(&hidden)?;
                    paying += usize::from(fusion::mixing_pays(kind, &band, &layout));
                    at += n;
                }
                mix_predictions.push((h, k, bands.len(), paying));
            }
            let fusable = k > 1;
            let names: Vec<&'static str> = plan
                .modes
                .iter()
                .copied()
                .filter(|&m| m != "fused" || fusable)
                .collect();
            // Each mode runs `repeats` times, the modes taking turns (in a
            // rotating order, so that a shared machine's drift falls on all
            // of them), and keeps its fastest run.
            let mut best = vec![f64::INFINITY; names.len()];
            for r in 0..plan.repeats.max(1) {
                for turn in 0..names.len() {
                    let m = (turn + r) % names.len();
                    let s = match names[m] {
                        // seq: one trial at a time on one lane with every core's threads.
                        "seq" => run_bare(backend, &mut lane_of(0, cores)?, make(&dev)?)?,
                        // lanes: all K through the core, one lane per core (at
                        // most one per trial), each lane running its trials in
                        // arrival order: this measures throughput. Round-robin
                        // (`pack`) would keep every trial's state hot at once,
                        // which is for fairness, not speed.
                        "lanes" => {
                            let cfg = core_cfg(Policy::Fifo, lanes.min(k));
                            run_core(backend, make(&dev)?, cfg)?.0
                        }
                        // fused: the K trials as fused groups of the size the
                        // scheduler would form (`salus::fusion`): one on a GPU;
                        // on the CPU groups small enough to stay in cache,
                        // spread over the lanes.
                        _ => run_fused(backend, make(&dev)?, kind, lanes, plan)?,
                    };
                    best[m] = best[m].min(s);
                }
            }
            // NaN (null in JSON) where seq was not run.
            let seq_s = names
                .iter()
                .position(|&m| m == "seq")
                .map_or(f64::NAN, |i| best[i]);
            let mut modes: Vec<(&str, f64)> = names.into_iter().zip(best).collect();
            let batch = match h {
                Width::Cnn(_) => CNN_BATCH,
                _ => BATCH,
            };
            // PyTorch on the same CPU, the K trials one after another.
            let torch_s = match (h, kind, plan.torch) {
                (Width::Cnn(w), DeviceKind::Cpu, true) => {
                    let s = torch_anchor(w, k, iterations, batch, cores, progress)?;
                    if let Some(s) = s {
                        modes.push(("torch", s));
                    }
                    s.unwrap_or(f64::NAN)
                }
                _ => f64::NAN,
            };
            // The reference GEMM is measured between cells too, and its
            // best counts, as each mode's does.
            gemm_best = gemm_best.max(gemm_gflops(backend.as_ref())?);
            for (mode, s) in modes {
                let row = Row {
                    h,
                    k,
                    mode,
                    tflops: total_flops / s / 1e12,
                    ratio_vs_seq: seq_s / s,
                    seconds: s,
                    iterations: k as u64 * iterations,
                    images_per_s: (k as u64 * iterations * batch as u64) as f64 / s,
                    vs_torch: torch_s / s,
                };
                let torch = if row.vs_torch.is_nan() {
                    String::new()
                } else {
                    format!("  x{:.2} vs torch", row.vs_torch)
                };
                progress(&format!(
                    "h={h:<6} K={k:<3} {mode:<6} {:.4} TFLOP/s  x{} vs seq{torch}  ({:.2} s, {})",
                    row.tflops,
                    ratio(row.ratio_vs_seq),
                    s,
                    plan.precision.name()
                ));
                rows.push(row);
            }
        }
    }
    // The core's own costs, at the first fixed width.
    let h = hs
        .iter()
        .find_map(|w| match w {
            Width::Fixed(h) => Some(*h),
            _ => None,
        })
        .unwrap_or(256);
    let dev = mlp_dev;
    let (overhead_pct, switching) = if plan.overhead {
        (
            Some(overhead_pct(backend, &dev, h, plan, progress)?),
            Some(switching(backend, &dev, h, plan, progress)?),
        )
    } else {
        (None, None)
    };
    let gemm_gflops = gemm_best.max(gemm_gflops(backend.as_ref())?);
    Ok(Results {
        rows,
        overhead_pct,
        switch_mean_us: switching.as_ref().and_then(|s| s.mean_us),
        switch_median_us: switching.as_ref().and_then(|s| s.median_us),
        switch_cost_us: switching.map(|s| s.cost_us),
        gemm_gflops,
        device: backend.name(),
        kind,
        lanes,
        cores,
        graphs: graphs && backend.graphs_supported(),
        optimizer_order: plan
            .optimizer_order
            .unwrap_or(training::OptimizerOrder::default_for(&**backend)),
        precision: plan.precision,
        mix_predictions,
    })
}

/// What switching costs: [`SWITCH_TRIALS`] resident trials of width `h` on
/// one lane under `priority` with equal priorities, which runs the least
/// recently run next, so every boundary is a switch.
struct Switching {
    /// Each switch's host latency, in microseconds: from the end of one
    /// trial's iteration (the device done) to the start of the next one's.
    /// The mean and median; `None` when nothing switched.
    mean_us: Option<f64>,
    median_us: Option<f64>,
    /// Device time lost per switch, in microseconds: the same trials under fifo,
    /// where each runs its iterations as one streak, against round-robin,
    /// over the number of switches (fastest of three runs each, taking
    /// turns). It adds what the host latency leaves out: on the CPU, the
    /// caches a switch evicts; on CUDA, any gap the device sees between the
    /// two trials' iterations. Negative differences (noise) count as 0.
    cost_us: f64,
}

fn switching<B: Backend>(
    backend: &Arc<B>,
    dev: &Arc<DeviceData<B>>,
    h: usize,
    plan: &Plan,
    progress: &mut dyn FnMut(&str),
) -> Result<Switching> {
    let iterations = 100;
    let run = |policy| -> Result<(f64, Vec<f64>)> {
        let trials = (0..SWITCH_TRIALS)
            .map(|s| TrainTrial::new_on_host(dev.clone(), config(vec![h, h], iterations, s as u64)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        run_core(
            backend,
            trials,
            core_config(backend.kind(), policy, 1, plan),
        )
    };
    let (mut round_robin, mut streaks) = (f64::INFINITY, f64::INFINITY);
    let mut latencies = Vec::new();
    for _ in 0..3 {
        let (s, l) = run(Policy::Priority)?;
        round_robin = round_robin.min(s);
        latencies = l;
        streaks = streaks.min(run(Policy::Fifo)?.0);
    }
    let n = latencies.len().max(1) as f64;
    let cost_us = 1e6 * (round_robin - streaks).max(0.0) / n;
    let mean = 1e6 * latencies.iter().sum::<f64>() / n;
    progress(&format!(
        "switches ({SWITCH_TRIALS} resident trials round-robin on one lane, h={h}, {} switches): \
         host latency {mean:.1} us mean; device time lost {cost_us:.1} us per switch",
        latencies.len(),
    ));
    latencies.sort_by(f64::total_cmp);
    Ok(Switching {
        mean_us: (!latencies.is_empty()).then_some(mean),
        median_us: latencies.get(latencies.len() / 2).map(|m| 1e6 * m),
        cost_us,
    })
}

/// The core's overhead against a bare loop, in percent: one trial, the
/// same lane set-up, at the first fixed width.
fn overhead_pct<B: Backend>(
    backend: &Arc<B>,
    dev: &Arc<DeviceData<B>>,
    h: usize,
    plan: &Plan,
    progress: &mut dyn FnMut(&str),
) -> Result<f64> {
    let cores = super::cores();
    let lane_of = |id, threads| lane(backend, id, threads, plan);
    let core_cfg = |policy, lanes| core_config(backend.kind(), policy, lanes, plan);
    let flops_iter = config(vec![h, h], 1, 1).flops_per_iteration(dev)?;
    let iterations = ((plan.target_gflop * 1e9 / flops_iter).ceil() as u64).max(20);
    // Paired runs close in time, in alternating order, so that a shared
    // machine's drift cancels; the overhead is the median of the pairs.
    let bare_run = || -> Result<f64> {
        run_bare(
            backend,
            &mut lane_of(0, cores)?,
            vec![TrainTrial::new_on_host(
                dev.clone(),
                config(vec![h, h], iterations, 1),
            )?],
        )
    };
    let core_run = || -> Result<f64> {
        let cfg = core_cfg(Policy::Pack, 1);
        Ok(run_core(
            backend,
            vec![TrainTrial::new_on_host(
                dev.clone(),
                config(vec![h, h], iterations, 1),
            )?],
            cfg,
        )?
        .0)
    };
    let mut ratios = Vec::new();
    for pair in 0..7 {
        let (bare, through) = if pair % 2 == 0 {
            let b = bare_run()?;
            (b, core_run()?)
        } else {
            let c = core_run()?;
            (bare_run()?, c)
        };
        ratios.push(through / bare);
    }
    ratios.sort_by(f64::total_cmp);
    let overhead_pct = 100.0 * (ratios[ratios.len() / 2] - 1.0);
    progress(&format!(
        "core overhead vs a bare loop (h={h}, K=1, {iterations} iterations): {overhead_pct:+.2}%"
    ));
    Ok(overhead_pct)
}

impl Results {
    pub fn json(&self) -> serde_json::Value {
        let mut v: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| json!({ "h": r.h.json(), "k": r.k, "mode": r.mode, "tflops": r.tflops, "ratio_vs_seq": r.ratio_vs_seq, "pct_of_gemm": self.pct_of_gemm(r), "seconds": r.seconds, "iterations": r.iterations, "images_per_s": r.images_per_s, "ratio_vs_torch": r.vs_torch, "precision": self.precision.name() }))
            .collect();
        v.push(json!({ "overhead_pct": self.overhead_pct }));
        v.push(json!({ "switch_mean_us": self.switch_mean_us, "switch_median_us": self.switch_median_us, "switch_cost_us": self.switch_cost_us }));
        let gemm_key = match self.kind {
            DeviceKind::Cpu => "cpu_gemm_gflops",
            DeviceKind::Cuda(_) => "device_gemm_gflops",
        };
        v.push(json!({ gemm_key: self.gemm_gflops, "device": self.device, "cores": self.cores, "lanes": self.lanes, "graphs": self.graphs, "optimizer_order": self.optimizer_order.name() }));
        // By workload, then K.
        let mut mixing = serde_json::Map::new();
        for &(h, k, bands, paying) in &self.mix_predictions {
            let cells = mixing
                .entry(h.to_string())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("an object");
            cells.insert(k.to_string(), json!({ "bands": bands, "mixed": paying }));
        }
        v.push(json!({ "mixed_group_pays": mixing }));
        serde_json::Value::Array(v)
    }

    /// A row's rate as a share of the same run's large-GEMM rate.
    pub fn pct_of_gemm(&self, r: &Row) -> f64 {
        100.0 * r.tflops * 1e3 / self.gemm_gflops
    }

    pub fn table(&self) -> String {
        let mlp = self.rows.iter().any(|r| !matches!(r.h, Width::Cnn(_)));
        let what = if mlp {
            format!("784-h-h-10 MLPs, batch {BATCH}, Adam")
        } else {
            "conv nets".to_string()
        };
        let mut out = format!(
            "bench packing: {what}; {}, {} host cores; GEMMs in {}; optimizer steps {}\n",
            self.device,
            self.cores,
            self.precision.name(),
            self.optimizer_order.name()
        );
        out += &format!(
            "seq: one trial at a time, {} threads; lanes: through the core, min(K, {}) lanes, fifo within a lane; \
             fused: the K trials as fused groups (one on a GPU; cache-sized on the CPU, over the lanes), of mixed shapes for mixed and mixed-depths; mixed: widths log-uniform in 64..1024; mixed-depths: the same widths, 1-3 hidden layers\n\n",
            self.cores, self.lanes
        );
        let cnn = self.rows.iter().any(|r| matches!(r.h, Width::Cnn(_)));
        if cnn {
            out += &format!(
                "cnn-digits: 1x8x8 digits, 3x3 convs of 16 and 32 channels with batch norm and max pooling, a 64-wide head; \
                 cnn-32: 32x32x3 synthetic images through the cuda-convnet preset; batch {CNN_BATCH}, Adam; \
                 torch: PyTorch {} threads, the K trials one after another (scripts/anchors/torch_cnn.py); vs torch: its seconds over the row's\n\n",
                self.cores
            );
        }
        out +=
            "h            K    mode    TFLOP/s   vs seq   % gemm   seconds   images/s   vs torch\n";
        for r in &self.rows {
            out += &format!(
                "{:<12} {:<4} {:<7} {:<9.4} {:<8} {:<8.1} {:<9.2} {:<10.0} {}\n",
                r.h.to_string(),
                r.k,
                r.mode,
                r.tflops,
                ratio(r.ratio_vs_seq),
                self.pct_of_gemm(r),
                r.seconds,
                r.images_per_s,
                ratio(r.vs_torch)
            );
        }
        if let (Some(mean), Some(median), Some(cost)) = (
            self.switch_mean_us,
            self.switch_median_us,
            self.switch_cost_us,
        ) {
            out += &format!(
                "\nswitch latency ({SWITCH_TRIALS} resident trials round-robin on one lane): {mean:.1} us mean, \
                 {median:.1} us median on the host; {cost:.1} us of device time lost per switch\n"
            );
        }
        if let Some(pct) = self.overhead_pct {
            out += &format!("core overhead vs a bare training loop: {pct:+.2}%\n");
        }
        for &(h, k, bands, paying) in &self.mix_predictions {
            out += &format!(
                "{h} K={k}: the runner's cost model would run {paying} of its {bands} bands of similar sizes as groups of mixed shapes, the rest through lanes (scheduler.mix_widths = \"auto\")\n"
            );
        }
        out += &format!(
            "{} sgemm 2048^3 (same run): {:.1} GFLOP/s\n",
            self.kind, self.gemm_gflops
        );
        out
    }
}

/// PyTorch's seconds for K conv-net trials one after another
/// (`scripts/anchors/torch_cnn.py`), or `None` with a note when no Python
/// with torch is found.
fn torch_anchor(
    w: ImageWorkload,
    k: usize,
    iterations: u64,
    batch: usize,
    threads: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<f64>> {
    let py = super::anchor_python();
    if !super::python_imports(&py, "torch") {
        progress(&format!(
            "{}: no PyTorch anchor ({} cannot import torch; set SALUS_TUNE_PYTHON)",
            w.name(),
            py.display()
        ));
        return Ok(None);
    }
    // Carried by the binary: an installed one has no source tree.
    let args = [w.name().to_string(), k.to_string(), iterations.to_string()]
        .into_iter()
        .chain([batch.to_string(), threads.to_string()])
        .collect::<Vec<_>>();
    let v = super::run_anchor_script(
        &py,
        "torch_cnn.py",
        include_str!("../../../scripts/anchors/torch_cnn.py"),
        &args,
    )?;
    Ok(v["seconds"].as_f64())
}
