//! The lock file beside a database, `<database>.lock`: held by the run that
//! found no other run of this host on the database, and released by the OS
//! when that process dies, so a dashboard (or the next run) can tell a live
//! run from a killed one at once.
//!
//! The file is removed when the run ends, so a finished study is its `.db`
//! alone. Removing a lock file races with a process that opened it just
//! before: that process could lock the removed file while a third one locks
//! a new file of the same name. So a lock counts only when the path still
//! names the file that was locked; otherwise taking it starts over.

use std::fs::File;
use std::path::{Path, PathBuf};

/// A run's hold on `<database>.lock`, if it got it.
pub struct RunLock {
    path: PathBuf,
    held: Option<File>,
}

impl RunLock {
    /// The lock file of the database at `db`.
    pub fn path_for(db: &Path) -> PathBuf {
        let mut name = db.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        db.with_file_name(name)
    }

    /// Takes the lock unless another process holds it. Never waits.
    pub fn take(db: &Path) -> Self {
        let path = Self::path_for(db);
        // A removal can overtake each attempt at most once per ending run.
        for _ in 0..8 {
            let Ok(file) = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
            else {
                break;
            };
            if file.try_lock().is_err() {
                break;
            }
            if names_file(&path, &file) {
                return RunLock {
                    path,
                    held: Some(file),
                };
            }
        }
        RunLock { path, held: None }
    }

    /// Whether this run holds the lock: no other run of this host is alive
    /// on the database.
    pub fn sole(&self) -> bool {
        self.held.is_some()
    }

    /// Whether some process holds the lock of the database at `db` now.
    pub fn held_elsewhere(db: &Path) -> bool {
        match File::open(Self::path_for(db)) {
            // Taking it for an instant: it is released when `f` drops.
            Ok(f) => f.try_lock().is_err(),
            Err(_) => false,
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        if self.held.is_some() {
            // Removed while still locked; the lock goes with the handle.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether `path` still names the open `file` (not a newer file of that name).
#[cfg(unix)]
fn names_file(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn names_file(path: &Path, _file: &File) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_file_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        let first = RunLock::take(&db);
        assert!(first.sole());
        assert!(RunLock::held_elsewhere(&db));
        let second = RunLock::take(&db);
        assert!(!second.sole(), "a second run on this host is not alone");
        drop(second);
        assert!(
            RunLock::path_for(&db).exists(),
            "only the holder removes it"
        );
        drop(first);
        assert!(!RunLock::path_for(&db).exists());
        assert!(!RunLock::held_elsewhere(&db));
        assert!(RunLock::take(&db).sole());
    }

    #[test]
    fn a_lock_on_a_removed_file_does_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        // Opened just before the holder removed it, locked just after.
        let stale = File::create(RunLock::path_for(&db)).unwrap();
        std::fs::remove_file(RunLock::path_for(&db)).unwrap();
        stale.try_lock().unwrap();
        assert!(!names_file(&RunLock::path_for(&db), &stale));
        let fresh = RunLock::take(&db);
        assert!(fresh.sole(), "a new file of the name is a new lock");
    }
}
