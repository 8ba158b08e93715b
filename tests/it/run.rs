//! The binary end to end: a study runs, stores what Optuna expects,
//! resumes, refuses a changed space, survives failing trials and Ctrl-C.

use crate::common::*;
use salus_tune::storage::TrialState;

#[test]
fn a_six_trial_digits_study_completes_and_stores_everything() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("six", 6));
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Best trial: ") && stdout.contains("val_accuracy: 0.9"),
        "{stdout}"
    );

    let db = dir.path().join("six.db");
    let trials = trials(&db, Some("six"));
    assert_eq!(trials.len(), 6);
    for t in &trials {
        assert_eq!(t.state, TrialState::Complete);
        assert!((0.0..=1.0).contains(&t.value.unwrap()), "an accuracy");
        assert_eq!(
            t.intermediate.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "one value per epoch"
        );
        assert_eq!(
            t.intermediate.last().unwrap().1,
            t.value.unwrap(),
            "the final report is the value"
        );
        let names: Vec<&str> = t.params.iter().map(|p| p.name.as_str()).collect();
        assert!(names.contains(&"lr") && names.contains(&"width") && names.contains(&"optimizer"));
        let sgd = t
            .params
            .iter()
            .any(|p| p.name == "optimizer" && p.internal == 0.0);
        assert_eq!(
            names.contains(&"sgd.momentum"),
            sgd,
            "momentum exactly when sgd"
        );
    }
    assert_eq!(
        trials.iter().map(|t| t.number.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5]
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM trial_values WHERE value_type = 'FINITE'"
        ),
        6
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_trials WHERE iterations = total_iterations AND persistent_bytes > 0"
        ),
        6
    );
    assert_eq!(scalar(&db, "SELECT schema_version FROM version_info"), 12);
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM alembic_version WHERE version_num = 'v3.2.0.a'"
        ),
        1
    );
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM salus_best_trials WHERE rank = 1"),
        1
    );
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM salus_learning_curves"),
        18
    );

    // `best` agrees with the stored values, in every format.
    let best = run_in(dir.path(), &["best", "s.toml", "--format", "json"]);
    assert_eq!(best.status.code(), Some(0), "{}", text(&best));
    let json: serde_json::Value = serde_json::from_slice(&best.stdout).unwrap();
    let top = trials
        .iter()
        .map(|t| t.value.unwrap())
        .fold(f64::MIN, f64::max);
    assert_eq!(json["value"].as_f64().unwrap(), top);
    assert!(json["params"]["optimizer"].is_string() && json["params"]["width"].is_i64());
    let table = text(&run_in(dir.path(), &["best", "s.toml"]));
    assert!(table.starts_with("Best trial: "), "{table}");
    let csv = text(&run_in(
        dir.path(),
        &["trials", "--storage", "sqlite:///six.db", "--format", "csv"],
    ));
    assert_eq!(csv.lines().count(), 7, "{csv}");
    assert!(csv.starts_with("number,state,value,duration_s,"), "{csv}");
    // CSV is for programs: values and float parameters with every digit.
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let number: i64 = cells[0].parse().unwrap();
        let t = trials.iter().find(|t| t.number.0 == number).unwrap();
        assert_eq!(
            cells[col("value")].parse::<f64>().unwrap(),
            t.value.unwrap()
        );
        let lr = t.params.iter().find(|p| p.name == "lr").unwrap().internal;
        assert_eq!(cells[col("lr")].parse::<f64>().unwrap(), lr, "{line}");
    }
    // The views' params are typed JSON: an int stays an int, a boolean a
    // boolean (a categorical of booleans, as Optuna stores one, added here).
    execute(
        &db,
        "INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) \
         SELECT trial_id, 'flag', 1.0, '{\"name\": \"CategoricalDistribution\", \"attributes\": {\"choices\": [false, true]}}' \
         FROM trials WHERE number = 0",
    );
    let params: serde_json::Value = serde_json::from_str(
        &scalar_text(
            &db,
            "SELECT params FROM salus_trial_summary WHERE number = 0",
        )
        .unwrap(),
    )
    .unwrap();
    assert!(params["width"].is_i64(), "{params}");
    assert!(params["lr"].is_f64(), "{params}");
    assert!(params["optimizer"].is_string(), "{params}");
    assert_eq!(params["flag"], serde_json::Value::Bool(true), "{params}");
    assert_eq!(
        scalar(
            &db,
            "SELECT typeof(value) = 'integer' FROM salus_params WHERE param_name = 'width' LIMIT 1"
        ),
        1
    );
}

