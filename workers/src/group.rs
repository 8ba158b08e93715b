//! `ModelGroup`: K same-shape MLP trials trained as one, slot by slot.
//!
//! A group owns the persistent state of its slots (parameters, optimizer
//! state, running training statistics) laid out `[slot][...]`, so that each
//! kernel call is one strided-batched launch for all K. A single trial is a
//! group of one; fused execution is a group of many. The ephemeral buffers
//! of an iteration come from the lane's [`Workspace`].
//!
//! # One iteration, the same launches every time
//!
//! What changes from one step to the next (batch indices, dropout steps,
//! Adam's bias corrections) is written by one copy into the workspace's
//! step block ([`kernels::StepWords`]) before the iteration; the kernels
//! read it from there. So on CUDA an iteration after the first can be
//! captured once as a graph and replayed, when the lane allows it
//! ([`Lane::set_graphs`]). A graph is kept under a key made of the address
//! of every buffer it touches and every per-slot scalar it bakes in, so a
//! group rebuilt by a membership change or a swap-in, a workspace rebuilt,
//! or another lane never replays a graph that would touch other memory: it
//! captures a new one.

use kernels::{
    ADAM_STEP_WORDS, ActivationOp, Backend, Batched, DROPOUT_STEP_WORDS, DropoutSlot, Gemm, Loss,
    Moments, ParamRun, STATS_LEN, Slots, StepWords, View, ViewMut, at, at_mut,
};

use crate::convnet::{ConvWorkspace, Running};
use crate::device_data::DeviceData;
use crate::error::{Result, WorkerError};
use crate::hparams::{OptimizerFamily, SlotHparams};
use crate::lane::Lane;
use crate::model::{Layer, LossKind, ModelSpec};

/// Everything that fixes the size of a group's buffers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupShape {
    pub spec: ModelSpec,
    pub slots: usize,
    pub batch: usize,
    /// Whether hidden layers apply dropout (its `p` is per slot).
    pub dropout: bool,
    pub target_cols: usize,
}

impl GroupShape {
    fn scratch_buffers(&self) -> usize {
        if self.dropout { 3 } else { 2 }
    }

    /// Elements of one iteration's ephemeral buffers, exactly as allocated.
    pub fn ephemeral_elems(&self) -> usize {
        let s = &self.spec;
        let kb = self.slots * self.batch;
        let per_hidden = if self.dropout { 3 } else { 2 };
        kb * s.data_features() * if self.augment().is_some() { 2 } else { 1 }
            + crate::convnet::workspace_elems(s, kb, self.slots)
            + self.step_words()
            + kb * self.target_cols
            + kb * s.hidden.iter().sum::<usize>() * per_hidden
            + 2 * kb * s.output
            + self.scratch_buffers() * kb * s.max_width()
            + self.slots * s.n_params()
            + self.slots * STATS_LEN
    }

    /// The conv net's training-time augmentation, if any.
    pub fn augment(&self) -> Option<crate::model::Augment> {
        self.spec.conv.as_ref().and_then(|c| c.augment)
    }

    /// Words of the step block: batch indices, then dropout steps, then Adam scalars.
    fn step_words(&self) -> usize {
        self.slots * (self.batch + DROPOUT_STEP_WORDS + ADAM_STEP_WORDS)
    }

    pub fn ephemeral_bytes(&self) -> usize {
        4 * self.ephemeral_elems()
    }

    /// Bytes of the slots' parameters, optimizer state and statistics.
    pub fn persistent_bytes(&self, family: OptimizerFamily) -> usize {
        let s = &self.spec;
        4 * self.slots * (s.n_params() * (1 + family.state_vectors()) + s.n_running() + STATS_LEN)
    }
}

/// One iteration's activations and gradients (see [`GroupShape::ephemeral_elems`]).
pub struct Workspace<B: Backend> {
    x: B::Buf,
    /// This step's values, written once per step (see the module docs).
    step: B::Buf,
    y: B::Buf,
    z: Vec<B::Buf>,
    a: Vec<B::Buf>,
    d: Vec<B::Buf>,
    logits: B::Buf,
    dlogits: B::Buf,
    dh: B::Buf,
    dz: B::Buf,
    dtmp: Option<B::Buf>,
    grads: B::Buf,
    eval_stats: B::Buf,
    /// The conv net's buffers, for image models.
    conv: Option<ConvWorkspace<B>>,
    /// The gathered batch before augmentation, when the net augments.
    raw: Option<B::Buf>,
}

impl<B: Backend> Workspace<B> {
    /// Every buffer of the workspace.
    fn buffers(&self) -> impl Iterator<Item = &B::Buf> {
        let one = [
            &self.x,
            &self.step,
            &self.y,
            &self.logits,
            &self.dlogits,
            &self.dh,
            &self.dz,
            &self.grads,
            &self.eval_stats,
        ];
        let layers = self
            .z
            .iter()
            .chain(&self.a)
            .chain(&self.d)
            .chain(&self.dtmp);
        let conv = self.conv.iter().flat_map(|c| c.buffers());
        one.into_iter().chain(layers).chain(conv).chain(&self.raw)
    }

    /// Elements actually allocated, to check [`GroupShape::ephemeral_elems`].
    pub fn allocated_elems(&self, b: &B) -> usize {
        self.buffers().map(|buf| b.buf_len(buf)).sum()
    }

    pub(crate) fn new(b: &B, shape: &GroupShape) -> Result<Self> {
        let s = &shape.spec;
        let kb = shape.slots * shape.batch;
        let hidden = |b: &B| -> Result<Vec<B::Buf>> {
            s.hidden
                .iter()
                .map(|&h| Ok(b.alloc_zeroed(kb * h)?))
                .collect()
        };
        let wide = kb * s.max_width();
        Ok(Workspace {
            x: b.alloc_zeroed(kb * s.data_features())?,
            step: b.alloc_zeroed(shape.step_words())?,
            y: b.alloc_zeroed(kb * shape.target_cols)?,
            z: hidden(b)?,
            a: hidden(b)?,
            d: if shape.dropout {
                hidden(b)?
            } else {
                Vec::new()
            },
            logits: b.alloc_zeroed(kb * s.output)?,
            dlogits: b.alloc_zeroed(kb * s.output)?,
            dh: b.alloc_zeroed(wide)?,
            dz: b.alloc_zeroed(wide)?,
            dtmp: if shape.dropout {
                Some(b.alloc_zeroed(wide)?)
            } else {
                None
            },
            grads: b.alloc_zeroed(shape.slots * s.n_params())?,
            eval_stats: b.alloc_zeroed(shape.slots * STATS_LEN)?,
            conv: ConvWorkspace::new(b, s, shape.slots, shape.batch)?,
            raw: match shape.augment() {
                Some(_) => Some(b.alloc_zeroed(kb * s.data_features())?),
                None => None,
            },
        })
    }
}

/// Where this step's values lie in the step block, in words.
#[derive(Clone, Copy)]
struct StepOffsets {
    dropout: usize,
    adam: usize,
}

/// When an iteration's optimizer steps run (a lane's setting,
/// [`Lane::set_optimizer_order`]). Both give the same bits: an optimizer
/// step is element-wise, and every layer is stepped once, after its
/// gradients are complete and its weights are no longer read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerOrder {
    /// Each layer's step as soon as the backward pass is done with the
    /// layer (its gradients summed, the input gradient taken through its
    /// weights), queued [`Backend::beside`] the earlier layers' backward
    /// GEMMs: on CUDA it overlaps them on a second stream.
    PerLayer,
    /// One step over all parameters after the whole backward pass.
    AfterBackward,
}

