//! The worker protocol, versions 1 to 3: JSON lines over a Unix socket.
//!
//! The orchestrator starts one process per trial with `SALUS_TUNE_SOCKET`
//! set to a socket path; the worker connects to it. The script's own stdout
//! and stderr are not part of the protocol, so nothing it prints can
//! corrupt it. Each message is one JSON object on one line, with a `type`:
//!
//! | from | `type` | fields | meaning |
//! |---|---|---|---|
//! | worker | `hello` | `version` | first message; `version` is 1, 2 or 3 |
//! | orchestrator | `start` | `version`, `trial`, `params`, `report_every`, `checkpoint_path`, `resume_from`; from version 2 also `device`, `memory_limit` | the trial to run; `resume_from` is a checkpoint path or null; `memory_limit` is the trial's grant in bytes, a cap the client sets on its allocator |
//! | worker | `ready` | from version 2, optional `memory` (`persistent`, `peak`, `cached`, in bytes) and `swap`; from version 3, optional `iteration` | asks to run its next iteration, then waits; `memory` is what the client measured on its device; `swap: true` says it can swap in process; `iteration`, the index of that iteration (a resumed script's place) |
//! | orchestrator | `go` | | run one iteration |
//! | orchestrator | `prune` | | exit now, cleanly |
//! | orchestrator | `checkpoint` | `path` | save your state to `path`, answer `checkpointed`, exit; you are restarted later with `resume_from` = `path` |
//! | worker | `checkpointed` | `path` | the state is saved |
//! | worker | `report` | `step`, `value`, optional `metrics` | an intermediate value (steps strictly increase); `metrics`, an object of auxiliary numbers at that step |
//! | worker | `attr` | `key`, `value` | a user attribute of the trial (any JSON value) |
//! | worker | `heartbeat` | | alive, during a long iteration |
//! | worker | `done` | `value`, `more` | the final value; the worker then exits, or with `more: true` waits for another `start` |
//! | worker | `error` | `message` | the trial failed; the worker then exits |
//! | worker | `oom` | `message`, optional `needed` | (version 2) the device ran out of memory; the worker then exits, and the trial waits for a larger grant |
//! | orchestrator | `swap_out` | | (version 2, to a worker that said `swap`) move the tracked state to host memory, free the device's, answer `swapped_out`, keep the process |
//! | worker | `swapped_out` | `bytes` | device bytes freed |
//! | orchestrator | `swap_in` | | bring the tracked state back; answer `swapped_in` |
//! | worker | `swapped_in` | `bytes` | device bytes taken again |
//! | orchestrator | `release_cache` | | (version 2, while the worker waits) give the allocator's cache back: the ledger needs the room |
//! | worker | `released` | `bytes` | device bytes given back |
//! | orchestrator | `save` | `path` | (version 3, while the worker waits; a PBT donor) save your state to `path` as a checkpoint, answer `saved`, go on waiting |
//! | worker | `saved` | `path` | the state is saved |
//! | orchestrator | `exploit` | `resume_from`, `params`, `iteration` | (version 3, while the worker waits; a PBT receiver) continue from the checkpoint at `resume_from` (another trial's, `iteration` iterations in) with `params` |
//! | worker | `exploited` | | the client loaded it in process; it waits for `go` |
//! | worker | `restart` | | the client cannot load it in process and exits; it is started again with `resume_from` and `params` |
//!
//! The version is the lower of the worker's and the orchestrator's: a
//! version 1 worker is sent version 1 messages only, and is swapped out by
//! `checkpoint` as before. A PBT study needs version 3 of its workers.
//!
//! The orchestrator answers each `ready` when the trial holds a lane: until
//! then the worker waits, keeping its state (it is paused). A worker that
//! sends nothing for `heartbeat_timeout` is killed.

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::storage::TrialNumber;

/// The newest protocol version this orchestrator speaks.
pub const VERSION: u64 = 3;

/// The oldest version it still speaks.
pub const OLDEST: u64 = 1;

