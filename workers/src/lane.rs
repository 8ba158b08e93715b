//! A lane: one execution context and its arena of ephemeral buffers.
//!
//! Salus splits a trial's memory in two. Persistent memory (weights,
//! optimizer state) belongs to the trial. Ephemeral memory (activations,
//! gradients) is needed only inside an iteration, so trials that take
//! turns on a lane share it: the lane keeps one [`Workspace`] per group
//! shape and hands it to whichever trial is stepping.

use std::collections::HashMap;
use std::sync::Arc;

use kernels::Backend;

use crate::error::Result;
pub use crate::group::GroupShape;
use crate::group::{OptimizerOrder, Workspace};

/// An execution context with its ephemeral arena.
pub struct Lane<B: Backend> {
    backend: Arc<B>,
    ctx: B::Ctx,
    id: usize,
    threads: usize,
    /// The host threads the lane was made with.
    max_threads: usize,
    workspaces: HashMap<GroupShape, Workspace<B>>,
    /// Whether trials may replay captured iterations here (CUDA graphs).
    graphs: bool,
    optimizer_order: OptimizerOrder,
}

impl<B: Backend> Lane<B> {
    /// A lane whose ops may use `threads` host threads.
    pub fn new(backend: Arc<B>, id: usize, threads: usize) -> Result<Self> {
        let ctx = backend.new_ctx(threads)?;
        let optimizer_order = OptimizerOrder::default_for(&*backend);
        Ok(Lane {
            backend,
            ctx,
            id,
            threads: threads.max(1),
            max_threads: threads.max(1),
            workspaces: HashMap::new(),
            graphs: false,
            optimizer_order,
        })
    }

    /// Lets trials capture an iteration once and replay it (where the
    /// backend can: CUDA). Off by default; `[scheduler] graphs` sets it.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs = on && self.backend.graphs_supported();
    }

    /// Whether trials replay captured iterations on this lane.
    pub fn graphs(&self) -> bool {
        self.graphs
    }

    /// When trials stepping here run their optimizer steps (by default
    /// [`OptimizerOrder::default_for`] the backend). Both orders give the
    /// same bits; `bench packing --optimizer-order` measures them.
    pub fn set_optimizer_order(&mut self, order: OptimizerOrder) {
        self.optimizer_order = order;
    }

    pub fn optimizer_order(&self) -> OptimizerOrder {
        self.optimizer_order
    }

    pub fn id(&self) -> usize {
        self.id
    }

    /// Host threads the lane's ops split work over now.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Splits the lane's work over `threads` of the host threads it was
    /// made with, from the next op on (see [`Backend::set_threads`]): the
    /// Salus core widens a lane that runs alone into idle lanes' cores.
    pub fn set_threads(&mut self, threads: usize) {
        let threads = threads.clamp(1, self.max_threads);
        if threads != self.threads {
            self.backend.set_threads(&mut self.ctx, threads);
            self.threads = threads;
        }
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The backend and this lane's context, borrowed together.
    pub fn device(&mut self) -> (&B, &mut B::Ctx) {
        (&self.backend, &mut self.ctx)
    }

    /// Runs `f` on this lane's host thread (see [`Backend::enter`]). Step a
    /// trial inside it: on the CPU this is what makes intra-op threads pay.
    pub fn run<R: Send>(&mut self, f: impl FnOnce(&mut Self) -> R + Send) -> R {
        let host = self.backend.host_threads(&self.ctx);
        let backend = self.backend.clone();
        backend.enter(&host, || f(self))
    }

    /// Marks the end of what this lane has queued, and waits for what was
    /// queued before the previous mark: see [`Backend::sync_previous`].
    pub fn sync_previous(&mut self) -> Result<()> {
        Ok(self.backend.sync_previous(&mut self.ctx)?)
    }

    /// Waits for everything queued on this lane.
    pub fn sync(&mut self) -> Result<()> {
        Ok(self.backend.sync(&mut self.ctx)?)
    }

    /// The backend, the context and the workspace for `shape`, allocated on first use.
    pub(crate) fn parts(
        &mut self,
        shape: &GroupShape,
    ) -> Result<(&B, &mut B::Ctx, &mut Workspace<B>)> {
        if !self.workspaces.contains_key(shape) {
            let ws = Workspace::new(&*self.backend, shape)?;
            self.workspaces.insert(shape.clone(), ws);
        }
        let ws = self.workspaces.get_mut(shape).expect("inserted above");
        Ok((&self.backend, &mut self.ctx, ws))
    }

    /// Elements allocated in this lane's arena, buffer by buffer.
    pub fn arena_allocated_elems(&self) -> usize {
        self.workspaces
            .values()
            .map(|ws| ws.allocated_elems(&*self.backend))
            .sum()
    }

    /// Bytes held by this lane's arena.
    pub fn arena_bytes(&self) -> usize {
        self.workspaces.keys().map(|s| s.ephemeral_bytes()).sum()
    }

    /// Frees the workspace of one shape (no job of that shape is left here).
    pub fn release_workspace(&mut self, shape: &GroupShape) {
        self.workspaces.remove(shape);
    }

    /// Frees the arena; it is rebuilt on the next step.
    pub fn release_arena(&mut self) {
        self.workspaces.clear();
    }
}
