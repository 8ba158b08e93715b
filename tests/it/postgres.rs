//! A study on PostgreSQL, as on SQLite: run, resume, `trials`, `best`, the
//! dashboard's reads, `SALUS_TUNE_STORAGE`; the schema made once; and
//! credentials that never show, from the URL, `PGPASSWORD` or a pgpass
//! file, with `sslmode` as libpq has it. Each test starts a throwaway
//! cluster of its own (`common::postgres`).

use crate::common::postgres::{Cluster, TUNER_PASSWORD};
use crate::common::*;

fn study(name: &str, trials: u64) -> String {
    small_study(name, trials)
}

#[test]
fn a_study_runs_resumes_and_reads_back_on_postgres() {
    let Some(cluster) = Cluster::start("runs_resumes") else {
        return;
    };
    let url = cluster.database("tuning");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &study("pg", 3));
    let out = run_in(dir.path(), &["s.toml", "--no-progress", "--storage", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("results: {url}")),
        "{}",
        text(&out)
    );

    // The same command with a larger target resumes it, here through
    // SALUS_TUNE_STORAGE.
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .args(["s.toml", "--no-progress", "--trials", "5"])
            .env("SALUS_TUNE_STORAGE", &url),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("resuming study 'pg'") && text(&out).contains("3 trials stored"),
        "{}",
        text(&out)
    );

    let db = TestDb::Postgres(url.clone());
    let rows = db.trials(Some("pg"));
    assert_eq!(rows.len(), 5);
    assert!(
        rows.iter()
            .all(|t| t.state.is_finished() && !t.params.is_empty())
    );
    let out = run_in(
        dir.path(),
        &["trials", "--storage", &url, "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 5);
    let out = run_in(dir.path(), &["best", "s.toml", "--storage", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The best trial's model, kept in the database (BYTEA), written out.
    let out = run_in(
        dir.path(),
        &["export", "s.toml", "--storage", &url, "--out", "model"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(dir.path().join("model/model.safetensors").is_file());

    // What the dashboard reads.
    let snap = block_on(salus_tune::dash::read(&url, None)).unwrap();
    assert_eq!(snap.study, "pg");
    assert!(!snap.running);
    assert_eq!(snap.budget_trials, Some(5));
    assert!(snap.best().is_some());
    assert!(snap.trials.iter().all(|t| !t.curve.is_empty()));

    // The schema, once: Optuna's version row and our six migrations.
    assert_eq!(db.scalar("SELECT COUNT(*) FROM version_info"), 1);
    assert_eq!(
        db.scalar("SELECT CAST(MAX(schema_version) AS BIGINT) FROM version_info"),
        12
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM salus_schema_migrations"), 6);
    // The views answer on PostgreSQL too, typed.
    let params = db.texts("SELECT params FROM salus_trial_summary WHERE number = 0");
    let params: serde_json::Value = serde_json::from_str(&params[0]).unwrap();
    assert!(params["width"].is_i64(), "{params}");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM salus_best_trials WHERE rank = 1"),
        1
    );
}

#[test]
fn processes_started_at_once_on_an_empty_database_make_the_schema_once() {
    let Some(cluster) = Cluster::start("schema_once") else {
        return;
    };
    let url = cluster.database("empty");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &study("once", 6));
    let procs: Vec<Running> = (0..6)
        .map(|_| {
            Running::spawn(bin().current_dir(dir.path()).args([
                "s.toml",
                "--no-progress",
                "--storage",
                &url,
            ]))
        })
        .collect();
    for (i, p) in procs.into_iter().enumerate() {
        let out = p.wait();
        assert_eq!(out.status.code(), Some(0), "process {i}: {}", text(&out));
    }
    let db = TestDb::Postgres(url);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM salus_schema_migrations"), 6);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM alembic_version"), 1);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM studies"), 1);
    assert_eq!(db.trials(None).len(), 6);
}

#[test]
fn passwords_never_show_and_come_from_the_url_pgpassword_or_a_pgpass_file() {
    let Some(cluster) = Cluster::start("credentials") else {
        return;
    };
    cluster.database("creds");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &study("creds", 2));
    let plain = cluster.tuner_url("creds");
    let with_password = plain.replacen("tuner@", &format!("tuner:{TUNER_PASSWORD}@"), 1);

    // In the URL: it runs, and the password shows nowhere.
    let out = run_in(
        dir.path(),
        &["s.toml", "--no-progress", "--storage", &with_password],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains(TUNER_PASSWORD), "{}", text(&out));
    assert!(
        text(&out).contains("results: postgresql://tuner:***@localhost:5432/creds"),
        "{}",
        text(&out)
    );
    let out = run_in(
        dir.path(),
        &["check", "s.toml", "--storage", &with_password],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        !text(&out).contains(TUNER_PASSWORD) && text(&out).contains("tuner:***@"),
        "{}",
        text(&out)
    );
    let out = run_in(
        dir.path(),
        &[
            "enqueue",
            "s.toml",
            "--param",
            "width=32",
            "--storage",
            &with_password,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains(TUNER_PASSWORD), "{}", text(&out));
    // The enqueued trial runs first with its value, the rest sampled.
    let out = run_in(
        dir.path(),
        &[
            "s.toml",
            "--no-progress",
            "--more",
            "1",
            "--storage",
            &with_password,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rows = TestDb::Postgres(cluster.url("creds")).trials(None);
    assert_eq!(rows.len(), 3);
    let enqueued = &rows[2];
    assert!(
        enqueued.state.is_finished() && enqueued.fixed_params.is_some(),
        "{enqueued:?}"
    );
    let dump = cluster.dump("creds");
    assert!(dump.contains("salus_runs") && !dump.contains(TUNER_PASSWORD));

    // A wrong password fails with the server's reason, masked.
    let wrong = plain.replacen("tuner@", "tuner:Wrong-Horse@", 1);
    let out = run_in(dir.path(), &["trials", "--storage", &wrong]);
    assert_ne!(out.status.code(), Some(0));
    assert!(!text(&out).contains("Wrong-Horse"), "{}", text(&out));
    assert!(
        text(&out).contains("password authentication failed"),
        "{}",
        text(&out)
    );

    // A generated password with '/', '?', '#' and '@' in it: percent-encoded
    // it runs; pasted raw it cannot parse; either way it shows nowhere.
    let secret = "Gen/3r?at#ed@Pw";
    cluster.psql("postgres", &format!("ALTER ROLE tuner PASSWORD '{secret}'"));
    let encoded = secret
        .replace('/', "%2F")
        .replace('?', "%3F")
        .replace('#', "%23")
        .replace('@', "%40");
    for (url, runs) in [
        (
            plain.replacen("tuner@", &format!("tuner:{encoded}@"), 1),
            true,
        ),
        (
            plain.replacen("tuner@", &format!("tuner:{secret}@"), 1),
            false,
        ),
    ] {
        let out = run_in(dir.path(), &["trials", "--storage", &url]);
        assert_eq!(out.status.success(), runs, "{}", text(&out));
        for part in [secret, &encoded, "3r?at", "ed@Pw", "Gen/"] {
            assert!(!text(&out).contains(part), "{part}: {}", text(&out));
        }
        // Nor in any command's help, where clap shows the environment's value.
        for command in ["run", "dash", "trials", "best", "enqueue", "export"] {
            let out = output_of(
                bin()
                    .args([command, "--help"])
                    .env("SALUS_TUNE_STORAGE", &url),
            );
            assert!(out.status.success(), "{command} --help: {}", text(&out));
            for part in [secret, &encoded, "3r?at", "Gen/"] {
                assert!(
                    !text(&out).contains(part),
                    "{command} --help shows {part}: {}",
                    text(&out)
                );
            }
        }
    }
    cluster.psql(
        "postgres",
        &format!("ALTER ROLE tuner PASSWORD '{TUNER_PASSWORD}'"),
    );

    // PGPASSWORD, as libpq reads it.
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .args(["trials", "--storage", &plain])
            .env("PGPASSWORD", TUNER_PASSWORD),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A pgpass file (PGPASSFILE, else ~/.pgpass), as libpq reads it.
    let pgpass = dir.path().join("pgpass");
    std::fs::write(&pgpass, format!("*:*:creds:tuner:{TUNER_PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&pgpass, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .args(["best", "--storage", &plain])
            .env_remove("PGPASSWORD")
            .env("PGPASSFILE", &pgpass),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // No password from anywhere: the server's refusal, clearly.
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .args(["trials", "--storage", &plain])
            .env_remove("PGPASSWORD")
            .env("PGPASSFILE", dir.path().join("none")),
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out).contains("storage postgresql://tuner@localhost:5432/creds"),
        "{}",
        text(&out)
    );
}

#[test]
fn sslmode_require_uses_tls_and_disable_does_not() {
    let Some(cluster) = Cluster::start_with("sslmode", true) else {
        return;
    };
    cluster.database("tls");
    let port = cluster.tls_port.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "s.toml", &study("tls", 2));
    let tcp = |mode: &str| {
        format!("postgresql://tuner:{TUNER_PASSWORD}@127.0.0.1:{port}/tls?sslmode={mode}")
    };
    // The server admits TLS only over TCP: require (and prefer) get in.
    let out = run_in(
        dir.path(),
        &["s.toml", "--no-progress", "--storage", &tcp("require")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run_in(dir.path(), &["trials", "--storage", &tcp("prefer")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Without TLS the server refuses; so does PGSSLMODE=disable.
    let out = run_in(dir.path(), &["trials", "--storage", &tcp("disable")]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("no encryption"), "{}", text(&out));
    let plain = format!("postgresql://tuner:{TUNER_PASSWORD}@127.0.0.1:{port}/tls");
    let out = output_of(
        bin()
            .current_dir(dir.path())
            .args(["trials", "--storage", &plain])
            .env("PGSSLMODE", "disable"),
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(!text(&out).contains(TUNER_PASSWORD), "{}", text(&out));
}

/// A value after a nullable float in the same prepared statement: sqlx
/// 0.8's `Any` driver sends `None::<f64>` as a `float4` NULL, the statement
/// is prepared with a `float4` there, and the next `f64` is refused
/// ("incorrect binary data format"). Lane statistics with no switches and
/// non-finite objective values are such NULLs; the writer binds NaN and
/// turns it back into NULL with `NULLIF(?::float8, 'NaN')`.
#[test]
fn a_value_after_a_null_float_is_stored_on_postgres() {
    let Some(cluster) = Cluster::start("null_float") else {
        return;
    };
    let url = cluster.url("nulls");
    cluster.psql("postgres", "CREATE DATABASE nulls");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(&url).await.unwrap();
        sqlx::query("CREATE TABLE t (x DOUBLE PRECISION)")
            .execute(&mut conn)
            .await
            .unwrap();
        let plain = "INSERT INTO t VALUES ($1)";
        sqlx::query(plain)
            .bind(None::<f64>)
            .execute(&mut conn)
            .await
            .unwrap();
        let refused = sqlx::query(plain)
            .bind(Some(1.5f64))
            .execute(&mut conn)
            .await;
        assert!(
            refused.is_err(),
            "sqlx now binds a NULL float8: the workaround can go"
        );
        let nullif = "INSERT INTO t VALUES (NULLIF($1::float8, 'NaN'))";
        for v in [2.5, f64::NAN, 3.5] {
            sqlx::query(nullif)
                .bind(v)
                .execute(&mut conn)
                .await
                .unwrap();
        }
        let rows: Vec<Option<f64>> = sqlx::query_scalar("SELECT x FROM t")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(rows, vec![None, Some(2.5), None, Some(3.5)]);
    });
}
