//! Study files: the examples parse, values resolve, and mistakes are
//! reported at their file, line, column and key.

use std::path::Path;

use salus_tune::error::Error;
use salus_tune::space::{Choice, Distribution, ParamValue, Params};
use salus_tune::study::{Direction, KnobValue, SamplerKind, load, parse_str};
use training::Optimizer;

fn parse(src: &str) -> Result<salus_tune::study::Study, Error> {
    parse_str(src, Path::new("studies/t.toml"))
}

#[test]
fn every_example_study_parses() {
    for entry in std::fs::read_dir("studies").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

#[test]
fn digits_example_resolves_its_space_and_defaults() {
    let s = load(Path::new("studies/digits.toml")).unwrap();
    assert_eq!(
        (s.name.as_str(), s.metric.as_str(), s.direction, s.trials),
        ("digits-mlp", "val_accuracy", Direction::Maximize, 32)
    );
    let names: Vec<&str> = s.space.params().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["depth", "width", "lr", "batch_size", "weight_decay"]
    );
    assert_eq!(
        s.space.params()[1].dist,
        Distribution::Int {
            low: 32,
            high: 512,
            log: true,
            step: 1
        }
    );
    let mut params = Params::new();
    params.insert("depth".into(), ParamValue::Int(3));
    params.insert("width".into(), ParamValue::Int(100));
    params.insert("lr".into(), ParamValue::Float(0.01));
    params.insert("batch_size".into(), ParamValue::Choice(1));
    params.insert("weight_decay".into(), ParamValue::Float(1e-4));
    let cfg = s.trial_config(&params, 9);
    assert_eq!(cfg.hidden, vec![100, 100, 100]);
    assert_eq!((cfg.batch_size, cfg.epochs), (64, 30));
    assert_eq!(cfg.hparams.lr, 0.01);
    assert_eq!(cfg.hparams.seed, 9);
    assert_eq!(cfg.hparams.optimizer, Optimizer::adam());
}

#[test]
fn cnn_studies_resolve_to_conv_nets() {
    let s = load(Path::new("studies/digits_cnn.toml")).unwrap();
    assert!(s.data.images, "a conv net reads the digits as images");
    let mut params = Params::new();
    for (name, v) in [
        ("width", ParamValue::Choice(1)),
        ("channels", ParamValue::Choice(0)),
        ("blocks_per_stage", ParamValue::Int(2)),
        ("kernel", ParamValue::Choice(1)),
        ("residual", ParamValue::Choice(1)),
        ("lr", ParamValue::Float(0.01)),
        ("batch_size", ParamValue::Choice(0)),
        ("weight_decay", ParamValue::Float(1e-4)),
        ("dropout", ParamValue::Float(0.1)),
    ] {
        params.insert(name.into(), v);
    }
    let cfg = s.trial_config(&params, 3);
    let conv = cfg.conv.expect("a conv net");
    assert_eq!(conv.stages, vec![16, 32], "each stage doubles the channels");
    assert_eq!((conv.blocks_per_stage, conv.kernel), (2, 5));
    assert!(conv.residual && conv.batch_norm && !conv.global_pool);
    assert_eq!(conv.pool, kernels::PoolKind::Max);
    assert_eq!(cfg.hidden, vec![128], "a head of depth x width");
    assert_eq!(s.fixed["model"], KnobValue::Str("cnn".into()));

    let preset =
        parse("[model]\nkind = \"cnn\"\npreset = \"cuda-convnet\"\n[data]\nsource = \"digits\"\n")
            .unwrap();
    let cfg = preset.trial_config(&Params::new(), 0);
    let conv = cfg.conv.unwrap();
    assert_eq!((conv.stages, conv.kernel), (vec![32, 32, 64], 5));
    assert!(!conv.batch_norm && !conv.residual);
    assert!(
        cfg.hidden.is_empty(),
        "the output layer follows the convolutions"
    );
    let augmented = parse("[model]\nkind = \"cnn\"\n[data]\ncrop = 4\nflip = true\n").unwrap();
    let conv = augmented.trial_config(&Params::new(), 0).conv.unwrap();
    assert_eq!(
        conv.augment,
        Some(training::model::Augment {
            crop: 4,
            flip: true
        })
    );
    // An MLP study stores nothing new: its fixed values are as before.
    let mlp = load(Path::new("studies/digits.toml")).unwrap();
    assert!(!mlp.fixed.contains_key("model") && !mlp.data.images);
}

