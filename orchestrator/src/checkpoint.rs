//! Trial checkpoints: each live trial's model and optimizer state at its
//! latest report point, one file per trial beside the database.
//!
//! `digits-mlp.db` keeps its checkpoints in `digits-mlp.db.checkpoints/`,
//! as `trial-<trial_id>.state` (`training::TrialSnapshot::to_bytes`). A file is
//! written to a temporary name of its own process and renamed, so a crash
//! at any moment leaves either the previous checkpoint or the new one,
//! never half of one, and two processes never write through one temporary
//! file. A trial's file is deleted when it finishes, fails or is pruned,
//! and files of trials that are not live any more are swept at the start
//! of a run: disk use is bounded by one state per live trial.
//!
//! During a run the writer task puts checkpoints in place inside the
//! transaction that checks the trial's claim (see `storage::writer`), so
//! that a process that lost a trial never replaces or removes the
//! checkpoint of the process that holds it now. A checkpoint is never
//! ahead of the stored curve where it counts: one that is (its values'
//! transaction rolled back, or the process died before the commit) is not
//! loaded on resume. So that such a death does not cost the trial's whole
//! progress, the checkpoint it replaced stays as `trial-<trial_id>.state.prev`
//! until the commit (the last committed one: a second checkpoint of the
//! trial in the same transaction leaves it alone), and resume takes the
//! furthest of the two that the stored curve covers.
//!
//! An external worker writes its own checkpoint, which no transaction can
//! fence: each claim of the trial (attempt) and each step gets its own
//! file, `trial-<trial_id>.a<attempt>.external.s<step>`, and the database
//! records which attempt and step is the trial's latest checkpoint. A file
//! written after that record (the process died before the commit of its
//! own) has another name, so resume never takes a state ahead of the
//! stored curve; the files a committed record makes stale are removed
//! after its commit.

use std::path::{Path, PathBuf};

use training::TrialSnapshot;