impl OptimizerOrder {
    /// `bench packing --optimizer-order`'s names.
    pub const NAMES: [&'static str; 2] = ["per-layer", "after-backward"];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [OptimizerOrder::PerLayer, OptimizerOrder::AfterBackward]
            .into_iter()
            .find(|o| o.name() == name)
    }

    /// Per layer where that overlaps the GEMMs (CUDA). On the CPU the
    /// steps would run in order anyway: the two orders measured level
    /// (0.90x-1.05x, within the machine's noise; `bench packing`,
    /// 2026-12-04), so it keeps one step over all parameters.
    pub fn default_for<B: Backend>(backend: &B) -> Self {
        if backend.beside_overlaps() {
            OptimizerOrder::PerLayer
        } else {
            OptimizerOrder::AfterBackward
        }
    }
}

/// The three products of a layer (see [`ModelGroup::layer_gemm`]).
#[derive(Clone, Copy)]
enum Product {
    /// `z = x W`: rows by fan-out by fan-in.
    Forward,
    /// `dW = x^T dz`: fan-in by fan-out by rows.
    WeightGrad,
    /// `dx = dz W^T`: rows by fan-in by fan-out.
    InputGrad,
}

/// Where the first layer reads its input from.
#[derive(Clone, Copy)]
enum Input {
    /// The gathered training batch in the workspace, one per slot.
    Batch,
    /// `rows` validation rows from `row` on, shared by every slot.
    Val { row: usize, rows: usize },
}

/// The state of one slot on the host: for swapping and checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotState {
    pub params: Vec<f32>,
    /// One vector per optimizer state (velocity; or first and second moments).
    pub opt_state: Vec<Vec<f32>>,
    pub train_stats: Vec<f32>,
    /// Batch norm's running statistics ([`ModelSpec::n_running`] words;
    /// empty without batch norm).
    pub running: Vec<f32>,
}

/// Per-slot sums from the loss op: see [`kernels::STATS_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossStats {
    pub loss_sum: f64,
    pub metric_sum: f64,
    pub rows: f64,
    /// Labels that were not a class index (see [`kernels::STATS_LEN`]).
    pub bad_labels: f64,
}

impl LossStats {
    fn from_slice(s: &[f32]) -> Self {
        LossStats {
            loss_sum: s[0] as f64,
            metric_sum: s[1] as f64,
            rows: s[2] as f64,
            bad_labels: s[3] as f64,
        }
    }

    /// Every slot's statistics, or an error when the loss met labels that
    /// are not class indices: loaders check labels, so the data on the
    /// device is corrupt, and no metric from it can be trusted.
    fn read_all(host: &[f32], what: &str) -> Result<Vec<LossStats>> {
        let stats: Vec<_> = host.chunks_exact(STATS_LEN).map(Self::from_slice).collect();
        match stats.iter().map(|s| s.bad_labels).sum::<f64>() {
            0.0 => Ok(stats),
            bad => Err(WorkerError::Config(format!(
                "{bad} {what} labels on the device are not class indices; the data is corrupt"
            ))),
        }
    }
    pub fn mean_loss(&self) -> f64 {
        self.loss_sum / self.rows.max(1.0)
    }
}

/// K same-shape trials trained together. See the module docs.
pub struct ModelGroup<B: Backend> {
    shape: GroupShape,
    layers: Vec<Layer>,
    n: usize,
    family: OptimizerFamily,
    slots: Vec<SlotHparams>,
    params: B::Buf,
    state: Vec<B::Buf>,
    train_stats: B::Buf,
    /// Batch norm's running statistics, `n_running` per slot.
    running: B::Buf,
    n_running: usize,
    /// This step's values on the host, reused from step to step.
    words: StepWords,
    /// Captured iterations by key (see the module docs), newest last.
    graphs: Vec<(Vec<u64>, B::Graph)>,
    /// Iterations run eagerly; graphs are captured after the first.
    eager_steps: u64,
    /// A capture failed once: this group runs eagerly from then on.
    graphs_failed: bool,
    /// Each slot's hidden widths, when the slots' widths differ (see
    /// [`ModelGroup::zeroed_mixed`]); `None` when they are `shape.spec`'s.
    widths: Option<Vec<Vec<usize>>>,
    /// Every slot's optimizer scalars, made when the slots' hyper-parameters
    /// change rather than at each optimizer step (one per layer and step
    /// with [`OptimizerOrder::PerLayer`]).
    settings: OptimizerSettings,
}

/// The optimizer scalars of a group's slots.
enum OptimizerSettings {
    Sgd(Vec<kernels::SgdSlot>),
    Adam(Vec<kernels::AdamSlot>),
}

impl OptimizerSettings {
    fn of(family: OptimizerFamily, slots: &[SlotHparams]) -> Self {
        match family {
            OptimizerFamily::Sgd => Self::Sgd(slots.iter().map(|h| h.sgd_slot()).collect()),
            OptimizerFamily::Adam => Self::Adam(slots.iter().map(|h| h.adam_slot()).collect()),
        }
    }
}

/// The hidden widths of a group of mixed shapes laid out for members of
/// `hidden` widths ([`ModelGroup::mixed_layout`]): as deep as the deepest,
/// each layer as wide as the widest member that has it, and the last also
/// as wide as every member's last (the output layer reads it there).
/// Errors when some members have no hidden layer and others do.
pub fn mixed_hidden(hidden: &[&[usize]]) -> Result<Vec<usize>> {
    let depth = hidden.iter().map(|h| h.len()).max().unwrap_or(0);
    if depth > 0 && hidden.iter().any(|h| h.is_empty()) {
        return Err(WorkerError::Config(
            "a trial without hidden layers cannot share a group with deeper ones".into(),
        ));
    }
    let mut layout: Vec<usize> = (0..depth)
        .map(|l| {
            hidden
                .iter()
                .filter_map(|h| h.get(l))
                .max()
                .copied()
                .unwrap_or(0)
        })
        .collect();
    if let Some(last) = layout.last_mut() {
        *last = hidden
            .iter()
            .filter_map(|h| h.last())
            .fold(*last, |a, &w| a.max(w));
    }
    Ok(layout)
}

/// Whether a member of `hidden` widths fits a group laid out as `layout`
/// ([`mixed_hidden`]): no deeper, no layer wider, and its last hidden
/// layer no wider than the layout's last.
pub fn fits_layout(hidden: &[usize], layout: &[usize]) -> bool {
    hidden.len() <= layout.len()
        && hidden.iter().zip(layout).all(|(w, l)| w <= l)
        && (hidden.is_empty() == layout.is_empty())
        && match (hidden.last(), layout.last()) {
            (Some(w), Some(l)) => w <= l,
            _ => true,
        }
}

/// Graphs a group keeps: one per lane it moves between, a few at most.
const MAX_GRAPHS: usize = 4;

impl<B: Backend> ModelGroup<B> {
    /// A group with freshly initialised slots (each from its own seed).
    pub fn new(
        lane: &mut Lane<B>,
        spec: ModelSpec,
        batch: usize,
        target_cols: usize,
        slots: Vec<SlotHparams>,
    ) -> Result<Self> {
        let mut group = Self::zeroed(lane, spec, batch, target_cols, slots)?;
        group.init_slots(lane)?;
        Ok(group)
    }

    /// A group of mixed widths ([`Self::zeroed_mixed`]) with freshly
    /// initialised slots, each as its own model alone.
    pub fn new_mixed(
        lane: &mut Lane<B>,
        specs: &[ModelSpec],
        batch: usize,
        target_cols: usize,
        slots: Vec<SlotHparams>,
    ) -> Result<Self> {
        let mut group = Self::zeroed_mixed(lane, specs, batch, target_cols, slots)?;
        group.init_slots(lane)?;
        Ok(group)
    }

