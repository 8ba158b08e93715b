//! `trials` and `best` output: a table, CSV or JSON.

pub use crate::numbers::fmt_float;
use serde_json::{Value, json};

use crate::storage::{PbtLineage, TrialRow, TrialState};
use crate::study::Direction;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

/// A stored parameter's value as Optuna shows it: the number, or the chosen
/// categorical value.
pub fn external(internal: f64, distribution_json: &str) -> Value {
    let dist: Value = serde_json::from_str(distribution_json).unwrap_or(Value::Null);
    match dist["name"].as_str() {
        Some("CategoricalDistribution") => dist["attributes"]["choices"]
            .get(internal as usize)
            .cloned()
            .unwrap_or(Value::Null),
        Some("IntDistribution") => json!(internal.round() as i64),
        _ => json!(internal),
    }
}

fn params_json(t: &TrialRow) -> serde_json::Map<String, Value> {
    t.params
        .iter()
        .map(|p| (p.name.clone(), external(p.internal, &p.distribution_json)))
        .collect()
}

fn duration_s(t: &TrialRow) -> Option<f64> {
    let parse = |s: &Option<String>| {
        s.as_deref()
            .and_then(|s| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").ok())
    };
    Some((parse(&t.datetime_complete)? - parse(&t.datetime_start)?).as_seconds_f64())
}

/// One trial as JSON.
pub fn trial_json(t: &TrialRow) -> Value {
    json!({
        "number": t.number,
        "state": t.state.as_str(),
        "value": t.value,
        "values": (!t.more_values.is_empty()).then(|| t.values()),
        "params": params_json(t),
        "datetime_start": t.datetime_start,
        "datetime_complete": t.datetime_complete,
        "duration_s": duration_s(t),
        "intermediate_values": t.intermediate.iter().map(|(s, v)| json!([s, v])).collect::<Vec<_>>(),
        "fail_reason": t.fail_reason,
        "rung": t.rung,
        "priority": t.priority,
    })
}

/// The best COMPLETE trial for `direction` (the lowest number on ties);
/// in a constrained study, the best feasible one, as Optuna's
/// `best_trial` is.
pub fn best(trials: &[TrialRow], direction: Direction) -> Option<&TrialRow> {
    trials
        .iter()
        .filter(|t| t.state == TrialState::Complete && t.value.is_some_and(f64::is_finite))
        .filter(|t| t.feasible())
        .fold(None, |acc: Option<&TrialRow>, t| match acc {
            Some(b) if !direction.better(t.value.unwrap(), b.value.unwrap()) => Some(b),
            _ => Some(t),
        })
}

/// The COMPLETE trials no other COMPLETE trial dominates, for a study of
/// several objectives in `directions`, by trial number; in a constrained
/// study, among the feasible ones (Optuna's `study.best_trials`).
pub fn pareto_front<'a>(trials: &'a [TrialRow], directions: &[Direction]) -> Vec<&'a TrialRow> {
    let complete: Vec<&TrialRow> = trials
        .iter()
        .filter(|t| t.state == TrialState::Complete && t.feasible())
        .filter(|t| {
            let v = t.values();
            v.len() == directions.len() && v.iter().all(|x| x.is_finite())
        })
        .collect();
    let points: Vec<Vec<f64>> = complete
        .iter()
        .map(|t| crate::pareto::minimised(&t.values(), directions))
        .collect();
    crate::pareto::front(&points)
        .into_iter()
        .map(|i| complete[i])
        .collect()
}

/// The Pareto front as text in `format`: one row per trial, its number,
/// each objective (named `names`) and its parameters.
pub fn render_front(front: &[&TrialRow], names: &[String], format: Format) -> String {
    if format == Format::Json {
        let all: Vec<Value> = front.iter().map(|t| trial_json(t)).collect();
        return serde_json::to_string_pretty(&all).unwrap() + "\n";
    }
    let mut params: Vec<String> = Vec::new();
    for t in front {
        for p in &t.params {
            if !params.contains(&p.name) {
                params.push(p.name.clone());
            }
        }
    }
    let header: Vec<String> = std::iter::once("number".to_string())
        .chain(names.iter().cloned())
        .chain(params.iter().cloned())
        .collect();
    let exact = format == Format::Csv;
    let rows: Vec<Vec<String>> = front
        .iter()
        .map(|t| {
            let p = params_json(t);
            std::iter::once(t.number.to_string())
                .chain(t.values().into_iter().map(|v| cell(&json!(v), exact)))
                .chain(
                    params
                        .iter()
                        .map(|n| p.get(n).map_or(String::new(), |v| cell(v, exact))),
                )
                .collect()
        })
        .collect();
    match format {
        Format::Csv => csv(&header, &rows),
        _ => format!(
            "Pareto front: {} trials that no other trial beats in every objective\n{}",
            front.len(),
            table(&header, &rows)
        ),
    }
}

