//! Results in SQLite, in Optuna's own schema plus `salus_*` tables.
//!
//! * `migrate` creates Optuna's tables exactly as Optuna 5.0 does, then
//!   ours; a database Optuna made itself is adopted as it is.
//! * [`Store`] opens a database (WAL, busy timeout), creates or resumes a
//!   study, and reads trials back. Readers use their own connections.
//! * [`writer`] is the one writer: a task that applies every write in short
//!   `BEGIN IMMEDIATE` transactions, batching what has queued up, each
//!   write for a trial fenced by its claim (`claims`).
//! * [`heartbeat`] beats for the run and its trials on a timer and a
//!   connection of its own.
//!
//! Values follow Optuna's encodings: parameters in their internal
//! representation with `distribution_json`, datetimes as SQLAlchemy writes
//! them (`YYYY-MM-DD HH:MM:SS.ffffff`, local time; heartbeats by the
//! database's clock, UTC on SQLite, see [`Clock`]), states as Optuna names
//! them.

pub mod audit;
mod claims;
pub mod credentials;
pub mod dashboard;
mod dialect;
mod error;
pub mod files;
pub mod heartbeat;
pub mod ids;
mod migrate;
mod read;
mod record;
mod statements;
pub mod writer;

use std::path::PathBuf;
use std::str::FromStr;

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, ConnectOptions, Connection};

pub use crate::credentials::masked;
pub use crate::ids::{RunId, StudyId, TrialId, TrialNumber};
pub use claims::{
    Claim, Claimed, Place, Requeuer, STALE_AFTER_S, fresh, host_name, live_runs, owner_gone_here,
    pid_exists, pid_namespace, run_alive,
};
pub use dialect::{Clock, Dialect, begin_write, sql, table_exists};
pub use read::{KeptModel, Owner, PbtLineage, StoredParam, StudyInfo, TrialRow, TrialState};
pub use record::{FIXED_KEY, StudyOpened, StudyRecord};
pub use writer::{CapAt, InFlightCap, NewTrial, Writer, WriterStats};

pub use error::{Error, Result, StorageFailure};

/// The database a storage URL names.
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    /// A SQLite file: a path, or Optuna's `sqlite:///path`.
    Sqlite(PathBuf),
    /// A PostgreSQL URL as sqlx takes it (`postgres://...`), from
    /// `postgresql://`, `postgres://` or SQLAlchemy's
    /// `postgresql+psycopg2://` (Optuna's form).
    Postgres(String),
}

impl Location {
    pub fn parse(url: &str) -> Result<Self> {
        if let Some((scheme, rest)) = url.split_once("://") {
            let base = scheme.split('+').next().unwrap_or(scheme);
            if base == "postgresql" || base == "postgres" {
                return Ok(Location::Postgres(format!("postgres://{rest}")));
            }
        }
        sqlite_path(url).map(Location::Sqlite)
    }
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
            "storage '{}': the '{scheme}' scheme is not supported; use a file path, \
             sqlite:///path.db or postgresql://user@host/db",
            masked(url)
        )));
    }
    if url.is_empty() {
        return Err(Error::Input("storage is empty".into()));
    }
    Ok(PathBuf::from(url))
}

/// Now, as SQLAlchemy writes a naive local `DATETIME` (Optuna's
/// `datetime.now()`): trials' datetimes, events, commands.
pub fn now() -> String {
    chrono::Local::now()
        .format("%Y-%m-%d %H:%M:%S%.6f")
        .to_string()
}

/// Now in UTC, as SQLite's `CURRENT_TIMESTAMP` (Optuna's heartbeats) has it.
pub fn now_utc() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%d %H:%M:%S%.6f")
        .to_string()
}

/// How long a connection waits for a lock another process holds before
/// its statement fails (and, for the writer and the heartbeat, is tried
/// again).
#[derive(Clone, Copy)]
enum LockWait {
    /// Commands and the dashboard: a minute, as before.
    Reader,
    /// The writer retries its transaction after this.
    Writer,
    /// A heartbeat that cannot be written now is written at the next tick.
    Heartbeat,
}