    /// Every slot's initial parameters (from its seed) and running statistics.
    fn init_slots(&mut self, lane: &mut Lane<B>) -> Result<()> {
        let (b, ctx) = lane.device();
        let running = self.shape.spec.init_running();
        for (s, h) in self.slots.iter().enumerate() {
            let init = self.pad(s, &self.slot_spec(s).init_params(h.seed));
            b.upload(ctx, &init, at_mut(&mut self.params, s * self.n))?;
            b.upload(ctx, &running, at_mut(&mut self.running, s * running.len()))?;
        }
        Ok(())
    }

    /// The shape a group of these slots has, without allocating it.
    pub fn shape_of(
        spec: ModelSpec,
        batch: usize,
        target_cols: usize,
        slots: &[SlotHparams],
    ) -> Result<(GroupShape, OptimizerFamily)> {
        let family = match slots.first() {
            None => {
                return Err(WorkerError::Config(
                    "a group needs at least one slot".into(),
                ));
            }
            Some(s) => s.optimizer.family(),
        };
        if slots.iter().any(|s| s.optimizer.family() != family) {
            return Err(WorkerError::Config(
                "all slots of a group need the same optimizer family".into(),
            ));
        }
        let shape = GroupShape {
            dropout: slots.iter().any(|s| s.dropout > 0.0),
            slots: slots.len(),
            batch,
            target_cols,
            spec,
        };
        Ok((shape, family))
    }

    /// A group whose parameters and state are all zero, to import into.
    pub fn zeroed(
        lane: &mut Lane<B>,
        spec: ModelSpec,
        batch: usize,
        target_cols: usize,
        slots: Vec<SlotHparams>,
    ) -> Result<Self> {
        let (shape, family) = Self::shape_of(spec, batch, target_cols, &slots)?;
        let n = shape.spec.n_params();
        let k = slots.len();
        let b = &**lane.backend();
        let state = (0..family.state_vectors())
            .map(|_| b.alloc_zeroed(k * n))
            .collect::<kernels::Result<_>>()?;
        let n_running = shape.spec.n_running();
        Ok(ModelGroup {
            running: b.alloc_zeroed(k * n_running)?,
            n_running,
            layers: shape.spec.layers(),
            params: b.alloc_zeroed(k * n)?,
            train_stats: b.alloc_zeroed(k * STATS_LEN)?,
            shape,
            n,
            family,
            settings: OptimizerSettings::of(family, &slots),
            slots,
            state,
            words: StepWords::new(),
            graphs: Vec::new(),
            eager_steps: 0,
            graphs_failed: false,
            widths: None,
        })
    }

    /// A group whose slots may differ in their hidden widths and depths
    /// (not in anything else), parameters and state all zero, to import
    /// into.
    ///
    /// Each slot lies in the group's layout ([`Self::mixed_layout`]): its
    /// hidden layer `l` in the layout's layer `l`, its output layer in the
    /// layout's output layer, its own weights packed at the start of each
    /// layer's weight block and its bias at the start of the bias. Every
    /// product is one grouped GEMM of the slots' own sizes, the weights in
    /// their own pitches ([`kernels::GroupedGemm`]), so no slot multiplies
    /// its padding; a layer a slot does not have is a product of size 0.
    /// The output layer's products run once per depth ("exit"), each over
    /// the slots of that depth, reading their last hidden layer. The
    /// optimizer steps each slot's own parameters (ragged runs,
    /// [`kernels::ParamRun::lens`]); the other element-wise ops run over
    /// the whole layout: what they write into a padding is never read by a
    /// product, nor exported.
    /// Dropout draws each slot's own mask ([`kernels::RowsWithin`]). Conv
    /// nets share a group when their conv nets are the same (only their
    /// heads differ): the conv net is the group's usual batched launches.
    pub fn zeroed_mixed(
        lane: &mut Lane<B>,
        specs: &[ModelSpec],
        batch: usize,
        target_cols: usize,
        slots: Vec<SlotHparams>,
    ) -> Result<Self> {
        let layout = Self::mixed_layout(specs)?;
        Self::zeroed_laid_out(lane, specs, layout, batch, target_cols, slots)
    }

    /// As [`Self::zeroed_mixed`], in `layout`, which every spec must fit
    /// ([`fits_layout`]): a group whose members left keeps the layout its
    /// memory was reserved for when theirs would outgrow it.
    pub fn zeroed_laid_out(
        lane: &mut Lane<B>,
        specs: &[ModelSpec],
        layout: ModelSpec,
        batch: usize,
        target_cols: usize,
        slots: Vec<SlotHparams>,
    ) -> Result<Self> {
        let own = Self::mixed_layout(specs)?;
        let unwidened = |s: &ModelSpec| ModelSpec {
            hidden: Vec::new(),
            ..s.clone()
        };
        if unwidened(&own) != unwidened(&layout)
            || specs
                .iter()
                .any(|s| !fits_layout(&s.hidden, &layout.hidden))
        {
            return Err(WorkerError::Config(format!(
                "trials of hidden layers {:?} do not fit a layout of {:?}",
                specs.iter().map(|s| &s.hidden).collect::<Vec<_>>(),
                layout.hidden
            )));
        }
        if specs.len() != slots.len() {
            return Err(WorkerError::Config(format!(
                "{} specs for {} slots",
                specs.len(),
                slots.len()
            )));
        }
        let mut group = Self::zeroed(lane, layout.clone(), batch, target_cols, slots)?;
        if specs.iter().any(|s| *s != layout) {
            group.widths = Some(specs.iter().map(|s| s.hidden.clone()).collect());
        }
        Ok(group)
    }

    /// The layout of a group of `specs`: as deep as the deepest, each
    /// hidden layer as wide as the widest slot that has it, and the last
    /// also as wide as every slot's last hidden layer (the output layer
    /// reads it). Errors unless the specs differ in their hidden layers
    /// alone, or when some but not all have none.
    pub fn mixed_layout(specs: &[ModelSpec]) -> Result<ModelSpec> {
        let first = specs
            .first()
            .ok_or_else(|| WorkerError::Config("a group needs at least one slot".into()))?;
        let unwidened = |s: &ModelSpec| ModelSpec {
            hidden: Vec::new(),
            ..s.clone()
        };
        if specs.iter().any(|s| unwidened(s) != unwidened(first)) {
            return Err(WorkerError::Config(
                "trials in one group may differ in their hidden layers only".into(),
            ));
        }
        let hidden: Vec<&[usize]> = specs.iter().map(|s| s.hidden.as_slice()).collect();
        let hidden = mixed_hidden(&hidden)?;
        Ok(ModelSpec {
            hidden,
            ..first.clone()
        })
    }

    /// Slot `s`'s own model.
    pub fn slot_spec(&self, s: usize) -> ModelSpec {
        match &self.widths {
            Some(w) => ModelSpec {
                hidden: w[s].clone(),
                ..self.shape.spec.clone()
            },
            None => self.shape.spec.clone(),
        }
    }

    /// Where slot `s`'s own packed vector lies in the group's layout: runs
    /// of `(own offset, layout offset, length)`, a layer's weights or bias
    /// each (and the conv net's parameters first). `None` when the slots'
    /// widths do not differ (the same layout).
    fn runs(&self, s: usize) -> Option<Vec<(usize, usize, usize)>> {
        self.widths.as_ref()?;
        let own = self.slot_spec(s).layers();
        // A conv net's parameters (the same net for every slot) lie first.
        let mut runs = vec![(0, 0, own[0].w_off)];
        // Hidden layers in order; the output layer to the layout's.
        let (own_out, layout_out) = (own.len() - 1, self.layers.len() - 1);
        let laid = (0..own.len()).map(|i| if i == own_out { layout_out } else { i });
        // A slot's weights lie packed at the start of the layout's (its
        // products use its own pitches), its bias at the start of the bias.
        for (o, l) in own.iter().zip(laid.map(|i| &self.layers[i])) {
            runs.push((o.w_off, l.w_off, o.fan_in * o.fan_out));
            runs.push((o.b_off, l.b_off, o.fan_out));
        }
        Some(runs)
    }

