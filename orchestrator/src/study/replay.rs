//! A PBT member's schedule as a study file of its own (`salus-tune best
//! --schedule`): the PBT study's file with `[pbt]` gone, each knob fixed
//! where the member's weights started, and `[train] schedule` for the
//! values that came later. It replays the schedule without PBT (not the
//! weights' exact path: the replay starts from its own seed).

use super::{KNOBS, Study};

/// A JSON value of a knob as TOML.
fn toml_value(v: &serde_json::Value) -> Option<toml::Value> {
    match v {
        serde_json::Value::Bool(b) => Some(toml::Value::Boolean(*b)),
        serde_json::Value::Number(n) => n
            .as_i64()
            .map(toml::Value::Integer)
            .or(n.as_f64().map(toml::Value::Float)),
        serde_json::Value::String(s) => Some(toml::Value::String(s.clone())),
        _ => None,
    }
}

/// The table at `path` (`train.adam`) in `root`, made where missing.
fn table_at<'a>(root: &'a mut toml::Table, path: &str) -> &'a mut toml::Table {
    path.split('.').fold(root, |t, key| {
        let entry = t
            .entry(key.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        entry.as_table_mut().expect("a table")
    })
}

/// `text` (the PBT study's file) rewritten to replay `schedule` (a
/// member's `pbt:schedule`).
pub fn replay_file(
    text: &str,
    study: &Study,
    schedule: &serde_json::Value,
) -> Result<String, String> {
    let mut root: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let entries = schedule
        .as_array()
        .filter(|e| !e.is_empty())
        .ok_or("the schedule is not a non-empty list")?;
    root.remove("pbt");
    root.remove("pruner");
    let st = table_at(&mut root, "study");
    st.insert(
        "name".into(),
        toml::Value::String(format!("{}-schedule", study.name)),
    );
    st.insert("trials".into(), toml::Value::Integer(1));
    let values_of = |e: &serde_json::Value| -> Result<Vec<(String, toml::Value)>, String> {
        let params = e["params"].as_object().ok_or("an entry without params")?;
        params
            .iter()
            .map(|(k, v)| {
                toml_value(v)
                    .map(|t| (k.clone(), t))
                    .ok_or(format!("{k} = {v} is not a knob's value"))
            })
            .collect()
    };
    // Where the weights started: every knob fixed in its own section.
    for (name, value) in values_of(&entries[0])? {
        let knob = KNOBS
            .iter()
            .find(|k| k.name == name)
            .ok_or(format!("unknown knob {name}"))?;
        table_at(&mut root, knob.section).insert(knob.key.to_string(), value);
    }
    // Steps count reports: the replay reports where the population did.
    if let Some(every) = study.report_every {
        table_at(&mut root, "train")
            .insert("report_every".into(), toml::Value::Integer(every as i64));
    }
    let mut later = Vec::new();
    for e in &entries[1..] {
        let mut entry = toml::Table::new();
        entry.insert(
            "step".into(),
            toml::Value::Integer(e["step"].as_i64().ok_or("an entry without a step")?),
        );
        entry.extend(values_of(e)?);
        later.push(toml::Value::Table(entry));
    }
    if !later.is_empty() {
        table_at(&mut root, "train").insert("schedule".into(), toml::Value::Array(later));
    }
    toml::to_string(&root).map_err(|e| e.to_string())
}
