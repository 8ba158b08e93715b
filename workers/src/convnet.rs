//! The convolutional part of a model ([`crate::model::ConvNetSpec`]): its
//! buffers for one iteration, and its forward and backward passes over K
//! slots at once.
//!
//! Images stay channels-last (NHWC) all the way, so a unit's convolution is
//! `im2col` and one strided-batched GEMM (`pixels x patch` times `patch x
//! channels`, one weight matrix per slot), and its output is NHWC again:
//! the bias, activation and batch norm ops see pixels as rows and channels
//! as columns, as in the MLP.
//!
//! Where the backend pools activations as it reads them
//! ([`Backend::pools_activations`], the CPU) and nothing but the pooling
//! reads a unit's activations, the activation and the pooling are one op
//! each way and the activations are never written; a first unit without
//! batch norm or a residual also makes its filter gradient through the
//! pooling ([`Backend::conv2d_filter_grad_through_pool`]). Same bits.
//!
//! # Gradients
//!
//! The backward pass walks the units in reverse. A unit's activations can
//! feed two consumers, the next unit and a residual connection further on;
//! both come later, so their gradients are complete when the unit's turn
//! comes. The first write into a gradient buffer overwrites it and later
//! ones add, decided on the host in the same order every step, so nothing
//! is cleared and the launches of an iteration never change.

use kernels::{
    ActivationOp, Backend, BatchNorm, Batched, Conv2d, ConvGemm, Images, Pool2d, PoolKind,
    Precision, View, ViewMut, at, at_mut,
};

use crate::error::Result;
use crate::model::{ConvPlan, ConvUnit, ImageShape, ModelSpec, UnitInput};

/// Batch norm's constants, as PyTorch's defaults.
const BN_MOMENTUM: f32 = 0.1;
const BN_EPS: f32 = 1e-5;

/// Sizes of the conv buffers of a group of `slots` x `rows` samples.
struct Sizes {
    /// Per unit: its output, and its pooled output (0 when not pooled).
    out: Vec<usize>,
    pooled: Vec<usize>,
    cols: usize,
    widest: usize,
    feat: usize,
}

fn sizes(plan: &ConvPlan, kb: usize) -> Sizes {
    let out: Vec<usize> = plan
        .units
        .iter()
        .map(|u| kb * u.out_shape().len())
        .collect();
    let pooled = plan
        .units
        .iter()
        .map(|u| {
            if u.pooled {
                kb * u.pooled_shape().len()
            } else {
                0
            }
        })
        .collect();
    let cols = plan
        .units
        .iter()
        .map(|u| kb * u.out_shape().h * u.out_shape().w * u.kernel * u.kernel * u.in_shape.c)
        .max()
        .unwrap_or(0);
    Sizes {
        widest: out.iter().copied().max().unwrap_or(0),
        out,
        pooled,
        cols,
        feat: kb * plan.last.c,
    }
}

/// Elements [`ConvWorkspace::new`] allocates, exactly.
pub(crate) fn workspace_elems(spec: &ModelSpec, kb: usize, slots: usize) -> usize {
    let (Some(c), Some(plan)) = (&spec.conv, spec.conv_plan()) else {
        return 0;
    };
    let s = sizes(&plan, kb);
    let bn = c.batch_norm;
    let per_unit: usize = s.out.iter().map(|o| o * if bn { 4 } else { 3 }).sum();
    let saved: usize = plan
        .units
        .iter()
        .filter(|u| u.running_off.is_some())
        .map(|u| slots * 2 * u.out_c)
        .sum();
    per_unit
        + 2 * s.pooled.iter().sum::<usize>()
        + saved
        + s.cols
        + s.widest * if bn { 2 } else { 1 }
        + if c.global_pool { s.feat } else { 0 }
}