    /// Slot `s`'s vector of parameters (or of one optimizer state) laid
    /// out as the group's layout, from its own packed layout.
    fn pad(&self, s: usize, own: &[f32]) -> Vec<f32> {
        let Some(runs) = self.runs(s) else {
            return own.to_vec();
        };
        let mut out = vec![0.0; self.n];
        for (o, l, n) in runs {
            out[l..l + n].copy_from_slice(&own[o..o + n]);
        }
        out
    }

    /// The inverse of `Self::pad`: slot `s`'s own packed vector, from
    /// one laid out as the group's (its part of [`Self::gradients`], say).
    pub fn unpad(&self, s: usize, laid: Vec<f32>) -> Vec<f32> {
        let Some(runs) = self.runs(s) else {
            return laid;
        };
        let mut out = vec![0.0; self.slot_spec(s).n_params()];
        for (o, l, n) in runs {
            out[o..o + n].copy_from_slice(&laid[l..l + n]);
        }
        out
    }

    /// The depths at which slots' output layers read their input
    /// ("exits"), deepest first: the layout's depth alone unless the
    /// slots' depths differ.
    fn exits(&self) -> Vec<usize> {
        let last = self.layers.len() - 1;
        let Some(widths) = &self.widths else {
            return vec![last];
        };
        let mut exits: Vec<usize> = widths.iter().map(|w| w.len()).collect();
        exits.sort_unstable_by(|a, b| b.cmp(a));
        exits.dedup();
        exits
    }

    /// One of layer `l`'s products for every slot that has it: `g` in the
    /// group's layout, or, when the slots' shapes differ, a grouped GEMM
    /// of each slot's own sizes inside that layout. Of the output layer,
    /// for the slots of depth `exit` only (its input their last hidden
    /// layer); of a hidden layer, `exit` is `l`.
    #[allow(clippy::too_many_arguments)]
    fn layer_gemm(
        &self,
        b: &B,
        ctx: &mut B::Ctx,
        (l, exit): (usize, usize),
        form: Product,
        g: &Gemm,
        x: View<'_, B::Buf>,
        y: View<'_, B::Buf>,
        out: ViewMut<'_, B::Buf>,
    ) -> Result<()> {
        let Some(widths) = &self.widths else {
            return Ok(b.gemm(ctx, g, x, y, out)?);
        };
        let last = self.layers.len() - 1;
        let layout = g.lds();
        let (sizes, pitches): (Vec<_>, Vec<_>) = (0..widths.len())
            .map(|s| {
                // The output layer's product is for the slots of depth `exit`.
                let (fi, fo) = match l < last || widths[s].len() == exit {
                    true => self.own_fans(s, l),
                    false => (0, 0),
                };
                if fo == 0 {
                    // Not this slot's layer: no product.
                    return ((0, 0, 0), layout);
                }
                // The activations in the layout's pitches; the slot's
                // weights (or their gradient) packed, `fo` to a row.
                let (la, lb, lc) = layout;
                match form {
                    Product::Forward => ((g.m, fo, fi), (la, fo, lc)),
                    Product::WeightGrad => ((fi, fo, g.k), (la, lb, fo)),
                    Product::InputGrad => ((g.m, fi, fo), (la, fo, lc)),
                }
            })
            .unzip();
        let grouped = kernels::GroupedGemm {
            base: *g,
            sizes: &sizes,
            pitches: Some(&pitches),
        };
        Ok(b.gemm_grouped(ctx, &grouped, x, y, out)?)
    }

    pub fn shape(&self) -> &GroupShape {
        &self.shape
    }

    pub fn family(&self) -> OptimizerFamily {
        self.family
    }

    /// Elements actually allocated for persistent state, to check
    /// [`GroupShape::persistent_bytes`].
    pub fn allocated_elems(&self, b: &B) -> usize {
        std::iter::once(&self.params)
            .chain(&self.state)
            .chain([&self.train_stats, &self.running])
            .map(|buf| b.buf_len(buf))
            .sum()
    }

    pub fn slots(&self) -> &[SlotHparams] {
        &self.slots
    }

    /// One training iteration of every slot. `idx` holds `slots x batch`
    /// training-row indices; `iterations[s]` is slot `s`'s 0-based iteration.
    /// On a lane that allows graphs, iterations after the first replay a
    /// captured graph (see the module docs); the result is the same.
    pub fn train_step(
        &mut self,
        lane: &mut Lane<B>,
        data: &DeviceData<B>,
        idx: &[u32],
        iterations: &[u64],
    ) -> Result<()> {
        let graphs = lane.graphs();
        let order = lane.optimizer_order();
        let offsets = self.stage(lane, data, idx, iterations)?;
        let (b, ctx, ws) = lane.parts(&self.shape)?;
        if !graphs || self.graphs_failed || self.eager_steps == 0 {
            self.eager_steps += 1;
            return self.step(b, ctx, ws, data, offsets, order);
        }
        let mut key = self.graph_key(b, ws, data);
        key.push(order as u64);
        if let Some(i) = self.graphs.iter().position(|(k, _)| *k == key) {
            return Ok(b.replay(ctx, &self.graphs[i].1)?);
        }
        let captured = match b.begin_capture(ctx) {
            Ok(()) => {
                let captured = self.step(b, ctx, ws, data, offsets, order);
                // The capture ends whatever happened, so that the lane stays usable.
                (captured, b.end_capture(ctx))
            }
            Err(e) => (Ok(()), Err(e)),
        };
        match captured {
            (Ok(()), Ok(g)) => {
                b.replay(ctx, &g)?;
                if self.graphs.len() == MAX_GRAPHS {
                    self.graphs.remove(0);
                }
                self.graphs.push((key, g));
                Ok(())
            }
            (captured, graph) => {
                // Nothing ran while capturing: run this iteration eagerly,
                // and the rest too.
                let why = captured
                    .err()
                    .map(|e| e.to_string())
                    .or(graph.err().map(|e| e.to_string()));
                eprintln!(
                    "warning: capturing an iteration as a graph failed ({}); running eagerly",
                    why.unwrap_or_default()
                );
                self.graphs_failed = true;
                self.eager_steps += 1;
                self.step(b, ctx, ws, data, offsets, order)
            }
        }
    }

    /// Graphs this group holds now (tests check that they are used).
    pub fn graphs_held(&self) -> usize {
        self.graphs.len()
    }

    /// The gradients of every slot's mean loss over the batch `idx`, without
    /// updating anything but the training statistics. For gradient checks.
    pub fn gradients(
        &mut self,
        lane: &mut Lane<B>,
        data: &DeviceData<B>,
        idx: &[u32],
        iterations: &[u64],
    ) -> Result<Vec<f32>> {
        let offsets = self.stage(lane, data, idx, iterations)?;
        let (b, ctx, ws) = lane.parts(&self.shape)?;
        self.forward_backward(b, ctx, ws, data, offsets, None)?;
        let mut host = vec![0.0; self.slots.len() * self.n];
        b.download(ctx, at(&ws.grads, 0), &mut host)?;
        Ok(host)
    }

