//! The one error type of the orchestrator, and how each maps to an exit code.
//!
//! Every variant that wraps another failure keeps it as its `#[source]`, so
//! callers and tests can match on the cause; the messages users read are
//! the `Display` of each variant.

use thiserror::Error;

/// A terminal operation of the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminalOp {
    Draw,
    Io,
}

impl std::fmt::Display for TerminalOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TerminalOp::Draw => "cannot draw the dashboard",
            TerminalOp::Io => "terminal",
        })
    }
}

#[derive(Debug, Error)]
pub enum Error {
    /// A study file that cannot be used: names the file, line, column and key.
    #[error("{path}:{line}:{col}: {key}: {msg}")]
    Study {
        path: String,
        line: usize,
        col: usize,
        key: String,
        msg: String,
    },
    /// Other bad input: a flag, a storage URL, a study that changed under its name.
    #[error("{0}")]
    Input(String),
    /// The database failed, or refused what it was given.
    #[error(transparent)]
    Storage(#[from] storage::Error),
    #[error(transparent)]
    Worker(#[from] training::WorkerError),
    /// A task of the run (the runner, the writer) panicked.
    #[error("the {task} panicked: {source}")]
    Panicked {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// The Salus core's event channel closed before the work was done.
    #[error("the Salus core stopped")]
    CoreStopped,
    #[error("study '{study}' has no complete trial yet")]
    NoCompleteTrial { study: String },
    #[error("{op}: {source}")]
    Terminal {
        op: TerminalOp,
        #[source]
        source: std::io::Error,
    },
    /// A file or folder a command needs could not be read or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// `[scheduler] mps = true`, and MPS could not start: says what is missing.
    #[error("MPS: {0}")]
    Mps(String),
    /// A benchmark could not be measured.
    #[error("{0}")]
    Bench(String),
}

impl Error {
    /// 2 for bad input, 1 for a failed run.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Study { .. } | Error::Input(_) => 2,
            Error::Storage(storage::Error::Input(_)) => 2,
            Error::Worker(
                training::WorkerError::Data { .. } | training::WorkerError::Io { .. },
            ) => 2,
            _ => 1,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// For `map_err`: a failed file or process operation, described by
    /// `what` ("writing x"), keeping the `io::Error` (exit status 1, not 2:
    /// the input was fine, the machine said no).
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    /// A storage failure; a password in `url` is masked (`credentials::masked`).
    pub fn storage(url: &str, source: impl Into<storage::StorageFailure>) -> Self {
        Error::Storage(storage::Error::storage(url, source))
    }
}

impl From<kernels::KernelError> for Error {
    fn from(e: kernels::KernelError) -> Self {
        Error::Worker(training::WorkerError::Kernel(e))
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn storage_errors_keep_their_cause_and_their_exit_status() {
        let e = Error::storage("x.db", storage::StorageFailure::WriterStopped);
        assert_eq!(e.to_string(), "storage x.db: the writer stopped");
        // Transparent: the first cause is storage's own failure.
        let cause = e.source().expect("a source");
        assert!(matches!(
            cause.downcast_ref::<storage::StorageFailure>(),
            Some(storage::StorageFailure::WriterStopped)
        ));
        assert_eq!(e.exit_code(), 1);
        let refused = Error::from(storage::Error::Input("no study 'x'".into()));
        assert_eq!(refused.exit_code(), 2);
    }

    #[test]
    fn io_failures_keep_their_cause() {
        let e = Error::Io {
            what: "writing x".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        let cause = e.source().and_then(|c| c.downcast_ref::<std::io::Error>());
        assert_eq!(
            cause.map(|c| c.kind()),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        assert_eq!(e.exit_code(), 1);
    }
}
