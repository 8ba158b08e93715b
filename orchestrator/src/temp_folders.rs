//! This process's folders in the temporary directory, and the sweep of
//! those that processes killed without a chance to clean up left behind.
//!
//! A run keeps its external workers' sockets in `salus-tune-<pid>`, and a
//! bench its scripts, client and checkpoints in `salus-tune-bench-<pid>`;
//! both are removed when the process ends normally or with an error. A
//! process killed with `kill -9` (or by the out-of-memory killer) cannot,
//! and its bench folder can hold hundreds of megabytes of checkpoints.
//! So `run` and `bench` sweep, once at start, the folders of processes
//! that are gone.
//!
//! A folder is swept only where its process is known to be gone (no
//! `/proc/<pid>`, so never where there is no `/proc`) and the folder has
//! not changed for [`MIN_AGE`]. The age is the margin for a process that
//! `/proc` does not show, one in another pid namespace sharing this
//! temporary directory: a live run creates a socket for each worker it
//! starts, which changes its folder, and a worker's socket is needed only
//! until the worker connects. In a socket folder only the sockets go; a
//! folder that still holds anything else (an MPS daemon's pipes) stays.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a gone process's folder must have been unchanged to be swept.
pub const MIN_AGE: Duration = Duration::from_secs(3600);

const SOCKETS: &str = "salus-tune-";
const BENCH: &str = "salus-tune-bench-";

/// This process's folder for worker sockets (and its MPS daemon's).
pub fn socket_dir() -> PathBuf {
    std::env::temp_dir().join(format!("{SOCKETS}{}", std::process::id()))
}

/// This process's folder for what a bench writes: the scripts and client
/// the binary carries, workers' checkpoints.
pub fn bench_dir() -> PathBuf {
    std::env::temp_dir().join(format!("{BENCH}{}", std::process::id()))
}

/// What a folder in the temporary directory is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// `salus-tune-<pid>`: a run's worker sockets.
    Sockets { pid: u32 },
    /// `salus-tune-bench-<pid>`: a bench's files.
    Bench { pid: u32 },
}

impl Owned {
    /// The folder named `name`, if it is one of ours.
    pub fn parse(name: &str) -> Option<Self> {
        if let Some(pid) = name.strip_prefix(BENCH) {
            return pid.parse().ok().map(|pid| Owned::Bench { pid });
        }
        let pid = name.strip_prefix(SOCKETS)?;
        pid.parse().ok().map(|pid| Owned::Sockets { pid })
    }

    fn pid(self) -> u32 {
        match self {
            Owned::Sockets { pid } | Owned::Bench { pid } => pid,
        }
    }
}

/// Whether to sweep folder `name`, unchanged for `age`, from the process
/// `me`: ours by name, another process's, that process gone (`pid_exists`
/// answers `Some(false)`), and old enough.
pub fn stale(
    name: &str,
    age: Duration,
    me: u32,
    pid_exists: impl Fn(i64) -> Option<bool>,
) -> Option<Owned> {
    let owned = Owned::parse(name)?;
    let gone = owned.pid() != me && pid_exists(owned.pid() as i64) == Some(false);
    (gone && age >= MIN_AGE).then_some(owned)
}

/// Sweeps the folders of gone processes from `tmp` (see the module docs);
/// returns those it removed.
pub fn sweep(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    let now = SystemTime::now();
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // Not followed: a link by one of our names is not swept.
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_dir() {
            continue;
        }
        // A folder changed "in the future" (a clock step) is not old.
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        let path = e.path();
        let gone = match stale(&name, age, std::process::id(), storage::pid_exists) {
            None => continue,
            Some(Owned::Bench { .. }) => std::fs::remove_dir_all(&path).is_ok(),
            Some(Owned::Sockets { .. }) => {
                remove_sockets(&path);
                !path.exists()
            }
        };
        if gone {
            removed.push(path);
        }
    }
    removed
}

/// [`sweep`] of the temporary directory, once per process.
pub fn sweep_once() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        sweep(&std::env::temp_dir());
    });
}

/// Removes the trial sockets in `dir`, then `dir` if that leaves it empty.
/// (An MPS daemon's folders there are its own.)
pub fn remove_sockets(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "sock") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = MIN_AGE;

    #[test]
    fn names_are_read_as_ours_or_not() {
        assert_eq!(
            Owned::parse("salus-tune-41"),
            Some(Owned::Sockets { pid: 41 })
        );
        assert_eq!(
            Owned::parse("salus-tune-bench-7"),
            Some(Owned::Bench { pid: 7 })
        );
        for other in [
            "salus-tune-",
            "salus-tune-bench-",
            "salus-tune-x1",
            "salus-tune-bench-12a",
            "salus-tune-1.sock",
            "torchinductor_me",
            "salus-tune-bench",
        ] {
            assert_eq!(Owned::parse(other), None, "{other}");
        }
    }

    #[test]
    fn only_old_folders_of_gone_processes_are_stale() {
        let gone = |_| Some(false);
        assert_eq!(
            stale("salus-tune-41", HOUR, 1, gone),
            Some(Owned::Sockets { pid: 41 })
        );
        assert_eq!(
            stale("salus-tune-bench-41", 2 * HOUR, 1, gone),
            Some(Owned::Bench { pid: 41 })
        );
        // Too recent: maybe a live process that /proc does not show.
        assert_eq!(
            stale("salus-tune-41", HOUR - Duration::from_secs(1), 1, gone),
            None
        );
        // Alive, or cannot be told (no /proc).
        assert_eq!(stale("salus-tune-41", 9 * HOUR, 1, |_| Some(true)), None);
        assert_eq!(stale("salus-tune-41", 9 * HOUR, 1, |_| None), None);
        // This process's own, and names that are not ours.
        assert_eq!(stale("salus-tune-41", 9 * HOUR, 41, gone), None);
        assert_eq!(stale("salus-tune-bench-41", 9 * HOUR, 41, gone), None);
        assert_eq!(stale("something-41", 9 * HOUR, 1, gone), None);
    }
}
