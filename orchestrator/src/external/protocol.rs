//! The worker protocol, version 1: JSON lines over a Unix socket.
//!
//! The orchestrator starts one process per trial with `SALUS_TUNE_SOCKET`
//! set to a socket path; the worker connects to it. The script's own stdout
//! and stderr are not part of the protocol, so nothing it prints can
//! corrupt it. Each message is one JSON object on one line, with a `type`:
//!
//! | from | `type` | fields | meaning |
//! |---|---|---|---|
//! | worker | `hello` | `version` | first message; `version` is 1 |
//! | orchestrator | `start` | `version`, `trial`, `params`, `report_every`, `checkpoint_path`, `resume_from` | the trial to run; `resume_from` is a checkpoint path or null |
//! | worker | `ready` | | asks to run its next iteration, then waits |
//! | orchestrator | `go` | | run one iteration |
//! | orchestrator | `prune` | | exit now, cleanly |
//! | orchestrator | `checkpoint` | `path` | save your state to `path`, answer `checkpointed`, exit; you are restarted later with `resume_from` = `path` |
//! | worker | `checkpointed` | `path` | the state is saved |
//! | worker | `report` | `step`, `value` | an intermediate value (steps strictly increase) |
//! | worker | `heartbeat` | | alive, during a long iteration |
//! | worker | `done` | `value`, `more` | the final value; the worker then exits, or with `more: true` waits for another `start` |
//! | worker | `error` | `message` | the trial failed; the worker then exits |
//!
//! The orchestrator answers each `ready` when the trial holds a lane: until
//! then the worker waits, keeping its state (it is paused). A worker that
//! sends nothing for `heartbeat_timeout` is killed.

use serde_json::{Value, json};

/// The protocol version this orchestrator speaks.
pub const VERSION: u64 = 1;

/// A message from a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum FromWorker {
    Hello {
        version: u64,
    },
    Ready,
    Report {
        step: u64,
        value: f64,
    },
    Heartbeat,
    Checkpointed {
        path: String,
    },
    /// `more`: the worker can take another trial (it then waits for `start`).
    Done {
        value: f64,
        more: bool,
    },
    Error {
        message: String,
    },
}

/// A message to a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum ToWorker {
    Start {
        trial: i64,
        params: Value,
        report_every: u64,
        checkpoint_path: String,
        resume_from: Option<String>,
    },
    Go,
    Prune,
    Checkpoint {
        path: String,
    },
}

fn number(v: &Value, key: &str) -> Result<f64, String> {
    match v.get(key) {
        Some(Value::Number(n)) => n.as_f64().ok_or_else(|| format!("'{key}' is not a number")),
        // JSON has no NaN: a worker may send it as a string.
        Some(Value::String(s))
            if matches!(
                s.as_str(),
                "NaN" | "nan" | "Infinity" | "-Infinity" | "inf" | "-inf"
            ) =>
        {
            Ok(s.replace("Infinity", "inf").parse().unwrap_or(f64::NAN))
        }
        Some(Value::Null) => Ok(f64::NAN),
        Some(other) => Err(format!("'{key}' must be a number, got {other}")),
        None => Err(format!("'{key}' is missing")),
    }
}

fn count(v: &Value, key: &str) -> Result<u64, String> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("'{key}' must be a non-negative integer"))
}

