//! `[scheduler] mps = true`: external workers share the GPU through
//! NVIDIA's Multi-Process Service, under a control daemon of the run's own.
//!
//! The daemon's pipe and log folders are under the run's own folder (the
//! one that holds its worker sockets), so that it never meets a system MPS
//! daemon or another run's; it is told to quit when the run ends. Each
//! worker is started with the daemon's folders and two limits from its
//! grant: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, its memory, and
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, its share of the SMs
//! ([`worker_limits`]).

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The MPS control program, as CUDA installs it.
pub const CONTROL: &str = "nvidia-cuda-mps-control";

/// A running MPS control daemon; quits when dropped.
#[derive(Debug)]
pub struct MpsDaemon {
    control: PathBuf,
    pipe: PathBuf,
    log: PathBuf,
}

/// `program` in the folders of a `PATH`-style list.
pub fn find_on_path(program: &str, path: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// What an MPS client may hold beyond its grant. The limit is hard (the
/// client's allocation fails past it), and a grant measured from a
/// client's report leaves out the CUDA context, cuBLAS's and cuDNN's
/// workspaces and their kernels: several hundred MiB for PyTorch (589 MiB
/// read on an H200, 2026-12-04, for a 44 MiB report). Without it every
/// PyTorch worker but the first ran out of memory on its first copy.
pub const MPS_HEADROOM: u64 = 1 << 30;

/// A worker's MPS limits from its grant: its memory in MiB (the grant plus
/// [`MPS_HEADROOM`]), and its share of the SMs in percent: its share of the
/// budget, but never less than a lane's (`100 / lanes`) nor more than all
/// of them.
pub fn worker_limits(grant: u64, budget: u64, lanes: usize) -> (u64, u32) {
    let mib = (grant + MPS_HEADROOM).div_ceil(1 << 20);
    let lane_share = 100 / lanes.max(1) as u64;
    let memory_share = (100 * grant).div_ceil(budget.max(1));
    let percent = memory_share.max(lane_share).clamp(1, 100);
    (mib, percent as u32)
}

impl MpsDaemon {
    /// Starts the daemon for the run's CUDA devices, its folders under
    /// `dir`. The error names what is missing.
    pub fn start(dir: &Path) -> Result<MpsDaemon, String> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let control = find_on_path(CONTROL, &path).ok_or_else(|| {
            format!(
                "[scheduler] mps = true, but {CONTROL} is not on PATH: it comes with NVIDIA's driver \
                 and CUDA toolkit; install it, or set mps = false"
            )
        })?;
        let (pipe, log) = (dir.join("mps-pipe"), dir.join("mps-log"));
        for d in [&pipe, &log] {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("cannot create the MPS folder {}: {e}", d.display()))?;
        }
        let daemon = MpsDaemon { control, pipe, log };
        let out = daemon
            .command()
            .arg("-d")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", daemon.control.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} -d failed ({}): {}{}; its log is in {}",
                daemon.control.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim(),
                daemon.log.display()
            ));
        }
        Ok(daemon)
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.control);
        c.env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log);
        c
    }

    /// The environment of a worker granted `grant` bytes of a `budget`
    /// shared by `lanes` lanes. Each worker sees only its own device
    /// (`CUDA_VISIBLE_DEVICES`), which it numbers 0.
    pub fn worker_env(&self, grant: u64, budget: u64, lanes: usize) -> Vec<(String, String)> {
        let (mib, percent) = worker_limits(grant, budget, lanes);
        vec![
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                self.pipe.display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".into(),
                self.log.display().to_string(),
            ),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
                format!("0={mib}M"),
            ),
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
                percent.to_string(),
            ),
        ]
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        if let Ok(mut child) = self.command().stdin(Stdio::piped()).spawn() {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(b"quit\n");
            }
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_becomes_memory_and_sm_limits() {
        // A quarter of the budget on 8 lanes: a quarter of the SMs, and
        // the grant's memory plus a GiB for the context and workspaces.
        assert_eq!(worker_limits(2 << 30, 8 << 30, 8), (3072, 25));
        // A small grant still gets a lane's share of the SMs.
        assert_eq!(worker_limits(100 << 20, 80 << 30, 4), (1124, 25));
        // Rounded up to whole MiB and percent; never past all of them.
        assert_eq!(worker_limits((1 << 20) + 1, 1 << 30, 1), (1026, 100));
        assert_eq!(worker_limits(16 << 30, 8 << 30, 2), (17408, 100));
        assert_eq!(worker_limits(0, 1 << 30, 200), (1024, 1));
    }

    #[test]
    fn a_missing_control_program_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(find_on_path(CONTROL, dir.path().as_os_str()), None);
        let fake = dir.path().join(CONTROL);
        std::fs::write(&fake, "").unwrap();
        assert_eq!(find_on_path(CONTROL, dir.path().as_os_str()), Some(fake));
    }
}