/// One iteration's conv buffers (see the module docs).
pub(crate) struct ConvWorkspace<B: Backend> {
    plan: ConvPlan,
    /// Per unit: the convolution's output (batch norm's input).
    z: Vec<B::Buf>,
    /// Per unit with batch norm: its output, then the residual added.
    u: Vec<Option<B::Buf>>,
    /// Per unit: after the activation.
    a: Vec<B::Buf>,
    /// Per unit: the gradient with respect to `a`.
    da: Vec<B::Buf>,
    /// Per pooled unit: the pooled output and its gradient.
    p: Vec<Option<B::Buf>>,
    dp: Vec<Option<B::Buf>>,
    /// Per unit with batch norm: the batch's mean and `1/std`.
    saved: Vec<Option<B::Buf>>,
    /// The patch matrix of a unit, forward and backward.
    cols: B::Buf,
    /// The gradient before the activation.
    dpre: B::Buf,
    /// The gradient before batch norm.
    dz: Option<B::Buf>,
    /// The global average of the last unit's output.
    feat: Option<B::Buf>,
    /// Per unit: whether its activation and pooling run as one op
    /// ([`Backend::activation_pool2d`]), its activations never written.
    act_pooled: Vec<bool>,
    global_pool: bool,
    pool: PoolKind,
    activation: kernels::Activation,
    precision: kernels::Precision,
}

impl<B: Backend> ConvWorkspace<B> {
    pub(crate) fn new(b: &B, spec: &ModelSpec, slots: usize, batch: usize) -> Result<Option<Self>> {
        let (Some(c), Some(plan)) = (&spec.conv, spec.conv_plan()) else {
            return Ok(None);
        };
        let s = sizes(&plan, slots * batch);
        let alloc = |n: usize| b.alloc_zeroed(n);
        let each = |f: &dyn Fn(usize) -> Option<usize>| -> kernels::Result<Vec<Option<B::Buf>>> {
            (0..plan.units.len())
                .map(|i| f(i).map(alloc).transpose())
                .collect()
        };
        let bn = c.batch_norm;
        let units = plan.units.clone();
        // Where the backend pools activations as it reads them, and no
        // other unit reads them (a residual or an unpooled input), the
        // activations need never be written.
        let read_by_another = |i: usize| {
            units
                .iter()
                .any(|v| v.input == UnitInput::Unit(i) || v.skip == Some(i))
        };
        let act_pooled = (0..units.len())
            .map(|i| {
                b.pools_activations()
                    && units[i].pooled
                    && Self::pool_shape(c.pool, &units[i], 1, 1).tiles()
                    && !read_by_another(i)
            })
            .collect();
        Ok(Some(ConvWorkspace {
            z: s.out
                .iter()
                .map(|&n| alloc(n))
                .collect::<kernels::Result<_>>()?,
            u: each(&|i| bn.then_some(s.out[i]))?,
            a: s.out
                .iter()
                .map(|&n| alloc(n))
                .collect::<kernels::Result<_>>()?,
            da: s
                .out
                .iter()
                .map(|&n| alloc(n))
                .collect::<kernels::Result<_>>()?,
            p: each(&|i| units[i].pooled.then_some(s.pooled[i]))?,
            dp: each(&|i| units[i].pooled.then_some(s.pooled[i]))?,
            saved: each(&|i| units[i].running_off.map(|_| slots * 2 * units[i].out_c))?,
            cols: alloc(s.cols)?,
            dpre: alloc(s.widest)?,
            dz: bn.then(|| alloc(s.widest)).transpose()?,
            feat: c.global_pool.then(|| alloc(s.feat)).transpose()?,
            act_pooled,
            global_pool: c.global_pool,
            pool: c.pool,
            activation: spec.activation,
            precision: spec.precision,
            plan,
        }))
    }

    /// Every buffer, for graph keys and size checks.
    pub(crate) fn buffers(&self) -> impl Iterator<Item = &B::Buf> {
        self.z
            .iter()
            .chain(&self.a)
            .chain(&self.da)
            .chain(self.u.iter().flatten())
            .chain(self.p.iter().flatten())
            .chain(self.dp.iter().flatten())
            .chain(self.saved.iter().flatten())
            .chain([&self.cols, &self.dpre])
            .chain(&self.dz)
            .chain(&self.feat)
    }

