//! Schema migrations, applied once each, in order, in one transaction.

use crate::error::StorageFailure;
use sqlx::{Connection, Row, SqliteConnection};

const MIGRATIONS: &[(i64, &str, &str)] = &[
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
];

/// The Optuna schema version these tables match.
pub const OPTUNA_SCHEMA_VERSION: i64 = 12;

pub(super) async fn migrate(conn: &mut SqliteConnection) -> Result<(), StorageFailure> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS salus_schema_migrations (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at DATETIME NOT NULL)")
        .execute(&mut *tx)
        .await
        ?;
    let applied: Vec<i64> = sqlx::query("SELECT version FROM salus_schema_migrations")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for &(version, name, sql) in MIGRATIONS {
        if applied.contains(&version) {
            continue;
        }
        let optuna_made = version == 1
            && sqlx::query(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'version_info'",
            )
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
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
        sqlx::query(
            "INSERT INTO salus_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
        )
        .bind(version)
        .bind(name)
        .bind(super::now())
        .execute(&mut *tx)
        .await?;
    }
    Ok(tx.commit().await?)
}
