//! Bad input exits with status 2 and a message that names the file, the
//! line and the key.

use crate::common::*;

const CASES: &[(&str, &str, &str)] = &[
    // (study file, key the message must name, words it must contain)
    (
        "[scheduler]\ngraphs = \"on\"\n",
        "s.toml:2:10: scheduler.graphs",
        "auto",
    ),
    (
        "[study]\ntrials = 3\n[train]\nlerning_rate = 0.1\n",
        "s.toml:4:1: train.lerning_rate",
        "did you mean 'lr'",
    ),
    (
        "[study]\nname = \"x\"\ntrails = 4\n",
        "s.toml:3:1: study.trails",
        "did you mean 'trials'",
    ),
    (
        "[studdy]\nname = \"x\"\n",
        "s.toml:1:2: studdy",
        "unknown section [studdy]; did you mean 'study'",
    ),
    (
        "[train]\nlr = { float = [0.1, 0.001] }\n",
        "s.toml:2:6: train.lr",
        "low (0.1) must not exceed high (0.001)",
    ),
    (
        "[train]\nlr = { float = [0.0, 0.1], log = true }\n",
        "s.toml:2:17: train.lr",
        "lr must be > 0, got 0",
    ),
    (
        "[train]\nweight_decay = { float = [0.0, 0.1], log = true }\n",
        "s.toml:2:16: train.weight_decay",
        "log-scaled range needs low > 0",
    ),
    (
        "[model]\nactivation = { choices = [] }\n",
        "s.toml:2:26: model.activation.choices",
        "choices must not be empty",
    ),
    (
        "[study]\nmetric = \"val_rmse\"\n",
        "s.toml:2:10: study.metric",
        "'val_rmse' is not a metric of classification",
    ),
    (
        "[data]\nsource = \"csv\"\npath = \"missing.csv\"\ntarget = \"y\"\n",
        "s.toml:3:8: data.path",
        "data file not found",
    ),
    (
        "[train]\nbatch_size = \"big\"\n",
        "s.toml:2:14: train.batch_size",
        "expected an integer or a distribution table, found a string",
    ),
    (
        "[train]\nepochs = 0\n",
        "s.toml:2:10: train.epochs",
        "epochs must be >= 1, got 0",
    ),
    (
        "[model]\nwidth = { float = [1.5, 9.0] }\n",
        "s.toml:2:19: model.width",
        "width takes integers: use int = [low, high]",
    ),
    (
        "[train]\noptimizer = \"adam\"\n[train.sgd]\nmomentum = 0.9\n",
        "s.toml:3:1: train.sgd",
        "applies only when optimizer can be 'sgd'",
    ),
    (
        "[train]\ndropout = 1.0\n",
        "s.toml:2:11: train.dropout",
        "dropout must be in [0, 1), got 1",
    ),
    (
        "[sampler]\nkind = \"grid\"\n[train]\nlr = { float = [0.001, 0.1] }\n",
        "s.toml:2:8: sampler.kind",
        "needs a step (or choices)",
    ),
    (
        "[study]\ntrials = 3\nname = \n",
        "s.toml:3:8: (syntax)",
        "invalid TOML",
    ),
    (
        "[train]\nlr = { float = [0.001, 0.1], int = [1, 2] }\n",
        "s.toml:2:6: train.lr",
        "exactly one of",
    ),
    (
        "[scheduler]\npolicy = \"srtff\"\n",
        "s.toml:2:10: scheduler.policy",
        "did you mean 'srtf'",
    ),
    (
        "[study]\ntimeout = \"ten minutes\"\n",
        "s.toml:2:11: study.timeout",
        "a duration such as",
    ),
    (
        "[data]\nsource = \"digits\"\ntarget = \"y\"\n",
        "s.toml:3:10: data.target",
        "does not apply to source = \"digits\"",
    ),
    (
        "[train]\nbatch_size = 5000\n",
        "s.toml:2:14: train.batch_size",
        "the training split has only 1438 rows",
    ),
    (
        "[pruner]\nkind = \"asha\"\nwarmup_steps = 2\n",
        "s.toml:3:16: pruner.warmup_steps",
        "does not apply to kind = \"asha\"",
    ),
    (
        "[pruner]\nkind = \"hyperband\"\nmin_resource = 4\nmax_resource = 2\n",
        "s.toml:4:16: pruner.max_resource",
        "must be at least min_resource (4)",
    ),
    (
        "[sampler]\nstartup_trials = 3\n",
        "s.toml:2:18: sampler.startup_trials",
        "applies only to kind = \"tpe\"",
    ),
];

