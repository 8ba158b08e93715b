//! CSV files: a header row, a named target column, numeric features.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use super::{Dataset, Task, TaskKind};
use crate::error::{Result, WorkerError};

/// Loads `path`; every column except `target` is a numeric feature.
/// Classification targets may be any text; classes are numbered in sorted
/// order (numeric order when every label is a number).
pub fn load_csv(path: &Path, target: &str, kind: TaskKind) -> Result<Dataset> {
    let file = std::fs::File::open(path).map_err(|source| WorkerError::Io {
        path: path.into(),
        source,
    })?;
    parse_csv(file, path, target, kind)
}

/// An error at a line (and column) of the CSV file at `path`.
fn data_error(path: &Path) -> impl Fn(u64, Option<u64>, String) -> WorkerError + '_ {
    move |line, col, msg| WorkerError::data(path, Some(line), col, msg)
}

/// A data row's target as written, with its line: parsed once the task is known.
type RawTarget = (u64, String);

/// The reader over a CSV source's records.
type Records<R> = csv::ByteRecordsIntoIter<R>;

/// [`load_csv`] over any reader; `path` only names the source in errors.
pub fn parse_csv(reader: impl Read, path: &Path, target: &str, kind: TaskKind) -> Result<Dataset> {
    let rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(reader);
    let mut records = rdr.into_byte_records();
    let (names, target_col) = read_header(&mut records, path, target)?;
    let features = names.len() - 1;
    let (x, raw_targets) = read_rows(records, path, &names, target_col)?;
    let rows = raw_targets.len();
    if rows == 0 {
        return Err(data_error(path)(
            1,
            None,
            "the file has a header but no data rows".into(),
        ));
    }
    let tcol = Some(target_col as u64 + 1);
    let (y, task, classes) = targets(&raw_targets, path, target, tcol, kind)?;
    Ok(Dataset {
        name: format!("csv:{}:{target}", path.display()),
        rows,
        features,
        image: None,
        x,
        y,
        task,
        classes,
    })
}

/// The header's column names and the target's column; at least one
/// feature besides it.
fn read_header<R: Read>(
    records: &mut Records<R>,
    path: &Path,
    target: &str,
) -> Result<(Vec<String>, usize)> {
    let err = data_error(path);
    let header = match records.next() {
        None => {
            return Err(err(
                1,
                None,
                "the file is empty; expected a header row".into(),
            ));
        }
        Some(r) => r.map_err(|e| csv_error(path, e))?,
    };
    let names: Vec<String> = header
        .iter()
        .enumerate()
        .map(|(i, f)| {
            std::str::from_utf8(f)
                .map(|s| s.trim().to_string())
                .map_err(|_| {
                    err(
                        1,
                        Some(i as u64 + 1),
                        "the header is not valid UTF-8".into(),
                    )
                })
        })
        .collect::<Result<_>>()?;
    let target_col = names.iter().position(|n| n == target).ok_or_else(|| {
        err(
            1,
            None,
            format!(
                "no column named '{target}' in the header; columns are: {}",
                names.join(", ")
            ),
        )
    })?;
    if names.len() < 2 {
        return Err(err(
            1,
            None,
            "the header has no feature columns besides the target".into(),
        ));
    }

    Ok((names, target_col))
}

/// The features of every data row, row-major, and each row's target as
/// written; blank lines are skipped.
fn read_rows<R: Read>(
    records: Records<R>,
    path: &Path,
    names: &[String],
    target_col: usize,
) -> Result<(Vec<f32>, Vec<RawTarget>)> {
    let err = data_error(path);
    let (mut x, mut raw_targets) = (Vec::new(), Vec::new());
    for rec in records {
        let rec = rec.map_err(|e| csv_error(path, e))?;
        let line = rec.position().map_or(0, |p| p.line());
        if rec.len() == 1
            && rec
                .get(0)
                .is_some_and(|f| f.iter().all(u8::is_ascii_whitespace))
        {
            continue; // a blank line
        }
        if rec.len() != names.len() {
            return Err(err(
                line,
                None,
                format!(
                    "expected {} fields as in the header, found {}",
                    names.len(),
                    rec.len()
                ),
            ));
        }
        for (i, field) in rec.iter().enumerate() {
            let col = Some(i as u64 + 1);
            let text = std::str::from_utf8(field)
                .map_err(|_| err(line, col, "not valid UTF-8".into()))?
                .trim();
            if i == target_col {
                raw_targets.push((line, text.to_string()));
                continue;
            }
            x.push(parse_number(text).ok_or_else(|| {
                err(
                    line,
                    col,
                    format!(
                        "expected a finite number in feature column '{}', found '{}'",
                        names[i], text
                    ),
                )
            })?);
        }
    }
    Ok((x, raw_targets))
}

