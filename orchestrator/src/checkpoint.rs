//! Trial checkpoints: each live trial's model and optimizer state at its
//! latest report point, one file per trial beside the database.
//!
//! `digits-mlp.db` keeps its checkpoints in `digits-mlp.db.checkpoints/`,
//! as `trial-<trial_id>.state` (`workers::TrialSnapshot::to_bytes`). A file is
//! written to a temporary name and renamed, so a crash at any moment leaves
//! either the previous checkpoint or the new one, never half of one. A
//! trial's file is deleted when it finishes, fails or is pruned, and files
//! of trials that are not live any more are swept at the start of a run:
//! disk use is bounded by one state per live trial.
//!
//! During a run the writer task saves checkpoints, after committing the
//! transaction that holds the intermediate values they cover, so that a
//! checkpoint is never ahead of the stored curve.

use std::path::{Path, PathBuf};

use workers::TrialSnapshot;

use crate::storage::TrialId;

/// The checkpoint folder of one database. See the module docs.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    dir: PathBuf,
}

impl Checkpoints {
    /// The folder beside the database file `db`.
    pub fn beside(db: &Path) -> Self {
        let mut name = db.file_name().unwrap_or_default().to_os_string();
        name.push(".checkpoints");
        Checkpoints {
            dir: db.with_file_name(name),
        }
    }

    /// A study's checkpoint folder: `[study] checkpoints` where the file
    /// sets one (a folder every process of the study can reach, for a
    /// study shared across machines); else beside a SQLite database; else,
    /// for a database on a server, `<study name>.checkpoints/` beside the
    /// study file.
    pub fn for_study(study: &crate::study::Study, location: &crate::storage::Location) -> Self {
        if let Some(dir) = &study.checkpoints {
            return Checkpoints { dir: dir.clone() };
        }
        match location {
            crate::storage::Location::Sqlite(db) => Self::beside(db),
            crate::storage::Location::Postgres(_) => Checkpoints {
                dir: study
                    .path
                    .with_file_name(format!("{}.checkpoints", study.name)),
            },
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, trial_id: TrialId) -> PathBuf {
        self.dir.join(format!("trial-{trial_id}.state"))
    }

    /// Writes `trial_id`'s checkpoint atomically; returns its size in bytes.
    pub fn save(&self, trial_id: TrialId, state: &TrialSnapshot) -> std::io::Result<usize> {
        let bytes = state.to_bytes();
        write_atomic(&self.path(trial_id), &bytes)?;
        Ok(bytes.len())
    }

    /// Where `trial_id`'s checkpoint goes (for the writer, which saves it
    /// once the values it covers are committed: see `WriteOp::SaveFile`).
    pub fn path_of(&self, trial_id: TrialId) -> PathBuf {
        self.path(trial_id)
    }

    /// The checkpoint of `trial_id`, if there is a readable one.
    pub fn load(&self, trial_id: TrialId) -> Option<TrialSnapshot> {
        let bytes = std::fs::read(self.path(trial_id)).ok()?;
        TrialSnapshot::from_bytes(&bytes).ok()
    }

    /// Where an external worker of `trial_id` saves its own checkpoint.
    pub fn external_path(&self, trial_id: TrialId) -> PathBuf {
        let _ = std::fs::create_dir_all(&self.dir);
        self.dir.join(format!("trial-{trial_id}.external"))
    }

    /// Every file a trial's checkpoints may use.
    pub fn paths_of(&self, trial_id: TrialId) -> Vec<PathBuf> {
        vec![
            self.path(trial_id),
            self.dir.join(format!("trial-{trial_id}.external")),
        ]
    }

    /// Deletes the files of `finished` trials (left by a crash between a
    /// trial's end and the removal of its checkpoint). The folder may be
    /// shared by other processes: files of trials not known to be
    /// finished stay, half-written ones included.
    pub fn sweep(&self, finished: &[TrialId]) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let done: Vec<String> = finished.iter().map(|t| format!("trial-{t}.")).collect();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if done.iter().any(|k| name.starts_with(k)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a
/// crash leaves the old file or the new one, never half of one. The file is
/// synced before the rename and the folder after it: without both, a power
/// loss can leave the new name pointing at nothing written.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = dir {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use workers::group::SlotState;

    fn state(iteration: u64) -> TrialSnapshot {
        TrialSnapshot {
            fingerprint: 7,
            iteration,
            reports: iteration / 10,
            slot: SlotState {
                params: vec![1.0, -2.5, iteration as f32],
                opt_state: vec![vec![0.5; 3]],
                train_stats: vec![0.0; 4],
                running: vec![0.25, 4.0],
            },
        }
    }

    #[test]
    fn save_load_replace_remove_and_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let c = Checkpoints::beside(&dir.path().join("s.db"));
        assert_eq!(c.dir(), dir.path().join("s.db.checkpoints"));
        assert!(c.load(TrialId(1)).is_none());
        c.save(TrialId(1), &state(10)).unwrap();
        c.save(TrialId(1), &state(20)).unwrap();
        c.save(TrialId(2), &state(30)).unwrap();
        assert_eq!(
            c.load(TrialId(1)),
            Some(state(20)),
            "the newer one replaces the older"
        );
        std::fs::write(c.dir().join("trial-3.state"), b"garbage").unwrap();
        assert!(
            c.load(TrialId(3)).is_none(),
            "a broken file is no checkpoint"
        );
        // Trial 1 finished; 2 runs (perhaps in another process), its
        // half-written file included; 3's broken file is not known finished.
        std::fs::write(c.dir().join("trial-2.state.tmp"), b"half").unwrap();
        std::fs::write(c.dir().join("trial-1.state.tmp"), b"half").unwrap();
        c.sweep(&[TrialId(1)]);
        assert!(c.load(TrialId(1)).is_none() && c.load(TrialId(2)).is_some());
        let mut left: Vec<String> = std::fs::read_dir(c.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["trial-2.state", "trial-2.state.tmp", "trial-3.state"]
        );
        c.sweep(&[TrialId(2), TrialId(3)]);
        assert_eq!(std::fs::read_dir(c.dir()).unwrap().count(), 0);
    }
}