#[test]
fn optimizer_sections_are_conditional_parameters() {
    let s = load(Path::new("studies/optimizers.toml")).unwrap();
    let momentum = s
        .space
        .params()
        .iter()
        .find(|p| p.name == "sgd.momentum")
        .unwrap();
    let cond = momentum.condition.as_ref().unwrap();
    assert_eq!(
        (cond.parent.as_str(), cond.values.clone()),
        ("optimizer", vec![Choice::Str("sgd".into())])
    );
    let mut params = Params::new();
    params.insert("optimizer".into(), ParamValue::Choice(0));
    params.insert("width".into(), ParamValue::Choice(1));
    params.insert("lr".into(), ParamValue::Float(0.05));
    params.insert("sgd.momentum".into(), ParamValue::Float(0.7));
    params.insert("sgd.nesterov".into(), ParamValue::Choice(1));
    let cfg = s.trial_config(&params, 0);
    assert_eq!(
        cfg.hparams.optimizer,
        Optimizer::Sgd {
            momentum: 0.7,
            nesterov: true
        }
    );
    assert_eq!(cfg.hidden, vec![128, 128]);
    // With optimizer fixed to sgd, its section is plain (unconditional) parameters.
    let fixed =
        parse("[train]\noptimizer = \"sgd\"\n[train.sgd]\nmomentum = { float = [0.1, 0.9] }\n")
            .unwrap();
    assert!(fixed.space.params()[0].condition.is_none());
    assert_eq!(
        fixed.value(&Params::new(), "sgd.nesterov"),
        KnobValue::Bool(false)
    );
}

#[test]
fn defaults_follow_the_task() {
    let s = parse("[data]\nsource = \"synthetic-regression\"\nrows = 100\n").unwrap();
    assert_eq!(
        (s.metric.as_str(), s.direction),
        ("val_rmse", Direction::Minimize)
    );
    assert_eq!(s.name, "t", "the name defaults to the file stem");
    let g = load(Path::new("studies/grid.toml")).unwrap();
    assert_eq!(g.sampler.kind, SamplerKind::Grid);
    let r =
        parse("[study]\nmetric = \"val_r2\"\n[data]\nsource = \"synthetic-regression\"\n").unwrap();
    assert_eq!(r.direction, Direction::Maximize);
}

#[test]
fn errors_point_at_line_column_and_key() {
    let err = parse("[study]\ntrials = 3\n\n[train]\nlerning_rate = 0.1\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "studies/t.toml:5:1: train.lerning_rate: unknown key 'lerning_rate' in [train]; did you mean 'lr'?"
    );
    let err = parse("[train]\nlr = { float = [0.1, 0.01], log = true }\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("studies/t.toml:2:6: train.lr: low (0.1) must not exceed high (0.01)"),
        "{err}"
    );
    let err = parse("[model]\nactivation = \"rleu\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(":2:14: model.activation: unknown activation 'rleu'")
            && err.contains("did you mean 'relu'"),
        "{err}"
    );
}

