//! Every message the study parser gives, pinned: one bad file per error
//! path, and the parsed form of good files. The parser can be rewritten;
//! what users read must not change.

use std::fmt::Write;
use std::path::Path;

use salus_tune::study::{load, parse_str};

/// Bad study files, each with one mistake.
const BAD: &[&str] = &[
    // syntax and sections
    "[study]\ntrials = 3\nname = \n",
    "x = [1,\n",
    "[studdy]\nname = \"x\"\n",
    "[zebra]\n",
    "study = 3\n",
    "data = \"digits\"\n",
    "[train]\nlr = 0.1\n[worker]\nkind = \"command\"\ncommand = [\"x\"]\n",
    "[params]\nx = 1\n",
    // [study]
    "[study]\nname = \"x\"\ntrails = 4\n",
    "[study]\nstudy_name = \"x\"\n",
    "[study]\nn_trials = 4\n",
    "[study]\nname = \"  \"\n",
    "[study]\nname = 3\n",
    "[study]\nmetric = \"val_rmse\"\n",
    "[study]\nmetric = \"val_acc\"\n",
    "[study]\nmetric = \"val_accuracy\"\n[data]\nsource = \"synthetic-regression\"\n",
    "[study]\nmetric = 3\n",
    "[study]\ndirection = \"up\"\n",
    "[study]\ndirection = \"maximise\"\n",
    "[study]\ndirection = true\n",
    "[study]\ntrials = 0\n",
    "[study]\ntrials = \"ten\"\n",
    "[study]\ntrials = 2.5\n",
    "[study]\nseed = -1\n",
    "[study]\nstorage = 5\n",
    "[study]\ntimeout = \"ten minutes\"\n",
    "[study]\ntimeout = 0\n",
    "[study]\ntimeout = -2.5\n",
    "[study]\ntimeout = [1]\n",
    "[study]\ntimeout = \"5d\"\n",
    "[study]\nmax_consecutive_failures = 0\n",
    "[study]\nkeep = \"bset\"\n",
    "[study]\nkeep = \"best\"\n[worker]\nkind = \"command\"\ncommand = [\"x\"]\n",
    "[study]\ndirection = \"maximize\"\nmetric = \"val_loss\"\n",
    "[study]\nmetric = \"val_rmse\"\ndirection = \"maximize\"\n[data]\nsource = \"synthetic-regression\"\n",
    // [model]
    "[model]\nhidden = 3\n",
    "[model]\nwidth = { float = [1.5, 9.0] }\n",
    "[model]\nwidth = 0\n",
    "[model]\ndepth = 2.5\n",
    "[model]\nactivation = \"relu6\"\n",
    "[model]\nactivation = 3\n",
    "[model]\nactivation = { choices = [] }\n",
    "[model]\nactivation = { choices = \"relu\" }\n",
    "[model]\nactivation = { choices = [\"relu\", \"relu\"] }\n",
    "[model]\nactivation = { choices = [\"relu\", 3] }\n",
    "[model]\nactivation = { choices = [\"relu\", \"tanh\"], log = true }\n",
    "[model]\nactivation = { int = [1, 2] }\n",
    "[model]\nwidth = { int = [8, 64], log = \"yes\" }\n",
    "[model]\nwidth = { int = [8, 64, 128] }\n",
    "[model]\nwidth = { int = \"8..64\" }\n",
    "[model]\nwidth = { int = [8, 6.5] }\n",
    "[model]\nwidth = { int = [8, 64], step = 2.5 }\n",
    "[model]\nwidth = { int = [0, 64] }\n",
    "[model]\nwidth = { int = [64, 8] }\n",
    "[model]\nwidth = { int = [8, 64], step = 0 }\n",
    "[model]\nwidth = { ints = [8, 64] }\n",
    "[model]\nwidth = {}\n",
    // [train]
    "[study]\ntrials = 3\n[train]\nlerning_rate = 0.1\n",
    "[train]\nlr = \"fast\"\n",
    "[train]\nlr = -0.1\n",
    "[train]\nlr = nan\n",
    "[train]\nlr = { float = [0.1, 0.001] }\n",
    "[train]\nlr = { float = [0.0, 0.1], log = true }\n",
    "[train]\nlr = { float = [0.001, \"a\"] }\n",
    "[train]\nlr = { float = [0.001, 0.1], step = \"x\" }\n",
    "[train]\nlr = { float = [0.001, 0.1], log = true, step = 0.01 }\n",
    "[train]\nlr = { float = [0.001, 0.1], int = [1, 2] }\n",
    "[train]\nlr = { int = [1, 2] }\n",
    "[train]\nlr = { choices = [0.1, 0.1] }\n",
    "[train]\nlr = { choices = [0.1, \"x\"] }\n",
    "[train]\nweight_decay = { float = [0.0, 0.1], log = true }\n",
    "[train]\nbatch_size = \"big\"\n",
    "[train]\nepochs = 0\n",
    "[train]\ndropout = 1.0\n",
    "[train]\ndropout = -0.5\n",
    "[train]\noptimizer = \"adamm\"\n",
    "[train]\noptimizer = 1\n",
    "[train]\nreport_every = 0\n",
    "[train]\nreport_every = \"often\"\n",
    "[train]\nsgd = 3\n",
    "[train]\noptimizer = \"adam\"\n[train.sgd]\nmomentum = 0.9\n",
    "[train.sgd]\nmomentum = 0.9\n",
    "[train]\noptimizer = { choices = [\"adam\", \"adamw\"] }\n[train.sgd]\nmomentum = 0.9\n",
    "[train]\noptimizer = \"sgd\"\n[train.sgd]\nmomentm = 0.9\n",
    "[train]\noptimizer = \"sgd\"\n[train.sgd]\nmomentum = 1.5\n",
    "[train]\noptimizer = \"sgd\"\n[train.sgd]\nnesterov = 1\n",
    "[train.adam]\nbeta1 = \"x\"\n",
    "[train.adam]\nbeta1 = 1.0\n",
    // [sampler]
    "[sampler]\nkind = \"grid\"\n[train]\nlr = { float = [0.001, 0.1] }\n",
    "[sampler]\nkind = \"tpee\"\n",
    "[sampler]\nkind = \"cmaes\"\n",
    "[sampler]\nstartup_trials = 3\n",
    "[sampler]\nmultivariate = false\n",
    "[sampler]\nkind = \"tpe\"\nmultivariate = \"yes\"\n",
    "[sampler]\nkind = \"tpe\"\npending = \"maybe\"\n",
    "[sampler]\npending = \"lie\"\n",
    "[study]\nmetric = [\"val_accuracy\", \"params\"]\n[sampler]\nkind = \"tpe\"\npending = \"believe\"\n",
    "[sampler]\nkind = \"tpe\"\nstartup_trials = -1\n",
    "[sampler]\nseed = -3\n",
    "[sampler]\nsed = 3\n",
    // [pruner]
    "[pruner]\nkind = \"asha\"\nwarmup_steps = 2\n",
    "[pruner]\nkind = \"hyperband\"\nmin_resource = 4\nmax_resource = 2\n",
    "[pruner]\nkind = \"ashaa\"\n",
    "[pruner]\nmin_resource = 2\n",
    "[pruner]\nkind = \"asha\"\nreduction_factor = 1\n",
    "[pruner]\nkind = \"asha\"\nmin_resource = 0\n",
    "[pruner]\nkind = \"median\"\nstartup_trials = \"x\"\n",
    "[pruner]\nkind = \"median\"\nwarmup = 3\n",
    // [scheduler]
    "[scheduler]\ngraphs = \"on\"\n",
    "[scheduler]\nmix_widths = \"always\"\n",
    "[scheduler]\npolicy = \"srtff\"\n",
    "[scheduler]\npolicy = 3\n",
    "[scheduler]\nmemory = \"lots\"\n",
    "[scheduler]\nmemory = 0\n",
    "[scheduler]\nmemory = 1.5\n",
    "[scheduler]\nmemory_bytes = 1024\n",
    "[scheduler]\nlanes = 0\n",
    "[scheduler]\nfuse = \"x\"\n",
    // [pbt]
    "[model]\nwidth = { int = [8, 64] }\n[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\npopulation = 4\n",
    "[study]\ntrials = 5\n[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\npopulation = 4\n",
    "[study]\ntrials = 1\n[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pruner]\nkind = \"asha\"\n[pbt]\npopulation = 4\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\nreport_every = 10\n[pbt]\ninterval = 15\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\nquantile = 0.7\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\ndonor_quantile = 0\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\nresample_probability = 1.5\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\nfactors = [1.2, -1]\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\nmutate = [\"width\"]\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\nmutate = [\"weight_decay\"]\n",
    "[train]\nlr = 0.01\n[pbt]\npopulation = 4\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\ndropout = { float = [0.0, 0.5] }\n[pbt]\n",
    "[train]\nlr = 0.01\nschedule = [{ step = 3, lr = 0.005 }]\n[scheduler]\nfuse = 4\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\npopulaton = 4\n",
    // [train] schedule
    "[train]\nlr = 0.01\nschedule = [{ lr = 0.005 }]\n",
    "[train]\nlr = 0.01\nschedule = [{ step = 3, lr = 0.005 }, { step = 2, lr = 0.001 }]\n",
    "[train]\nlr = 0.01\nschedule = [{ step = 3, width = 64 }]\n",
    "[train]\nlr = 0.01\nschedule = [{ step = 3, lrr = 0.1 }]\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\nschedule = [{ step = 3, lr = 0.005 }]\n",
    "[train]\nlr = 0.01\nschedule = [{ step = 3, lr = -1 }]\n",
    "[train]\nlr = 0.01\nschedule = [{ step = 3, dropout = 0.2 }]\n",
    "[train]\nlr = { float = [1e-3, 1e-1] }\nschedule = [{ step = 3, weight_decay = 0.1 }]\n[pbt]\n",
    "[study]\nmetric = [\"val_accuracy\", \"params\"]\n[train]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\n",
    "[scheduler]\nmax_concurrent = 0\n",
    // [data]
    "[data]\nsource = \"digits\"\ntarget = \"y\"\n",
    "[data]\nsource = \"csv\"\npath = \"missing.csv\"\ntarget = \"y\"\n",
    "[data]\nsource = \"csv\"\ntarget = \"y\"\n",
    "[data]\nsource = \"csv\"\npath = \"data/regression.csv\"\n",
    "[data]\nsource = \"npy\"\npath = \"data/regression.csv\"\n",
    "[data]\nsource = \"parquet\"\n",
    "[data]\nsource = \"cvs\"\n",
    "[data]\nsorce = \"digits\"\n",
    "[data]\nsource = \"synthetic-classification\"\nrows = 2\n",
    "[data]\nsource = \"synthetic-classification\"\nclasses = 1\n",
    "[data]\nsource = \"synthetic-classification\"\nnoise = 0.1\n",
    "[data]\nsource = \"synthetic-regression\"\nnoise = -1\n",
    "[data]\nsource = \"synthetic-regression\"\nnoise = \"x\"\n",
    "[data]\nsource = \"csv\"\npath = 3\ntarget = \"y\"\n",
    "[data]\ntask = \"ranking\"\n",
    "[data]\nvalidation = 1.5\n",
    "[data]\nvalidation = \"x\"\n",
    "[data]\nsplit_seed = -1\n",
    // [worker] and [params]
    "[worker]\nkind = \"docker\"\n",
    "[worker]\nkind = \"mlp\"\ncommand = [\"x\"]\n",
    "[worker]\ncommand = [\"x\"]\n",
    "[worker]\nkind = \"command\"\n",
    "[worker]\nkind = \"command\"\ncommand = []\n",
    "[worker]\nkind = \"command\"\ncommand = \"python3 t.py\"\n",
    "[worker]\nkind = \"command\"\ncommand = [\"python3\", 3]\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\ncomand = [\"y\"]\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nenv = 3\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nenv = { A = 1 }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nmemory = \"lots\"\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nmemory = -5\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nheartbeat_timeout = \"soon\"\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nheartbeat_timeout = 0\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nreport_every = 0\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nmax_concurrency = 0\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\niterations = \"x\"\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\ncwd = 3\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nx = { float = [1, 0] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nx = { range = [1, 2] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nx = [1, 2]\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nx = { choices = [1, 1] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nx = { int = [1, 2.5] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[study]\nmetric = 3\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nparams = 3\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nwhen = 1979-05-27\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\nreport_every = 10\n[params]\nlr = { float = [1e-3, 1e-1] }\n[pbt]\ninterval = 15\n",
    // [params.when.P.V]
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nx = { float = [0, 1] }\n[params.when.opt.sgd]\nm = { float = [0, 1] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nopt = { float = [0, 1] }\n[params.when.opt.sgd]\nm = { float = [0, 1] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nopt = { choices = [\"sgd\", \"adam\"] }\n[params.when.opt.rmsprop]\nm = { float = [0, 1] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nopt = { choices = [\"sgd\", \"adam\"] }\n[params.when.opt.sgd]\nnesterov = true\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nopt = { choices = [\"sgd\", \"adam\"] }\n\"sgd.m\" = 1\n[params.when.opt.sgd]\nm = { float = [0, 1] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nopt = { choices = [\"sgd\", \"adam\"] }\n[params.when.opt.sgd]\nm = { float = [1, 0] }\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nopt = { choices = [\"sgd\", \"adam\"] }\n[params.when.opt]\nsgd = 3\n",
    // values of other types
    "worker = 3\n",
    "model = [1]\n",
    "[train]\nadam = \"x\"\n",
    "[train]\nlr = 1979-05-27\n",
    "[train]\nlr = { choices = [1979-05-27] }\n",
    "[study]\nname = 1979-05-27T07:32:00Z\n",
    "[study]\ntrials = { n = 3 }\n",
    "[model]\nwidth = { int = { low = 1 } }\n",
    "[worker]\nkind = \"command\"\ncommand = { a = \"b\" }\n",
    "[model]\nchannels = 16\n",
    "[model]\nkind = \"cnn\"\n[data]\nsource = \"synthetic-classification\"\n",
    "[model]\nkind = \"cnn\"\nkernel = 4\n",
    "[model]\nkind = \"cnn\"\nkernel = { int = [3, 5] }\n",
    "[model]\nkind = \"cnn\"\nkernel = { choices = [3, 7] }\n",
    "[model]\nkind = \"cnn\"\npreset = \"cuda-convnet\"\nwidth = 64\n",
    "[model]\npreset = \"cuda-convnet\"\n",
    "[model]\nkind = \"cnn\"\npreset = \"alexnet\"\n",
    "[model]\nkind = \"cnn\"\npool = \"mean\"\n",
    "[data]\nsource = \"cifar10\"\npath = \"nope\"\n",
    "[data]\nsource = \"idx\"\n",
    "[data]\nsource = \"cifar10\"\ntargets = \"y\"\n",
    "[data]\ncrop = 2\n",
    "[study]\nkeep = \"best\"\n[model]\nkind = \"cnn\"\n",
    "[data]\nsource = \"synthetic-classification\"\nflip = true\n",
];

/// Good study files: their parsed form is pinned too.
const GOOD: &[&str] = &[
    "",
    "[study]\nname = \"n\"\ntrials = 7\nseed = 3\ntimeout = \"1.5h\"\nstorage = \"sqlite:///r.db\"\n",
    "[study]\ntimeout = 90\nstorage = \"out/r.db\"\ndirection = \"minimize\"\nmetric = \"val_loss\"\n",
    "[data]\nsource = \"synthetic-regression\"\nrows = 300\nnoise = 0.5\nvalidation = 0.25\nsplit_seed = 4\n",
    "[data]\nsource = \"synthetic-classification\"\nclasses = 3\nfeatures = 8\n[study]\nseed = 5\n",
    "[model]\nkind = \"mlp\"\ndepth = { int = [1, 3] }\nwidth = { int = [16, 256], log = true }\nactivation = { choices = [\"relu\", \"tanh\"] }\n",
    "[model]\nkind = \"cnn\"\nchannels = { choices = [8, 16] }\nstages = 3\nresidual = true\nblocks_per_stage = 2\nkernel = { choices = [3, 5] }\npool = \"avg\"\nglobal_pool = true\nbatch_norm = false\n",
    "[model]\nkind = \"cnn\"\npreset = \"cuda-convnet\"\n",
    "[model]\nkind = \"cnn\"\n[data]\ncrop = 1\nflip = true\n",
    "[train]\noptimizer = { choices = [\"sgd\", \"adam\"] }\nlr = { float = [1e-4, 1e-1], log = true }\ndropout = { float = [0.0, 0.5], step = 0.1 }\nepochs = 3\nreport_every = 2\n[train.sgd]\nmomentum = { float = [0.0, 0.99] }\nnesterov = { choices = [true, false] }\n[train.adam]\nbeta1 = 0.8\n",
    "[train]\noptimizer = \"adamw\"\n[train.adamw]\nbeta2 = 0.99\n",
    "[sampler]\nkind = \"tpe\"\nstartup_trials = 4\nmultivariate = false\nseed = 11\n",
    "[sampler]\nkind = \"grid\"\n[train]\nlr = { choices = [0.1, 0.01] }\nbatch_size = { int = [16, 64], step = 16 }\n",
    "[sampler]\nkind = \"qmc\"\n[pruner]\nkind = \"hyperband\"\nmin_resource = 2\nreduction_factor = 2\n",
    "[pruner]\nkind = \"median\"\nstartup_trials = 2\nwarmup_steps = 1\n",
    "[pruner]\nkind = \"asha\"\n[scheduler]\npolicy = \"fifo\"\nlanes = 2\nmax_concurrent = 8\nmemory = \"2GiB\"\nfuse = 4\ngraphs = \"off\"\n",
    "[scheduler]\nmemory = 1048576\n[worker]\nkind = \"mlp\"\n",
    "[worker]\nkind = \"command\"\ncommand = [\"python3\", \"t.py\"]\ncwd = \"sub\"\nenv = { A = \"1\" }\nmemory = \"64MiB\"\nreport_every = 2\nmax_concurrency = 3\niterations = 9\nheartbeat_timeout = \"2m\"\n[study]\nmetric = \"loss\"\n[params]\nx = { float = [-1, 1] }\nn = { int = [1, 9], step = 2 }\nc = { choices = [\"a\", 2, true] }\nfixed = 4\nflag = false\n",
    "[worker]\nkind = \"command\"\ncommand = [\"x\"]\n[params]\nopt = { choices = [\"sgd\", \"adam\"] }\nlayers = { choices = [1, 2] }\n[params.when.opt.sgd]\nmomentum = { float = [0.5, 0.99] }\n[params.when.opt.adam]\nbeta2 = { float = [0.9, 0.999], log = true }\n[params.when.layers.2]\nwidth2 = { int = [8, 64] }\n",
];

#[test]
fn every_study_error_message_is_unchanged() {
    let mut out = String::new();
    for src in BAD {
        let msg = match parse_str(src, Path::new("studies/s.toml")) {
            Ok(_) => "PARSED (expected an error)".to_string(),
            Err(e) => e.to_string(),
        };
        writeln!(out, "{src:?}\n  => {msg}").unwrap();
    }
    insta::assert_snapshot!(out);
}

#[test]
fn good_study_files_parse_to_the_same_form() {
    let mut out = String::new();
    for src in GOOD {
        let study =
            parse_str(src, Path::new("studies/s.toml")).unwrap_or_else(|e| panic!("{src:?}: {e}"));
        writeln!(out, "{src:?}\n  => {study:#?}").unwrap();
    }
    let mut examples: Vec<_> = std::fs::read_dir("studies")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    examples.sort();
    for path in examples {
        let study = load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        writeln!(out, "{}\n  => {study:#?}", path.display()).unwrap();
    }
    insta::assert_snapshot!(out);
}