#[test]
fn rerunning_resumes_and_a_changed_space_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("again", 3));
    assert_eq!(run_in(dir.path(), &["s.toml"]).status.code(), Some(0));
    let first = trials(&dir.path().join("again.db"), None);

    // The budget is met: nothing new runs.
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out).contains("resuming study 'again'"),
        "{}",
        text(&out)
    );
    assert_eq!(trials(&dir.path().join("again.db"), None), first);

    // A larger budget adds trials after the finished ones, which stay as they were.
    assert_eq!(
        run_in(dir.path(), &["s.toml", "--trials", "5"])
            .status
            .code(),
        Some(0)
    );
    let more = trials(&dir.path().join("again.db"), None);
    assert_eq!(more.len(), 5);
    assert_eq!(&more[..3], &first[..]);
    let params: Vec<_> = more.iter().map(|t| t.params.clone()).collect();
    assert!(
        params[3..].iter().all(|p| !params[..3].contains(p)),
        "resumed sampling does not repeat earlier points"
    );

    // The same name with another search space is bad input.
    write(
        dir.path(),
        "s.toml",
        &small_study("again", 3).replace("[16, 32]", "[16, 64]"),
    );
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("different search space ('width' changed"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_diverging_trial_fails_and_the_study_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let study = "[study]\nname = \"nan\"\ntrials = 4\nseed = 1\n[model]\ndepth = 1\nwidth = 16\n\
                 [train]\noptimizer = \"sgd\"\nlr = { choices = [0.01, 1e30] }\nbatch_size = 64\nepochs = 2\n";
    write(dir.path(), "s.toml", study);
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let trials = trials(&dir.path().join("nan.db"), None);
    assert_eq!(trials.len(), 4);
    let failed: Vec<_> = trials
        .iter()
        .filter(|t| t.state == TrialState::Fail)
        .collect();
    assert!(!failed.is_empty() && failed.len() < 4, "{trials:?}");
    for t in &failed {
        assert!(
            t.fail_reason.as_deref().unwrap().contains("diverged"),
            "{t:?}"
        );
        assert!(t.value.is_none());
    }
    assert_eq!(
        scalar(
            &dir.path().join("nan.db"),
            "SELECT COUNT(*) FROM trial_system_attributes WHERE \"key\" = 'fail_reason'"
        ),
        failed.len() as i64
    );
}

#[test]
fn a_run_that_completes_no_trial_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let study = "[study]\nname = \"allnan\"\ntrials = 2\n[model]\ndepth = 1\nwidth = 16\n\
                 [train]\noptimizer = \"sgd\"\nlr = 1e30\nbatch_size = 64\nepochs = 1\n";
    write(dir.path(), "s.toml", study);
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no trial completed"), "{}", text(&out));
    let trials = trials(&dir.path().join("allnan.db"), None);
    assert!(
        trials.len() == 2 && trials.iter().all(|t| t.state == TrialState::Fail),
        "{trials:?}"
    );
}

#[test]
fn more_adds_trials_and_a_met_target_says_so() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("more", 2));
    assert_eq!(run_in(dir.path(), &["s.toml"]).status.code(), Some(0));
    // The target is met: the rerun says so instead of doing nothing silently.
    let again = run_in(dir.path(), &["s.toml"]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(
        text(&again).contains("already has 2 finished trials (the target is 2)"),
        "{}",
        text(&again)
    );
    let more = run_in(dir.path(), &["s.toml", "--more", "2"]);
    assert_eq!(more.status.code(), Some(0), "{}", text(&more));
    let stored = trials(&dir.path().join("more.db"), None);
    assert_eq!(stored.len(), 4, "2 more than the 2 finished");
    assert!(stored.iter().all(|t| t.state == TrialState::Complete));
    // A seed given on resume is not silently mixed in.
    let seeded = run_in(dir.path(), &["s.toml", "--more", "1", "--seed", "7"]);
    assert_eq!(seeded.status.code(), Some(0), "{}", text(&seeded));
    assert!(
        text(&seeded).contains("warning: --seed 7 on a resumed study"),
        "{}",
        text(&seeded)
    );
    let both = run_in(dir.path(), &["s.toml", "--more", "1", "--trials", "9"]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both));
}

