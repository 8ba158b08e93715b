//! The docs cannot drift: every page of the book is in its summary, every
//! relative link and anchor resolves, every TOML example is a valid study
//! file (the parser `salus-tune check` uses), and every command line of a
//! shell example parses with the CLI's own grammar and names files that
//! exist. The front page (README.md) and ARCHITECTURE.md are checked too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use salus_tune::cli::{Cli, Command};

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown page: the book's chapters, the front page and the map.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

fn parser(text: &str) -> Parser<'_> {
    Parser::new_ext(text, Options::ENABLE_TABLES)
}

/// The anchor mdBook and GitHub give a heading: lower case, letters,
/// digits, `-` and `_` kept, spaces turned into `-`, the rest dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in parser(&text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = &mut heading {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                out.insert(slug(&heading.take().unwrap()));
            }
            _ => {}
        }
    }
    out
}

/// Code blocks of a page: (info string, first line, text).
fn code_blocks(page: &Path) -> Vec<(String, usize, String)> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut out = vec![];
    let mut current: Option<(String, usize, String)> = None;
    for (event, range) in parser(&text).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                let line = text[..range.start].lines().count() + 2;
                current = Some((info.to_string(), line, String::new()));
            }
            Event::Text(t) => {
                if let Some((_, _, body)) = &mut current {
                    body.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => out.extend(current.take()),
            _ => {}
        }
    }
    out
}