    /// Checks this step's indices and writes its values into the step block.
    fn stage(
        &mut self,
        lane: &mut Lane<B>,
        data: &DeviceData<B>,
        idx: &[u32],
        iterations: &[u64],
    ) -> Result<StepOffsets> {
        let (k, rows) = (self.slots.len(), self.shape.batch);
        if idx.len() != k * rows || iterations.len() != k {
            return Err(WorkerError::Config(format!(
                "train_step: {} indices and {} iterations for {k} slots of {rows}",
                idx.len(),
                iterations.len()
            )));
        }
        // The device gathers without checking (a bad index reads zeros).
        if let Some(&bad) = idx.iter().find(|&&i| i as usize >= data.n_train) {
            return Err(WorkerError::Config(format!(
                "train_step: row index {bad} >= {} training rows",
                data.n_train
            )));
        }
        self.words.clear();
        self.words.push_indices(idx);
        let dropout = self.words.push_dropout_steps(iterations.iter().copied());
        let adam = match self.family {
            OptimizerFamily::Adam => {
                let adams = self.slots.iter().map(|h| h.adam_slot());
                self.words
                    .push_adam(adams.zip(iterations.iter().map(|&it| it + 1)))
            }
            OptimizerFamily::Sgd => self.words.push_adam([]),
        };
        let (b, ctx, ws) = lane.parts(&self.shape)?;
        b.stage_step(ctx, self.words.as_slice(), at_mut(&mut ws.step, 0))?;
        Ok(StepOffsets { dropout, adam })
    }

    /// Everything a captured iteration bakes in: buffer addresses and the
    /// per-slot scalars passed by value.
    fn graph_key(&self, b: &B, ws: &Workspace<B>, data: &DeviceData<B>) -> Vec<u64> {
        // Sizes baked into launches (the gather's row count among them).
        let mut key = vec![
            self.slots.len() as u64,
            self.shape.batch as u64,
            data.n_train as u64,
            data.features as u64,
        ];
        key.extend(
            std::iter::once(&self.params)
                .chain(&self.state)
                .chain([&self.running, &self.train_stats, &data.train_x])
                .chain([&data.train_y])
                .map(|x| b.buf_addr(x) as u64),
        );
        key.extend(ws.buffers().map(|x| b.buf_addr(x) as u64));
        for h in &self.slots {
            key.extend(h.key_bits());
        }
        // A group of mixed shapes bakes its slots' sizes into its products
        // and dropout launches.
        if let Some(widths) = &self.widths {
            for w in widths {
                key.push(w.len() as u64);
                key.extend(w.iter().map(|&w| w as u64));
            }
        }
        key
    }

    /// One training iteration: forward, backward and the optimizer steps.
    fn step(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        ws: &mut Workspace<B>,
        data: &DeviceData<B>,
        offsets: StepOffsets,
        order: OptimizerOrder,
    ) -> Result<()> {
        self.forward_backward(b, ctx, ws, data, offsets, Some(order))?;
        match order {
            OptimizerOrder::PerLayer => Ok(b.join_beside(ctx)?),
            OptimizerOrder::AfterBackward => {
                let all = [&ws.grads, &ws.step];
                Ok(self.optimizer_step(b, ctx, all, offsets, 0, self.n)?)
            }
        }
    }

    /// Forward and backward; with `OptimizerOrder::PerLayer`, each layer's
    /// optimizer step too (queued beside the rest of the backward pass).
    fn forward_backward(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        ws: &mut Workspace<B>,
        data: &DeviceData<B>,
        offsets: StepOffsets,
        order: Option<OptimizerOrder>,
    ) -> Result<()> {
        let (k, rows) = (self.slots.len(), self.shape.batch);
        // With augmentation the batch lands in `raw` and is cropped and
        // flipped from there into `x`, each slot by its own seed and step.
        let x_dst = ws.raw.as_mut().unwrap_or(&mut ws.x);
        for (cols, from, to) in [
            (data.features, &data.train_x, x_dst),
            (data.target_cols, &data.train_y, &mut ws.y),
        ] {
            b.gather_rows(
                ctx,
                cols,
                k * rows,
                at(&ws.step, 0),
                at(from, 0),
                at_mut(to, 0),
            )?;
        }
        if let (Some(a), Some(raw), Some(image)) = (self.shape.augment(), &ws.raw, data.image) {
            let slots: Vec<_> = self
                .slots
                .iter()
                .map(|h| kernels::AugmentSlot {
                    seed: h.seed,
                    pad: a.crop,
                    flip: a.flip,
                })
                .collect();
            let images = kernels::Images::packed(k, rows, image.h, image.w, image.c);
            let steps = at(&ws.step, offsets.dropout);
            b.augment(
                ctx,
                &images,
                &slots,
                steps,
                at(raw, 0),
                at_mut(&mut ws.x, 0),
            )?;
        }
        if let Some(cw) = ws.conv.as_mut() {
            let params = (&self.params, self.n);
            let running = Running::Train(&mut self.running);
            let x = at(&ws.x, 0);
            cw.forward(b, ctx, (k, rows), x, rows * data.features, params, running)?;
        }
        self.forward(b, ctx, ws, data, Input::Batch, Some(offsets))?;
        let out = self.shape.spec.output;
        let shape = Batched::new(k, rows, out);
        let stats = at_mut(&mut self.train_stats, 0);
        let dlogits = Some(at_mut(&mut ws.dlogits, 0));
        let loss = Loss {
            shape,
            target_stride: rows * data.target_cols,
            accumulate: true,
        };
        let (logits, targets) = (at(&ws.logits, 0), at(&ws.y, 0));
        Self::loss(
            self.shape.spec.loss,
            b,
            ctx,
            &loss,
            [logits, targets],
            dlogits,
            stats,
        )?;
        let per_layer = order == Some(OptimizerOrder::PerLayer);
        self.backward(b, ctx, ws, rows, offsets, per_layer)
    }

    /// Dropout of hidden layer `layer` for every slot. In a group of mixed
    /// widths each slot's rows are padded to the layout's, and its mask is
    /// drawn as the slot alone draws it.
    fn dropout_slots(&self, layer: usize) -> Vec<DropoutSlot> {
        let stride = self.layers[layer].fan_out;
        self.slots
            .iter()
            .enumerate()
            .map(|(s, h)| {
                let d = h.dropout_slot(layer);
                match &self.widths {
                    // A layer the slot does not have is all padding.
                    Some(w) => d.within(w[s].get(layer).copied().unwrap_or(0), stride),
                    None => d,
                }
            })
            .collect()
    }

    /// Where layer input `e` lies, and its slots' stride: `first` (the
    /// data, or the conv net's features) for `e = 0`, else hidden layer
    /// `e - 1`'s output in `acts` (its activations, or their dropout).
    fn layer_input<'w>(
        &self,
        e: usize,
        rows: usize,
        first: (View<'w, B::Buf>, usize),
        acts: &'w [B::Buf],
    ) -> (View<'w, B::Buf>, usize) {
        match e {
            0 => first,
            _ => (at(&acts[e - 1], 0), rows * self.layers[e].fan_in),
        }
    }

    /// The first layer's input in training (`val: None`) or evaluation,
    /// and its slots' stride.
    fn first_input<'w>(
        &self,
        rows: usize,
        x: &'w B::Buf,
        conv: Option<&'w ConvWorkspace<B>>,
        val: Option<(&'w DeviceData<B>, usize)>,
    ) -> (View<'w, B::Buf>, usize) {
        let fan_in = self.layers[0].fan_in;
        match (conv, val) {
            (Some(cw), _) => (cw.head_input(), rows * fan_in),
            (None, None) => (at(x, 0), rows * fan_in),
            (None, Some((data, row))) => (at(&data.val_x, row * data.features), 0),
        }
    }

