//! What worker processes really hold on the GPU, where NVML can be loaded.
//!
//! A client reports what its framework's allocator holds. A process holds
//! more: its CUDA context, cuDNN and cuBLAS workspaces, a second framework
//! that allocates on its own. A ledger that planned with the report alone
//! would let that memory make neighbours run out. Where the driver's
//! NVML library is present (opened at run time by `nvml-wrapper`, as
//! cudarc opens CUDA, so the binary builds and runs anywhere), each worker
//! process's usage is read every [`CHECK_EVERY`] at its `ready`: the plan
//! takes it as the trial's floor (and the largest reading as the floor of
//! trials not yet read), and a worker that holds clearly more than it
//! reports ([`unreported`]) is named once, as a [`Warning`] the run prints
//! and stores as an event. Without NVML (the CPU, a container without the
//! driver's library) nothing is read and nothing is said.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

/// How often one worker's usage is read.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// A CUDA context alone takes a few hundred MiB: less is not worth a word.
const SLACK: u64 = 512 << 20;

/// Bytes a worker holds beyond what its client reported, when worth a
/// warning: more than 512 MiB and more than a quarter of the report (a
/// context and its workspaces are expected; a second framework is not).
pub fn unreported(real: u64, reported: u64) -> Option<u64> {
    let extra = real.saturating_sub(reported);
    (extra > SLACK && extra > reported / 4).then_some(extra)
}

/// A worker that holds memory its client does not report.
#[derive(Debug, Clone, PartialEq)]
pub struct Warning {
    pub trial: u64,
    pub pid: u32,
    pub real: u64,
    pub reported: u64,
}

impl Warning {
    pub fn message(&self) -> String {
        let mib = |b: u64| b >> 20;
        format!(
            "trial {}: its worker (pid {}) holds {} MiB of GPU memory, its client reports {} MiB: \
             the rest (a CUDA context, cuDNN workspaces, another framework) is planned from NVML's \
             reading from now on; declare [worker] memory or report it to plan for it from the start",
            self.trial,
            self.pid,
            mib(self.real),
            mib(self.reported)
        )
    }
}

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().ok()).as_ref()
}

/// Warnings not yet taken by the run.
fn pending() -> &'static Mutex<Vec<Warning>> {
    static PENDING: OnceLock<Mutex<Vec<Warning>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// Device memory process `pid` uses, summed over the GPUs NVML sees
/// (NVML numbers devices its own way; a pid names the worker on any).
/// `None` without NVML or where the driver does not say.
pub fn process_usage(pid: u32) -> Option<u64> {
    let nvml = nvml()?;
    let mut total = None;
    for i in 0..nvml.device_count().ok()? {
        let Ok(device) = nvml.device_by_index(i) else {
            continue;
        };
        for p in device.running_compute_processes().unwrap_or_default() {
            if let (true, UsedGpuMemory::Used(bytes)) = (p.pid == pid, p.used_gpu_memory) {
                *total.get_or_insert(0) += bytes;
            }
        }
    }
    total
}

/// Queues a warning when worker `pid`, read to hold `real` bytes, holds
/// clearly more than `reported`; returns whether it is (or was) warned
/// about. A process warns once: a serving worker runs trial after trial,
/// and the same context would be named for each.
pub fn check(trial: u64, pid: u32, real: u64, reported: u64) -> bool {
    static WARNED: OnceLock<Mutex<std::collections::HashSet<u32>>> = OnceLock::new();
    if unreported(real, reported).is_none() {
        return false;
    }
    let first = WARNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(pid);
    if first {
        pending()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Warning {
                trial,
                pid,
                real,
                reported,
            });
    }
    true
}

/// The warnings queued since the last call.
pub fn take_warnings() -> Vec<Warning> {
    std::mem::take(&mut *pending().lock().unwrap_or_else(|e| e.into_inner()))
}

/// Whether NVML could be loaded here, for `salus-tune devices`.
pub fn describe() -> String {
    match nvml() {
        Some(n) => match n.sys_driver_version() {
            Ok(v) => format!("nvml: loaded (driver {v}): workers' real usage is checked"),
            Err(_) => "nvml: loaded: workers' real usage is checked".into(),
        },
        None => "nvml: not loaded: workers' real usage is not checked".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_is_expected_a_second_framework_is_not() {
        const MIB: u64 = 1 << 20;
        // A 300 MiB context beside 2 GiB of tensors: nothing to say.
        assert_eq!(unreported(2348 * MIB, 2048 * MIB), None);
        // 600 MiB beside a 1 GiB report: more than the slack and a quarter.
        assert_eq!(unreported(1624 * MIB, 1024 * MIB), Some(600 * MIB));
        // 600 MiB beside 40 GiB: within a quarter of what is planned.
        assert_eq!(unreported(41560 * MIB, 40960 * MIB), None);
        // Nothing reported at all (a v1 client): all of it is unplanned.
        assert_eq!(unreported(3 << 30, 0), Some(3 << 30));
        // Less than reported: nothing.
        assert_eq!(unreported(MIB, 2 * MIB), None);
    }

    #[test]
    fn a_process_is_named_once_whatever_the_trials_it_serves() {
        const MIB: u64 = 1 << 20;
        // A pid no other test uses.
        let pid = u32::MAX - 7;
        assert!(!check(3, pid, 600 * MIB, 500 * MIB), "within the slack");
        assert!(check(3, pid, 922 * MIB, 162 * MIB));
        assert!(check(4, pid, 922 * MIB, 162 * MIB));
        let said: Vec<_> = take_warnings()
            .into_iter()
            .filter(|w| w.pid == pid)
            .collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert_eq!(said[0].trial, 3);
    }

    #[test]
    fn without_nvml_nothing_is_read_or_said() {
        if nvml().is_some() {
            kernels::device_tests::skipped_because_present(
                "external::nvml::without_nvml_nothing_is_read_or_said",
                "nvml",
                "NVML is loaded here",
            );
            return;
        }
        assert_eq!(process_usage(std::process::id()), None);
    }
}
