//! The one error type of the `training` crate.

use std::path::PathBuf;

use thiserror::Error;

/// Everything a data loader or a trial can fail with.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// A data file that cannot be used; `line` and `column` are 1-based
    /// where the format has them.
    #[error("{}{}: {msg}", path.display(), position(*line, *column))]
    Data {
        path: PathBuf,
        line: Option<u64>,
        column: Option<u64>,
        msg: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A user's worker process failed: it crashed, hung, broke the protocol
    /// or reported an error. The message says which, with its output.
    #[error("{0}")]
    External(String),
    /// A configuration that cannot describe a trial.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The training loss became NaN or infinite.
    #[error("diverged at iteration {iteration}: training loss is {loss}")]
    Diverged { iteration: u64, loss: f64 },
    /// `step` on a trial whose state is swapped out.
    #[error("trial is not resident: swap it in first")]
    NotResident,
    /// A trial that needs more device memory on its own than the budget
    /// holds, so it could never be admitted.
    #[error(
        "needs {needed} bytes of device memory on its own (weights and optimizer state, one iteration's workspace, the data set), more than the whole budget of {budget} bytes"
    )]
    TooLarge { needed: u64, budget: u64 },
    /// Bytes that are not a trial state of this shape.
    #[error("bad trial state: {0}")]
    BadState(String),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
}

fn position(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

pub type Result<T> = std::result::Result<T, WorkerError>;

impl WorkerError {
    pub(crate) fn data(
        path: impl Into<PathBuf>,
        line: Option<u64>,
        column: Option<u64>,
        msg: impl Into<String>,
    ) -> Self {
        WorkerError::Data {
            path: path.into(),
            line,
            column,
            msg: msg.into(),
        }
    }
}