/// What a client measured on its device at a `ready`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct MemoryReport {
    /// Held between iterations: weights, optimizer state, kept tensors.
    #[serde(deserialize_with = "bytes")]
    pub persistent: u64,
    /// The most held at once inside the last iteration (0: not measured).
    #[serde(default, deserialize_with = "bytes")]
    pub peak: u64,
    /// Kept by the allocator's cache beyond what is allocated.
    #[serde(default, deserialize_with = "bytes")]
    pub cached: u64,
}

/// A message from a worker.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FromWorker {
    Hello {
        #[serde(deserialize_with = "version")]
        version: u64,
    },
    Ready {
        #[serde(default)]
        memory: Option<MemoryReport>,
        /// The client tracks its state and can swap it in process.
        #[serde(default)]
        swap: bool,
        /// Version 3: the index of the iteration it asks to run (its
        /// place in training, which a resume or an exploit moves).
        #[serde(default)]
        iteration: Option<u64>,
    },
    Report {
        #[serde(deserialize_with = "step")]
        step: u64,
        #[serde(deserialize_with = "value")]
        value: f64,
        /// Auxiliary metrics at this step, by name.
        #[serde(default, deserialize_with = "metrics")]
        metrics: Vec<(String, f64)>,
    },
    /// `set_user_attr(key, value)`: any JSON value.
    Attr {
        #[serde(deserialize_with = "attr_key")]
        key: String,
        value: Value,
    },
    Heartbeat,
    Checkpointed {
        #[serde(deserialize_with = "path")]
        path: String,
    },
    /// Version 3: a PBT donor's state is saved (`save`).
    Saved {
        #[serde(deserialize_with = "path")]
        path: String,
    },
    /// Version 3: a PBT receiver loaded the donor's state in process.
    Exploited,
    /// Version 3: a PBT receiver exits, to be started again from the
    /// donor's state.
    Restart,
    /// `more`: the worker can take another trial (it then waits for `start`).
    /// `value`: the trial's final value, or a list of them, one per
    /// objective, for a study of several.
    Done {
        #[serde(deserialize_with = "values")]
        value: Vec<f64>,
        #[serde(default)]
        more: bool,
    },
    Error {
        #[serde(default, deserialize_with = "text")]
        message: String,
    },
    /// The device ran out of memory; `needed`, the bytes the client
    /// believes it needs (0: unknown).
    Oom {
        #[serde(default, deserialize_with = "text")]
        message: String,
        #[serde(default, deserialize_with = "bytes")]
        needed: u64,
    },
    #[serde(rename = "swapped_out")]
    SwappedOut {
        #[serde(deserialize_with = "bytes")]
        bytes: u64,
    },
    #[serde(rename = "swapped_in")]
    SwappedIn {
        #[serde(deserialize_with = "bytes")]
        bytes: u64,
    },
    Released {
        #[serde(deserialize_with = "bytes")]
        bytes: u64,
    },
}

/// A message to a worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ToWorker {
    Start {
        version: u64,
        trial: TrialNumber,
        params: Value,
        report_every: u64,
        checkpoint_path: String,
        resume_from: Option<String>,
        /// Version 2: the device the worker sees (`"cuda"` or `"cpu"`).
        #[serde(skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        /// Version 2: the trial's grant in bytes (absent: no cap).
        #[serde(skip_serializing_if = "Option::is_none")]
        memory_limit: Option<u64>,
    },
    Go,
    Prune,
    Checkpoint {
        path: String,
    },
    #[serde(rename = "swap_out")]
    SwapOut,
    #[serde(rename = "swap_in")]
    SwapIn,
    /// Give the allocator's cache back to the device.
    #[serde(rename = "release_cache")]
    ReleaseCache,
    /// Version 3: save the state to `path` and go on waiting (PBT's donor).
    Save {
        path: String,
    },
    /// Version 3: continue from another trial's checkpoint with new
    /// parameters (PBT's receiver).
    Exploit {
        resume_from: String,
        params: Value,
        /// Iterations the checkpoint's trial had done.
        iteration: u64,
    },
}

