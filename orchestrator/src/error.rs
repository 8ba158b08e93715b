//! The one error type of the orchestrator, and how each maps to an exit code.

use thiserror::Error;

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
    #[error("storage {url}: {msg}")]
    Storage { url: String, msg: String },
    #[error(transparent)]
    Worker(#[from] workers::WorkerError),
    #[error("{0}")]
    Run(String),
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

impl From<kernels::KernelError> for Error {
    fn from(e: kernels::KernelError) -> Self {
        Error::Worker(workers::WorkerError::Kernel(e))
    }
}