/// The targets as numbers: regression values, or class indices with the
/// class names (refusing labels that look continuous).
fn targets(
    raw_targets: &[RawTarget],
    path: &Path,
    target: &str,
    tcol: Option<u64>,
    kind: TaskKind,
) -> Result<(Vec<f32>, Task, Vec<String>)> {
    let rows = raw_targets.len();
    let err = data_error(path);
    Ok(match kind {
        TaskKind::Regression => {
            let y = raw_targets
                .iter()
                .map(|(line, t)| {
                    parse_number(t).ok_or_else(|| err(*line, tcol, format!("expected a finite number as regression target '{target}', found '{t}'")))
                })
                .collect::<Result<Vec<_>>>()?;
            (y, Task::Regression { targets: 1 }, Vec::new())
        }
        TaskKind::Classification => {
            if let Some((line, _)) = raw_targets.iter().find(|(_, t)| t.is_empty()) {
                return Err(err(
                    *line,
                    tcol,
                    format!("the class label '{target}' is empty"),
                ));
            }
            let classes = class_names(raw_targets.iter().map(|(_, t)| t.as_str()));
            if let Some(why) = looks_continuous(&classes, rows) {
                return Err(err(
                    1,
                    tcol,
                    format!(
                        "'{target}' looks like a continuous target for classification ({why}); \
                         for a numeric target set task = \"regression\" in [data]"
                    ),
                ));
            }
            if classes.len() < 2 {
                return Err(err(
                    1,
                    tcol,
                    format!(
                        "classification needs at least 2 classes in '{target}', found {}",
                        classes.len()
                    ),
                ));
            }
            let y = raw_targets
                .iter()
                .map(|(_, t)| classes.iter().position(|c| c == t).unwrap() as f32)
                .collect();
            (
                y,
                Task::Classification {
                    classes: classes.len(),
                },
                classes,
            )
        }
    })
}

fn parse_number(s: &str) -> Option<f32> {
    s.parse::<f32>().ok().filter(|v| v.is_finite())
}

/// Why numeric class labels look like a regression target, if they do:
/// a fractional label, or so many distinct values that most classes would
/// have a row or two (the split then cannot hold out any of them).
fn looks_continuous(classes: &[String], rows: usize) -> Option<String> {
    let numbers: Vec<f64> = classes.iter().map_while(|c| c.parse().ok()).collect();
    if numbers.len() != classes.len() {
        return None;
    }
    if let Some(f) = numbers.iter().find(|v| v.fract() != 0.0) {
        return Some(format!("it has fractional values such as {f}"));
    }
    let many =
        classes.len() > MAX_CLASSES_PER_ROWS.0 && classes.len() * MAX_CLASSES_PER_ROWS.1 > rows;
    many.then(|| format!("{} distinct values in {rows} rows", classes.len()))
}

/// More numeric classes than `.0` and than one per `.1` rows is a regression
/// target (digits has 10 classes in 1797 rows; a price column has hundreds).
const MAX_CLASSES_PER_ROWS: (usize, usize) = (50, 4);

/// Distinct labels, in numeric order when all are numbers, else sorted text.
fn class_names<'a>(labels: impl Iterator<Item = &'a str>) -> Vec<String> {
    let set: BTreeSet<&str> = labels.collect();
    let mut names: Vec<String> = set.into_iter().map(String::from).collect();
    if names.iter().all(|n| n.parse::<f64>().is_ok()) {
        names.sort_by(|a, b| {
            a.parse::<f64>()
                .unwrap()
                .total_cmp(&b.parse::<f64>().unwrap())
        });
    }
    names
}

fn csv_error(path: &Path, e: csv::Error) -> WorkerError {
    let line = e.position().map(|p| p.line());
    WorkerError::data(path, line, None, format!("malformed CSV: {e}"))
}