/// The version both sides speak, for a worker's `hello`; the error says
/// what to upgrade.
pub fn negotiate(worker: u64) -> Result<u64, String> {
    if worker < OLDEST {
        return Err(format!(
            "the worker speaks protocol version {worker}; this salus-tune speaks {OLDEST} to {VERSION}"
        ));
    }
    Ok(worker.min(VERSION))
}

/// A number; JSON has no NaN, so a worker may send it as a string or null.
fn value<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| de::Error::custom("'value' is not a number")),
        Value::String(s)
            if matches!(
                s.as_str(),
                "NaN" | "nan" | "Infinity" | "-Infinity" | "inf" | "-inf"
            ) =>
        {
            Ok(s.replace("Infinity", "inf").parse().unwrap_or(f64::NAN))
        }
        Value::Null => Ok(f64::NAN),
        other => Err(de::Error::custom(format!(
            "'value' must be a number, got {other}"
        ))),
    }
}

/// A number, or a non-empty list of them, each read as `value` reads one.
fn values<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    let one = |v: Value| value(v).map_err(|e: serde_json::Error| de::Error::custom(e.to_string()));
    match Value::deserialize(d)? {
        Value::Array(items) if items.is_empty() => Err(de::Error::custom(
            "'value' is an empty list: give one number per objective",
        )),
        Value::Array(items) => items.into_iter().map(one).collect(),
        v => Ok(vec![one(v)?]),
    }
}

/// `{"name": number, ...}`, each number read as `value` reads one.
fn metrics<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, f64)>, D::Error> {
    let Value::Object(map) = Value::deserialize(d)? else {
        return Err(de::Error::custom(
            "'metrics' must be an object of names and numbers",
        ));
    };
    map.into_iter()
        .map(|(name, v)| {
            value(v)
                .map(|v| (name.clone(), v))
                .map_err(|e| de::Error::custom(format!("metric '{name}': {e}")))
        })
        .collect()
}

/// Keys the orchestrator writes itself.
pub const RESERVED_ATTRS: &[&str] = &[crate::storage::FIXED_KEY];

fn attr_key<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(k) if RESERVED_ATTRS.contains(&k.as_str()) => Err(de::Error::custom(
            format!("the user attribute '{k}' is salus-tune's own; choose another key"),
        )),
        Value::String(k) if !k.is_empty() => Ok(k),
        _ => Err(de::Error::custom("'key' must be a non-empty string")),
    }
}

fn count<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<u64, D::Error> {
    Value::deserialize(d)?
        .as_u64()
        .ok_or_else(|| de::Error::custom(format!("'{key}' must be a non-negative integer")))
}

fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(0),
        Value::Number(n) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or(0)),
        // Python's floats for large byte counts.
        Value::Number(n) if n.as_f64().is_some_and(|f| f >= 0.0 && f.is_finite()) => {
            Ok(n.as_f64().unwrap_or(0.0) as u64)
        }
        _ => Err(de::Error::custom(
            "byte counts must be non-negative numbers",
        )),
    }
}

fn step<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    count(d, "step")
}

fn version<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    count(d, "version")
}

fn path<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        _ => Err(de::Error::custom("'path' must be a string")),
    }
}

/// Any JSON as text: an error message may arrive as an object.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        other => other.to_string(),
    })
}

/// Parses one line from a worker. The error says what is wrong with it.
pub fn parse(line: &str) -> Result<FromWorker, String> {
    let v: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("not a JSON object ({e}): {}", shorten(line)))?;
    if !v.get("type").is_some_and(Value::is_string) {
        return Err(format!("no \"type\" in {}", shorten(line)));
    }
    FromWorker::deserialize(&v).map_err(|e| {
        // serde's words for the two mistakes our own field readers do not see.
        let e = e.to_string();
        if let Some(rest) = e.strip_prefix("unknown variant `") {
            let kind = rest.split('`').next().unwrap_or(rest);
            format!("unknown message type '{kind}'")
        } else if let Some(rest) = e.strip_prefix("missing field `") {
            let key = rest.split('`').next().unwrap_or(rest);
            format!("'{key}' is missing")
        } else {
            e
        }
    })
}

