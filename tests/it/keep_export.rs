//! `[study] keep` and `salus-tune export`: the best (or every) COMPLETE
//! trial's final weights are stored, and the exported model reproduces the
//! trial's validation accuracy when run outside salus-tune.

use std::path::Path;

use crate::common::*;
use safetensors::SafeTensors;
use salus_tune::output;
use salus_tune::storage::TrialState;
use salus_tune::study::Direction;

fn floats(t: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let v = t.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let data = v
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (v.shape().to_vec(), data)
}

/// Validation accuracy of the exported MLP (ReLU hidden layers) on the
/// study's own split, computed here in f64 from the files alone.
fn accuracy_of_export(dir: &Path, study_file: &Path) -> f64 {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let t = SafeTensors::deserialize(&bytes).unwrap();
    let card: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap();
    assert_eq!(card["activation"], "relu");
    let layers = card["hidden"].as_array().unwrap().len() + 1;
    let study = salus_tune::study::load(study_file).unwrap();
    let data = study.load_data().unwrap();
    // The exported standardisation is the split's.
    assert_eq!(floats(&t, "input.mean").1, data.feature_mean);
    assert_eq!(floats(&t, "input.std").1, data.feature_std);
    let f = data.features;
    let mut right = 0;
    for r in 0..data.n_val {
        let mut x: Vec<f64> = data.val_x[r * f..(r + 1) * f]
            .iter()
            .map(|&v| v as f64)
            .collect();
        for i in 0..layers {
            let (shape, w) = floats(&t, &format!("layer{i}.weight"));
            let (_, b) = floats(&t, &format!("layer{i}.bias"));
            let (fan_in, fan_out) = (shape[0], shape[1]);
            assert_eq!(fan_in, x.len());
            let mut y: Vec<f64> = b.iter().map(|&v| v as f64).collect();
            for (k, xk) in x.iter().enumerate() {
                for (j, yj) in y.iter_mut().enumerate() {
                    *yj += xk * w[k * fan_out + j] as f64;
                }
            }
            if i + 1 < layers {
                y.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            x = y;
        }
        let predicted = (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
        right += usize::from(predicted == data.val_y[r] as usize);
    }
    right as f64 / data.n_val as f64
}

#[test]
fn the_best_trial_is_kept_and_its_export_reproduces_its_accuracy() {
    // Two trials per lane, so that trials meet to fuse (the CPU's default
    // without a pruner is one per lane).
    for (name, extra) in [
        ("fused", "\n[scheduler]\nmax_concurrent = 4\n"),
        ("alone", "\n[scheduler]\nmax_concurrent = 4\nfuse = 1\n"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "s.toml", &(small_study(name, 5) + extra));
        let out = run_in(dir.path(), &["s.toml"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let db = dir.path().join(format!("{name}.db"));
        let stored = trials(&db, None);
        let best = output::best(&stored, Direction::Maximize).unwrap();
        // keep = "best" (the default): one model, the best trial's.
        assert_eq!(scalar(&db, "SELECT COUNT(*) FROM salus_models"), 1);
        assert_eq!(
            scalar(
                &db,
                "SELECT t.number FROM salus_models m JOIN trials t USING (trial_id)"
            ),
            best.number.0
        );
        let export = dir.path().join("model");
        let out = run_in(
            dir.path(),
            &["export", "s.toml", "--out", export.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(
            text(&out).contains(&format!("trial {} of study '{name}'", best.number)),
            "{}",
            text(&out)
        );
        let accuracy = accuracy_of_export(&export, &file);
        let n_val = 360.0; // 20% of 1797 digits, stratified
        assert!(
            (accuracy - best.value.unwrap()).abs() <= 1.0 / n_val,
            "{name}: exported model {accuracy}, trial {}",
            best.value.unwrap()
        );
        let card: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(export.join("model.json")).unwrap())
                .unwrap();
        assert_eq!(card["trial"]["number"], best.number.0);
        assert_eq!(card["trial"]["fixed"]["epochs"], 3);
        // Another trial has none, and the error names the ones that do.
        let other = stored.iter().find(|t| t.number != best.number).unwrap();
        let out = run_in(
            dir.path(),
            &[
                "export",
                "s.toml",
                "--trial",
                &other.number.to_string(),
                "--out",
                "x",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            text(&out).contains(&format!(
                "trial {} of study '{name}' has no kept model; trials with one: {}",
                other.number, best.number
            )),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn keep_all_keeps_every_complete_trial_and_none_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let study = |name: &str, keep: &str| {
        small_study(name, 4).replace("seed = 3", &format!("seed = 3\nkeep = \"{keep}\""))
    };
    write(dir.path(), "a.toml", &study("all", "all"));
    assert_eq!(run_in(dir.path(), &["a.toml"]).status.code(), Some(0));
    let db = dir.path().join("all.db");
    let complete = trials(&db, None)
        .iter()
        .filter(|t| t.state == TrialState::Complete)
        .count() as i64;
    assert_eq!(complete, 4);
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM salus_models"), complete);

    write(dir.path(), "n.toml", &study("none", "none"));
    assert_eq!(run_in(dir.path(), &["n.toml"]).status.code(), Some(0));
    assert_eq!(
        scalar(
            &dir.path().join("none.db"),
            "SELECT COUNT(*) FROM salus_models"
        ),
        0
    );
    let out = run_in(dir.path(), &["export", "n.toml", "--out", "x"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("none has one (set [study] keep"),
        "{}",
        text(&out)
    );
}