impl LockWait {
    fn ms(self) -> u64 {
        match self {
            LockWait::Reader => 60_000,
            LockWait::Writer => 2_000,
            LockWait::Heartbeat => 4_000,
        }
    }
}

/// A database connection for one study's reads and set-up.
pub struct Store {
    /// The storage URL as shown: [`masked`].
    pub url: String,
    location: Location,
    conn: AnyConnection,
}

/// A PostgreSQL URL that names this process to the server
/// (`application_name = salus-tune-<pid>`, as `pg_stat_activity` shows
/// it), unless the URL names one: a database administrator, or a test,
/// can tell which process holds which connection and lock.
fn with_application_name(url: &str) -> String {
    if url.contains("application_name=") {
        return url.to_string();
    }
    let join = if url.contains('?') { '&' } else { '?' };
    format!(
        "{url}{join}application_name=salus-tune-{}",
        std::process::id()
    )
}

impl Store {
    fn options(location: &Location, create: bool) -> Result<AnyConnectOptions> {
        let url = match location {
            Location::Sqlite(path) => {
                // sqlx reads the path from a URL: characters that URLs
                // give a meaning to are escaped.
                let path = path
                    .display()
                    .to_string()
                    .replace('%', "%25")
                    .replace('?', "%3F")
                    .replace('#', "%23");
                let mode = if create { "rwc" } else { "rw" };
                format!("sqlite://{path}?mode={mode}")
            }
            Location::Postgres(url) => with_application_name(url),
        };
        let options = AnyConnectOptions::from_str(&url)
            .map_err(|e| Error::Input(format!("storage '{}': {e}", masked(&url))))?;
        Ok(options.disable_statement_logging())
    }