fn shorten(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() > 120 {
        format!("{}...", s.chars().take(120).collect::<String>())
    } else {
        s.to_string()
    }
}

/// One line (with its newline) for a worker.
pub fn encode(m: &ToWorker) -> String {
    let line = serde_json::to_string(m).expect("a message serialises to JSON");
    format!("{line}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_worker_message_parses() {
        assert_eq!(
            parse(r#"{"type":"hello","version":1}"#),
            Ok(FromWorker::Hello { version: 1 })
        );
        assert_eq!(
            parse("{\"type\": \"ready\"}\n"),
            Ok(FromWorker::Ready {
                memory: None,
                swap: false,
                iteration: None
            })
        );
        assert_eq!(
            parse(r#"{"type":"report","step":3,"value":0.25}"#),
            Ok(FromWorker::Report {
                step: 3,
                value: 0.25,
                metrics: vec![],
            })
        );
        assert_eq!(
            parse(
                r#"{"type":"report","step":3,"value":0.25,"metrics":{"train_loss":1.5,"lr":"NaN"}}"#
            )
            .map(|m| match m {
                FromWorker::Report { metrics, .. } => {
                    metrics
                        .iter()
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect::<Vec<_>>()
                }
                other => panic!("{other:?}"),
            }),
            Ok(vec!["lr=NaN".to_string(), "train_loss=1.5".to_string()])
        );
        assert_eq!(
            parse(r#"{"type":"attr","key":"arch","value":{"layers":[64,32]}}"#),
            Ok(FromWorker::Attr {
                key: "arch".into(),
                value: json!({"layers": [64, 32]})
            })
        );
        assert_eq!(parse(r#"{"type":"heartbeat"}"#), Ok(FromWorker::Heartbeat));
        assert_eq!(
            parse(r#"{"type":"done","value":2,"more":true}"#),
            Ok(FromWorker::Done {
                value: vec![2.0],
                more: true
            })
        );
        // A study of several objectives: one value each.
        assert_eq!(
            parse(r#"{"type":"done","value":[0.9,1200,"NaN"]}"#).map(|m| match m {
                FromWorker::Done { value, .. } => format!("{value:?}"),
                other => panic!("{other:?}"),
            }),
            Ok("[0.9, 1200.0, NaN]".to_string())
        );
        assert_eq!(
            parse(r#"{"type":"checkpointed","path":"/tmp/x"}"#),
            Ok(FromWorker::Checkpointed {
                path: "/tmp/x".into()
            })
        );
        assert_eq!(
            parse(r#"{"type":"done","value":-1.5e3}"#),
            Ok(FromWorker::Done {
                value: vec![-1500.0],
                more: false
            })
        );
        assert_eq!(
            parse(r#"{"type":"error","message":"CUDA out of memory"}"#),
            Ok(FromWorker::Error {
                message: "CUDA out of memory".into()
            })
        );
    }

    #[test]
    fn version_2_messages_parse() {
        assert_eq!(
            parse(
                r#"{"type":"ready","memory":{"persistent":1048576,"peak":3e6,"cached":0},"swap":true}"#
            ),
            Ok(FromWorker::Ready {
                memory: Some(MemoryReport {
                    persistent: 1 << 20,
                    peak: 3_000_000,
                    cached: 0
                }),
                swap: true,
                iteration: None
            })
        );
        assert_eq!(
            parse(
                r#"{"type":"oom","message":"CUDA out of memory. Tried to allocate 20.00 MiB","needed":5000}"#
            ),
            Ok(FromWorker::Oom {
                message: "CUDA out of memory. Tried to allocate 20.00 MiB".into(),
                needed: 5000
            })
        );
        assert_eq!(
            parse(r#"{"type":"swapped_out","bytes":123}"#),
            Ok(FromWorker::SwappedOut { bytes: 123 })
        );
        assert_eq!(
            parse(r#"{"type":"swapped_in","bytes":123}"#),
            Ok(FromWorker::SwappedIn { bytes: 123 })
        );
        assert_eq!(
            parse(r#"{"type":"released","bytes":4096}"#),
            Ok(FromWorker::Released { bytes: 4096 })
        );
        let e = parse(r#"{"type":"ready","memory":{"persistent":-1}}"#).unwrap_err();
        assert!(e.contains("byte counts must be non-negative"), "{e}");
        let e = parse(r#"{"type":"ready","memory":{"peak":1}}"#).unwrap_err();
        assert!(e.contains("persistent"), "{e}");
    }

    #[test]
    fn the_version_is_the_lower_of_the_two() {
        assert_eq!(negotiate(1), Ok(1));
        assert_eq!(negotiate(2), Ok(2));
        assert_eq!(negotiate(3), Ok(3));
        assert_eq!(negotiate(7), Ok(VERSION));
        let e = negotiate(0).unwrap_err();
        assert!(e.contains("speaks 1 to 3"), "{e}");
    }

    #[test]
    fn non_finite_values_arrive_as_nan_or_infinity() {
        let v = |line: &str| match parse(line).unwrap() {
            FromWorker::Report { value, .. } => value,
            FromWorker::Done { value, .. } => value[0],
            other => panic!("{other:?}"),
        };
        assert!(v(r#"{"type":"done","value":"NaN"}"#).is_nan());
        assert!(v(r#"{"type":"done","value":null}"#).is_nan());
        assert_eq!(
            v(r#"{"type":"report","step":1,"value":"-Infinity"}"#),
            f64::NEG_INFINITY
        );
    }

    #[test]
    fn values_arrive_to_the_last_bit() {
        // serde_json's default float parser can be a unit in the last place
        // off; the workspace turns on its exact one (`float_roundtrip`).
        let mut bits = 0x9e37_79b9_7f4a_7c15u64;
        let mut values = vec![0.9926287033046013, 1e-300, 123456.789e10];
        for _ in 0..2000 {
            bits = bits.wrapping_mul(6364136223846793005).wrapping_add(1);
            values.push(f64::from_bits(bits >> 2)); // finite, positive
        }
        for v in values.into_iter().filter(|v| v.is_finite()) {
            let line = format!(r#"{{"type":"done","value":{v}}}"#);
            match parse(&line).unwrap() {
                FromWorker::Done { value, .. } => {
                    assert_eq!(value[0].to_bits(), v.to_bits(), "{line}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn malformed_messages_say_what_is_wrong() {
        for (line, words) in [
            ("hello", "not a JSON object"),
            ("{\"kind\":\"ready\"}", "no \"type\""),
            ("{\"type\":\"dance\"}", "unknown message type 'dance'"),
            ("{\"type\":\"report\",\"value\":1}", "'step' is missing"),
            (
                "{\"type\":\"report\",\"step\":-1,\"value\":1}",
                "'step' must be",
            ),
            (
                "{\"type\":\"done\",\"value\":\"high\"}",
                "'value' must be a number",
            ),
            ("{\"type\":\"done\"}", "'value' is missing"),
            (
                "{\"type\":\"done\",\"value\":[]}",
                "empty list: give one number per objective",
            ),
            ("{\"type\":\"checkpointed\"}", "'path' is missing"),
            (
                "{\"type\":\"checkpointed\",\"path\":3}",
                "'path' must be a string",
            ),
            (
                "{\"type\":\"hello\",\"version\":\"1\"}",
                "'version' must be",
            ),
            (
                "{\"type\":\"report\",\"step\":1,\"value\":1,\"metrics\":[1]}",
                "'metrics' must be an object",
            ),
            (
                "{\"type\":\"report\",\"step\":1,\"value\":1,\"metrics\":{\"a\":\"x\"}}",
                "metric 'a': 'value' must be a number",
            ),
            (
                "{\"type\":\"attr\",\"key\":\"fixed_params\",\"value\":1}",
                "the user attribute 'fixed_params' is salus-tune's own",
            ),
            (
                "{\"type\":\"attr\",\"key\":\"\",\"value\":1}",
                "'key' must be",
            ),
        ] {
            let e = parse(line).unwrap_err();
            assert!(e.contains(words), "{line}: {e}");
        }
    }

    #[test]
    fn orchestrator_messages_are_one_json_line_each() {
        let start = encode(&ToWorker::Start {
            version: 1,
            trial: TrialNumber(7),
            params: json!({"lr": 0.01, "opt": "sgd"}),
            report_every: 2,
            checkpoint_path: "/c/7".into(),
            resume_from: None,
            device: None,
            memory_limit: None,
        });
        assert!(start.ends_with('\n') && start.matches('\n').count() == 1);
        let v: Value = serde_json::from_str(&start).unwrap();
        assert_eq!(v["type"], "start");
        assert_eq!(v["version"], 1);
        assert_eq!(v["params"]["opt"], "sgd");
        assert!(v["resume_from"].is_null());
        // A version 1 worker sees exactly version 1's fields.
        assert_eq!(v.as_object().unwrap().len(), 7, "{v}");
        let v2 = encode(&ToWorker::Start {
            version: 2,
            trial: TrialNumber(7),
            params: json!({}),
            report_every: 1,
            checkpoint_path: "/c/7".into(),
            resume_from: None,
            device: Some("cuda".into()),
            memory_limit: Some(1 << 30),
        });
        let v2: Value = serde_json::from_str(&v2).unwrap();
        assert_eq!(
            (v2["device"].as_str(), v2["memory_limit"].as_u64()),
            (Some("cuda"), Some(1 << 30))
        );
        for (m, t) in [
            (ToWorker::Go, "go"),
            (ToWorker::Prune, "prune"),
            (ToWorker::Checkpoint { path: "/p".into() }, "checkpoint"),
            (ToWorker::SwapOut, "swap_out"),
            (ToWorker::SwapIn, "swap_in"),
            (ToWorker::ReleaseCache, "release_cache"),
            (ToWorker::Save { path: "/p".into() }, "save"),
        ] {
            let v: Value = serde_json::from_str(&encode(&m)).unwrap();
            assert_eq!(v["type"], t);
        }
        let v: Value = serde_json::from_str(&encode(&ToWorker::Exploit {
            resume_from: "/c/3.exploit".into(),
            params: json!({"lr": 0.02}),
            iteration: 4,
        }))
        .unwrap();
        assert_eq!(
            (
                &v["type"],
                &v["resume_from"],
                &v["params"]["lr"],
                &v["iteration"]
            ),
            (
                &json!("exploit"),
                &json!("/c/3.exploit"),
                &json!(0.02),
                &json!(4)
            )
        );
    }

    #[test]
    fn a_pbt_worker_s_answers_parse() {
        assert_eq!(
            parse("{\"type\":\"saved\",\"path\":\"/p\"}"),
            Ok(FromWorker::Saved { path: "/p".into() })
        );
        assert_eq!(parse("{\"type\":\"exploited\"}"), Ok(FromWorker::Exploited));
        assert_eq!(
            parse(r#"{"type":"ready","iteration":14}"#),
            Ok(FromWorker::Ready {
                memory: None,
                swap: false,
                iteration: Some(14)
            })
        );
        assert_eq!(parse("{\"type\":\"restart\"}"), Ok(FromWorker::Restart));
        assert!(
            parse("{\"type\":\"saved\"}")
                .unwrap_err()
                .contains("'path' is missing")
        );
    }
}
