//! NVRTC compilation of `kernels/cu/*.cu`, once per process and target,
//! and the loaded functions, once per device.
//!
//! # Which code the driver gets
//!
//! PTX is compiled again by the driver when it loads, and PTX from an NVRTC
//! newer than the driver fails there with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`.
//! So when NVRTC knows the device's architecture the kernels are compiled to
//! its machine code (`sm_XY`, a cubin), which the driver loads as it is,
//! whatever its version. Only a device newer than NVRTC gets PTX, for the
//! newest architecture NVRTC knows below it; that needs a driver at least
//! as new as NVRTC, and [`Target::choose`] says so plainly when it is not.
//!
//! Compiling takes a few hundred milliseconds, so the code is kept in a
//! process-wide cell per target and every backend on the same device shares
//! one loaded module.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;

use crate::error::{KernelError, Message, Result};

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
    pub bias_activation: CudaFunction,
    pub col_sum: CudaFunction,
    pub gather_rows: CudaFunction,
    pub softmax_xent: CudaFunction,
    pub mse: CudaFunction,
    pub sgd_step: CudaFunction,
    pub adam_step: CudaFunction,
    pub im2col: CudaFunction,
    pub col2im: CudaFunction,
    pub pool2d: CudaFunction,
    pub pool2d_backward: CudaFunction,
    pub bn_stats: CudaFunction,
    pub bn_apply: CudaFunction,
    pub bn_backward_reduce: CudaFunction,
    pub bn_backward_dx: CudaFunction,
    pub add: CudaFunction,
    pub augment: CudaFunction,
    pub grouped_pointers: CudaFunction,
    /// What was compiled for this device, and why (for `salus-tune devices`).
    pub target: Target,
}

/// What NVRTC compiles the kernels to for one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `sm_XY` (machine code) or `compute_XY` (PTX).
    pub arch: String,
    pub nvrtc: (i32, i32),
    pub driver: (i32, i32),
}

impl Target {
    pub fn is_cubin(&self) -> bool {
        self.arch.starts_with("sm_")
    }

    /// The target for a device of compute capability `cc` (e.g. 90), given
    /// the architectures NVRTC supports and both versions.
    pub fn choose(
        cc: i32,
        supported: &[i32],
        nvrtc: (i32, i32),
        driver: (i32, i32),
    ) -> std::result::Result<Target, String> {
        if supported.contains(&cc) {
            return Ok(Target {
                arch: format!("sm_{cc}"),
                nvrtc,
                driver,
            });
        }
        let Some(&below) = supported.iter().filter(|&&a| a <= cc).max() else {
            return Err(format!(
                "NVRTC {}.{} supports no architecture at or below the device's sm_{cc} (it knows {supported:?})",
                nvrtc.0, nvrtc.1
            ));
        };
        if nvrtc > driver {
            return Err(format!(
                "the device (sm_{cc}) is newer than NVRTC {}.{}, so the kernels must go to the driver as PTX, \
                 but PTX from NVRTC {}.{} is newer than the driver (CUDA {}.{}) accepts; \
                 use an NVRTC no newer than the driver (put its lib folder first in LD_LIBRARY_PATH) or update the driver",
                nvrtc.0, nvrtc.1, nvrtc.0, nvrtc.1, driver.0, driver.1
            ));
        }
        Ok(Target {
            arch: format!("compute_{below}"),
            nvrtc,
            driver,
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_cubin() {
            "machine code"
        } else {
            "PTX"
        };
        write!(
            f,
            "kernels: {} ({kind}), NVRTC {}.{}, driver CUDA {}.{}",
            self.arch, self.nvrtc.0, self.nvrtc.1, self.driver.0, self.driver.1
        )?;
        if self.nvrtc > self.driver {
            write!(
                f,
                " (NVRTC newer than the driver: machine code avoids its PTX limit)"
            )?;
        }
        Ok(())
    }
}

/// NVRTC's version and the architectures it compiles for (as 75, 80, 90...).
pub fn nvrtc_info() -> Result<((i32, i32), Vec<i32>)> {
    use cudarc::nvrtc::sys;
    let (mut major, mut minor, mut n) = (0, 0, 0);
    // SAFETY: out-pointers to locals, and a buffer of the size NVRTC gave.
    unsafe {
        sys::nvrtcVersion(&mut major, &mut minor)
            .result()
            .map_err(|e| KernelError::device("nvrtcVersion", e))?;
        sys::nvrtcGetNumSupportedArchs(&mut n)
            .result()
            .map_err(|e| KernelError::device("nvrtcGetNumSupportedArchs", e))?;
        let mut archs = vec![0i32; n.max(0) as usize];
        sys::nvrtcGetSupportedArchs(archs.as_mut_ptr())
            .result()
            .map_err(|e| KernelError::device("nvrtcGetSupportedArchs", e))?;
        Ok(((major, minor), archs))
    }
}

/// The driver's CUDA version, as (13, 0).
pub fn driver_version() -> Result<(i32, i32)> {
    let mut v = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| KernelError::device("cuDriverGetVersion", e))?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// Options shared by every target: the CPU backend keeps IEEE division
/// and sqrt, so do we, so that the two agree within fp32 rounding.
fn options(arch: Option<&str>) -> Vec<String> {
    let mut o = vec!["--prec-div=true".to_string(), "--prec-sqrt=true".into()];
    if let Some(a) = arch {
        o.push(format!("--gpu-architecture={a}"));
    }
    o
}

/// The PTX of `ops.cu` for NVRTC's default architecture, compiled on first
/// use. NVRTC needs no GPU, so this works (and is tested) on any machine
/// that has the library.
#[cfg(test)]
pub fn ptx() -> Result<Ptx> {
    use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
    static PTX: OnceLock<std::result::Result<Ptx, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        let opts = CompileOptions {
            name: Some("ops.cu".into()),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            ..Default::default()
        };
        compile_ptx_with_opts(OPS_CU, opts).map_err(|e| format!("NVRTC failed on ops.cu: {e}"))
    })
    .clone()
    .map_err(|m| KernelError::device("nvrtcCompileProgram (ops.cu, PTX)", Message(m)))
}