/// Parses one line from a worker. The error says what is wrong with it.
pub fn parse(line: &str) -> Result<FromWorker, String> {
    let v: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("not a JSON object ({e}): {}", shorten(line)))?;
    let Some(kind) = v.get("type").and_then(Value::as_str) else {
        return Err(format!("no \"type\" in {}", shorten(line)));
    };
    Ok(match kind {
        "hello" => FromWorker::Hello {
            version: count(&v, "version")?,
        },
        "ready" => FromWorker::Ready,
        "report" => FromWorker::Report {
            step: count(&v, "step")?,
            value: number(&v, "value")?,
        },
        "heartbeat" => FromWorker::Heartbeat,
        "checkpointed" => FromWorker::Checkpointed {
            path: v
                .get("path")
                .and_then(Value::as_str)
                .ok_or("'path' must be a string")?
                .to_string(),
        },
        "done" => FromWorker::Done {
            value: number(&v, "value")?,
            more: v.get("more").and_then(Value::as_bool).unwrap_or(false),
        },
        "error" => FromWorker::Error {
            message: v
                .get("message")
                .map(|m| m.as_str().map_or(m.to_string(), str::to_string))
                .unwrap_or_default(),
        },
        other => return Err(format!("unknown message type '{other}'")),
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
    let v = match m {
        ToWorker::Start {
            trial,
            params,
            report_every,
            checkpoint_path,
            resume_from,
        } => json!({
            "type": "start", "version": VERSION, "trial": trial, "params": params,
            "report_every": report_every, "checkpoint_path": checkpoint_path, "resume_from": resume_from,
        }),
        ToWorker::Go => json!({ "type": "go" }),
        ToWorker::Prune => json!({ "type": "prune" }),
        ToWorker::Checkpoint { path } => json!({ "type": "checkpoint", "path": path }),
    };
    format!("{v}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_message_parses() {
        assert_eq!(
            parse(r#"{"type":"hello","version":1}"#),
            Ok(FromWorker::Hello { version: 1 })
        );
        assert_eq!(parse("{\"type\": \"ready\"}\n"), Ok(FromWorker::Ready));
        assert_eq!(
            parse(r#"{"type":"report","step":3,"value":0.25}"#),
            Ok(FromWorker::Report {
                step: 3,
                value: 0.25
            })
        );
        assert_eq!(parse(r#"{"type":"heartbeat"}"#), Ok(FromWorker::Heartbeat));
        assert_eq!(
            parse(r#"{"type":"done","value":2,"more":true}"#),
            Ok(FromWorker::Done {
                value: 2.0,
                more: true
            })
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
                value: -1500.0,
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
    fn non_finite_values_arrive_as_nan_or_infinity() {
        let v = |line: &str| match parse(line).unwrap() {
            FromWorker::Report { value, .. } | FromWorker::Done { value, .. } => value,
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
    fn malformed_messages_say_what_is_wrong() {
        for (line, words) in [
            ("hello", "not a JSON object"),
            ("{\"kind\":\"ready\"}", "no \"type\""),
            ("{\"type\":\"dance\"}", "unknown message type 'dance'"),
            ("{\"type\":\"report\",\"value\":1}", "'step' must be"),
            (
                "{\"type\":\"report\",\"step\":-1,\"value\":1}",
                "'step' must be",
            ),
            (
                "{\"type\":\"done\",\"value\":\"high\"}",
                "'value' must be a number",
            ),
            ("{\"type\":\"done\"}", "'value' is missing"),
            ("{\"type\":\"checkpointed\"}", "'path' must be a string"),
        ] {
            let e = parse(line).unwrap_err();
            assert!(e.contains(words), "{line}: {e}");
        }
    }

    #[test]
    fn orchestrator_messages_are_one_json_line_each() {
        let start = encode(&ToWorker::Start {
            trial: 7,
            params: json!({"lr": 0.01, "opt": "sgd"}),
            report_every: 2,
            checkpoint_path: "/c/7".into(),
            resume_from: None,
        });
        assert!(start.ends_with('\n') && start.matches('\n').count() == 1);
        let v: Value = serde_json::from_str(&start).unwrap();
        assert_eq!(v["type"], "start");
        assert_eq!(v["version"], 1);
        assert_eq!(v["params"]["opt"], "sgd");
        assert!(v["resume_from"].is_null());
        for (m, t) in [
            (ToWorker::Go, "go"),
            (ToWorker::Prune, "prune"),
            (ToWorker::Checkpoint { path: "/p".into() }, "checkpoint"),
        ] {
            let v: Value = serde_json::from_str(&encode(&m)).unwrap();
            assert_eq!(v["type"], t);
        }
    }
}
