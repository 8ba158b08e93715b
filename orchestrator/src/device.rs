//! `--device auto|cpu|cuda:N`: which backend runs the trials.
//!
//! The backends are generic parameters everywhere below the CLI, so this is
//! the one place that names them: [`open`] opens the chosen device
//! and [`OpenedDevice::run`] calls a generic function with it.

use std::sync::Arc;

use kernels::cuda::{self, CudaBackend};
use kernels::{Backend, CpuBackend};

use crate::error::{Error, Result};

/// A device the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Auto,
    Cpu,
    Cuda(usize),
}

/// Parses `--device`. Bad syntax is an input error (exit 2).
pub fn parse(arg: &str) -> Result<Request> {
    match arg {
        "auto" => Ok(Request::Auto),
        "cpu" => Ok(Request::Cpu),
        "cuda" => Ok(Request::Cuda(0)),
        d => match d.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(Request::Cuda(n)),
            _ => Err(Error::Input(format!(
                "--device {d}: expected auto, cpu, cuda or cuda:N (N a device number)"
            ))),
        },
    }
}

/// Something that runs on whichever backend was opened.
pub trait OnBackend {
    type Output;
    fn run<B: Backend>(self, backend: Arc<B>) -> Result<Self::Output>;
}

/// An opened device.
#[derive(Clone)]
pub enum OpenedDevice {
    Cpu(Arc<CpuBackend>),
    Cuda(Arc<CudaBackend>),
}

impl OpenedDevice {
    /// Runs `job` on this device's backend.
    pub fn run<J: OnBackend>(self, job: J) -> Result<J::Output> {
        match self {
            OpenedDevice::Cpu(b) => job.run(b),
            OpenedDevice::Cuda(b) => job.run(b),
        }
    }
}

/// Opens the requested device. `auto` takes CUDA when the libraries and a
/// device are present, and says on stderr which it chose; an explicit
/// `cuda:N` that cannot be opened is an input error (exit 2).
pub fn open(request: Request) -> Result<OpenedDevice> {
    match request {
        Request::Cpu => Ok(OpenedDevice::Cpu(Arc::new(CpuBackend::new()))),
        Request::Cuda(n) => CudaBackend::new(n)
            .map(|b| OpenedDevice::Cuda(Arc::new(b)))
            .map_err(|e| Error::Input(format!("--device cuda:{n}: CUDA is not usable here: {e}"))),
        Request::Auto => {
            match cuda::probe().and_then(|_| CudaBackend::new(0).map_err(|e| e.to_string())) {
                Ok(b) => {
                    eprintln!("device: {} (auto)", b.name());
                    Ok(OpenedDevice::Cuda(Arc::new(b)))
                }
                Err(why) => {
                    eprintln!("device: cpu (auto; no CUDA: {why})");
                    Ok(OpenedDevice::Cpu(Arc::new(CpuBackend::new())))
                }
            }
        }
    }
}

/// One line per compute device this machine offers, for `salus-tune devices`.
pub fn report() -> Vec<String> {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    let cpu = CpuBackend::new();
    let mut lines = vec![format!(
        "cpu: {}, {:.1} GiB",
        cpu.name(),
        gib(cpu.memory_bytes())
    )];
    match cuda::probe() {
        Ok(n) => {
            for i in 0..n {
                match CudaBackend::new(i) {
                    Ok(b) => {
                        lines.push(format!(
                            "{}, {:.1} GiB free",
                            b.name(),
                            gib(b.memory_bytes())
                        ));
                        // The kernels' target and versions, and any fallback
                        // (no memory pool, no pinned memory) taken here.
                        lines.extend(b.notes().into_iter().map(|n| format!("  {n}")));
                    }
                    Err(e) => lines.push(format!("cuda:{i}: cannot be opened: {e}")),
                }
            }
        }
        Err(why) => lines.push(format!("cuda: none ({why})")),
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_and_rejects_the_rest() {
        assert_eq!(parse("auto").unwrap(), Request::Auto);
        assert_eq!(parse("cpu").unwrap(), Request::Cpu);
        assert_eq!(parse("cuda").unwrap(), Request::Cuda(0));
        assert_eq!(parse("cuda:3").unwrap(), Request::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, Error::Input(_)), "{bad}: {e}");
            assert!(e.to_string().contains("expected auto, cpu"), "{e}");
        }
    }
}
