//! Fused execution end to end: trials of one shape that start together
//! train as fused groups, record the same results as unfused runs, and
//! leave their groups when the median rule prunes them.

mod common;

use common::*;
use salus_tune::storage::TrialState;

fn fixed_shape_study(name: &str, fuse: usize, pruner: &str) -> String {
    format!(
        "[study]\nname = \"{name}\"\ntrials = 8\nseed = 5\nmetric = \"val_loss\"\n\n\
         [model]\ndepth = 1\nwidth = 32\n\n\
         [train]\noptimizer = \"adam\"\ndropout = {{ float = [0.0, 0.3] }}\nlr = {{ float = [1e-3, 3e-2], log = true }}\n\
         weight_decay = {{ float = [1e-6, 1e-3], log = true }}\nbatch_size = 64\nepochs = 4\n\n\
         [sampler]\nkind = \"random\"\n\n{pruner}\
         [scheduler]\nmax_concurrent = 8\nlanes = 2\nfuse = {fuse}\n"
    )
}

fn fused_with(db: &std::path::Path) -> i64 {
    scalar(
        db,
        "SELECT COUNT(*) FROM trial_system_attributes WHERE key = 'salus:fused_with'",
    )
}

#[test]
fn fused_trials_store_what_unfused_trials_store() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "fused.toml", &fixed_shape_study("fused", 4, ""));
    write(dir.path(), "alone.toml", &fixed_shape_study("alone", 1, ""));
    for f in ["fused.toml", "alone.toml"] {
        let out = run_in(dir.path(), &[f, "--no-progress"]);
        assert_eq!(out.status.code(), Some(0), "{f}: {}", text(&out));
    }
    let (fdb, adb) = (dir.path().join("fused.db"), dir.path().join("alone.db"));
    assert_eq!(fused_with(&fdb), 8, "every trial ran in a group of four");
    assert_eq!(fused_with(&adb), 0, "fuse = 1 turns fusion off");
    let (fused, alone) = (trials(&fdb, None), trials(&adb, None));
    assert_eq!(fused.len(), 8);
    for (f, a) in fused.iter().zip(&alone) {
        assert_eq!(f.state, TrialState::Complete);
        assert_eq!(f.params, a.params, "same seed, same proposals");
        assert_eq!(f.intermediate.len(), 4, "one value per epoch");
        for ((fs, fv), (as_, av)) in f.intermediate.iter().zip(&a.intermediate) {
            assert_eq!(fs, as_);
            assert!(
                (fv - av).abs() <= 1e-4 * av.abs().max(1.0),
                "trial {} step {fs}: fused {fv}, alone {av}",
                f.number
            );
        }
    }
}

#[test]
fn the_median_rule_prunes_members_out_of_their_groups() {
    let dir = tempfile::tempdir().unwrap();
    let pruner = "[pruner]\nkind = \"median\"\nstartup_trials = 0\nwarmup_steps = 1\n\n";
    write(
        dir.path(),
        "m.toml",
        &fixed_shape_study("median", 8, pruner),
    );
    let out = run_in(dir.path(), &["m.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("median.db");
    assert_eq!(fused_with(&db), 8);
    let all = trials(&db, None);
    assert_eq!(all.len(), 8);
    let pruned: Vec<_> = all
        .iter()
        .filter(|t| t.state == TrialState::Pruned)
        .collect();
    let complete = all
        .iter()
        .filter(|t| t.state == TrialState::Complete)
        .count();
    assert!(!pruned.is_empty() && complete > 0, "{all:?}");
    assert_eq!(pruned.len() + complete, 8);
    for t in &pruned {
        // Pruned after its report at step 2 or 3, never at the end.
        let steps: Vec<i64> = t.intermediate.iter().map(|(s, _)| *s).collect();
        assert!((2..4).contains(&(steps.len() as i64)), "{steps:?}");
        assert_eq!(steps, (1..=steps.len() as i64).collect::<Vec<_>>());
    }
}