#[test]
fn the_database_is_one_file_when_the_run_ends() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("onefile", 2));
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("onefile.db");
    let wal = dir.path().join("onefile.db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "the write-ahead log is folded in"
    );
    assert!(
        !dir.path().join("onefile.db.checkpoints").exists(),
        "no empty checkpoints folder is left"
    );
    assert!(
        !dir.path().join("onefile.db.lock").exists(),
        "no lock file is left"
    );
    // A copy of the .db alone is the whole study.
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    let stored = trials(&copy, None);
    assert_eq!(stored.len(), 2);
    assert!(stored.iter().all(|t| t.state == TrialState::Complete));
}

#[test]
fn the_run_stops_after_max_consecutive_failures() {
    let dir = tempfile::tempdir().unwrap();
    let study = "[study]\nname = \"streak\"\ntrials = 10\nmax_consecutive_failures = 3\n\
                 [model]\ndepth = 1\nwidth = 16\n[train]\noptimizer = \"sgd\"\nlr = 1e30\n\
                 batch_size = 64\nepochs = 1\n[scheduler]\nmax_concurrent = 1\n";
    write(dir.path(), "s.toml", study);
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(
            "stopping: 3 trials failed in a row (max_consecutive_failures); the last: diverged"
        ),
        "{}",
        text(&out)
    );
    let stored = trials(&dir.path().join("streak.db"), None);
    assert_eq!(stored.len(), 3, "no trial starts after the third failure");
    assert!(stored.iter().all(|t| t.state == TrialState::Fail));
}

#[test]
fn a_data_mistake_leaves_no_study_and_an_empty_study_can_be_redefined() {
    let dir = tempfile::tempdir().unwrap();
    let file = |metric: &str, batch: u32, extra: &str| {
        format!(
            "[study]\nname = \"redef\"\ntrials = 2\nmetric = \"{metric}\"\n{extra}\n[model]\ndepth = 1\n\
             width = {{ choices = [16, 32] }}\n[train]\nbatch_size = {batch}\nepochs = 1\n"
        )
    };
    let db = dir.path().join("redef.db");
    // A data mistake is found before the study is created.
    write(dir.path(), "s.toml", &file("val_accuracy", 5000, ""));
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("training split has only"),
        "{}",
        text(&out)
    );
    assert!(!db.exists(), "a data mistake creates no database");
    // Another study makes the database (its tables) in the same file.
    write(
        dir.path(),
        "o.toml",
        &small_study("other", 1).replace("seed = 3", "seed = 3\nstorage = \"redef.db\""),
    );
    assert_eq!(run_in(dir.path(), &["o.toml"]).status.code(), Some(0));
    // An empty study of that name, as `optuna.create_study` makes one
    // (MINIMIZE by default), or a first run that stopped before any trial.
    execute(&db, "INSERT INTO studies (study_name) VALUES ('redef')");
    execute(
        &db,
        "INSERT INTO study_directions (direction, study_id, objective) \
         SELECT 'MINIMIZE', study_id, 0 FROM studies WHERE study_name = 'redef'",
    );
    // The file maximises val_accuracy: the empty study takes its definition.
    write(dir.path(), "s.toml", &file("val_accuracy", 64, ""));
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("it has no trial yet, so the file redefines it"),
        "{}",
        text(&out)
    );
    assert_eq!(trials(&db, Some("redef")).len(), 2);
    assert_eq!(
        scalar_text(
            &db,
            "SELECT d.direction FROM study_directions d JOIN studies s USING (study_id) \
             WHERE s.study_name = 'redef'"
        )
        .as_deref(),
        Some("MAXIMIZE")
    );
    // With trials stored, a changed definition is refused as before.
    write(dir.path(), "s.toml", &file("val_loss", 64, ""));
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("start a new study from this file with --fork NEW_NAME"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_continuous_target_is_caught_by_check_and_before_the_study_exists() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..120)
        .map(|i| format!("{i},{}\n", 100.0 + i as f64 * 1.37))
        .collect();
    write(dir.path(), "houses.csv", &format!("rooms,price\n{rows}"));
    let study = |task: &str| {
        format!(
            "[study]\nname = \"houses\"\ntrials = 1\n{}\n[data]\nsource = \"csv\"\npath = \"houses.csv\"\n\
             target = \"price\"\n{task}\n[model]\ndepth = 1\nwidth = 8\n[train]\nbatch_size = 16\nepochs = 1\n",
            if task.is_empty() {
                ""
            } else {
                "metric = \"val_rmse\""
            }
        )
    };
    write(dir.path(), "s.toml", &study(""));
    for args in [&["check", "s.toml"][..], &["s.toml"][..]] {
        let out = run_in(dir.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains(
                "'price' looks like a continuous target for classification \
                 (it has fractional values such as 101.37); for a numeric target set task = \"regression\" in [data]"
            ),
            "{}",
            text(&out)
        );
    }
    assert!(!dir.path().join("houses.db").exists());
    // Fixed as the message says, the same study runs; check shows the split.
    write(dir.path(), "s.toml", &study("task = \"regression\""));
    let out = run_in(dir.path(), &["check", "s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("1 features, regression; 96 training rows, 24 validation rows (0.2)"),
        "{}",
        text(&out)
    );
    assert_eq!(run_in(dir.path(), &["s.toml"]).status.code(), Some(0));
}

