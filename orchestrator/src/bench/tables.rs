//! The tabulated benchmark: every configuration of one grid of MLP knobs,
//! trained once by the built-in trainer on each of four data sets
//! (`scripts/tabulate.sh` writes `tables/<data set>.csv`; the binary
//! carries them), replayed by `bench samplers` as lookups, so that a
//! sampler's regret over many seeds costs microseconds per trial.
//!
//! A problem's space is the grid's: width, depth, learning rate and batch
//! size as indices into their ordered levels (ordinal integers, as users
//! map such lists to `suggest_int`), and the activation as a categorical.
//! Its value is the configuration's final validation loss; a trial that
//! diverged in the table counts as the table's worst loss. Of several
//! objectives, `mlp-digits` is the validation error (1 - accuracy)
//! against the parameter count, both minimised.
//!
//! Held out: `tab-synthetic-b` and `tab-breast-cancer` are not looked
//! at while the samplers' settings are chosen; `tab-digits` and
//! `tab-synthetic-a` are.

use crate::space::{Choice, Distribution, Param, ParamValue, Params, SearchSpace};

/// The ordinal knobs, in the table's column order, then the categorical.
const ORDINAL: [&str; 4] = ["width", "depth", "lr", "batch_size"];
const ACTIVATIONS: [&str; 3] = ["relu", "tanh", "gelu"];

/// The tables the binary carries: (problem name, CSV, held out).
pub const TABLES: [(&str, &str, bool); 4] = [
    ("tab-digits", include_str!("tables/digits.csv"), false),
    (
        "tab-synthetic-a",
        include_str!("tables/synthetic-a.csv"),
        false,
    ),
    (
        "tab-synthetic-b",
        include_str!("tables/synthetic-b.csv"),
        true,
    ),
    (
        "tab-breast-cancer",
        include_str!("tables/breast-cancer.csv"),
        true,
    ),
];

/// One configuration's results.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub val_loss: f64,
    pub val_accuracy: f64,
    pub params: f64,
}

/// A table: each configuration's results by its knobs' level indices.
#[derive(Debug, Clone)]
pub struct Table {
    /// Each ordinal knob's levels, ascending, as written.
    levels: Vec<Vec<String>>,
    entries: std::collections::BTreeMap<[usize; 5], Entry>,
    worst_loss: f64,
}

impl Table {
    /// Parses a table as `scripts/tabulate.sh` writes it; the grid must
    /// be complete (every combination of the levels once).
    pub fn parse(csv_text: &str) -> Result<Table, String> {
        let mut rdr = csv::Reader::from_reader(csv_text.as_bytes());
        let mut rows: Vec<(Vec<String>, Entry)> = Vec::new();
        for (i, rec) in rdr.records().enumerate() {
            let rec = rec.map_err(|e| format!("row {}: {e}", i + 2))?;
            let num = |k: usize| -> Result<f64, String> {
                rec.get(k)
                    .unwrap_or("")
                    .parse::<f64>()
                    .map_err(|e| format!("row {}, column {}: {e}", i + 2, k + 1))
            };
            let knobs: Vec<String> = (0..5)
                .map(|k| rec.get(k).unwrap_or("").to_string())
                .collect();
            rows.push((
                knobs,
                Entry {
                    val_loss: num(5)?,
                    val_accuracy: num(6)?,
                    params: num(7)?,
                },
            ));
        }
        let levels: Vec<Vec<String>> = (0..ORDINAL.len())
            .map(|k| {
                let mut v: Vec<String> = rows.iter().map(|r| r.0[k].clone()).collect();
                v.sort_by(|a, b| {
                    let (x, y) = (a.parse::<f64>(), b.parse::<f64>());
                    match (x, y) {
                        (Ok(x), Ok(y)) => x.total_cmp(&y),
                        _ => a.cmp(b),
                    }
                });
                v.dedup();
                v
            })
            .collect();
        let mut entries = std::collections::BTreeMap::new();
        for (knobs, e) in rows {
            let mut key = [0usize; 5];
            for k in 0..ORDINAL.len() {
                key[k] = levels[k]
                    .iter()
                    .position(|l| *l == knobs[k])
                    .expect("a level");
            }
            key[4] = ACTIVATIONS
                .iter()
                .position(|a| *a == knobs[4])
                .ok_or_else(|| format!("unknown activation '{}'", knobs[4]))?;
            entries.insert(key, e);
        }
        let cells: usize = levels.iter().map(Vec::len).product::<usize>() * ACTIVATIONS.len();
        if entries.len() != cells {
            return Err(format!(
                "{} configurations, but the levels make {cells}",
                entries.len()
            ));
        }
        let worst_loss = entries
            .values()
            .map(|e| e.val_loss)
            .filter(|v| v.is_finite())
            .fold(f64::NEG_INFINITY, f64::max);
        Ok(Table {
            levels,
            entries,
            worst_loss,
        })
    }

