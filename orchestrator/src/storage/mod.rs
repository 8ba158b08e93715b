//! Results in SQLite, in Optuna's own schema plus `salus_*` tables.
//!
//! * [`migrate`] creates Optuna's tables exactly as Optuna 5.0 does, then
//!   ours; a database Optuna made itself is adopted as it is.
//! * [`Store`] opens a database (WAL, busy timeout), creates or resumes a
//!   study, and reads trials back. Readers use their own connections.
//! * [`writer`] is the one writer: a task that applies every write in short
//!   `BEGIN IMMEDIATE` transactions, batching what has queued up.
//!
//! Values follow Optuna's encodings: parameters in their internal
//! representation with `distribution_json`, datetimes as SQLAlchemy writes
//! them (`YYYY-MM-DD HH:MM:SS.ffffff`, local time), states as Optuna names
//! them.

mod claims;
mod ids;
mod migrate;
mod read;
mod study;
pub mod writer;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

pub use claims::{STALE_AFTER_S, fresh, host_name, live_runs, pid_exists, run_alive};
pub use ids::{TrialId, TrialNumber};
pub use read::{KeptModel, Owner, StoredParam, StudyInfo, TrialRow, TrialState};
pub use study::{FIXED_KEY, Opened};
pub use writer::{Writer, WriterStats};

use crate::error::{Error, Result};

/// Where a study's results go: `--storage`, else `SALUS_TUNE_STORAGE`, else
/// the study file's `storage`, else `<name>.db` beside the study file.
pub fn resolve(flag: Option<&str>, study: &crate::study::Study) -> String {
    if let Some(url) = flag.map(str::to_string).or_else(|| {
        std::env::var("SALUS_TUNE_STORAGE")
            .ok()
            .filter(|s| !s.is_empty())
    }) {
        return url;
    }
    study.storage.clone().unwrap_or_else(|| {
        let dir = study.path.parent().unwrap_or(Path::new("."));
        dir.join(format!("{}.db", study.name)).display().to_string()
    })
}

/// The file behind a storage URL: a path, or Optuna's `sqlite:///path`
/// (`sqlite:////abs/path` for an absolute one).
pub fn sqlite_path(url: &str) -> Result<PathBuf> {
    if let Some(rest) = url.strip_prefix("sqlite:///") {
        if rest.is_empty() {
            return Err(Error::Input(format!("storage '{url}' names no file")));
        }
        return Ok(PathBuf::from(rest));
    }
    if url.contains("://") {
        let scheme = url.split("://").next().unwrap_or("");
        return Err(Error::Input(format!(
            "storage '{url}': the '{scheme}' scheme is not supported; use a file path or sqlite:///path.db"
        )));
    }
    if url.is_empty() {
        return Err(Error::Input("storage is empty".into()));
    }
    Ok(PathBuf::from(url))
}

/// Now, as SQLAlchemy writes a naive local `DATETIME` in SQLite.
pub fn now() -> String {
    chrono::Local::now()
        .format("%Y-%m-%d %H:%M:%S%.6f")
        .to_string()
}

fn storage_err(url: &str, e: impl Into<crate::error::StorageFailure>) -> Error {
    Error::storage(url, e)
}

/// A database connection for one study's reads and set-up.
pub struct Store {
    pub url: String,
    pub path: PathBuf,
    conn: SqliteConnection,
}

impl Store {
    fn options(path: &Path, create: bool) -> SqliteConnectOptions {
        SqliteConnectOptions::from_str("sqlite://")
            .expect("a static URL")
            .filename(path)
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(60))
            .disable_statement_logging()
    }

    /// Opens (creating if needed) and migrates the database at `url`.
    pub async fn open(url: &str) -> Result<Self> {
        let path = sqlite_path(url)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                storage_err(
                    url,
                    crate::error::StorageFailure::CreateDir {
                        path: dir.to_path_buf(),
                        source: std::sync::Arc::new(e),
                    },
                )
            })?;
        }
        let mut store = Self::connect(url, path, true).await?;
        migrate::migrate(&mut store.conn)
            .await
            .map_err(|e| storage_err(url, e))?;
        Ok(store)
    }

    /// Opens an existing database for reading; a missing file is bad input.
    pub async fn open_existing(url: &str) -> Result<Self> {
        let path = sqlite_path(url)?;
        if !path.is_file() {
            return Err(Error::Input(format!(
                "no database at {} (storage '{url}')",
                path.display()
            )));
        }
        Self::connect(url, path, false).await
    }

    async fn connect(url: &str, path: PathBuf, create: bool) -> Result<Self> {
        let conn = Self::options(&path, create)
            .connect()
            .await
            .map_err(|e| storage_err(url, e))?;
        Ok(Store {
            url: url.to_string(),
            path,
            conn,
        })
    }

    /// A second connection to the same file, for the writer.
    pub async fn connect_writer(&self) -> Result<SqliteConnection> {
        Self::options(&self.path, false)
            .connect()
            .await
            .map_err(|e| storage_err(&self.url, e))
    }

    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }

    /// Folds the write-ahead log into the database file and closes the
    /// connection: when it is the last one, SQLite removes the `-wal` and
    /// `-shm` files, and a copy of the `.db` alone is the whole study.
    /// Readers still open (a dashboard, another process) keep the log; it
    /// is folded as far as they allow, without waiting for them.
    pub async fn close(mut self) -> Result<()> {
        let url = self.url.clone();
        // Without waiting: while other processes use the database, the
        // last one to leave folds the log.
        sqlx::raw_sql("PRAGMA busy_timeout = 0; PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut self.conn)
            .await
            .map_err(|e| storage_err(&url, e))?;
        self.conn.close().await.map_err(|e| storage_err(&url, e))
    }
}