/// `ops.cu` compiled for `arch`: a cubin for `sm_XY`, PTX for `compute_XY`.
/// Kept per architecture for the life of the process.
pub fn image(arch: &str) -> Result<Vec<u8>> {
    static IMAGES: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let mut images = IMAGES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(i) = images.get(arch) {
        return Ok(i.clone());
    }
    let image = compile(arch).map_err(|m| {
        KernelError::device(format!("nvrtcCompileProgram (ops.cu, {arch})"), Message(m))
    })?;
    images.insert(arch.to_string(), image.clone());
    Ok(image)
}

fn compile(arch: &str) -> std::result::Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let src = CString::new(OPS_CU).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, Some(c"ops.cu")).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` lives until destroyed below; buffers have NVRTC's sizes.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options(Some(arch)));
        if let Err(e) = compiled {
            let log = result::get_program_log(prog)
                .map(|l| {
                    let bytes: Vec<u8> =
                        l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            Err(format!("{e:?}: {log}"))
        } else if arch.starts_with("sm_") {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(prog, &mut size)
                .result()
                .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))
                .and_then(|_| {
                    let mut bin = vec![0u8; size];
                    sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast())
                        .result()
                        .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))
                        .map(|_| bin)
                })
        } else {
            result::get_ptx(prog)
                .map(|p| p.iter().map(|&c| c as u8).collect())
                .map_err(|e| format!("{e:?}"))
        }
    };
    // SAFETY: created above and not destroyed yet.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The target for the device behind `cu`.
pub fn target(cu: &Arc<CudaContext>) -> Result<Target> {
    let attr = |a| {
        cu.attribute(a)
            .map_err(|e| KernelError::device("cuDeviceGetAttribute", e))
    };
    let cc = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? * 10
        + attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let (nvrtc, supported) = nvrtc_info()?;
    Target::choose(cc, &supported, nvrtc, driver_version()?).map_err(KernelError::Unavailable)
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
    let target = target(cu)?;
    let mut image = image(&target.arch)?;
    if !target.is_cubin() && image.last() != Some(&0) {
        image.push(0); // PTX is loaded as a C string
    }
    let module = cu
        .load_module(Ptx::from_binary(image))
        .map_err(|e| KernelError::device(format!("cuModuleLoadData (ops.cu, {target})"), e))?;
    let f = |name: &str| {
        module
            .load_function(name)
            .map_err(|e| KernelError::device(format!("cuModuleGetFunction ({name})"), e))
    };
    let set = Arc::new(KernelSet {
        activation: f("activation")?,
        activation_backward: f("activation_backward")?,
        dropout: f("dropout")?,
        bias_add: f("bias_add")?,
        bias_activation: f("bias_activation")?,
        col_sum: f("col_sum")?,
        gather_rows: f("gather_rows")?,
        softmax_xent: f("softmax_xent")?,
        mse: f("mse")?,
        sgd_step: f("sgd_step")?,
        adam_step: f("adam_step")?,
        im2col: f("im2col")?,
        col2im: f("col2im")?,
        pool2d: f("pool2d")?,
        pool2d_backward: f("pool2d_backward")?,
        bn_stats: f("bn_stats")?,
        bn_apply: f("bn_apply")?,
        bn_backward_reduce: f("bn_backward_reduce")?,
        bn_backward_dx: f("bn_backward_dx")?,
        add: f("add")?,
        augment: f("augment")?,
        grouped_pointers: f("grouped_pointers")?,
        target,
    });
    loaded.insert(cu.ordinal(), set.clone());
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether NVRTC can be loaded; without it the test is skipped, or
    /// fails where `SALUS_TUNE_REQUIRE_NVRTC` says it must be there.
    fn nvrtc_for_test(test: &str) -> bool {
        // SAFETY: only tries to open the shared library.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return true;
        }
        if std::env::var_os("SALUS_TUNE_REQUIRE_NVRTC").is_some() {
            panic!("NVRTC is required (SALUS_TUNE_REQUIRE_NVRTC) but libnvrtc.so was not found");
        }
        eprintln!("{test}: skipped: libnvrtc.so was not found");
        false
    }

    /// Compiles the real kernel source wherever NVRTC can be loaded: CI
    /// installs it from PyPI (scripts/test.sh), GPU machines have it.
    #[test]
    fn ops_cu_compiles_with_nvrtc() {
        if !nvrtc_for_test("ops_cu_compiles_with_nvrtc") {
            return;
        }
        let ptx = ptx().unwrap_or_else(|e| panic!("{e}")).to_src();
        for name in [
            "activation",
            "activation_backward",
            "dropout",
            "bias_add",
            "bias_activation",
            "col_sum",
            "gather_rows",
            "softmax_xent",
            "mse",
            "sgd_step",
            "adam_step",
            "im2col",
            "col2im",
            "pool2d",
            "pool2d_backward",
            "bn_stats",
            "bn_apply",
            "bn_backward_reduce",
            "bn_backward_dx",
            "add",
            "augment",
            "grouped_pointers",
        ] {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "no kernel {name} in the PTX"
            );
        }
        // The by-value slot arrays have the sizes of the Rust mirrors in params.rs.
        for (param, bytes) in [
            ("sgd_step_param_2", 20 * MAX_SLOTS),
            ("adam_step_param_2", 24 * MAX_SLOTS),
            ("dropout_param_1", 24 * MAX_SLOTS),
        ] {
            assert!(
                ptx.contains(&format!("{param}[{bytes}]")),
                "{param} is not {bytes} bytes in the PTX"
            );
        }
    }

    #[test]
    fn the_target_is_machine_code_when_nvrtc_knows_the_device() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        // A newer NVRTC than the driver is fine with machine code.
        let t = Target::choose(90, &archs, (13, 1), (13, 0)).unwrap();
        assert_eq!(t.arch, "sm_90");
        assert!(t.is_cubin());
        assert!(t.to_string().contains("NVRTC newer than the driver"), "{t}");
        // A device NVRTC does not know gets PTX for the newest arch below it...
        let t = Target::choose(121, &archs, (13, 0), (13, 0)).unwrap();
        assert_eq!(t.arch, "compute_120");
        // ...which the driver must accept: both versions are named.
        let e = Target::choose(121, &archs, (13, 1), (13, 0)).unwrap_err();
        assert!(
            e.contains("13.1") && e.contains("13.0") && e.contains("PTX"),
            "{e}"
        );
        let e = Target::choose(60, &archs, (13, 0), (13, 0)).unwrap_err();
        assert!(e.contains("sm_60"), "{e}");
    }

    /// Machine code for the H200's architecture, as the device run will load it.
    #[test]
    fn ops_cu_compiles_to_sm_90_machine_code() {
        if !nvrtc_for_test("ops_cu_compiles_to_sm_90_machine_code") {
            return;
        }
        let (_, archs) = nvrtc_info().unwrap();
        assert!(archs.contains(&90), "NVRTC does not know sm_90: {archs:?}");
        let cubin = image("sm_90").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "a cubin is an ELF image");
    }

    #[test]
    fn max_slots_matches_the_cuda_source() {
        assert!(OPS_CU.contains(&format!("#define MAX_SLOTS {MAX_SLOTS}")));
    }
}
