//! The layers of ARCHITECTURE.md hold. Between crates: each crate's
//! `[dependencies]` name only the crates below it, and only storage owns
//! sqlx (Cargo itself refuses cycles). Inside the CLI crate: each listed
//! module reaches (through `crate::` paths) only the modules below it, so
//! a new edge that would close a cycle fails here with its file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("orchestrator/src")
}

/// The files of module `m` (a file or a folder).
fn files(m: &str) -> Vec<PathBuf> {
    let file = src().join(format!("{m}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut out = vec![];
    let mut dirs = vec![src().join(m)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    assert!(!out.is_empty(), "no module {m}");
    out
}

/// Every module that `m` names as `crate::<module>`, and where.
fn uses(m: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    for f in files(m) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() && name != m {
                out.push((name, f.display().to_string()));
            }
        }
    }
    out
}

/// The workspace crates a crate's `Cargo.toml` depends on (normal
/// dependencies), and its other dependencies.
fn dependencies(manifest: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(manifest);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    let deps = doc
        .get("dependencies")
        .and_then(|d| d.as_table())
        .cloned()
        .unwrap_or_default();
    let ours = ["kernels", "training", "salus-core", "tuning", "storage"];
    deps.keys()
        .cloned()
        .partition(|k| ours.contains(&k.as_str()))
}

#[test]
fn each_crate_depends_only_on_the_crates_below_it() {
    // Crate -> the workspace crates it may use. Bottom first.
    let allowed: &[(&str, &str, &[&str])] = &[
        ("kernels", "kernels/Cargo.toml", &[]),
        ("training", "workers/Cargo.toml", &["kernels"]),
        (
            "salus-core",
            "orchestrator/salus-core/Cargo.toml",
            &["kernels", "training"],
        ),
        ("tuning", "orchestrator/tuning/Cargo.toml", &["kernels"]),
        (
            "storage",
            "orchestrator/storage/Cargo.toml",
            &["tuning", "training"],
        ),
    ];
    for (name, manifest, ok) in allowed {
        let (ours, _) = dependencies(manifest);
        let extra: Vec<_> = ours.iter().filter(|d| !ok.contains(&d.as_str())).collect();
        assert!(extra.is_empty(), "{name} depends on {extra:?}");
    }
    // The core and tuning know no storage, runtime or terminal.
    for manifest in [
        "orchestrator/salus-core/Cargo.toml",
        "orchestrator/tuning/Cargo.toml",
    ] {
        let (_, theirs) = dependencies(manifest);
        for banned in ["sqlx", "tokio", "ratatui", "clap"] {
            assert!(!theirs.contains(banned), "{manifest} depends on {banned}");
        }
    }
    // Only storage speaks SQL.
    for manifest in [
        "Cargo.toml",
        "orchestrator/salus-core/Cargo.toml",
        "orchestrator/tuning/Cargo.toml",
        "workers/Cargo.toml",
        "kernels/Cargo.toml",
    ] {
        assert!(
            !dependencies(manifest).1.contains("sqlx"),
            "{manifest} depends on sqlx; its queries belong in storage"
        );
    }
    assert!(
        dependencies("orchestrator/storage/Cargo.toml")
            .1
            .contains("sqlx")
    );
}

#[test]
fn each_module_uses_only_the_layers_below_it() {
    // Module of the CLI crate -> what it may use. Bottom first.
    let allowed: &[(&str, &[&str])] = &[
        ("numbers", &[]),
        ("error", &[]),
        (
            "study",
            &[
                "salus",
                "space",
                "sampler",
                "pruner",
                "pbt",
                "objective",
                "error",
                "numbers",
                // `[scheduler] devices` is checked by `--device`'s grammar.
                "device",
            ],
        ),
        // The dashboard reads the database, never the runner's state.
        // Its Pareto chart sorts the study's values (tuning's pure functions).
        (
            "dash",
            &["error", "numbers", "run_lock", "storage", "study", "pareto"],
        ),
    ];
    let mut problems = BTreeSet::new();
    for (m, ok) in allowed {
        for (used, file) in uses(m) {
            if !ok.contains(&used.as_str()) {
                problems.insert(format!("{file}: {m} uses crate::{used}"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