/// `[train] precision`: TF32 on the CPU is a study-file error naming the
/// line and key; BF16 runs there, and is stored with each trial as a fixed
/// value, so that a study is never mixed with another precision.
#[test]
fn precision_is_stored_with_each_trial_and_tf32_needs_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let file = |p: &str| {
        StudyFile::digits("prec", 2)
            .set("train", "precision", &format!("\"{p}\""))
            .build()
    };
    let tf32 = file("tf32");
    write(dir.path(), "s.toml", &tf32);
    let out = run_in(dir.path(), &["s.toml", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let line = tf32
        .lines()
        .position(|l| l.starts_with("precision"))
        .unwrap()
        + 1;
    assert!(
        text(&out).contains(&format!("s.toml:{line}:"))
            && text(&out).contains("train.precision")
            && text(&out).contains("precision \"tf32\" needs a CUDA device"),
        "{}",
        text(&out)
    );
    assert!(
        !dir.path().join("prec.db").exists(),
        "a refused run made a database"
    );
    write(dir.path(), "s.toml", &file("bf16"));
    let out = run_in(dir.path(), &["s.toml", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("prec.db");
    let fixed = scalar_text(
        &db,
        "SELECT a.value_json FROM trial_user_attributes a JOIN trials t USING (trial_id) \
         WHERE a.\"key\" = 'fixed_params' AND t.number = 1",
    )
    .unwrap();
    assert!(fixed.contains(r#""precision":"bf16""#), "{fixed}");
    for t in trials(&db, None) {
        assert_eq!(t.state, TrialState::Complete, "{t:?}");
        assert!(t.value.unwrap() > 0.5, "{t:?}");
    }
    // The same study in fp32 would mix two precisions: refused.
    write(dir.path(), "s.toml", &file("fp32"));
    let out = run_in(dir.path(), &["s.toml", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("'precision' changed from \"bf16\" to \"fp32\"")
            || text(&out).contains("'precision' changed from bf16 to fp32"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_changed_fixed_value_is_refused_and_fork_starts_a_new_study() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fixed.db");
    write(dir.path(), "s.toml", &small_study("fixed", 2));
    assert_eq!(run_in(dir.path(), &["s.toml"]).status.code(), Some(0));
    // Each trial records the fixed values it ran with, typed.
    assert_eq!(
        scalar_text(
            &db,
            "SELECT a.value_json FROM trial_user_attributes a JOIN trials t USING (trial_id) \
             WHERE a.\"key\" = 'fixed_params' AND t.number = 1"
        )
        .as_deref(),
        Some(r#"{"batch_size":64,"depth":1,"epochs":3}"#)
    );
    // epochs 3 -> 5 would mix two settings in one study.
    write(
        dir.path(),
        "s.toml",
        &small_study("fixed", 4).replace("epochs = 3", "epochs = 5"),
    );
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(
            "study 'fixed' in fixed.db ran its trials with other fixed values ('epochs' changed from 3 to 5); \
             start a new study from this file with --fork NEW_NAME"
        ),
        "{}",
        text(&out)
    );
    // --fork runs the changed file as a new study and leaves the old one be.
    let out = run_in(dir.path(), &["s.toml", "--fork", "fixed-5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("study 'fixed' stays as it is"),
        "{}",
        text(&out)
    );
    assert_eq!(trials(&db, Some("fixed")).len(), 2);
    assert_eq!(trials(&db, Some("fixed-5")).len(), 4);
    assert_eq!(
        scalar_text(
            &db,
            "SELECT a.value_json FROM study_user_attributes a JOIN studies s USING (study_id) \
             WHERE a.\"key\" = 'forked_from' AND s.study_name = 'fixed-5'"
        )
        .as_deref(),
        Some("\"fixed\"")
    );
    // The same command again resumes the fork.
    let out = run_in(dir.path(), &["s.toml", "--fork", "fixed-5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("resuming study 'fixed-5'"),
        "{}",
        text(&out)
    );
    let out = run_in(dir.path(), &["s.toml", "--fork", "fixed"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn a_trial_that_can_never_fit_the_memory_budget_fails_instead_of_waiting() {
    let dir = tempfile::tempdir().unwrap();
    for (name, fuse) in [("tiny", 1), ("tinyfused", 8)] {
        let study = format!(
            "[study]\nname = \"{name}\"\ntrials = 2\n[model]\ndepth = 1\nwidth = 16\n\
             [train]\nbatch_size = 64\nepochs = 1\n[scheduler]\nmemory = \"1KiB\"\nfuse = {fuse}\n"
        );
        write(dir.path(), "s.toml", &study);
        let out = run_in(dir.path(), &["s.toml"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let trials = trials(&dir.path().join(format!("{name}.db")), None);
        assert_eq!(trials.len(), 2, "{trials:?}");
        for t in &trials {
            assert_eq!(t.state, TrialState::Fail);
            let reason = t.fail_reason.as_deref().unwrap_or("");
            assert!(
                reason.contains("more than the whole budget of 1024 bytes"),
                "{reason}"
            );
        }
    }
}

#[test]
fn an_orphaned_running_trial_is_run_again_first() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("orphan", 2));
    assert_eq!(run_in(dir.path(), &["s.toml"]).status.code(), Some(0));
    let db = dir.path().join("orphan.db");
    let before = trials(&db, None);
    // As if the process had died during trial 1.
    block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query(
            "UPDATE trials SET state = 'RUNNING', datetime_complete = NULL WHERE number = 1",
        )
        .execute(&mut c)
        .await
        .unwrap();
        sqlx::query("DELETE FROM trial_values WHERE trial_id = (SELECT trial_id FROM trials WHERE number = 1)").execute(&mut c).await.unwrap();
    });
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let after = trials(&db, None);
    assert_eq!(after.len(), 2, "no extra trial: the orphan is re-run");
    assert_eq!(after[1].state, TrialState::Complete);
    assert_eq!(after[1].params, before[1].params);
    assert_eq!(
        after[1].value, before[1].value,
        "same parameters, same seed, same result"
    );
}

#[test]
fn ctrl_c_stops_cleanly_and_the_study_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let study = small_study("stop", 40)
        .replace("epochs = 3", "epochs = 40")
        .replace("[16, 32]", "[256, 512]");
    write(dir.path(), "s.toml", &study);
    let mut child = Running::spawn(bin().current_dir(dir.path()).args(["s.toml"]));
    // Interrupt mid-study: once some trial has stored a value.
    let db = dir.path().join("stop.db");
    wait_until("a stored value", std::time::Duration::from_secs(60), || {
        assert!(child.try_wait().is_none(), "the study ended before Ctrl-C");
        migrated(&db) && scalar(&db, "SELECT COUNT(*) FROM trial_intermediate_values") > 0
    });
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'"),
        0
    );
    // Every trial that was in flight (one per lane: built-in trials on the
    // CPU, no pruner) went back to WAITING.
    let waiting = scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'WAITING'");
    assert!((1..=4).contains(&waiting), "{waiting} waiting");
    let done = scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'");
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM trials"), done + waiting);
    block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        let ok: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(ok, "ok");
    });
    // Resume with a budget that covers just them: they run first, and no new trial is made.
    let out = run_in(
        dir.path(),
        &["s.toml", "--trials", &(done + waiting).to_string()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'WAITING'"),
        0
    );
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM trials"), done + waiting);
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'"),
        done + waiting
    );
}

#[test]
fn readers_never_see_a_locked_database_while_a_study_runs() {
    let dir = tempfile::tempdir().unwrap();
    let study = small_study("busy", 6)
        .replace("epochs = 3", "epochs = 30")
        .replace("[16, 32]", "[128, 256]");
    write(dir.path(), "s.toml", &study);
    let mut child = Running::spawn(bin().current_dir(dir.path()).args(["s.toml"]));
    let mut reads = 0;
    while child.try_wait().is_none() && reads < 200 {
        if dir.path().join("busy.db").exists() {
            let out = run_in(dir.path(), &["trials", "s.toml", "--format", "json"]);
            let msg = text(&out);
            assert!(!msg.contains("locked"), "{msg}");
            if out.status.code() == Some(0) {
                reads += 1;
                serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .expect("a whole JSON document");
            } else {
                // Only before the study exists may a reader find nothing.
                assert!(
                    msg.contains("no study named") || msg.contains("holds no study"),
                    "{msg}"
                );
            }
        }
    }
    assert_eq!(child.wait().status.code(), Some(0));
    assert!(reads >= 3, "only {reads} reads overlapped the run");
}

#[test]
fn the_same_seed_gives_the_same_study() {
    let runs: Vec<_> = (0..3)
        .map(|i| {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), "s.toml", &small_study("seeded", 3));
            let seed = if i < 2 { "7" } else { "8" };
            let out = run_in(dir.path(), &["s.toml", "--seed", seed]);
            assert_eq!(out.status.code(), Some(0), "{}", text(&out));
            trials(&dir.path().join("seeded.db"), None)
                .into_iter()
                .map(|t| (t.params, t.value, t.intermediate))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        runs[0], runs[1],
        "same seed: same parameters, values and curves"
    );
    assert_ne!(runs[0], runs[2]);
}

#[test]
fn scheduler_settings_reach_the_core_and_telemetry_covers_every_iteration() {
    let dir = tempfile::tempdir().unwrap();
    let study = format!(
        "{}\n[scheduler]\npolicy = \"priority\"\nlanes = 1\nmax_concurrent = 3\nmemory = \"1GiB\"\n",
        small_study("sched", 4)
    );
    write(dir.path(), "s.toml", &study);
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("sched.db");
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_runs WHERE policy = 'priority' AND lanes = 1 AND budget_bytes = 1073741824"
        ),
        1
    );
    // The timeline accounts for every iteration each trial ran, on lane 0.
    assert_eq!(
        scalar(&db, "SELECT SUM(iterations) FROM salus_lane_segments"),
        scalar(&db, "SELECT SUM(total_iterations) FROM salus_trials")
    );
    assert_eq!(
        scalar(&db, "SELECT COUNT(DISTINCT lane) FROM salus_lane_segments"),
        1
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_lane_segments WHERE trial_id IS NULL"
        ),
        0
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_swaps WHERE direction = 'in'"
        ),
        4,
        "each trial admitted once"
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_lane_utilisation WHERE busy_fraction > 0 AND busy_fraction <= 1"
        ),
        1
    );
    // Three trials in flight on one lane, with equal priorities (no pruner):
    // they take turns at every boundary, and a turn between two resident
    // trials is a switch. (Under `fair` or `pack` small trials may end
    // inside one 5 ms slice, and never switch.)
    assert!(scalar(&db, "SELECT switches FROM salus_lane_stats") > 0);
}

#[test]
fn asha_pauses_promotes_and_prunes_at_rungs_with_tpe() {
    let dir = tempfile::tempdir().unwrap();
    let study = "[study]\nname = \"asha\"\ntrials = 12\nseed = 2\n[model]\ndepth = 1\nwidth = { int = [16, 64], log = true }\n\
                 [train]\nlr = { float = [1e-4, 3e-1], log = true }\nbatch_size = 64\nepochs = 9\n\
                 [sampler]\nkind = \"tpe\"\nstartup_trials = 4\n[pruner]\nkind = \"asha\"\nmin_resource = 1\nreduction_factor = 3\n";
    write(dir.path(), "s.toml", study);
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("asha.db");
    let trials = trials(&db, None);
    assert_eq!(trials.len(), 12);
    let pruned: Vec<_> = trials
        .iter()
        .filter(|t| t.state == TrialState::Pruned)
        .collect();
    let complete = trials
        .iter()
        .filter(|t| t.state == TrialState::Complete)
        .count();
    assert_eq!(pruned.len() + complete, 12, "every trial finished");
    assert!(!pruned.is_empty() && complete >= 1);
    let log = text(&out);
    for t in &pruned {
        // A pruned trial stopped at a rung (steps 1, 3 or 9) and kept its curve.
        let last = t.intermediate.last().unwrap().0;
        assert!([1, 3].contains(&last), "pruned after step {last}");
        assert!(t.value.is_none());
        // The progress log says so, with its step and rung.
        let rung = if last == 1 { 0 } else { 1 };
        let line = format!("trial {} PRUNED at step {last} (rung {rung})", t.number);
        assert!(log.contains(&line), "no '{line}' in:\n{log}");
    }
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_events WHERE kind = 'trial_pruned'"
        ),
        pruned.len() as i64,
        "prunes are events of their own kind"
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM trial_system_attributes WHERE \"key\" = 'salus:rung'"
        ),
        pruned.len() as i64
    );
    assert!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_priority WHERE reason = 'paused'"
        ) >= pruned.len() as i64
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT COUNT(*) FROM salus_runs WHERE policy = 'priority'"
        ),
        1,
        "a pruner makes priority the default"
    );
    // `trials` shows each trial's rung and priority.
    let out = run_in(dir.path(), &["trials", "s.toml", "--format", "json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for r in rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "PRUNED")
    {
        assert!(r["rung"].is_i64() && r["priority"].is_f64(), "{r}");
    }
    assert!(
        text(&run_in(dir.path(), &["trials", "s.toml"]))
            .lines()
            .next()
            .unwrap()
            .contains("rung  priority")
    );
}

#[test]
fn a_gp_study_runs_with_trials_in_flight_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let study = "[study]\nname = \"gp\"\ntrials = 8\nseed = 3\n[model]\ndepth = 1\nwidth = { int = [16, 64], log = true }\n\
                 [train]\nlr = { float = [1e-3, 3e-1], log = true }\nbatch_size = 64\nepochs = 2\n\
                 [sampler]\nkind = \"gp\"\nstartup_trials = 3\n[scheduler]\nmax_concurrent = 4\n";
    write(dir.path(), "s.toml", study);
    let out = run_in(dir.path(), &["check", "s.toml"]);
    assert!(
        text(&out).contains("gp (startup_trials 3)"),
        "{}",
        text(&out)
    );
    let out = run_in(dir.path(), &["s.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("gp.db");
    let first = trials(&db, None);
    assert_eq!(first.len(), 8);
    assert!(first.iter().all(|t| t.state == TrialState::Complete));
    let points: Vec<_> = first.iter().map(|t| t.params.clone()).collect();
    for (i, p) in points.iter().enumerate() {
        assert!(!points[..i].contains(p), "trial {i} repeats a point");
    }
    // A larger budget resumes: finished trials stay, the GP proposes more.
    let out = run_in(dir.path(), &["s.toml", "--trials", "11"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let more = trials(&db, None);
    assert_eq!(more.len(), 11);
    assert_eq!(&more[..8], &first[..]);
}

/// Most trials alive at once where a trial numbered `from` to `to` starts.
fn most_alive_at_once(db: &std::path::Path, from: i64, to: i64) -> i64 {
    TestDb::Sqlite(db.to_path_buf()).most_alive_at_once(from, to)
}

/// The detail of the run's `study_start` event.
fn study_start(db: &std::path::Path) -> serde_json::Value {
    let detail = scalar_text(
        db,
        "SELECT detail FROM salus_events WHERE kind = 'study_start'",
    )
    .expect("a study_start event");
    serde_json::from_str(&detail).expect("its detail is JSON")
}

#[test]
fn tpe_with_a_pruner_keeps_one_trial_per_lane_while_the_study_is_young() {
    let most_at_once = |db: &std::path::Path, from: i64| most_alive_at_once(db, from, i64::MAX);
    let dir = tempfile::tempdir().unwrap();
    let base = StudyFile::digits("young", 8)
        .set("sampler", "kind", "\"tpe\"")
        .set("sampler", "startup_trials", "3")
        .set("pruner", "kind", "\"median\"")
        .set("scheduler", "lanes", "2");
    write(dir.path(), "s.toml", &base.build());
    let out = run_in(dir.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("young.db");
    assert_eq!(trials(&db, None).len(), 8);
    let start = study_start(&db);
    assert_eq!(start["max_concurrent"], 4, "{start}");
    assert_eq!(
        start["ramp"],
        serde_json::json!({ "random_start": 3, "first_cap": 2, "first_until": 23, "cap": 2, "until_trials": 60 })
    );
    // The three random proposals run at once (they learn nothing from
    // results); from the first proposal TPE models on, one per lane.
    assert_eq!(most_at_once(&db, 0), 3);
    assert!(
        most_at_once(&db, 3) <= 2,
        "{} at once",
        most_at_once(&db, 3)
    );
    // Set, max_concurrent has no start: four go at once.
    let set = tempfile::tempdir().unwrap();
    write(
        set.path(),
        "s.toml",
        &base.set("scheduler", "max_concurrent", "4").build(),
    );
    let out = run_in(set.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = set.path().join("young.db");
    let start = study_start(&db);
    assert_eq!(start.get("ramp"), Some(&serde_json::Value::Null), "{start}");
    assert!(
        most_at_once(&db, 3) >= 3,
        "{} at once",
        most_at_once(&db, 3)
    );
}

#[test]
fn on_eight_lanes_the_start_keeps_counts_of_trials_not_shares_of_lanes() {
    // Two GPUs' 8 lanes, here 8 CPU devices of a lane each (on 2 cores),
    // with a pruner (two per lane by default): 2 in flight after the random
    // start, as on one GPU's 4 lanes, where half the lanes would be 4; then
    // 4 from 23 trials.
    let dir = tempfile::tempdir().unwrap();
    let study = StudyFile::digits("eight", 30)
        .set("sampler", "kind", "\"tpe\"")
        .set("sampler", "startup_trials", "3")
        .set("pruner", "kind", "\"median\"")
        .set(
            "scheduler",
            "devices",
            "[\"cpu:0\", \"cpu:1\", \"cpu:2\", \"cpu:3\", \"cpu:4\", \"cpu:5\", \"cpu:6\", \"cpu:7\"]",
        );
    write(dir.path(), "s.toml", &study.build());
    let out = run_in(dir.path(), &["s.toml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = dir.path().join("eight.db");
    assert_eq!(trials(&db, None).len(), 30);
    let start = study_start(&db);
    assert_eq!(start["max_concurrent"], 16, "{start}");
    assert_eq!(
        start["ramp"],
        serde_json::json!({ "random_start": 3, "first_cap": 2, "first_until": 23, "cap": 4, "until_trials": 60 })
    );
    assert_eq!(most_alive_at_once(&db, 0, 2), 3);
    let first = most_alive_at_once(&db, 3, 22);
    assert!(first <= 2, "{first} at once in the first proposals");
    let then = most_alive_at_once(&db, 23, 29);
    assert!(then <= 4, "{then} at once from 23 trials");
}
