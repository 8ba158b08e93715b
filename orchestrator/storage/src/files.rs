//! Files written so that a crash leaves the old one or the new one, never
//! half of one: synced, renamed into place, their folder synced. The
//! writer puts checkpoints in place inside its transactions with these,
//! and `checkpoint` saves and loads through them outside a run.

use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` through a temporary file and a rename, so a
/// crash leaves the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = staging_path(path);
    let written = write_synced(&tmp, bytes).and_then(|()| put_in_place(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Where the checkpoint that `path` replaced waits for the commit.
pub fn previous_of(path: &Path) -> PathBuf {
    let mut prev = path.as_os_str().to_os_string();
    prev.push(".prev");
    PathBuf::from(prev)
}

/// Puts the staged `tmp` in place at `path` and keeps what was there as
/// [`previous_of`]`(path)`, until [`settled`] drops it (the commit) or
/// restores it (a rollback).
pub fn replace_keeping_previous(tmp: &Path, path: &Path) -> std::io::Result<()> {
    let prev = previous_of(path);
    let _ = std::fs::remove_file(&prev);
    match std::fs::hard_link(path, &prev) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::rename(tmp, path)
}

/// After the transaction that put `path` in place: committed, the previous
/// checkpoint goes; rolled back, it comes back.
pub fn settled(path: &Path, committed: bool) {
    let prev = previous_of(path);
    if committed {
        let _ = std::fs::remove_file(prev);
    } else if prev.exists() {
        let _ = std::fs::rename(prev, path);
    } else {
        // There was none before: the trial had no checkpoint.
        let _ = std::fs::remove_file(path);
    }
}

/// This process's temporary name for `path`: two processes (or two
/// threads of one) never write through the same one.
pub fn staging_path(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".{}-{n}.tmp", std::process::id()));
    PathBuf::from(tmp)
}

/// Writes `bytes` to a new file at `path` and syncs it. The folder is made
/// first, and made again if a finishing process removed it (empty) in
/// between: a shared folder comes and goes.
pub fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    // Racing a peer that keeps removing the folder: retry for a while, not
    // a number of times (on a loaded machine a few dozen tries can all
    // lose); a real error comes back at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut f = loop {
        let again = || std::time::Instant::now() < deadline;
        if let Some(dir) = dir {
            match std::fs::create_dir_all(dir) {
                // `create_dir_all` reports the folder as existing and then
                // finds it gone when a peer removes it in between.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && again() => {
                    std::thread::yield_now();
                    continue;
                }
                made => made?,
            }
        }
        match std::fs::File::create(path) {
            Ok(f) => break f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && again() => {
                std::thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    };
    f.write_all(bytes)?;
    f.sync_all()
}

/// Renames the synced file `tmp` to `path`, and syncs the folder: without
/// both syncs, a power loss can leave the new name pointing at nothing
/// written.
fn put_in_place(tmp: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(tmp, path)?;
    sync_folder_of(path)
}

/// Syncs the folder that holds `path`, so that a rename into it survives
/// a power loss. The writer renames checkpoints inside its transaction and
/// syncs their folder once after the commit, outside the write lock.
pub fn sync_folder_of(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_survives_a_peer_removing_the_empty_shared_folder() {
        // A finishing process removes the folder whenever it finds it
        // empty; a peer saving at that moment makes it again.
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        let stop = std::sync::atomic::AtomicBool::new(false);
        let failed = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::remove_dir(&shared);
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            });
            let failed = (0..100).find_map(|i| {
                let path = shared.join(format!("trial-{i}.state"));
                let saved = write_atomic(&path, b"state");
                let _ = std::fs::remove_file(&path);
                saved.err().map(|e| format!("save {i}: {e}"))
            });
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            failed
        });
        assert_eq!(failed, None);
    }

    #[test]
    fn two_writers_of_one_checkpoint_never_share_a_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trial-1.state");
        let (a, b) = (staging_path(&path), staging_path(&path));
        assert_ne!(a, b);
        assert!(
            a.to_string_lossy()
                .contains(&std::process::id().to_string())
        );
    }
}
