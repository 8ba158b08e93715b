//! Compute backends for salus-tune.
//!
//! # Design
//!
//! One trait, [`Backend`], is what every device provides: buffers that are
//! device handles, host<->device copies, GEMM (single and strided-batched),
//! and the element-wise, loss and optimizer ops an MLP needs, each with its
//! backward pass. The model code in `workers` is generic over it, so the
//! CPU and CUDA run the same trials and the same tests.
//!
//! * **Batched everywhere.** Each op serves `slots` same-shape trials in one
//!   call, with per-slot scalars ([`ops::SgdSlot`], [`ops::AdamSlot`],
//!   [`ops::DropoutSlot`]). A single trial is one slot. Fused execution of
//!   many trials is this form with more slots.
//! * **Execution contexts.** Every op takes a `Ctx`: a Salus lane's thread
//!   pool on the CPU, a stream on CUDA. The caller decides how many threads a
//!   lane may use, so `lanes x threads <= cores` holds.
//! * **No hidden state.** Dropout masks come from a counter-based RNG
//!   ([`rng`]), so a trial's state is just its buffers and its step count.
//! * **Per-step values live in device memory.** Batch indices, dropout
//!   steps and Adam's bias corrections change every iteration; they are
//!   written once per step into a step block ([`StepWords`],
//!   [`Backend::stage_step`]) and read by the kernels, so that the launches
//!   of an iteration do not change and CUDA can replay them as a graph.
//!
//! * **Images are channels-last (NHWC).** A convolution is defined as
//!   `im2col` and the GEMM the MLP already uses (what CUDA runs; the CPU
//!   also has Winograd tiles and a direct form for the shapes where they
//!   measured faster), and its output is NHWC again, so bias, activation
//!   and batch norm treat pixels as rows and channels as columns.
//!
//! [`cpu::CpuBackend`] is the CPU implementation: `matrixmultiply` for GEMM,
//! hand-split tasks on a rayon pool for the rest.

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;
pub mod device_tests;
pub mod error;
pub mod ops;
pub mod rng;

pub use backend::{Backend, DeviceKind, Moments, View, ViewMut, at, at_mut, gemm_each};
pub use cpu::{CpuBackend, CpuBuf, CpuCtx};
pub use error::{KernelError, Result};
pub use ops::{
    ADAM_STEP_WORDS, AUGMENT_STREAM, Activation, ActivationOp, AdamSlot, AugmentSlot, BatchNorm,
    Batched, Conv2d, ConvGemm, DROPOUT_STEP_WORDS, DropoutSlot, Gemm, GroupedGemm, Images, Loss,
    ParamRun, Pool2d, PoolKind, Precision, RowsWithin, STATS_LEN, SgdSlot, Slots, StepWords,
    round_bf16,
};