use crate::storage::TrialId;
use crate::storage::files::{previous_of, write_atomic};

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

    /// The readable checkpoints of `trial_id`: its current one and the one
    /// it replaced in a transaction that never committed (see the module
    /// docs), for [`furthest_covered`] to choose from.
    pub fn load_all(&self, trial_id: TrialId) -> Vec<TrialSnapshot> {
        let current = self.path(trial_id);
        [previous_of(&current), current]
            .iter()
            .filter_map(|p| std::fs::read(p).ok())
            .filter_map(|b| TrialSnapshot::from_bytes(&b).ok())
            .collect()
    }

    /// Where a PBT member's state at exploit point `generation` goes while
    /// other processes share the study (see `runner::pbt_shared`). Not
    /// one of [`Checkpoints::files_of`]: a receiver of another process may
    /// still read it after the member ended.
    pub fn point_path(&self, trial_id: TrialId, generation: u64) -> PathBuf {
        self.dir.join(format!("pbt-{trial_id}.g{generation}.state"))
    }

    /// Where an external worker of `trial_id`, held by run `run`, saves its
    /// state at point `generation` for other processes; the writer then
    /// puts it at [`Checkpoints::point_path`] under the run's claim.
    pub fn point_saving_path(
        &self,
        trial_id: TrialId,
        generation: u64,
        run: crate::storage::RunId,
    ) -> PathBuf {
        let _ = std::fs::create_dir_all(&self.dir);
        self.dir
            .join(format!("pbt-{trial_id}.g{generation}.run{run}.saving"))
    }

    /// Deletes the exploit-point files of `finished` trials: once no
    /// process of the study runs any more, or at the next start.
    pub fn sweep_points(&self, finished: &[TrialId]) {
        self.remove_files_of(finished, "pbt");
    }

    /// The name attempt `attempt` of an external worker of `trial_id`
    /// saves its checkpoints under, each step's apart
    /// ([`crate::external::worker::checkpoint_at`]; see the module docs).
    pub fn external_path(&self, trial_id: TrialId, attempt: i64) -> PathBuf {
        let _ = std::fs::create_dir_all(&self.dir);
        self.dir
            .join(format!("trial-{trial_id}.a{attempt}.external"))
    }

    /// The checkpoint attempt `attempt` of an external worker of
    /// `trial_id` saved covering the steps up to `step`.
    pub fn external_at(&self, trial_id: TrialId, attempt: i64, step: i64) -> PathBuf {
        crate::external::worker::checkpoint_at(
            &self.external_path(trial_id, attempt),
            step.max(0) as u64,
        )
    }

    /// The external checkpoints of `trial_id` that its checkpoint of
    /// `attempt` at `step` makes stale: earlier steps of the attempt, and
    /// every file of earlier attempts. A later attempt's files (another
    /// process's) and this attempt's staged exploit stay.
    pub fn external_superseded(&self, trial_id: TrialId, attempt: i64, step: i64) -> Vec<PathBuf> {
        let prefix = format!("trial-{trial_id}.a");
        self.files_of(trial_id)
            .into_iter()
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                let Some((k, rest)) = name
                    .strip_prefix(&prefix)
                    .and_then(|r| r.split_once(".external"))
                else {
                    return false;
                };
                let Ok(k) = k.parse::<i64>() else {
                    return false;
                };
                let at = rest.strip_prefix(".s").and_then(|n| n.parse::<i64>().ok());
                match (k.cmp(&attempt), at) {
                    (std::cmp::Ordering::Less, _) => true,
                    (std::cmp::Ordering::Equal, Some(n)) => n < step,
                    // This attempt's staged exploit, or an unnamed file
                    // of an older version of salus-tune.
                    (std::cmp::Ordering::Equal, None) => rest.is_empty(),
                    (std::cmp::Ordering::Greater, _) => false,
                }
            })
            .collect()
    }

    /// Every file of `trial_id` in the folder now: its checkpoint, each
    /// attempt's external one, and what a killed process left staged.
    pub fn files_of(&self, trial_id: TrialId) -> Vec<PathBuf> {
        files_named(&self.dir, &[format!("trial-{trial_id}.")])
    }

    /// Deletes the files of `finished` trials (left by a crash between a
    /// trial's end and the removal of its checkpoint). The folder may be
    /// shared by other processes: files of trials not known to be
    /// finished stay, half-written ones included.
    pub fn sweep(&self, finished: &[TrialId]) {
        self.remove_files_of(finished, "trial");
    }

    /// Deletes every `<kind>-<trial_id>.*` file of `trials` in the folder.
    fn remove_files_of(&self, trials: &[TrialId], kind: &str) {
        let done: Vec<String> = trials.iter().map(|t| format!("{kind}-{t}.")).collect();
        for path in files_named(&self.dir, &done) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The files in `dir` whose names start with one of `prefixes` (none
/// where `dir` cannot be read).
pub fn files_named(dir: &Path, prefixes: &[String]) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    prefixes.iter().any(|p| name.starts_with(p.as_str()))
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Of `candidates`, the furthest one whose report count the stored curve
/// (`stored`: its last step) covers and that `usable` accepts.
pub fn furthest_covered(
    candidates: impl IntoIterator<Item = TrialSnapshot>,
    stored: i64,
    usable: impl Fn(&TrialSnapshot) -> bool,
) -> Option<TrialSnapshot> {
    candidates
        .into_iter()
        .filter(|s| s.reports as i64 <= stored)
        .filter(|s| usable(s))
        .max_by_key(|s| s.reports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::files::{replace_keeping_previous, settled, staging_path, write_synced};
    use training::group::SlotState;

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

    /// A process that dies between putting a checkpoint in place and the
    /// commit of the values it covers leaves one ahead of the stored
    /// curve; the one it replaced is still there, and resume takes it.
    #[test]
    fn a_checkpoint_replaced_before_its_commit_leaves_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let c = Checkpoints::beside(&dir.path().join("s.db"));
        let path = c.path_of(TrialId(4));
        let put = |iteration: u64| {
            let tmp = staging_path(&path);
            write_synced(&tmp, &state(iteration).to_bytes()).unwrap();
            replace_keeping_previous(&tmp, &path).unwrap();
        };
        // The first checkpoint replaces none; a rollback removes it.
        put(20);
        assert_eq!(c.load_all(TrialId(4)).len(), 1);
        settled(&path, false);
        assert!(c.load_all(TrialId(4)).is_empty());
        // Committed: only the new one stays.
        put(20);
        settled(&path, true);
        assert_eq!(c.load_all(TrialId(4)), vec![state(20)]);
        // Put in place, then the process dies: both are there, and with
        // 2 steps stored (the new one's 3rd never committed) the old one
        // is the furthest covered.
        put(30);
        let both = c.load_all(TrialId(4));
        assert_eq!(both, vec![state(20), state(30)]);
        let pick = |stored| furthest_covered(both.clone(), stored, |_| true).map(|s| s.reports);
        assert_eq!(pick(2), Some(2));
        assert_eq!(pick(3), Some(3));
        assert_eq!(pick(1), None);
        assert_eq!(
            furthest_covered(both.clone(), 3, |s| s.reports < 3).map(|s| s.reports),
            Some(2)
        );
        // The next save replaces the stale previous file; a rollback then
        // brings back what was current before it.
        put(40);
        settled(&path, false);
        assert_eq!(c.load(TrialId(4)), Some(state(30)));
        assert!(!previous_of(&path).exists());
        // A sweep takes the previous file too.
        put(50);
        c.sweep(&[TrialId(4)]);
        assert!(c.files_of(TrialId(4)).is_empty());
    }

    /// Each step of an external attempt has its own file, so a save never
    /// overwrites the one the database names; a committed record makes
    /// the earlier steps and earlier attempts stale, never a later
    /// attempt's files (another process's) or the staged exploit.
    #[test]
    fn an_external_checkpoint_supersedes_earlier_steps_and_attempts_only() {
        let dir = tempfile::tempdir().unwrap();
        let c = Checkpoints::beside(&dir.path().join("s.db"));
        let t = TrialId(9);
        assert_ne!(c.external_at(t, 2, 9), c.external_at(t, 2, 10));
        let touch = |p: PathBuf| std::fs::write(&p, b"state").unwrap();
        touch(c.external_path(t, 1));
        touch(c.external_at(t, 1, 30));
        touch(crate::external::worker::exploit_path(
            &c.external_path(t, 1),
        ));
        touch(c.external_at(t, 2, 9));
        touch(c.external_at(t, 2, 10));
        touch(c.external_at(t, 2, 11));
        touch(crate::external::worker::exploit_path(
            &c.external_path(t, 2),
        ));
        touch(c.external_at(t, 3, 4));
        touch(c.external_at(TrialId(91), 1, 1));
        touch(c.path_of(t));
        let mut stale = c.external_superseded(t, 2, 10);
        stale.sort();
        let mut want = vec![
            c.external_path(t, 1),
            c.external_at(t, 1, 30),
            crate::external::worker::exploit_path(&c.external_path(t, 1)),
            c.external_at(t, 2, 9),
        ];
        want.sort();
        assert_eq!(stale, want);
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