#[test]
fn every_chapter_is_in_the_summary_and_every_link_resolves() {
    let docs = root().join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let mut listed = BTreeSet::new();
    for event in parser(&summary) {
        if let Event::Start(Tag::Link { dest_url, .. }) = event {
            listed.insert(docs.join(dest_url.as_ref()));
        }
    }
    let mut problems = vec![];
    for page in pages() {
        let is_chapter = page.starts_with(&docs)
            && page != docs.join("SUMMARY.md")
            // A GPU run's own notes are data, linked from its chapter.
            && !page.starts_with(docs.join("gpu-runs"))
            || page == docs.join("gpu-runs/2026-11-30/README.md");
        if is_chapter && !listed.contains(&page) {
            problems.push(format!("{}: not in docs/SUMMARY.md", page.display()));
        }
        let text = std::fs::read_to_string(&page).unwrap();
        let mut headings = 0;
        for (event, range) in parser(&text).into_offset_iter() {
            if let Event::Start(Tag::Heading {
                level: HeadingLevel::H1,
                ..
            }) = event
            {
                headings += 1;
            }
            let Event::Start(Tag::Link { dest_url, .. }) = event else {
                continue;
            };
            let line = text[..range.start].lines().count().max(1);
            let dest = dest_url.as_ref();
            if dest.contains("://") || dest.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = dest.split_once('#').unwrap_or((dest, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let at = format!("{}:{line}: link {dest}", page.display());
            if !target.exists() {
                problems.push(format!("{at}: no such file"));
            } else if !target.starts_with(root()) || target.canonicalize().is_err() {
                problems.push(format!("{at}: outside the repository"));
            } else if !anchor.is_empty() && !anchors(&target).contains(anchor) {
                problems.push(format!("{at}: no heading with this anchor"));
            }
        }
        if page.starts_with(&docs) && page != docs.join("SUMMARY.md") && headings == 0 {
            problems.push(format!("{}: no title (# heading)", page.display()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_toml_example_is_a_valid_study_file() {
    let mut checked = 0;
    let mut problems = vec![];
    for page in pages() {
        for (info, line, body) in code_blocks(&page) {
            if info != "toml" {
                continue;
            }
            // Named as if it were in studies/, where the examples' relative
            // paths (workers, data) point.
            let name = root().join("studies").join(format!(
                "{}-line-{line}.toml",
                page.file_stem().unwrap().to_string_lossy()
            ));
            match salus_tune::study::parse::parse_str(&body, &name) {
                Ok(_) => checked += 1,
                Err(e) => problems.push(format!("{}:{line}: {e}", page.display())),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 5, "only {checked} TOML examples found");
}

/// One command line of a shell example, split into words, without what
/// only a shell reads: leading `VAR=value`s, redirections, a final `&`.
fn command_words(line: &str) -> Option<Vec<String>> {
    let line = line.trim().trim_end_matches('&').trim();
    let line = line.split(" #").next().unwrap();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let words = shell_words::split(line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let words: Vec<String> = words
        .into_iter()
        .skip_while(|w| {
            w.split_once('=')
                .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        })
        .take_while(|w| !w.starts_with('>') && !w.starts_with("2>"))
        .collect();
    let first = words.first()?.as_str();
    // Shell grammar and set-up, not commands of ours.
    if matches!(first, "for" | "do" | "done" | "wait" | "export" | "cd") {
        return None;
    }
    Some(words)
}

#[test]
fn every_command_line_example_parses_and_names_files_that_exist() {
    let mut ours = 0;
    let mut problems = vec![];
    for page in pages() {
        for (info, line, body) in code_blocks(&page) {
            if !matches!(info.as_str(), "sh" | "bash" | "console") {
                continue;
            }
            let joined = body.replace("\\\n", " ");
            for (i, l) in joined.lines().enumerate() {
                let Some(words) = command_words(l) else {
                    continue;
                };
                let at = format!("{}:{}: {l}", page.display(), line + i);
                let args: Vec<String> = match words[0].as_str() {
                    "salus-tune" => words.clone(),
                    "cargo" if words.iter().any(|w| w == "--") => {
                        let rest = words.iter().skip_while(|w| *w != "--").skip(1);
                        std::iter::once("salus-tune".to_string())
                            .chain(rest.cloned())
                            .collect()
                    }
                    _ => vec![],
                };
                if !args.is_empty() {
                    ours += 1;
                    match salus_tune::cli::parse_args(&args) {
                        Err(e) => problems.push(format!("{at}: {}", e.render())),
                        // A misspelt command parses as `run` of a study
                        // file of that name.
                        Ok(Cli {
                            command: Command::Run { study, .. },
                        }) if study.extension().is_none_or(|e| e != "toml") => {
                            problems.push(format!("{at}: no command {}", study.display()))
                        }
                        Ok(_) => {}
                    }
                }
                // Paths into the repository must exist; a file name
                // without a folder is the reader's own (study.toml).
                for w in &words[1..] {
                    let path = w.rsplit_once('=').map_or(w.as_str(), |(_, v)| v);
                    let repo_path = path.contains('/')
                        && !path.contains("://")
                        && !path.contains('$')
                        && !path.starts_with('/')
                        && !path.starts_with('-');
                    if repo_path && !root().join(path).exists() {
                        problems.push(format!("{at}: {path} does not exist"));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(ours >= 5, "only {ours} salus-tune command lines found");
}

#[test]
fn anchors_follow_mdbooks_rule() {
    // On headings the book links to.
    assert_eq!(
        slug("When a process stalls and comes back: what holds"),
        "when-a-process-stalls-and-comes-back-what-holds"
    );
    assert_eq!(slug("`[study]`"), "study");
}

/// Every long flag of every command, as clap knows them.
fn cli_flags() -> BTreeSet<String> {
    fn walk(cmd: &clap::Command, out: &mut BTreeSet<String>) {
        for arg in cmd.get_arguments() {
            if let Some(long) = arg.get_long() {
                out.insert(format!("--{long}"));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&<Cli as clap::CommandFactory>::command(), &mut out);
    out
}

#[test]
fn the_cli_chapter_names_every_flag_and_no_other() {
    let text = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let mut named = BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let flag: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if !flag.is_empty() && !flag.starts_with('-') && !flag.ends_with('-') {
            named.insert(format!("--{flag}"));
        }
    }
    let flags = cli_flags();
    let missing: Vec<_> = flags.difference(&named).collect();
    let unknown: Vec<_> = named.difference(&flags).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "flags of --help that docs/cli.md does not name: {missing:?}\n\
         flags docs/cli.md names that no command has: {unknown:?}"
    );
}

/// The rows of docs/cli.md's exit-status table: (status, example).
fn exit_status_rows() -> Vec<(i32, String)> {
    let text = std::fs::read_to_string(root().join("docs/cli.md")).unwrap();
    let start = text
        .find("| status | meaning | for example |")
        .expect("the table");
    text[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].parse().unwrap(), cells[3].to_string())
        })
        .collect()
}

#[test]
fn the_exit_status_table_is_what_the_binary_does() {
    let rows = exit_status_rows();
    let statuses: Vec<i32> = rows.iter().map(|r| r.0).collect();
    assert_eq!(statuses, [0, 1, 2, 130]);
    // --help gives the same statuses.
    let help = <Cli as clap::CommandFactory>::command()
        .render_long_help()
        .to_string();
    assert!(
        help.contains("Exit status: 0 success, 1 ")
            && help.contains(", 2 bad input")
            && help.contains(", 130 stopped by Ctrl-C"),
        "{help}"
    );
    // Each example, run: a study with a kept model stands in for STUDY.toml.
    let dir = tempfile::tempdir().unwrap();
    let study = dir.path().join("s.toml");
    std::fs::write(
        &study,
        "[study]\nname = \"s\"\ntrials = 1\n\n[train]\nepochs = 1\n",
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_salus-tune");
    let status = |args: &[&str]| {
        let out = std::process::Command::new(bin)
            .args(args)
            .current_dir(root())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let s = study.to_str().unwrap();
    assert_eq!(status(&[s, "--no-progress"]).0, Some(0));
    for (code, example) in rows {
        let Some(command) = example.strip_prefix('`').and_then(|e| e.split('`').next()) else {
            assert_eq!(
                code, 130,
                "only Ctrl-C has no example (tests/it/run.rs sends it)"
            );
            continue;
        };
        let words = shell_words::split(&command.replace("STUDY.toml", s)).unwrap();
        assert_eq!(words[0], "salus-tune");
        let (got, stderr) = status(&words[1..].iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(got, Some(code), "{command}: {stderr}");
    }
}