#[test]
fn sampler_and_pruner_sections_resolve() {
    use salus_tune::sampler::Pending;
    use salus_tune::study::{PrunerKind, SamplerKind};
    let s = parse("[sampler]\nkind = \"tpe\"\nstartup_trials = 4\nmultivariate = false\n[pruner]\nkind = \"hyperband\"\nmin_resource = 2\n").unwrap();
    assert_eq!(
        s.sampler.kind,
        SamplerKind::Tpe {
            startup_trials: 4,
            multivariate: false,
            pending: Pending::Auto
        }
    );
    assert_eq!(
        s.pruner,
        PrunerKind::Hyperband {
            min_resource: 2,
            max_resource: 54,
            reduction_factor: 3
        }
    );
    let s = parse("[sampler]\nkind = \"tpe\"\n[pruner]\nkind = \"median\"\nwarmup_steps = 2\n")
        .unwrap();
    assert_eq!(
        s.sampler.kind,
        SamplerKind::Tpe {
            startup_trials: 10,
            multivariate: true,
            pending: Pending::Auto
        }
    );
    assert_eq!(
        s.pruner,
        PrunerKind::Median {
            startup_trials: 5,
            warmup_steps: 2
        }
    );
    assert_eq!(
        parse("[sampler]\nkind = \"qmc\"\n").unwrap().sampler.kind,
        SamplerKind::Qmc
    );
    assert_eq!(
        parse("[sampler]\nkind = \"gp\"\nstartup_trials = 6\n")
            .unwrap()
            .sampler
            .kind,
        SamplerKind::Gp { startup_trials: 6 }
    );
    let err = parse("[sampler]\nkind = \"gp\"\nmultivariate = true\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("multivariate applies only to kind = \"tpe\""),
        "{err}"
    );
    let err = parse("[sampler]\nkind = \"qmc\"\nstartup_trials = 3\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("startup_trials applies only to kind = \"tpe\" and \"gp\""),
        "{err}"
    );
    for (value, pending) in [("believe", Pending::Believe), ("lie", Pending::Lie)] {
        assert_eq!(
            parse(&format!(
                "[sampler]\nkind = \"tpe\"\npending = \"{value}\"\n"
            ))
            .unwrap()
            .sampler
            .kind,
            SamplerKind::Tpe {
                startup_trials: 10,
                multivariate: true,
                pending
            }
        );
    }
    let err = parse("[sampler]\nkind = \"gp\"\npending = \"lie\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sampler.pending: pending applies only to kind = \"tpe\""),
        "{err}"
    );
    let err = parse("[sampler]\nmultivariate = true\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sampler.multivariate: multivariate applies only to kind = \"tpe\""),
        "{err}"
    );
}

mod fuzz {
    //! The study parser on hostile input: it answers every string with a
    //! study or an input error (exit status 2's kind), and never panics.

    use proptest::prelude::*;
    use salus_tune::error::Error;
    use std::path::Path;

    const KEYS: &[&str] = &[
        "[study]",
        "[model]",
        "[train]",
        "[data]",
        "[sampler]",
        "[pruner]",
        "[scheduler]",
        "[train.sgd]",
        "name",
        "trials",
        "width",
        "depth",
        "lr",
        "epochs",
        "batch_size",
        "kind",
        "optimizer",
        "dropout",
        "choices",
        "float",
        "int",
        "log",
        "step",
        "=",
        "{",
        "}",
        "[",
        "]",
        "\"",
        ",",
        "\n",
        "1e-3",
        "-1",
        "0",
        "true",
        "\"adam\"",
        "9999999999999999999",
        "nan",
    ];

    fn check(src: &str) {
        match salus_tune::study::parse::parse_str(src, Path::new("fuzz.toml")) {
            Ok(_) => {}
            Err(e @ Error::Study { .. }) | Err(e @ Error::Input(_)) => {
                assert!(e.to_string().contains("fuzz.toml"), "{e}");
                assert_eq!(e.exit_code(), 2);
            }
            Err(e) => panic!("not an input error: {e}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn arbitrary_text_never_panics(src in ".{0,200}") {
            check(&src);
        }

        #[test]
        fn study_like_token_soup_never_panics(tokens in proptest::collection::vec(0..KEYS.len(), 0..60)) {
            let src: String = tokens.iter().map(|&i| KEYS[i]).collect::<Vec<_>>().join(" ");
            check(&src);
        }
    }
}

#[test]
fn every_policy_is_read_by_the_name_it_is_stored_under() {
    use salus_tune::study::Policy;
    for policy in Policy::ALL {
        let s = parse(&format!("[scheduler]\npolicy = \"{}\"\n", policy.name())).unwrap();
        assert_eq!(s.scheduler.policy, Some(policy));
    }
}