    fn forward(
        &self,
        b: &B,
        ctx: &mut B::Ctx,
        ws: &mut Workspace<B>,
        data: &DeviceData<B>,
        input: Input,
        train: Option<StepOffsets>,
    ) -> Result<()> {
        let (k, n, last) = (self.slots.len(), self.n, self.layers.len() - 1);
        let dropout = train.is_some() && self.shape.dropout;
        let rows = match input {
            Input::Batch => self.shape.batch,
            Input::Val { rows, .. } => rows,
        };
        let precision = self.shape.spec.precision;
        let val = match input {
            Input::Batch => None,
            Input::Val { row, .. } => Some((data, row)),
        };
        for (l, layer) in self.layers[..last].iter().enumerate() {
            let acts = if dropout { &ws.d } else { &ws.a };
            let first = self.first_input(rows, &ws.x, ws.conv.as_ref(), val);
            let (a_in, a_stride) = self.layer_input(l, rows, first, acts);
            let g = Gemm::new(rows, layer.fan_out, layer.fan_in)
                .batched(k, a_stride, n, rows * layer.fan_out)
                .precision(precision);
            let w = at(&self.params, layer.w_off);
            let z = at_mut(&mut ws.z[l], 0);
            self.layer_gemm(b, ctx, (l, l), Product::Forward, &g, a_in, w, z)?;
            let (shape, bias) = (
                Batched::new(k, rows, layer.fan_out),
                at(&self.params, layer.b_off),
            );
            let act = self.shape.spec.activation;
            let (z, a) = (at_mut(&mut ws.z[l], 0), at_mut(&mut ws.a[l], 0));
            b.bias_activation(ctx, shape, n, act, z, bias, a)?;
            if let (true, Some(offsets)) = (dropout, train) {
                let settings = self.dropout_slots(l);
                let slots = Slots {
                    n: rows * layer.fan_out,
                    settings: &settings,
                };
                b.dropout(
                    ctx,
                    slots,
                    at(&ws.step, offsets.dropout),
                    at(&ws.a[l], 0),
                    at_mut(&mut ws.d[l], 0),
                )?;
            }
        }
        // The output layer, once per exit: each slot reads its own last
        // hidden layer.
        let layer = self.layers[last];
        let w = at(&self.params, layer.w_off);
        for e in self.exits() {
            let acts = if dropout { &ws.d } else { &ws.a };
            let first = self.first_input(rows, &ws.x, ws.conv.as_ref(), val);
            let (a_in, a_stride) = self.layer_input(e, rows, first, acts);
            let fan_in = self.layers[e].fan_in;
            let g = Gemm::new(rows, layer.fan_out, fan_in)
                .batched(k, a_stride, n, rows * layer.fan_out)
                .precision(precision);
            let logits = at_mut(&mut ws.logits, 0);
            self.layer_gemm(b, ctx, (last, e), Product::Forward, &g, a_in, w, logits)?;
        }
        let (shape, bias) = (
            Batched::new(k, rows, layer.fan_out),
            at(&self.params, layer.b_off),
        );
        b.bias_add(ctx, shape, n, at_mut(&mut ws.logits, 0), bias)?;
        Ok(())
    }

