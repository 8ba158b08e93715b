//! One storage layer, two SQL dialects: SQLite and PostgreSQL.
//!
//! Every statement is written once, in SQLite's form with `?`
//! placeholders, through sqlx's `Any` driver. [`sql`] adapts it to the
//! connection's dialect just before it runs:
//!
//! * `?` becomes `$1`, `$2`, ... on PostgreSQL;
//! * a placeholder typed for PostgreSQL, `?::timestamp` or `?::trialstate`
//!   (Optuna's enums and datetimes refuse a text parameter there), keeps
//!   its cast on PostgreSQL and loses it on SQLite.
//!
//! Reads take datetimes and enums as `CAST(col AS TEXT)`, which both
//! dialects answer with text (the `Any` driver has no datetime type). The
//! few statements that differ beyond that (JSON, the catalogue, locks) ask
//! [`Dialect::of`] and say both forms where they stand.

use std::borrow::Cow;

use sqlx::AnyConnection;

/// Which database a connection talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    pub fn of(conn: &AnyConnection) -> Self {
        if conn.backend_name().eq_ignore_ascii_case("PostgreSQL") {
            Dialect::Postgres
        } else {
            Dialect::Sqlite
        }
    }

    /// `text` (SQLite's form, see the module docs) in this dialect.
    pub fn sql(self, text: &str) -> Cow<'_, str> {
        if !text.contains('?') {
            return Cow::Borrowed(text);
        }
        if self == Dialect::Sqlite && !text.contains("?::") {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len() + 16);
        let mut chars = text.chars().peekable();
        let mut quote: Option<char> = None;
        let mut n = 0;
        while let Some(c) = chars.next() {
            match (quote, c) {
                (Some(q), c) if c == q => {
                    quote = None;
                    out.push(c);
                }
                (Some(_), c) => out.push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    out.push(c);
                }
                (None, '?') => {
                    n += 1;
                    if self == Dialect::Postgres {
                        out.push_str(&format!("${n}"));
                    } else {
                        out.push('?');
                        // A cast for PostgreSQL only: drop `::type`.
                        if chars.peek() == Some(&':') {
                            let rest: String = chars.clone().take(2).collect();
                            if rest == "::" {
                                chars.next();
                                chars.next();
                                while chars
                                    .peek()
                                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
                                {
                                    chars.next();
                                }
                            }
                        }
                    }
                }
                (None, c) => out.push(c),
            }
        }
        Cow::Owned(out)
    }

    /// The statement that opens a writing transaction: SQLite takes the
    /// write lock at once (no deadlock between two readers upgrading);
    /// PostgreSQL locks rows as statements touch them.
    pub fn begin_write(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
        }
    }

    /// Seconds from the heartbeat in `column` to now, by the clock that
    /// heartbeats are written with ([`Clock::beat`]).
    pub fn age_s(self, column: &str) -> String {
        match self {
            Dialect::Sqlite => format!("((julianday('now') - julianday({column})) * 86400.0)"),
            Dialect::Postgres => {
                format!("CAST(EXTRACT(EPOCH FROM (LOCALTIMESTAMP - {column})) AS DOUBLE PRECISION)")
            }
        }
    }

    /// A JSON object's member `key` as text, from the JSON text in `column`.
    pub fn json_member(self, column: &str, key: &str) -> String {
        match self {
            Dialect::Sqlite => format!("json_extract({column}, '$.{key}')"),
            Dialect::Postgres => format!("(CAST({column} AS json) ->> '{key}')"),
        }
    }
}

/// Now, in the two forms a writer stores.
#[derive(Debug, Clone, PartialEq)]
pub struct Clock {
    /// For a trial's datetimes, events and commands: this host's local
    /// time, as Optuna writes `datetime_start` (Python's naive
    /// `datetime.now()`), on both dialects.
    pub local: String,
    /// For heartbeats: the database's own clock, so that machines whose
    /// clocks disagree still age each other's heartbeats alike. On SQLite
    /// that is UTC, as Optuna's heartbeats (`CURRENT_TIMESTAMP`) are, so a
    /// daylight-saving change or two processes with different `TZ` agree;
    /// on PostgreSQL the server's `LOCALTIMESTAMP` in our sessions' zone
    /// (UTC: sqlx sets it). Optuna's own PostgreSQL sessions write
    /// heartbeats in the server's default zone, which a client cannot
    /// read, so a trial only Optuna holds is judged by whether its
    /// heartbeat moves, not by its age (see `runner::processes`).
    pub beat: String,
}

/// Now (see [`Clock`]).
pub async fn clock(conn: &mut AnyConnection) -> sqlx::Result<Clock> {
    let local = super::now();
    let beat = match Dialect::of(conn) {
        Dialect::Sqlite => super::now_utc(),
        Dialect::Postgres => {
            sqlx::query_scalar("SELECT CAST(LOCALTIMESTAMP AS TEXT)")
                .fetch_one(&mut *conn)
                .await?
        }
    };
    Ok(Clock { local, beat })
}

/// `text` adapted to `conn`'s dialect.
pub fn sql<'a>(conn: &AnyConnection, text: &'a str) -> Cow<'a, str> {
    Dialect::of(conn).sql(text)
}

/// A transaction that writes, opened as `conn`'s dialect wants it.
pub async fn begin_write(
    conn: &mut AnyConnection,
) -> sqlx::Result<sqlx::Transaction<'_, sqlx::Any>> {
    use sqlx::Connection;
    let statement = Dialect::of(conn).begin_write();
    conn.begin_with(statement).await
}

/// Whether the database has table (or view) `name` (readers do not migrate).
pub async fn table_exists(conn: &mut AnyConnection, name: &str) -> sqlx::Result<bool> {
    let query = match Dialect::of(conn) {
        Dialect::Sqlite => {
            "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?"
        }
        Dialect::Postgres => {
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = $1"
        }
    };
    Ok(sqlx::query(query)
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?
        .is_some())
}

#[cfg(test)]
mod tests {
    use super::Dialect::{Postgres, Sqlite};

    #[test]
    fn placeholders_are_numbered_for_postgres_and_casts_kept_only_there() {
        let q = "UPDATE trials SET state = ?::trialstate, datetime_complete = ?::timestamp \
                 WHERE trial_id = ? AND \"key\" = 'a?b'";
        assert_eq!(
            Postgres.sql(q),
            "UPDATE trials SET state = $1::trialstate, datetime_complete = $2::timestamp \
             WHERE trial_id = $3 AND \"key\" = 'a?b'"
        );
        assert_eq!(
            Sqlite.sql(q),
            "UPDATE trials SET state = ?, datetime_complete = ? \
             WHERE trial_id = ? AND \"key\" = 'a?b'"
        );
        // Nothing to change: the text itself.
        let plain = "SELECT 1 FROM trials WHERE trial_id = ?";
        assert!(matches!(Sqlite.sql(plain), std::borrow::Cow::Borrowed(_)));
        // A cast written in SQL (not on a placeholder) stays in both.
        assert_eq!(
            Sqlite.sql("SELECT CAST(x AS TEXT) FROM t WHERE a = ?::timestamp"),
            "SELECT CAST(x AS TEXT) FROM t WHERE a = ?"
        );
    }

    #[test]
    fn json_members_read_as_text_in_both_dialects() {
        assert_eq!(
            Sqlite.json_member("detail", "budget"),
            "json_extract(detail, '$.budget')"
        );
        assert_eq!(
            Postgres.json_member("detail", "budget"),
            "(CAST(detail AS json) ->> 'budget')"
        );
    }
}