#[test]
fn bad_study_files_exit_2_naming_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (body, at, words)) in CASES.iter().enumerate() {
        write(dir.path(), "s.toml", body);
        // Semantic errors that need the data set show up on `run`; the rest on `check` already.
        let cmd = if words.contains("training split") {
            "run"
        } else {
            "check"
        };
        let out = run_in(
            dir.path(),
            &[cmd, "s.toml", "--storage", &format!("case{i}.db")],
        );
        let msg = text(&out);
        assert_eq!(out.status.code(), Some(2), "case {i}: {msg}");
        assert!(
            msg.contains(at) && msg.contains(words),
            "case {i}: want '{at}' and '{words}' in:\n{msg}"
        );
    }
    assert!(CASES.len() >= 24);
}

#[test]
fn bad_flags_and_storage_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &small_study("flags", 1));
    for (args, words) in [
        // No machine has a hundredth GPU: this fails with or without CUDA.
        (
            vec!["s.toml", "--device", "cuda:99"],
            "--device cuda:99: CUDA is not usable here",
        ),
        (
            vec!["s.toml", "--device", "tpu"],
            "'tpu' is not a device; expected auto, all, cpu, cuda, cuda:N",
        ),
        (vec!["s.toml", "--trials", "0"], "--trials"),
        (
            vec!["s.toml", "--storage", "mysql://tuner:hunter2@db/x"],
            "'mysql' scheme is not supported; use a file path, sqlite:///path.db or postgresql://user@host/db",
        ),
        (
            vec!["missing.toml"],
            "missing.toml: cannot read the study file",
        ),
        (
            vec!["trials", "--storage", "nothing-here.db"],
            "no database at",
        ),
        (vec!["best"], "give a study file, or --storage"),
        (vec!["run", "s.toml", "--frobnicate"], "--frobnicate"),
    ] {
        let out = run_in(dir.path(), &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(words), "{args:?}: {}", text(&out));
    }
}

#[test]
fn check_prints_the_resolved_search_space() {
    let out = run_in(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &["check", "studies/optimizers.toml"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let s = text(&out);
    assert!(s.contains("studies/optimizers.toml: ok"), "{s}");
    assert!(
        s.contains("sgd.momentum   float [0.5, 0.99]  (when optimizer = sgd)"),
        "{s}"
    );
    assert!(
        s.contains("optimizer      choices [\"sgd\", \"adam\"]"),
        "{s}"
    );
    assert!(s.contains("pruner     none\n"), "{s}");
    assert!(
        s.contains("scheduler  policy pack (default), lanes auto"),
        "{s}"
    );
    assert!(
        s.contains("max_concurrent lanes on a CPU, 2 x lanes on a GPU (default)"),
        "{s}"
    );
    // The pruner's settings, the default policy it brings, and a grid's size.
    let asha = text(&run_in(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &["check", "studies/digits_asha.toml"],
    ));
    assert!(
        asha.contains("pruner     asha (min_resource 3, reduction_factor 3)"),
        "{asha}"
    );
    assert!(
        asha.contains("policy priority (default with a pruner)"),
        "{asha}"
    );
    assert!(
        asha.contains("max_concurrent 2 x lanes (default)"),
        "{asha}"
    );
    let grid = text(&run_in(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &["check", "studies/grid.toml"],
    ));
    assert!(grid.contains("grid       12 points\n"), "{grid}");
    let gp = text(&run_in(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &["check", "studies/digits_gp.toml"],
    ));
    assert!(gp.contains("gp (startup_trials 8)"), "{gp}");
    // GP starts with fewer trials in flight where more than 2 would run.
    assert!(
        gp.contains(
            "max_concurrent all for the random start's 8 trials, then over every process on \
             the study 2 until 28 trials, 4 (at most half of it) until 60, twice as many each \
             time the trials double, up to lanes on a CPU (no start on 1 or 2 lanes), \
             2 x lanes on a GPU (default)"
        ),
        "{gp}"
    );
    let cnn = text(&run_in(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &["check", "studies/digits_cnn.toml"],
    ));
    assert!(
        cnn.contains("digits (built in), as 1x8x8 images")
            && cnn.contains("1x8x8 images, classification, 10 classes")
            && cnn.contains("model          cnn"),
        "{cnn}"
    );
}
