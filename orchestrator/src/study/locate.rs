//! Where a mistake stands: byte offsets to `file:line:col: key: message`.
//!
//! [`Source`] keeps the file's text and toml's spanned tree. Every error
//! the parser reports goes through it: checks in `parse.rs` name their key
//! themselves, and [`Source::serde_error`] is the one place that turns a
//! serde error (an unknown key, a wrong type) into the same form, finding
//! the key from the error's span and adding "did you mean".

use std::ops::Range;
use std::path::Path;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::error::Error;

/// A study file's text and tree.
pub struct Source<'a> {
    pub path: &'a Path,
    src: &'a str,
    root: Spanned<DeTable<'a>>,
}

impl<'a> Source<'a> {
    /// Parses `src`; a syntax error is reported under the key "(syntax)".
    pub fn parse(src: &'a str, path: &'a Path) -> Result<Self, Error> {
        match DeTable::parse(src) {
            Ok(root) => Ok(Source { path, src, root }),
            Err(e) => {
                let span = e.span().unwrap_or(0..0);
                let at = Source {
                    path,
                    src,
                    root: Spanned::new(0..0, DeTable::default()),
                };
                Err(at.err(
                    span,
                    "(syntax)",
                    format!("invalid TOML: {}", e.message().trim()),
                ))
            }
        }
    }

    /// The file as a serde struct, with serde's errors in our words.
    pub fn deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        toml::from_str(self.src).map_err(|e| self.serde_error(&e))
    }

    pub fn err(&self, span: Range<usize>, key: &str, msg: impl Into<String>) -> Error {
        let (line, col) = self.line_col(span.start);
        Error::Study {
            path: self.path.display().to_string(),
            line,
            col,
            key: key.to_string(),
            msg: msg.into(),
        }
    }

    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let before = &self.src[..offset.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, col)
    }

    /// The keys of the table at dotted `path`, in toml's order, with their spans.
    pub fn keys(&self, path: &str) -> Vec<(String, Range<usize>)> {
        let mut table = self.root.get_ref();
        for part in path.split('.').filter(|p| !p.is_empty()) {
            match table
                .iter()
                .find(|(k, _)| k.get_ref().as_ref() == part)
                .map(|(_, v)| v.get_ref())
            {
                Some(DeValue::Table(t)) => table = t,
                _ => return Vec::new(),
            }
        }
        table
            .iter()
            .map(|(k, _)| (k.get_ref().to_string(), k.span()))
            .collect()
    }

    /// The dotted key of the key or value at `span`; array elements belong
    /// to their array's key.
    fn key_at(&self, span: &Range<usize>) -> Option<String> {
        fn walk(table: &DeTable, prefix: &str, span: &Range<usize>) -> Option<String> {
            for (k, v) in table.iter() {
                let path = if prefix.is_empty() {
                    k.get_ref().to_string()
                } else {
                    format!("{prefix}.{}", k.get_ref())
                };
                if k.span() == *span || v.span() == *span {
                    return Some(path);
                }
                if let Some(found) = in_value(v, &path, span) {
                    return Some(found);
                }
            }
            None
        }
        fn in_value(v: &Spanned<DeValue>, path: &str, span: &Range<usize>) -> Option<String> {
            match v.get_ref() {
                DeValue::Table(t) => walk(t, path, span),
                DeValue::Array(items) => items.iter().find_map(|item| {
                    if item.span() == *span {
                        Some(path.to_string())
                    } else {
                        in_value(item, path, span)
                    }
                }),
                _ => None,
            }
        }
        walk(self.root.get_ref(), "", span)
    }

    /// The one place a serde error becomes a study error.
    fn serde_error(&self, e: &toml::de::Error) -> Error {
        let span = e.span().unwrap_or(0..0);
        let key = self.key_at(&span).unwrap_or_default();
        let msg = e.message().trim();
        if let Some(rest) = msg.strip_prefix("unknown field `") {
            let (word, expected) = rest.split_once('`').unwrap_or((rest, ""));
            let known: Vec<&str> = expected
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|k| !k.starts_with('$'))
                .collect();
            let hint = suggest(word, &known).map_or_else(
                || format!("; expected one of: {}", known.join(", ")),
                |k| format!("; did you mean '{k}'?"),
            );
            let what = match key.rsplit_once('.') {
                None => format!("unknown section [{word}]"),
                Some((section, _)) => format!("unknown key '{word}' in [{section}]"),
            };
            return self.err(span, &key, format!("{what}{hint}"));
        }
        if let Some(found) = msg.strip_prefix(super::raw::NOT_A_TABLE) {
            return self.err(
                span,
                &key,
                format!("expected a table ([{key}]), found {found}"),
            );
        }
        self.err(span, &key, msg)
    }
}

const ALIASES: &[(&str, &str)] = &[
    ("learning_rate", "lr"),
    ("n_trials", "trials"),
    ("num_trials", "trials"),
    ("batch", "batch_size"),
    ("batchsize", "batch_size"),
    ("hidden", "width"),
    ("hidden_size", "width"),
    ("layers", "depth"),
    ("n_layers", "depth"),
    ("num_epochs", "epochs"),
    ("l2", "weight_decay"),
    ("val_fraction", "validation"),
    ("test_size", "validation"),
    ("objective", "metric"),
    ("study_name", "name"),
];

/// The closest known word, for "did you mean": by spelling, or through a
/// common alias (also misspelt, as in "lerning_rate").
pub fn suggest<'k>(word: &str, known: &[&'k str]) -> Option<&'k str> {
    let lower = word.to_lowercase();
    let aliases = ALIASES
        .iter()
        .filter_map(|(from, to)| known.iter().find(|k| *k == to).map(|k| (*from, *k)));
    known
        .iter()
        .map(|k| (*k, *k))
        .chain(aliases)
        .map(|(spelling, key)| {
            (
                key,
                strsim::jaro_winkler(&lower, spelling),
                strsim::levenshtein(&lower, spelling),
            )
        })
        .filter(|(_, sim, dist)| *sim >= 0.8 || *dist <= 2)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _, _)| k)
}
