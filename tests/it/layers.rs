//! The layers of ARCHITECTURE.md hold: each listed module of the
//! orchestrator reaches (through `crate::` paths) only the modules below
//! it. A new edge that would close a cycle fails here with its file.

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

#[test]
fn each_module_uses_only_the_layers_below_it() {
    // Module -> what it may use. Bottom first.
    let allowed: &[(&str, &[&str])] = &[
        ("salus", &[]),
        ("credentials", &[]),
        ("numbers", &[]),
        ("objective", &[]),
        ("ids", &[]),
        ("error", &["credentials"]),
        ("space", &["error", "numbers"]),
        ("sampler", &["space", "objective", "error", "ids"]),
        ("pruner", &["objective", "ids", "error"]),
        (
            "study",
            &[
                "salus",
                "space",
                "sampler",
                "pruner",
                "objective",
                "error",
                "numbers",
            ],
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