    /// Opens (creating if needed) and migrates the database at `url`.
    pub async fn open(url: &str) -> Result<Self> {
        let location = Location::parse(url)?;
        if let Location::Sqlite(path) = &location
            && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::storage(
                    url,
                    StorageFailure::CreateDir {
                        path: dir.to_path_buf(),
                        source: std::sync::Arc::new(e),
                    },
                )
            })?;
        }
        let mut store = Self::connect(url, location, true).await?;
        migrate::migrate(&mut store.conn)
            .await
            .map_err(|e| Error::storage(url, e))?;
        Ok(store)
    }

    /// Opens an existing database for reading; a missing file is bad input.
    pub async fn open_existing(url: &str) -> Result<Self> {
        let location = Location::parse(url)?;
        if let Location::Sqlite(path) = &location
            && !path.is_file()
        {
            return Err(Error::Input(format!(
                "no database at {} (storage '{}')",
                path.display(),
                masked(url)
            )));
        }
        Self::connect(url, location, false).await
    }

    async fn connect(url: &str, location: Location, create: bool) -> Result<Self> {
        let conn = Self::connection(url, &location, create).await?;
        Ok(Store {
            url: masked(url),
            location,
            conn,
        })
    }

    async fn connection(url: &str, location: &Location, create: bool) -> Result<AnyConnection> {
        Self::connection_waiting(url, location, create, LockWait::Reader).await
    }

    async fn connection_waiting(
        url: &str,
        location: &Location,
        create: bool,
        wait: LockWait,
    ) -> Result<AnyConnection> {
        sqlx::any::install_default_drivers();
        let mut conn = AnyConnection::connect_with(&Self::options(location, create)?)
            .await
            .map_err(|e| Error::storage(url, e))?;
        let ms = wait.ms();
        let settings = match location {
            // WAL: readers never wait for the writer. A busy writer is
            // waited for a while, then the writer tries again (see
            // `writer`): a stopped process that holds the lock delays the
            // others, and never fails them.
            Location::Sqlite(_) if create => {
                format!(
                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = {ms}"
                )
            }
            Location::Sqlite(_) => {
                format!("PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = {ms}")
            }
            // A row lock held by a stopped process ends a statement after
            // this long, instead of never; the writer then tries again.
            Location::Postgres(_) => format!("SET lock_timeout = {ms}"),
        };
        sqlx::raw_sql(&settings)
            .execute(&mut conn)
            .await
            .map_err(|e| Error::storage(url, e))?;
        Ok(conn)
    }

    /// The database this store is connected to.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The writer's connections to the same database: its own, its
    /// reader's and its heartbeat's (see [`Writer::spawn`]).
    pub async fn writer_connections(&self) -> Result<[AnyConnection; 3]> {
        let open = |wait| Self::connection_waiting(&self.url, &self.location, false, wait);
        Ok([
            open(LockWait::Writer).await?,
            open(LockWait::Reader).await?,
            open(LockWait::Heartbeat).await?,
        ])
    }

    pub fn conn(&mut self) -> &mut AnyConnection {
        &mut self.conn
    }

    /// Folds SQLite's write-ahead log into the database file and closes
    /// the connection: when it is the last one, SQLite removes the `-wal`
    /// and `-shm` files, and a copy of the `.db` alone is the whole study.
    /// Readers still open (a dashboard, another process) keep the log; it
    /// is folded as far as they allow, without waiting for them.
    pub async fn close(mut self) -> Result<()> {
        let url = self.url.clone();
        if matches!(self.location, Location::Sqlite(_)) {
            // Without waiting: while other processes use the database, the
            // last one to leave folds the log.
            sqlx::raw_sql("PRAGMA busy_timeout = 0; PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&mut self.conn)
                .await
                .map_err(|e| Error::storage(&url, e))?;
        }
        self.conn.close().await.map_err(|e| Error::storage(&url, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_url_names_the_process_unless_it_names_one() {
        let me = format!("application_name=salus-tune-{}", std::process::id());
        assert_eq!(
            with_application_name("postgresql://db/studies"),
            format!("postgresql://db/studies?{me}")
        );
        assert_eq!(
            with_application_name("postgresql://db/studies?sslmode=require"),
            format!("postgresql://db/studies?sslmode=require&{me}")
        );
        let named = "postgresql://db/studies?application_name=lab";
        assert_eq!(with_application_name(named), named);
    }

    #[test]
    fn passwords_are_masked_wherever_they_sit() {
        assert_eq!(
            masked("postgresql://tuner:s3cret@db.lab:5432/studies?sslmode=require"),
            "postgresql://tuner:***@db.lab:5432/studies?sslmode=require"
        );
        assert_eq!(
            masked("postgres://tuner@db/studies?password=s3cret&sslmode=disable"),
            "postgres://tuner@db/studies?password=***&sslmode=disable"
        );
        assert_eq!(
            masked("postgresql://tuner@db/studies"),
            "postgresql://tuner@db/studies"
        );
        assert_eq!(masked("runs/digits.db"), "runs/digits.db");
        // A password that holds an '@' still goes.
        assert_eq!(masked("postgresql://u:p@ss@h/d"), "postgresql://u:***@h/d");
        // Generated secrets with '/', '?', '#', '&' or '=' unescaped.
        for secret in ["a/b", "x?y", "q#r", "s/t?u@v", "k=l&m", "/?@#"] {
            let url = format!("postgresql://tuner:{secret}@db.lab:5432/studies?sslmode=require");
            let shown = masked(&url);
            assert_eq!(
                shown, "postgresql://tuner:***@db.lab:5432/studies?sslmode=require",
                "{secret}"
            );
            assert!(!shown.contains(secret), "{shown}");
        }
        // No user-info: nothing to mask, and nothing lost.
        assert_eq!(
            masked("postgresql://db.lab/studies?application_name=me"),
            "postgresql://db.lab/studies?application_name=me"
        );
    }

    #[test]
    fn storage_urls_name_sqlite_files_or_postgres_databases() {
        assert_eq!(
            Location::parse("postgresql+psycopg2://u@h/d").unwrap(),
            Location::Postgres("postgres://u@h/d".into())
        );
        assert_eq!(
            Location::parse("sqlite:///runs/a.db").unwrap(),
            Location::Sqlite("runs/a.db".into())
        );
        assert_eq!(
            Location::parse("a.db").unwrap(),
            Location::Sqlite("a.db".into())
        );
        let err = Location::parse("mysql://u:pw@h/d").unwrap_err().to_string();
        assert!(
            err.contains("mysql://u:***@h/d") && !err.contains("pw"),
            "{err}"
        );
    }
}
