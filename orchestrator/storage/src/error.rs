//! Storage's one error type. The CLI wraps it whole (its `Error::Storage`),
//! so the cause and the exit status travel together: a database that
//! refuses the study as given is bad input (2), a failed query is not (1).

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

#[derive(Debug, Error)]
pub enum Error {
    /// The database refuses what it was given: a storage URL it cannot
    /// take, a study that changed under its name, a name it does not hold.
    #[error("{0}")]
    Input(String),
    #[error("storage {url}: {source}")]
    Storage {
        url: String,
        #[source]
        source: StorageFailure,
    },
}

impl Error {
    /// A storage failure; a password in `url` is masked ([`crate::masked`]).
    pub fn storage(url: &str, source: impl Into<StorageFailure>) -> Self {
        Error::Storage {
            url: crate::credentials::masked(url),
            source: source.into(),
        }
    }

    /// Whether this is a locked SQLite database, worth a retry.
    pub fn is_locked(&self) -> bool {
        matches!(self, Error::Storage { source, .. } if source.is_locked())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

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
    fn a_password_in_the_url_is_masked() {
        let e = Error::storage("postgres://u:secret@h/db", sqlx::Error::RowNotFound);
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
