//! Schema migrations, applied once each, in order, in one transaction.
//!
//! Each dialect has its own list (`migrations/sqlite/`,
//! `migrations/postgres/`): SQLite's grew one step at a time with the
//! databases users already have, and PostgreSQL's starts at the schema
//! those steps reached. Processes started at the same instant on an empty
//! database create the schema exactly once: SQLite's `BEGIN IMMEDIATE`
//! lets one in at a time, and on PostgreSQL a session advisory lock does
//! (Optuna's issue #1092 is this race without one).

use super::dialect::{Dialect, begin_write, table_exists};
use crate::error::StorageFailure;
use sqlx::{AnyConnection, Row};

/// The advisory lock that serialises migrations on PostgreSQL: any
/// constant of our own ("salus" in ASCII).
const MIGRATION_LOCK: i64 = 0x73616c7573;

const POSTGRES: &[(i64, &str, &str)] = &[
    (
        1,
        "optuna_v3.2.0.a",
        include_str!("../../../migrations/postgres/0001_optuna.sql"),
    ),
    (
        9,
        "salus_tables",
        include_str!("../../../migrations/postgres/0002_salus.sql"),
    ),
    (
        10,
        "salus_fencing",
        include_str!("../../../migrations/postgres/0003_salus_fencing.sql"),
    ),
    (
        11,
        "salus_swap_medium",
        include_str!("../../../migrations/postgres/0004_salus_swap_medium.sql"),
    ),
    (
        12,
        "salus_pbt",
        include_str!("../../../migrations/postgres/0005_salus_pbt.sql"),
    ),
    (
        13,
        "salus_pbt_points",
        include_str!("../../../migrations/postgres/0006_salus_pbt_points.sql"),
    ),
];

const SQLITE: &[(i64, &str, &str)] = &[
    (
        1,
        "optuna_v3.2.0.a",
        include_str!("../../../migrations/sqlite/0001_optuna.sql"),
    ),
    (
        2,
        "salus_tables",
        include_str!("../../../migrations/sqlite/0002_salus.sql"),
    ),
    (
        3,
        "salus_telemetry",
        include_str!("../../../migrations/sqlite/0003_salus_telemetry.sql"),
    ),
    (
        4,
        "salus_priority",
        include_str!("../../../migrations/sqlite/0004_salus_priority.sql"),
    ),
    (
        5,
        "salus_commands",
        include_str!("../../../migrations/sqlite/0005_salus_commands.sql"),
    ),
    (
        6,
        "salus_typed_params",
        include_str!("../../../migrations/sqlite/0006_salus_typed_params.sql"),
    ),
    (
        7,
        "salus_metrics",
        include_str!("../../../migrations/sqlite/0007_salus_metrics.sql"),
    ),
    (
        8,
        "salus_models",
        include_str!("../../../migrations/sqlite/0008_salus_models.sql"),
    ),
    (
        9,
        "salus_processes",
        include_str!("../../../migrations/sqlite/0009_salus_processes.sql"),
    ),
    (
        10,
        "salus_fencing",
        include_str!("../../../migrations/sqlite/0010_salus_fencing.sql"),
    ),
    (
        11,
        "salus_swap_medium",
        include_str!("../../../migrations/sqlite/0011_salus_swap_medium.sql"),
    ),
    (
        12,
        "salus_pbt",
        include_str!("../../../migrations/sqlite/0012_salus_pbt.sql"),
    ),
    (
        13,
        "salus_pbt_points",
        include_str!("../../../migrations/sqlite/0013_salus_pbt_points.sql"),
    ),
];

/// The Optuna schema version these tables match.
pub const OPTUNA_SCHEMA_VERSION: i64 = 12;

pub(super) async fn migrate(conn: &mut AnyConnection) -> Result<(), StorageFailure> {
    if Dialect::of(conn) == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
        let migrated = apply(conn, POSTGRES).await;
        // Released on every path: the session may live on (a reader).
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await;
        migrated?;
        unlocked?;
        Ok(())
    } else {
        apply(conn, SQLITE).await
    }
}

async fn apply(
    conn: &mut AnyConnection,
    migrations: &[(i64, &'static str, &'static str)],
) -> Result<(), StorageFailure> {
    let dialect = Dialect::of(conn);
    let mut tx = begin_write(conn).await?;
    let datetime = match dialect {
        Dialect::Sqlite => "DATETIME",
        Dialect::Postgres => "TIMESTAMP WITHOUT TIME ZONE",
    };
    let create = format!(
        "CREATE TABLE IF NOT EXISTS salus_schema_migrations (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at {datetime} NOT NULL)"
    );
    sqlx::raw_sql(&create).execute(&mut *tx).await?;
    let applied: Vec<i64> = sqlx::query("SELECT version FROM salus_schema_migrations")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for &(version, name, sql) in migrations {
        if applied.contains(&version) {
            continue;
        }
        let optuna_made = version == 1 && table_exists(&mut tx, "version_info").await?;
        if optuna_made {
            let v: Option<i64> = sqlx::query_scalar("SELECT schema_version FROM version_info")
                .fetch_optional(&mut *tx)
                .await?
                .flatten();
            if v != Some(OPTUNA_SCHEMA_VERSION) {
                return Err(StorageFailure::OptunaSchema {
                    found: v,
                    wanted: OPTUNA_SCHEMA_VERSION,
                });
            }
        } else {
            sqlx::raw_sql(sql)
                .execute(&mut *tx)
                .await
                .map_err(|e| StorageFailure::Migration {
                    version,
                    name,
                    source: std::sync::Arc::new(e),
                })?;
        }
        sqlx::query(&dialect.sql(
            "INSERT INTO salus_schema_migrations (version, name, applied_at) VALUES (?, ?, ?::timestamp)",
        ))
        .bind(version)
        .bind(name)
        .bind(super::now())
        .execute(&mut *tx)
        .await?;
    }
    Ok(tx.commit().await?)
}