/// A value as a cell: floats rounded for people (`fmt_float`), or with
/// every digit (the shortest text that reads back to the same `f64`) where
/// `exact`, as CSV is for programs.
fn cell(v: &Value, exact: bool) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && !exact => fmt_float(f),
            Some(f) if n.is_f64() => f.to_string(),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Where a PBT member's weights came from: `donor@step` for each exploit
/// it took, in order.
fn lineage_cell(exploits: &[(i64, crate::storage::TrialNumber)]) -> String {
    exploits
        .iter()
        .map(|(step, donor)| format!("{donor}@{step}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Rows of trials as text in `format`; `lineage`, a PBT study's exploits
/// (a `pbt_from` column, `donor@step` for each a trial took).
pub fn render_trials(trials: &[TrialRow], lineage: &PbtLineage, format: Format) -> String {
    if format == Format::Json {
        let rows: Vec<Value> = trials
            .iter()
            .map(|t| {
                let mut j = trial_json(t);
                if !lineage.is_empty() {
                    let took = lineage.get(&t.number).map_or(&[][..], Vec::as_slice);
                    j["pbt_from"] = took
                        .iter()
                        .map(|(step, donor)| json!({ "step": step, "trial": donor }))
                        .collect();
                }
                j
            })
            .collect();
        return serde_json::to_string_pretty(&rows).unwrap() + "\n";
    }
    let mut names: Vec<String> = Vec::new();
    for t in trials {
        for p in &t.params {
            if !names.contains(&p.name) {
                names.push(p.name.clone());
            }
        }
    }
    let mut header = vec![
        "number".to_string(),
        "state".into(),
        "value".into(),
        "duration_s".into(),
    ];
    // Rung and priority exist when a pruner ran.
    let staged = trials.iter().any(|t| t.priority.is_some());
    if staged {
        header.extend(["rung".to_string(), "priority".to_string()]);
    }
    header.extend(names.iter().cloned());
    let pbt = !lineage.is_empty();
    if pbt {
        header.push("pbt_from".into());
    }
    let exact = format == Format::Csv;
    let rows: Vec<Vec<String>> = trials
        .iter()
        .map(|t| {
            let params = params_json(t);
            let rounded = |v: f64, places: usize| match exact {
                true => v.to_string(),
                false => format!("{v:.places$}"),
            };
            let mut row = vec![
                t.number.to_string(),
                t.state.as_str().to_string(),
                t.value.map_or(String::new(), |v| cell(&json!(v), exact)),
                duration_s(t).map_or(String::new(), |d| rounded(d, 2)),
            ];
            if staged {
                row.push(t.rung.map_or(String::new(), |r| r.to_string()));
                row.push(t.priority.map_or(String::new(), |p| rounded(p, 3)));
            }
            row.extend(
                names
                    .iter()
                    .map(|n| params.get(n).map_or(String::new(), |v| cell(v, exact))),
            );
            if pbt {
                row.push(
                    lineage
                        .get(&t.number)
                        .map_or(String::new(), |l| lineage_cell(l)),
                );
            }
            row
        })
        .collect();
    match format {
        Format::Csv => csv(&header, &rows),
        _ => table(&header, &rows),
    }
}

/// A header and rows as CSV.
fn csv(header: &[String], rows: &[Vec<String>]) -> String {
    std::iter::once(header)
        .chain(rows.iter().map(Vec::as_slice))
        .map(|r| r.iter().map(|c| csv_field(c)).collect::<Vec<_>>().join(",") + "\n")
        .collect()
}

fn table(header: &[String], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            std::iter::once(&header[i])
                .chain(rows.iter().map(|r| &r[i]))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |r: &[String]| {
        r.iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
            + "\n"
    };
    let mut out = line(header);
    out += &(widths
        .iter()
        .map(|w| "-".repeat(*w))
        .collect::<Vec<_>>()
        .join("  ")
        + "\n");
    rows.iter().for_each(|r| out += &line(r));
    out
}

/// The best trial as text in `format`.
pub fn render_best(t: &TrialRow, metric: Option<&str>, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(&trial_json(t)).unwrap() + "\n",
        Format::Csv => render_trials(std::slice::from_ref(t), &PbtLineage::new(), Format::Csv),
        Format::Table => {
            let mut out = format!(
                "Best trial: {}\n  {}: {}\n  params:\n",
                t.number,
                metric.unwrap_or("value"),
                t.value.map_or(String::new(), |v| v.to_string())
            );
            for (n, v) in params_json(t) {
                out += &format!("    {n}: {}\n", cell(&v, false));
            }
            out
        }
    }
}