    /// What the head reads: the last output, pooled, or globally averaged.
    pub(crate) fn head_input(&self) -> View<'_, B::Buf> {
        if let Some(f) = &self.feat {
            return at(f, 0);
        }
        let last = self.plan.units.len() - 1;
        match &self.p[last] {
            Some(p) => at(p, 0),
            None => at(&self.a[last], 0),
        }
    }

    /// Where the head's input gradient goes: the last unit's (pooled)
    /// output gradient, or a scratch buffer that global pooling reads.
    pub(crate) fn head_input_grad(&mut self) -> ViewMut<'_, B::Buf> {
        let last = self.plan.units.len() - 1;
        if self.global_pool {
            return at_mut(&mut self.dpre, 0);
        }
        match &mut self.dp[last] {
            Some(dp) => at_mut(dp, 0),
            None => at_mut(&mut self.da[last], 0),
        }
    }

    fn images(k: usize, rows: usize, s: ImageShape) -> Images {
        Images::packed(k, rows, s.h, s.w, s.c)
    }

    fn conv_op(u: &ConvUnit, input: Images) -> Conv2d {
        Conv2d {
            input,
            kh: u.kernel,
            kw: u.kernel,
            stride: 1,
            pad: u.kernel / 2,
        }
    }

    /// Unit `u`'s convolution of `input`, its weights `n` apart per slot;
    /// a unit without batch norm has a bias, right after its weights.
    fn conv_gemm(u: &ConvUnit, input: Images, n: usize, precision: Precision) -> ConvGemm {
        ConvGemm {
            conv: Self::conv_op(u, input),
            out_c: u.out_shape().c,
            weight_stride: n,
            precision,
            accumulate_dx: false,
            bias: u.running_off.is_none(),
        }
    }

    fn pool_op(&self, u: &ConvUnit, k: usize, rows: usize) -> Pool2d {
        Self::pool_shape(self.pool, u, k, rows)
    }

    fn pool_shape(kind: PoolKind, u: &ConvUnit, k: usize, rows: usize) -> Pool2d {
        Pool2d {
            input: Self::images(k, rows, u.out_shape()),
            kind,
            kh: 2,
            kw: 2,
            stride: 2,
        }
    }

    fn global_op(&self, k: usize, rows: usize) -> Pool2d {
        let s = self.plan.last;
        Pool2d {
            input: Self::images(k, rows, s),
            kind: PoolKind::Avg,
            kh: s.h,
            kw: s.w,
            stride: 1,
        }
    }

    fn batch_norm(u: &ConvUnit, k: usize, rows: usize, n: usize, n_running: usize) -> BatchNorm {
        let o = u.out_shape();
        BatchNorm {
            shape: Batched::new(k, rows * o.h * o.w, o.c),
            param_stride: n,
            running_stride: n_running,
            momentum: BN_MOMENTUM,
            eps: BN_EPS,
        }
    }

    /// The forward pass of `k` slots of `rows` samples each, from `data`
    /// (slots `data_stride` apart; 0 shares one batch). Training uses and
    /// moves the batch statistics; evaluation reads the running ones.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        (k, rows): (usize, usize),
        data: View<'_, B::Buf>,
        data_stride: usize,
        (params, n): (&B::Buf, usize),
        mut running: Running<'_, B::Buf>,
    ) -> Result<()> {
        let n_running = self.plan.n_running;
        for i in 0..self.plan.units.len() {
            let u = self.plan.units[i];
            let o = u.out_shape();
            let (x, images) = unit_input::<B>(&self.a, &self.p, &u, k, rows, data, data_stride);
            let op = Self::conv_gemm(&u, images, n, self.precision);
            b.conv2d(
                ctx,
                &op,
                x,
                at(params, u.w_off),
                at_mut(&mut self.cols, 0),
                at_mut(&mut self.z[i], 0),
            )?;
            let m = op.conv.out_rows();
            let len = k * m * o.c;
            let pre = match (u.running_off, &mut self.u[i]) {
                (Some(r), Some(ub)) => {
                    let bn = Self::batch_norm(&u, k, rows, n, n_running);
                    let p = at(params, u.b_off);
                    match &mut running {
                        Running::Train(run) => {
                            let saved = self.saved[i].as_mut().expect("saved");
                            b.batch_norm_train(
                                ctx,
                                &bn,
                                at(&self.z[i], 0),
                                p,
                                at_mut(*run, r),
                                at_mut(saved, 0),
                                at_mut(ub, 0),
                            )?;
                        }
                        Running::Eval(run) => {
                            let z = at(&self.z[i], 0);
                            b.batch_norm_eval(ctx, &bn, z, p, at(*run, r), at_mut(ub, 0))?;
                        }
                    }
                    ub
                }
                // The bias was added by the convolution.
                _ => &mut self.z[i],
            };
            if let Some(j) = u.skip {
                b.add(ctx, len, at(&self.a[j], 0), at_mut(pre, 0))?;
            }
            if self.act_pooled[i] {
                let pool = Self::pool_shape(self.pool, &u, k, rows);
                let p = self.p[i].as_mut().expect("pooled");
                b.activation_pool2d(ctx, self.activation, &pool, at(pre, 0), at_mut(p, 0))?;
                continue;
            }
            let act = ActivationOp {
                activation: self.activation,
                n: len,
            };
            b.activation(ctx, act, at(pre, 0), at_mut(&mut self.a[i], 0))?;
            if u.pooled {
                let pool = self.pool_op(&u, k, rows);
                let p = self.p[i].as_mut().expect("pooled");
                b.pool2d(ctx, &pool, at(&self.a[i], 0), at_mut(p, 0))?;
            }
        }
        if self.global_pool {
            let pool = self.global_op(k, rows);
            let last = self.plan.units.len() - 1;
            let src = match &self.p[last] {
                Some(p) => at(p, 0),
                None => at(&self.a[last], 0),
            };
            let feat = self.feat.as_mut().expect("global pool buffer");
            b.pool2d(ctx, &pool, src, at_mut(feat, 0))?;
        }
        Ok(())
    }

    /// The backward pass after [`ConvWorkspace::forward`] in training,
    /// once the head has written its input's gradient
    /// ([`ConvWorkspace::head_input_grad`]). Parameter gradients go into
    /// `grads` (slots `n` apart, laid out as the parameters).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(
        &mut self,
        b: &B,
        ctx: &mut B::Ctx,
        (k, rows): (usize, usize),
        data: View<'_, B::Buf>,
        data_stride: usize,
        (params, n): (&B::Buf, usize),
        grads: &mut B::Buf,
    ) -> Result<()> {
        let units = self.plan.units.clone();
        let last = units.len() - 1;
        if self.global_pool {
            let pool = self.global_op(k, rows);
            let (x, dx) = match (&self.p[last], &mut self.dp[last]) {
                (Some(p), Some(dp)) => (at(p, 0), at_mut(dp, 0)),
                _ => (at(&self.a[last], 0), at_mut(&mut self.da[last], 0)),
            };
            b.pool2d_backward(ctx, &pool, x, at(&self.dpre, 0), dx)?;
        }
        // Whether a unit's output gradient holds a first contribution.
        let mut written = vec![false; units.len()];
        for (i, u) in units.iter().enumerate().rev() {
            let o = u.out_shape();
            let pre = self.u[i].as_ref().unwrap_or(&self.z[i]);
            // A first unit without batch norm or a residual: its output's
            // gradient feeds only its filter gradient, which the backend
            // makes through the pooling without writing it.
            if self.act_pooled[i]
                && u.input == UnitInput::Data
                && u.running_off.is_none()
                && u.skip.is_none()
            {
                let pool = self.pool_op(u, k, rows);
                let dp = self.dp[i].as_ref().expect("pooled");
                let (x, images) = unit_input::<B>(&self.a, &self.p, u, k, rows, data, data_stride);
                let op = Self::conv_gemm(u, images, n, self.precision);
                b.conv2d_filter_grad_through_pool(
                    ctx,
                    &op,
                    self.activation,
                    &pool,
                    x,
                    at(pre, 0),
                    at(dp, 0),
                    at_mut(&mut self.cols, 0),
                    at_mut(grads, u.w_off),
                )?;
                continue;
            }
            let len = k * rows * o.len();
            if self.act_pooled[i] {
                let pool = self.pool_op(u, k, rows);
                let dp = self.dp[i].as_ref().expect("pooled");
                b.activation_pool2d_backward(
                    ctx,
                    self.activation,
                    &pool,
                    at(pre, 0),
                    at(dp, 0),
                    at_mut(&mut self.dpre, 0),
                )?;
            } else {
                if u.pooled {
                    let pool = self.pool_op(u, k, rows);
                    let dp = self.dp[i].as_ref().expect("pooled");
                    b.pool2d_backward(
                        ctx,
                        &pool,
                        at(&self.a[i], 0),
                        at(dp, 0),
                        at_mut(&mut self.da[i], 0),
                    )?;
                }
                let act = ActivationOp {
                    activation: self.activation,
                    n: len,
                };
                b.activation_backward(
                    ctx,
                    act,
                    at(pre, 0),
                    at(&self.a[i], 0),
                    at(&self.da[i], 0),
                    at_mut(&mut self.dpre, 0),
                )?;
            }
            if let Some(j) = u.skip {
                if written[j] {
                    b.add(ctx, len, at(&self.dpre, 0), at_mut(&mut self.da[j], 0))?;
                } else {
                    b.copy(ctx, len, at(&self.dpre, 0), at_mut(&mut self.da[j], 0))?;
                }
                written[j] = true;
            }
            let dz = match (u.running_off, &mut self.dz) {
                (Some(_), Some(dz)) => {
                    let bn = Self::batch_norm(u, k, rows, n, self.plan.n_running);
                    let saved = self.saved[i].as_ref().expect("saved");
                    b.batch_norm_backward(
                        ctx,
                        &bn,
                        at(&self.z[i], 0),
                        at(params, u.b_off),
                        at(saved, 0),
                        at(&self.dpre, 0),
                        at_mut(dz, 0),
                        at_mut(grads, u.b_off),
                    )?;
                    &*dz
                }
                // The bias's gradient comes with the weights'.
                _ => &self.dpre,
            };
            let (x, images) = unit_input::<B>(&self.a, &self.p, u, k, rows, data, data_stride);
            let op = Self::conv_gemm(u, images, n, self.precision);
            // The patch matrix is made again rather than kept per unit from
            // the forward pass: one buffer for all units, where cnn-32's
            // first unit alone would keep 20 MB per trial.
            b.conv2d_filter_grad(
                ctx,
                &op,
                x,
                at(dz, 0),
                at_mut(&mut self.cols, 0),
                at_mut(grads, u.w_off),
            )?;
            let (target, accumulate) = match u.input {
                UnitInput::Data => continue,
                UnitInput::Unit(j) => {
                    let acc = written[j];
                    written[j] = true;
                    (&mut self.da[j], acc)
                }
                UnitInput::Pooled(j) => (self.dp[j].as_mut().expect("pooled"), false),
            };
            let op = ConvGemm {
                conv: Self::conv_op(u, Self::images(k, rows, u.in_shape)),
                accumulate_dx: accumulate,
                ..op
            };
            b.conv2d_data_grad(
                ctx,
                &op,
                at(dz, 0),
                at(params, u.w_off),
                at_mut(&mut self.cols, 0),
                at_mut(target, 0),
            )?;
        }
        Ok(())
    }
}

/// A unit's input: the data (`data`, slots `data_stride` apart), or an
/// earlier unit's output (`a`, or `p` when pooled).
#[allow(clippy::too_many_arguments)]
fn unit_input<'a, B: Backend>(
    a: &'a [B::Buf],
    p: &'a [Option<B::Buf>],
    u: &ConvUnit,
    k: usize,
    rows: usize,
    data: View<'a, B::Buf>,
    data_stride: usize,
) -> (View<'a, B::Buf>, Images) {
    let mut images = Images::packed(k, rows, u.in_shape.h, u.in_shape.w, u.in_shape.c);
    match u.input {
        UnitInput::Data => {
            images.slot_stride = data_stride;
            (data, images)
        }
        UnitInput::Unit(j) => (at(&a[j], 0), images),
        UnitInput::Pooled(j) => (at(p[j].as_ref().expect("pooled"), 0), images),
    }
}

/// Batch norm's statistics in a forward pass: moved in training, read in
/// evaluation.
pub(crate) enum Running<'a, Buf> {
    Train(&'a mut Buf),
    Eval(&'a Buf),
}