    /// The search space: an index per ordinal knob, the activation.
    pub fn space(&self) -> SearchSpace {
        let mut params: Vec<Param> = ORDINAL
            .iter()
            .zip(&self.levels)
            .map(|(name, levels)| Param {
                name: (*name).into(),
                dist: Distribution::Int {
                    low: 0,
                    high: levels.len() as i64 - 1,
                    log: false,
                    step: 1,
                },
                condition: None,
            })
            .collect();
        params.push(Param {
            name: "activation".into(),
            dist: Distribution::Categorical {
                choices: ACTIVATIONS.map(|a| Choice::Str(a.into())).to_vec(),
            },
            condition: None,
        });
        SearchSpace::new(params).expect("a valid space")
    }

    /// The configuration `p` names.
    pub fn at(&self, p: &Params) -> Entry {
        let mut key = [0usize; 5];
        for (k, name) in ORDINAL.iter().enumerate() {
            key[k] = p[*name].internal() as usize;
        }
        key[4] = match p["activation"] {
            ParamValue::Choice(c) => c,
            v => v.internal() as usize,
        };
        self.entries[&key]
    }

    /// `p`'s validation loss; a diverged configuration's is the worst.
    pub fn loss(&self, p: &Params) -> f64 {
        let l = self.at(p).val_loss;
        if l.is_finite() { l } else { self.worst_loss }
    }

    /// The smallest validation loss of the table.
    pub fn best_loss(&self) -> f64 {
        self.entries
            .values()
            .map(|e| e.val_loss)
            .filter(|v| v.is_finite())
            .fold(f64::INFINITY, f64::min)
    }

    /// The largest parameter count of the table.
    pub fn most_params(&self) -> f64 {
        self.entries.values().map(|e| e.params).fold(0.0, f64::max)
    }
}

/// The carried table of problem `name`.
pub fn table(name: &str) -> Table {
    let (_, text, _) = TABLES
        .iter()
        .find(|t| t.0 == name)
        .unwrap_or_else(|| panic!("no table {name}"));
    Table::parse(text).unwrap_or_else(|e| panic!("the carried table {name}: {e}"))
}

/// Writes the carried tables beside the anchor scripts (as
/// `<problem>.csv`), for Optuna's side to read the same values.
pub fn carry() -> crate::error::Result<()> {
    for (name, text, _) in TABLES {
        super::carried_file(&format!("{name}.csv"), text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_carried_table_is_a_whole_grid_of_real_results() {
        for (name, _, _) in TABLES {
            let t = table(name);
            let space = t.space();
            assert_eq!(space.params().len(), 5, "{name}");
            assert_eq!(t.entries.len(), 675, "{name}");
            // The best configuration learned, and bigger nets hold more.
            assert!(t.best_loss() > 0.0 && t.best_loss() < 1.0, "{name}");
            let acc: Vec<f64> = t.entries.values().map(|e| e.val_accuracy).collect();
            assert!(acc.iter().cloned().fold(0.0, f64::max) > 0.6, "{name}");
            assert!(
                t.most_params()
                    > t.entries
                        .values()
                        .map(|e| e.params)
                        .fold(f64::INFINITY, f64::min)
            );
        }
    }

    #[test]
    fn a_table_is_parsed_by_its_levels_and_refuses_a_gap() {
        let head = "width,depth,lr,batch_size,activation,val_loss,val_accuracy,params\n";
        let mut text = String::from(head);
        for w in ["16", "8"] {
            for a in ACTIVATIONS {
                text += &format!("{w},1,0.01,32,{a},0.{w},0.9,{w}\n");
            }
        }
        let t = Table::parse(&text).unwrap();
        // Levels ascend numerically: 8 before 16.
        assert_eq!(t.levels[0], vec!["8", "16"]);
        let p: Params = [
            ("width", ParamValue::Int(1)),
            ("depth", ParamValue::Int(0)),
            ("lr", ParamValue::Int(0)),
            ("batch_size", ParamValue::Int(0)),
            ("activation", ParamValue::Choice(2)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(t.loss(&p), 0.16);
        let gap: String = text.lines().take(6).collect::<Vec<_>>().join("\n");
        assert!(Table::parse(&gap).unwrap_err().contains("5 configurations"));
    }
}
