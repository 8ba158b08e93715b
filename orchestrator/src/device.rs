//! `--device auto|all|cpu|cuda:N|cuda:0,cuda:1|cpu:0,cpu:1`: which
//! backend runs the trials, on how many devices.
//!
//! The backends are generic parameters everywhere below the CLI, so this is
//! the one place that names them: [`open_all`] opens the chosen devices
//! (all of one kind) and [`OpenedDevices::run`] calls a generic function
//! with them. A study run puts one Salus core on each
//! (`salus_core::devices`); the benchmarks take one device ([`open`]).

use std::sync::Arc;

use kernels::cuda::{self, CudaBackend};
use kernels::{Backend, CpuBackend};

use crate::error::{Error, Result};

/// The devices the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// CUDA device 0 where CUDA works, else the CPU.
    Auto,
    /// Every CUDA device, else the CPU.
    All,
    /// The whole CPU as one device (`cpu`), or split into numbered devices
    /// (`cpu:0,cpu:1`), each with its share of the cores.
    Cpu(Vec<usize>),
    /// These CUDA devices.
    Cuda(Vec<usize>),
}

/// Parses `--device` (or `[scheduler] devices` joined by commas). Bad
/// syntax is an input error (exit 2).
pub fn parse(arg: &str) -> Result<Request> {
    let bad = |why: &str| {
        Error::Input(format!(
            "--device {arg}: {why}; expected auto, all, cpu, cuda, cuda:N, or a \
             comma-separated list of one kind (cuda:0,cuda:1 or cpu:0,cpu:1)"
        ))
    };
    match arg {
        "auto" => return Ok(Request::Auto),
        "all" => return Ok(Request::All),
        "cpu" => return Ok(Request::Cpu(Vec::new())),
        _ => {}
    }
    let (mut cpus, mut gpus) = (Vec::new(), Vec::new());
    for part in arg.split(',').map(str::trim) {
        let (list, n) = match part.split_once(':') {
            None if part == "cuda" => (&mut gpus, Some(0)),
            Some(("cuda", n)) => (&mut gpus, n.parse::<usize>().ok()),
            Some(("cpu", n)) => (&mut cpus, n.parse::<usize>().ok()),
            _ => return Err(bad(&format!("'{part}' is not a device"))),
        };
        let Some(n) = n else {
            return Err(bad(&format!("'{part}' has no device number")));
        };
        if list.contains(&n) {
            return Err(bad(&format!("'{part}' is named twice")));
        }
        list.push(n);
    }
    match (cpus.is_empty(), gpus.is_empty()) {
        (true, false) => Ok(Request::Cuda(gpus)),
        (false, true) => Ok(Request::Cpu(cpus)),
        _ => Err(bad("a run uses devices of one kind")),
    }
}

/// Something that runs on whichever devices were opened.
pub trait OnDevices {
    type Output;
    fn run<B: Backend>(self, backends: Vec<Arc<B>>) -> Result<Self::Output>;
}

/// Something that runs on one device (a benchmark).
pub trait OnBackend {
    type Output;
    fn run<B: Backend>(self, backend: Arc<B>) -> Result<Self::Output>;
}

/// Opened devices, all of one kind.
#[derive(Clone)]
pub enum OpenedDevices {
    Cpu(Vec<Arc<CpuBackend>>),
    Cuda(Vec<Arc<CudaBackend>>),
}

impl OpenedDevices {
    /// Runs `job` on these devices' backends.
    pub fn run<J: OnDevices>(self, job: J) -> Result<J::Output> {
        match self {
            OpenedDevices::Cpu(b) => job.run(b),
            OpenedDevices::Cuda(b) => job.run(b),
        }
    }

