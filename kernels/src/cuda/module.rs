//! NVRTC compilation of `kernels/cu/*.cu`, once per process, and the loaded
//! functions, once per device.
//!
//! Compiling takes a few hundred milliseconds, so the PTX is kept in a
//! process-wide cell and every backend on the same device shares one loaded
//! module.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

use crate::error::{KernelError, Result};

/// The CUDA source of every kernel, embedded at build time.
pub const OPS_CU: &str = include_str!("../../cu/ops.cu");

/// Slots per launch: must equal `MAX_SLOTS` in `ops.cu`.
pub const MAX_SLOTS: usize = 32;

/// The loaded kernels of one device.
pub struct KernelSet {
    pub activation: CudaFunction,
    pub activation_backward: CudaFunction,
    pub dropout: CudaFunction,
    pub bias_add: CudaFunction,
    pub col_sum: CudaFunction,
    pub gather_rows: CudaFunction,
    pub softmax_xent: CudaFunction,
    pub mse: CudaFunction,
    pub sgd_step: CudaFunction,
    pub adam_step: CudaFunction,
}

/// The PTX of `ops.cu`, compiled on first use. NVRTC needs no GPU, so this
/// works (and is tested) on any machine that has the library.
pub fn ptx() -> Result<Ptx> {
    static PTX: OnceLock<std::result::Result<Ptx, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        let opts = CompileOptions {
            name: Some("ops.cu".into()),
            // The CPU backend keeps IEEE division and sqrt; so do we, so
            // that the two agree within fp32 rounding.
            prec_div: Some(true),
            prec_sqrt: Some(true),
            ..Default::default()
        };
        compile_ptx_with_opts(OPS_CU, opts).map_err(|e| format!("NVRTC failed on ops.cu: {e}"))
    })
    .clone()
    .map_err(KernelError::Device)
}

/// The kernels of the device behind `cu`, compiled and loaded on first use.
pub fn kernels(cu: &Arc<CudaContext>) -> Result<Arc<KernelSet>> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<KernelSet>>>> = OnceLock::new();
    let mut loaded = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(k) = loaded.get(&cu.ordinal()) {
        return Ok(k.clone());
    }
    let module = cu
        .load_module(ptx()?)
        .map_err(|e| KernelError::Device(format!("loading ops.cu: {e}")))?;
    let f = |name: &str| {
        module
            .load_function(name)
            .map_err(|e| KernelError::Device(format!("kernel {name}: {e}")))
    };
    let set = Arc::new(KernelSet {
        activation: f("activation")?,
        activation_backward: f("activation_backward")?,
        dropout: f("dropout")?,
        bias_add: f("bias_add")?,
        col_sum: f("col_sum")?,
        gather_rows: f("gather_rows")?,
        softmax_xent: f("softmax_xent")?,
        mse: f("mse")?,
        sgd_step: f("sgd_step")?,
        adam_step: f("adam_step")?,
    });
    loaded.insert(cu.ordinal(), set.clone());
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the real kernel source wherever NVRTC can be loaded: CI
    /// installs it from PyPI (scripts/test.sh), GPU machines have it.
    #[test]
    fn ops_cu_compiles_with_nvrtc() {
        // SAFETY: only tries to open the shared library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            if std::env::var_os("SALUS_TUNE_REQUIRE_NVRTC").is_some() {
                panic!(
                    "NVRTC is required (SALUS_TUNE_REQUIRE_NVRTC) but libnvrtc.so was not found"
                );
            }
            eprintln!("ops_cu_compiles_with_nvrtc: skipped: libnvrtc.so was not found");
            return;
        }
        let ptx = ptx().unwrap_or_else(|e| panic!("{e}")).to_src();
        for name in [
            "activation",
            "activation_backward",
            "dropout",
            "bias_add",
            "col_sum",
            "gather_rows",
            "softmax_xent",
            "mse",
            "sgd_step",
            "adam_step",
        ] {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "no kernel {name} in the PTX"
            );
        }
        // The by-value slot arrays have the sizes of the Rust mirrors in params.rs.
        for (param, bytes) in [
            ("sgd_step_param_1", 16 * MAX_SLOTS),
            ("adam_step_param_1", 32 * MAX_SLOTS),
            ("dropout_param_1", 24 * MAX_SLOTS),
        ] {
            assert!(
                ptx.contains(&format!("{param}[{bytes}]")),
                "{param} is not {bytes} bytes in the PTX"
            );
        }
    }

    #[test]
    fn max_slots_matches_the_cuda_source() {
        assert!(OPS_CU.contains(&format!("#define MAX_SLOTS {MAX_SLOTS}")));
    }
}
