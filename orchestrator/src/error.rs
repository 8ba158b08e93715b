//! The one error type of the orchestrator, and how each maps to an exit code.
//!
//! Every variant that wraps another failure keeps it as its `#[source]`, so
//! callers and tests can match on the cause; the messages users read are
//! the `Display` of each variant.

use std::sync::Arc;

use thiserror::Error;

/// Why a storage operation failed. Cheap to clone (causes are shared):
/// the writer answers every op of a rolled-back transaction with the same
/// failure.
#[derive(Debug, Error, Clone)]
pub enum StorageFailure {
    #[error(transparent)]
    Sql(Arc<sqlx::Error>),
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        path: std::path::PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A schema migration failed.
    #[error("migration {version} ({name}): {source}")]
    Migration {
        version: i64,
        name: &'static str,
        #[source]
        source: Arc<sqlx::Error>,
    },
    /// The database was made by an Optuna whose schema we do not read.
    #[error(
        "the database has Optuna schema version {found:?}; salus-tune reads version {wanted} (Optuna 5.0)"
    )]
    OptunaSchema { found: Option<i64>, wanted: i64 },
    /// The writer's transaction failed; every op in it was rolled back.
    #[error("a write failed and was rolled back: {0}")]
    RolledBack(#[source] Arc<sqlx::Error>),
    #[error("the writer stopped")]
    WriterStopped,
}

impl StorageFailure {
    /// SQLite's "database is locked" or "busy": what a process can meet
    /// while another sets the same new file up; worth a retry.
    pub fn is_locked(&self) -> bool {
        let sql = match self {
            StorageFailure::Sql(e) | StorageFailure::RolledBack(e) => e,
            StorageFailure::Migration { source, .. } => source,
            _ => return false,
        };
        match sql.as_ref() {
            sqlx::Error::Database(d) => {
                matches!(d.code().as_deref(), Some("5" | "6" | "261" | "517"))
                    || d.message().contains("locked")
            }
            _ => false,
        }
    }
}

impl From<sqlx::Error> for StorageFailure {
    fn from(e: sqlx::Error) -> Self {
        StorageFailure::Sql(Arc::new(e))
    }
}

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
    #[error("storage {url}: {source}")]
    Storage {
        url: String,
        #[source]
        source: StorageFailure,
    },
    #[error(transparent)]
    Worker(#[from] workers::WorkerError),
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
    /// A benchmark could not be measured.
    #[error("{0}")]
    Bench(String),
}

impl Error {
    /// 2 for bad input, 1 for a failed run.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Study { .. } | Error::Input(_) => 2,
            Error::Worker(workers::WorkerError::Data { .. } | workers::WorkerError::Io { .. }) => 2,
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

    /// A storage failure of `url`.
    /// A storage failure; a password in `url` is masked (`credentials::masked`).
    pub fn storage(url: &str, source: impl Into<StorageFailure>) -> Self {
        Error::Storage {
            url: crate::credentials::masked(url),
            source: source.into(),
        }
    }
}

impl From<kernels::KernelError> for Error {
    fn from(e: kernels::KernelError) -> Self {
        Error::Worker(workers::WorkerError::Kernel(e))
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn storage_errors_keep_their_cause_and_their_message() {
        let e = Error::storage("x.db", sqlx::Error::RowNotFound);
        assert_eq!(
            e.to_string(),
            format!("storage x.db: {}", sqlx::Error::RowNotFound)
        );
        let cause = e.source().expect("a source");
        assert!(matches!(
            cause.downcast_ref::<StorageFailure>(),
            Some(StorageFailure::Sql(_))
        ));
        // The writer's rolled-back failure reaches the sqlx error underneath.
        let e = Error::storage(
            "x.db",
            StorageFailure::RolledBack(Arc::new(sqlx::Error::PoolTimedOut)),
        );
        assert!(e.to_string().contains("a write failed and was rolled back"));
        let root = e.source().and_then(|c| c.source()).expect("the sqlx error");
        assert!(root.downcast_ref::<Arc<sqlx::Error>>().is_some());
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