    /// How many.
    pub fn len(&self) -> usize {
        match self {
            OpenedDevices::Cpu(b) => b.len(),
            OpenedDevices::Cuda(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One opened device.
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

fn open_cuda(n: usize) -> Result<Arc<CudaBackend>> {
    CudaBackend::new(n)
        .map(Arc::new)
        .map_err(|e| Error::Input(format!("--device cuda:{n}: CUDA is not usable here: {e}")))
}

/// Opens the requested devices. `auto` takes CUDA device 0 when the
/// libraries and a device are present, and `all` every CUDA device; each
/// says on stderr which it chose. An explicit `cuda:N` that cannot be
/// opened is an input error (exit 2).
pub fn open_all(request: Request) -> Result<OpenedDevices> {
    match request {
        Request::Cpu(list) if list.is_empty() => {
            Ok(OpenedDevices::Cpu(vec![Arc::new(CpuBackend::new())]))
        }
        Request::Cpu(list) => Ok(OpenedDevices::Cpu(
            list.into_iter()
                .map(|i| Arc::new(CpuBackend::numbered(i)))
                .collect(),
        )),
        Request::Cuda(list) => Ok(OpenedDevices::Cuda(
            list.into_iter().map(open_cuda).collect::<Result<_>>()?,
        )),
        Request::Auto | Request::All => {
            let count = if request == Request::All {
                usize::MAX
            } else {
                1
            };
            let opened = cuda::probe().and_then(|n| {
                (0..n.min(count))
                    .map(|i| CudaBackend::new(i).map(Arc::new).map_err(|e| e.to_string()))
                    .collect::<std::result::Result<Vec<_>, _>>()
            });
            let how = if count == 1 { "auto" } else { "all" };
            match opened {
                Ok(b) if !b.is_empty() => {
                    let names: Vec<String> = b
                        .iter()
                        .map(|b| format!("{} {}", b.label(), b.name()))
                        .collect();
                    eprintln!("device: {} ({how})", names.join(", "));
                    Ok(OpenedDevices::Cuda(b))
                }
                Ok(_) => {
                    eprintln!("device: cpu ({how}; no CUDA device)");
                    Ok(OpenedDevices::Cpu(vec![Arc::new(CpuBackend::new())]))
                }
                Err(why) => {
                    eprintln!("device: cpu ({how}; no CUDA: {why})");
                    Ok(OpenedDevices::Cpu(vec![Arc::new(CpuBackend::new())]))
                }
            }
        }
    }
}

/// Opens one device, for the benchmarks: a list is an input error.
pub fn open(request: Request) -> Result<OpenedDevice> {
    let opened = open_all(request)?;
    if opened.len() != 1 {
        return Err(Error::Input(
            "--device: the benchmarks run on one device; name one (cpu, cuda:N)".into(),
        ));
    }
    Ok(match opened {
        OpenedDevices::Cpu(mut b) => OpenedDevice::Cpu(b.remove(0)),
        OpenedDevices::Cuda(mut b) => OpenedDevice::Cuda(b.remove(0)),
    })
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
        assert_eq!(parse("all").unwrap(), Request::All);
        assert_eq!(parse("cpu").unwrap(), Request::Cpu(vec![]));
        assert_eq!(parse("cuda").unwrap(), Request::Cuda(vec![0]));
        assert_eq!(parse("cuda:3").unwrap(), Request::Cuda(vec![3]));
        assert_eq!(parse("cuda:0,cuda:1").unwrap(), Request::Cuda(vec![0, 1]));
        assert_eq!(parse("cpu:0, cpu:1").unwrap(), Request::Cpu(vec![0, 1]));
        for (bad, why) in [
            ("gpu", "not a device"),
            ("cuda:", "no device number"),
            ("cuda:x", "no device number"),
            ("cuda:-1", "no device number"),
            ("CPU", "not a device"),
            ("cpu:0,cuda:1", "one kind"),
            ("cuda:1,cuda:1", "named twice"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, Error::Input(_)), "{bad}: {e}");
            let text = e.to_string();
            assert!(
                text.contains(why) && text.contains("expected auto, all"),
                "{text}"
            );
        }
    }

    #[test]
    fn numbered_cpu_devices_open_with_their_labels() {
        let OpenedDevices::Cpu(b) = open_all(parse("cpu:0,cpu:1").unwrap()).unwrap() else {
            panic!("cpu devices")
        };
        let labels: Vec<String> = b.iter().map(|b| b.label()).collect();
        assert_eq!(labels, ["cpu:0", "cpu:1"]);
        assert!(open(parse("cpu:0,cpu:1").unwrap()).is_err());
        assert!(open(parse("cpu").unwrap()).is_ok());
    }
}