    /// The task's loss of `logits` against `targets`.
    fn loss(
        kind: LossKind,
        b: &B,
        ctx: &mut B::Ctx,
        loss: &Loss,
        [logits, targets]: [View<'_, B::Buf>; 2],
        dlogits: Option<ViewMut<'_, B::Buf>>,
        stats: ViewMut<'_, B::Buf>,
    ) -> Result<()> {
        match kind {
            LossKind::CrossEntropy => b.softmax_xent(ctx, loss, logits, targets, dlogits, stats)?,
            LossKind::Mse => b.mse(ctx, loss, logits, targets, dlogits, stats)?,
        }
        Ok(())
    }

    /// The backward pass; with `per_layer`, each layer's optimizer step
    /// right after the last op that reads its weights.
    ///
    /// Step `l` (from the output layer down) takes the gradient of layer
    /// `l`'s input, hidden layer `l - 1`'s output, into `dh`: from layer
    /// `l` for the slots that have it, and from the output layer for the
    /// slots of depth `l` (their exit). So every slot's gradient of a
    /// layer's output is complete before that layer's own step.
    fn backward(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        ws: &mut Workspace<B>,
        rows: usize,
        offsets: StepOffsets,
        per_layer: bool,
    ) -> Result<()> {
        let (k, n) = (self.slots.len(), self.n);
        let dropout = self.shape.dropout;
        let act = self.shape.spec.activation;
        let precision = self.shape.spec.precision;
        let last = self.layers.len() - 1;
        let exits = self.exits();
        let last_exit = *exits.last().expect("a group has a depth");
        let out = self.layers[last];
        // The output layer's parameters: its weights, then its bias.
        let out_run = (out.w_off, out.fan_in * out.fan_out + out.fan_out);
        b.col_sum(
            ctx,
            Batched::new(k, rows, out.fan_out),
            n,
            at(&ws.dlogits, 0),
            at_mut(&mut ws.grads, out.b_off),
        )?;
        // By index: a layer's step below borrows the group mutably, and a
        // copy of the list would be an allocation every iteration.
        for l in (0..=last).rev() {
            let layer = self.layers[l];
            let fi = layer.fan_in;
            // (layer, exit, dL/dz of its output): layer `l` itself, whose
            // dL/dz is in `dz`, and the output layer for the slots of depth
            // `l`, whose dL/dz is in `dlogits`.
            let hidden = (l < last).then_some((l, l, at(&ws.dz, 0)));
            let exit = exits.contains(&l).then_some((last, l, at(&ws.dlogits, 0)));
            for (p, e, dz) in hidden.into_iter().chain(exit) {
                let fo = self.layers[p].fan_out;
                let acts = if dropout { &ws.d } else { &ws.a };
                let first = self.first_input(rows, &ws.x, ws.conv.as_ref(), None);
                let (h_in, _) = self.layer_input(e, rows, first, acts);
                let dw = Gemm::new(fi, fo, rows)
                    .trans_a()
                    .batched(k, rows * fi, rows * fo, n)
                    .precision(precision);
                let grads = at_mut(&mut ws.grads, self.layers[p].w_off);
                self.layer_gemm(b, ctx, (p, e), Product::WeightGrad, &dw, h_in, dz, grads)?;
                if p < last {
                    b.col_sum(
                        ctx,
                        Batched::new(k, rows, fo),
                        n,
                        dz,
                        at_mut(&mut ws.grads, layer.b_off),
                    )?;
                }
                if l == 0 {
                    // The first layer's input gradient: the conv net's, if any.
                    continue;
                }
                let dh = Gemm::new(rows, fi, fo)
                    .trans_b()
                    .batched(k, rows * fo, n, rows * fi)
                    .precision(precision);
                let w = at(&self.params, self.layers[p].w_off);
                let dh_out = at_mut(&mut ws.dh, 0);
                self.layer_gemm(b, ctx, (p, e), Product::InputGrad, &dh, dz, w, dh_out)?;
            }
            if l == 0 {
                self.backward_first(b, ctx, ws, rows, offsets, per_layer)?;
                break;
            }
            if per_layer {
                let run = (layer.w_off, fi * layer.fan_out + layer.fan_out);
                let step = [&ws.grads, &ws.step];
                if l < last {
                    self.update_beside(b, ctx, step, offsets, run)?;
                }
                if l == last_exit {
                    self.update_beside(b, ctx, step, offsets, out_run)?;
                }
            }
            let len = k * rows * fi;
            let da = match ws.dtmp.as_mut() {
                Some(dtmp) => {
                    let settings = self.dropout_slots(l - 1);
                    let slots = Slots {
                        n: rows * fi,
                        settings: &settings,
                    };
                    let steps = at(&ws.step, offsets.dropout);
                    b.dropout_backward(ctx, slots, steps, at(&ws.dh, 0), at_mut(dtmp, 0))?;
                    at(&*dtmp, 0)
                }
                None => at(&ws.dh, 0),
            };
            b.activation_backward(
                ctx,
                ActivationOp {
                    activation: act,
                    n: len,
                },
                at(&ws.z[l - 1], 0),
                at(&ws.a[l - 1], 0),
                da,
                at_mut(&mut ws.dz, 0),
            )?;
        }
        Ok(())
    }

    /// The end of the backward pass at the first layer, whose products
    /// are done: the conv net's backward pass, if any, and the first
    /// layer's optimizer step (and the conv net's) with `per_layer`.
    fn backward_first(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        ws: &mut Workspace<B>,
        rows: usize,
        offsets: StepOffsets,
        per_layer: bool,
    ) -> Result<()> {
        let (k, n) = (self.slots.len(), self.n);
        let layer = self.layers[0];
        let (fi, fo) = (layer.fan_in, layer.fan_out);
        let run = (layer.w_off, fi * fo + fo);
        let Some(cw) = ws.conv.as_mut() else {
            if per_layer {
                self.update_beside(b, ctx, [&ws.grads, &ws.step], offsets, run)?;
            }
            return Ok(());
        };
        // The head's input gradient, then the conv net's backward pass.
        // Its dL/dz is in `dlogits` when it is the output layer.
        let dz = if self.layers.len() == 1 {
            at(&ws.dlogits, 0)
        } else {
            at(&ws.dz, 0)
        };
        let dh = Gemm::new(rows, fi, fo)
            .trans_b()
            .batched(k, rows * fo, n, rows * fi)
            .precision(self.shape.spec.precision);
        let w = at(&self.params, layer.w_off);
        // Of a group of mixed heads, each slot's own first layer.
        self.layer_gemm(
            b,
            ctx,
            (0, 0),
            Product::InputGrad,
            &dh,
            dz,
            w,
            cw.head_input_grad(),
        )?;
        if per_layer {
            self.update_beside(b, ctx, [&ws.grads, &ws.step], offsets, run)?;
        }
        let x = at(&ws.x, 0);
        let params = (&self.params, n);
        let stride = rows * self.shape.spec.data_features();
        cw.backward(b, ctx, (k, rows), x, stride, params, &mut ws.grads)?;
        if per_layer {
            // The conv units' parameters lie before the head's.
            let conv = (0, layer.w_off);
            self.update_beside(b, ctx, [&ws.grads, &ws.step], offsets, conv)?;
        }
        Ok(())
    }

    /// [`Self::optimizer_step`] of one run of parameters, queued beside
    /// what the backward pass queues next ([`Backend::beside`]).
    fn update_beside(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        [grads, step]: [&B::Buf; 2],
        offsets: StepOffsets,
        (start, len): (usize, usize),
    ) -> Result<()> {
        let step_run = |b: &B, ctx: &mut B::Ctx| {
            self.optimizer_step(b, ctx, [grads, step], offsets, start, len)
        };
        Ok(b.beside(ctx, step_run)?)
    }

    /// The optimizer step of every slot's parameters `start..start + len`;
    /// `grads` and `step` are the workspace's gradients and step block. In
    /// a group of mixed shapes, each layer's weights and bias are ragged
    /// runs: each slot steps its own parameters (at the start of each
    /// block), never the padding.
    fn optimizer_step(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        buffers: [&B::Buf; 2],
        offsets: StepOffsets,
        start: usize,
        len: usize,
    ) -> kernels::Result<()> {
        if self.widths.is_none() {
            return self.step_run(b, ctx, buffers, offsets, (start, len), None);
        }
        let end = start + len;
        // The conv net's parameters (every slot's alike), then each
        // layer's weights and bias, as far as they lie in the run.
        let head = self.layers[0].w_off;
        if start < head {
            self.step_run(
                b,
                ctx,
                buffers,
                offsets,
                (start, head.min(end) - start),
                None,
            )?;
        }
        for p in 0..self.layers.len() {
            let layer = self.layers[p];
            if layer.w_off >= end || layer.b_off + layer.fan_out <= start {
                continue;
            }
            let own: Vec<(usize, usize)> =
                (0..self.slots.len()).map(|s| self.own_fans(s, p)).collect();
            let weights: Vec<usize> = own.iter().map(|&(fi, fo)| fi * fo).collect();
            let biases: Vec<usize> = own.iter().map(|&(_, fo)| fo).collect();
            let blocks = [
                (layer.w_off, layer.fan_in * layer.fan_out, weights),
                (layer.b_off, layer.fan_out, biases),
            ];
            for (at, n, lens) in blocks {
                // Runs are whole layers, the conv net, or everything.
                debug_assert!(at + n <= start || at >= end || (at >= start && at + n <= end));
                if at >= start && at + n <= end {
                    self.step_run(b, ctx, buffers, offsets, (at, n), Some(&lens))?;
                }
            }
        }
        Ok(())
    }

    /// Slot `s`'s own fan-in and fan-out of the layout's layer `p`; `(0, 0)`
    /// for a layer it does not have.
    fn own_fans(&self, s: usize, p: usize) -> (usize, usize) {
        let Some(widths) = &self.widths else {
            let l = self.layers[p];
            return (l.fan_in, l.fan_out);
        };
        let (w, last) = (&widths[s], self.layers.len() - 1);
        let fan_in = |i: usize| {
            if i == 0 {
                self.shape.spec.input
            } else {
                w[i - 1]
            }
        };
        match p == last {
            true => (fan_in(w.len()), self.shape.spec.output),
            false if p < w.len() => (fan_in(p), w[p]),
            false => (0, 0),
        }
    }

    /// One optimizer launch over `len` parameters from `start` in every
    /// slot, each slot's first `lens[s]` of them with `lens`.
    fn step_run(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        [grads, step]: [&B::Buf; 2],
        offsets: StepOffsets,
        (start, len): (usize, usize),
        lens: Option<&[usize]>,
    ) -> kernels::Result<()> {
        let stride = self.n;
        match (&self.settings, self.state.as_mut_slice()) {
            (OptimizerSettings::Sgd(settings), [vel]) => {
                b.sgd_step(
                    ctx,
                    ParamRun {
                        len,
                        stride,
                        settings,
                        lens,
                    },
                    at_mut(&mut self.params, start),
                    at(grads, start),
                    Some(at_mut(vel, start)),
                )?;
            }
            (OptimizerSettings::Adam(settings), [m, v]) => {
                let moments = Moments {
                    m: at_mut(m, start),
                    v: at_mut(v, start),
                };
                b.adam_step(
                    ctx,
                    ParamRun {
                        len,
                        stride,
                        settings,
                        lens,
                    },
                    at(step, offsets.adam),
                    at_mut(&mut self.params, start),
                    at(grads, start),
                    moments,
                )?;
            }
            _ => unreachable!("state vectors match the family"),
        }
        Ok(())
    }

    /// Loss statistics of every slot over the whole validation split.
    pub fn evaluate(&self, lane: &mut Lane<B>, data: &DeviceData<B>) -> Result<Vec<LossStats>> {
        let (k, chunk) = (self.slots.len(), self.shape.batch);
        let out = self.shape.spec.output;
        let (b, ctx, ws) = lane.parts(&self.shape)?;
        let mut row = 0;
        while row < data.n_val {
            let rows = chunk.min(data.n_val - row);
            if let Some(cw) = ws.conv.as_mut() {
                let x = at(&data.val_x, row * data.features);
                let params = (&self.params, self.n);
                cw.forward(
                    b,
                    ctx,
                    (k, rows),
                    x,
                    0,
                    params,
                    Running::Eval(&self.running),
                )?;
            }
            self.forward(b, ctx, ws, data, Input::Val { row, rows }, None)?;
            let shape = Batched::new(k, rows, out);
            let targets = at(&data.val_y, row * data.target_cols);
            let stats = at_mut(&mut ws.eval_stats, 0);
            let loss = Loss {
                shape,
                target_stride: 0,
                accumulate: row > 0,
            };
            let logits = at(&ws.logits, 0);
            Self::loss(
                self.shape.spec.loss,
                b,
                ctx,
                &loss,
                [logits, targets],
                None,
                stats,
            )?;
            row += rows;
        }
        let mut host = vec![0.0f32; k * STATS_LEN];
        b.download(ctx, at(&ws.eval_stats, 0), &mut host)?;
        LossStats::read_all(&host, "validation")
    }

    /// The training statistics accumulated since the last call, which resets them.
    pub fn take_train_stats(&mut self, lane: &mut Lane<B>) -> Result<Vec<LossStats>> {
        let k = self.slots.len();
        let (b, ctx) = lane.device();
        let mut host = vec![0.0f32; k * STATS_LEN];
        b.download(ctx, at(&self.train_stats, 0), &mut host)?;
        b.fill(ctx, k * STATS_LEN, 0.0, at_mut(&mut self.train_stats, 0))?;
        LossStats::read_all(&host, "training")
    }

    /// Slot `s`'s parameters as the group lays them out, padding included
    /// (to check what the group's ops leave there).
    pub fn laid_params(&self, lane: &mut Lane<B>, s: usize) -> Result<Vec<f32>> {
        let (b, ctx) = lane.device();
        let mut v = vec![0.0; self.n];
        b.download(ctx, at(&self.params, s * self.n), &mut v)?;
        Ok(v)
    }

    /// Copies slot `s`'s persistent state to the host.
    pub fn export_slot(&self, lane: &mut Lane<B>, s: usize) -> Result<SlotState> {
        let n = self.n;
        let (b, ctx) = lane.device();
        let mut read = |buf: &B::Buf, off: usize, len: usize| -> Result<Vec<f32>> {
            let mut v = vec![0.0; len];
            b.download(ctx, at(buf, off), &mut v)?;
            Ok(v)
        };
        let params = read(&self.params, s * n, n)?;
        let opt_state: Vec<_> = self
            .state
            .iter()
            .map(|st| read(st, s * n, n))
            .collect::<Result<_>>()?;
        Ok(SlotState {
            params: self.unpad(s, params),
            opt_state: opt_state.into_iter().map(|v| self.unpad(s, v)).collect(),
            train_stats: read(&self.train_stats, s * STATS_LEN, STATS_LEN)?,
            running: read(&self.running, s * self.n_running, self.n_running)?,
        })
    }

    /// Overwrites slot `dst`'s persistent state with slot `src` of `from`,
    /// device to device (PBT's exploit): parameters, optimizer state,
    /// training statistics and batch norm's running statistics. Returns
    /// the bytes copied. `from` must have this group's model.
    pub fn copy_slot_from(
        &mut self,
        lane: &mut Lane<B>,
        dst: usize,
        from: &ModelGroup<B>,
        src: usize,
    ) -> Result<usize> {
        if from.shape.spec != self.shape.spec
            || from.state.len() != self.state.len()
            || from.slot_spec(src) != self.slot_spec(dst)
        {
            return Err(WorkerError::BadState(
                "the donor's state was taken from a different model or optimizer".into(),
            ));
        }
        let (n, m) = (self.n, self.n_running);
        let (b, ctx) = lane.device();
        b.copy(
            ctx,
            n,
            at(&from.params, src * n),
            at_mut(&mut self.params, dst * n),
        )?;
        for (to, fr) in self.state.iter_mut().zip(&from.state) {
            b.copy(ctx, n, at(fr, src * n), at_mut(to, dst * n))?;
        }
        b.copy(
            ctx,
            STATS_LEN,
            at(&from.train_stats, src * STATS_LEN),
            at_mut(&mut self.train_stats, dst * STATS_LEN),
        )?;
        if m > 0 {
            b.copy(
                ctx,
                m,
                at(&from.running, src * m),
                at_mut(&mut self.running, dst * m),
            )?;
        }
        Ok(4 * (n * (1 + self.state.len()) + STATS_LEN + m))
    }

    /// Overwrites slot `dst`'s persistent state with slot `src`'s, on the
    /// device (PBT's exploit between two members of one fused group).
    /// Returns the bytes copied.
    pub fn copy_slot_within(
        &mut self,
        lane: &mut Lane<B>,
        dst: usize,
        src: usize,
    ) -> Result<usize> {
        if self.slot_spec(src) != self.slot_spec(dst) {
            return Err(WorkerError::BadState(
                "slots of different shapes cannot take each other's state".into(),
            ));
        }
        let (n, m) = (self.n, self.n_running);
        let (b, ctx) = lane.device();
        b.copy_within(ctx, n, &mut self.params, src * n, dst * n)?;
        for st in &mut self.state {
            b.copy_within(ctx, n, st, src * n, dst * n)?;
        }
        b.copy_within(
            ctx,
            STATS_LEN,
            &mut self.train_stats,
            src * STATS_LEN,
            dst * STATS_LEN,
        )?;
        if m > 0 {
            b.copy_within(ctx, m, &mut self.running, src * m, dst * m)?;
        }
        Ok(4 * (n * (1 + self.state.len()) + STATS_LEN + m))
    }

    /// Gives slot `s` new hyper-parameters from its next iteration on. The
    /// optimizer family and whether dropout is on must not change: they
    /// shape the group's buffers.
    pub fn set_slot_hparams(&mut self, s: usize, h: SlotHparams) -> Result<()> {
        if h.optimizer.family() != self.family || (h.dropout > 0.0) != self.shape.dropout {
            return Err(WorkerError::Config(
                "new hyper-parameters may not change the optimizer family or turn dropout on or off"
                    .into(),
            ));
        }
        self.slots[s] = h;
        self.settings = OptimizerSettings::of(self.family, &self.slots);
        Ok(())
    }

    /// Overwrites slot `s`'s persistent state from the host.
    pub fn import_slot(&mut self, lane: &mut Lane<B>, s: usize, st: &SlotState) -> Result<()> {
        let n = self.slot_spec(s).n_params();
        if st.params.len() != n
            || st.opt_state.len() != self.state.len()
            || st.opt_state.iter().any(|v| v.len() != n)
            || st.train_stats.len() != STATS_LEN
            || st.running.len() != self.n_running
        {
            return Err(WorkerError::BadState(format!(
                "state does not fit a slot of {n} parameters with {} optimizer vectors",
                self.state.len()
            )));
        }
        let n = self.n;
        let params = self.pad(s, &st.params);
        let opt_state: Vec<_> = st.opt_state.iter().map(|v| self.pad(s, v)).collect();
        let (b, ctx) = lane.device();
        b.upload(ctx, &params, at_mut(&mut self.params, s * n))?;
        for (buf, v) in self.state.iter_mut().zip(&opt_state) {
            b.upload(ctx, v, at_mut(buf, s * n))?;
        }
        b.upload(
            ctx,
            &st.train_stats,
            at_mut(&mut self.train_stats, s * STATS_LEN),
        )?;
        let m = self.n_running;
        b.upload(ctx, &st.running, at_mut(&mut self.running, s * m))?;
        Ok(())
    }
}
