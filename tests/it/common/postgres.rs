//! A throwaway PostgreSQL cluster for one test: `initdb` and `pg_ctl` in a
//! temporary folder, listening on a Unix socket there only, run as the
//! `postgres` user when the tests run as root (PostgreSQL refuses root).
//! It depends on no system service, and stops when dropped.
//!
//! The superuser `postgres` connects without a password; the role `tuner`
//! needs its password ([`TUNER_PASSWORD`]), for the credential tests.
//!
//! Where PostgreSQL is not installed, [`Cluster::start`] answers `None` and
//! the test says it skipped; `SALUS_TUNE_REQUIRE_POSTGRES=1` (set by
//! `scripts/test.sh`, which installs it) makes that a failure instead.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const TUNER_PASSWORD: &str = "s3cret-Pw";

pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_postgres: bool,
    /// With TLS: the TCP port on 127.0.0.1, where only TLS is let in.
    pub tls_port: Option<u16>,
    /// The port, which also names the socket file.
    port: u16,
}

/// The folder that holds `initdb` and `pg_ctl`: on the PATH, else Debian's
/// `/usr/lib/postgresql/<version>/bin` (newest first).
fn pg_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
    });
    on_path
        .or_else(|| {
            let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
                .ok()?
                .filter_map(|e| Some(e.ok()?.path().join("bin")))
                .filter(|d| d.join("initdb").is_file())
                .collect();
            versions.sort_by_key(|d| {
                d.parent()
                    .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
                    .unwrap_or(0)
            });
            versions.pop()
        })
        // /usr/local/bin may hold links to the real folder, which also has
        // psql and pg_dump.
        .map(|d| {
            std::fs::canonicalize(d.join("initdb"))
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .unwrap_or(d)
        })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Cluster {
    /// A new cluster, started; `None` (after saying why) where PostgreSQL
    /// is not installed and not required.
    pub fn start(test: &str) -> Option<Cluster> {
        Self::start_with(test, false)
    }

    /// [`Cluster::start`], and with `tls` also listening on a TCP port of
    /// 127.0.0.1 that admits TLS connections only (a self-signed
    /// certificate made with `openssl`).
    pub fn start_with(test: &str, tls: bool) -> Option<Cluster> {
        let Some(bin) = pg_bin() else {
            let why = "PostgreSQL is not installed (initdb not found)";
            if std::env::var("SALUS_TUNE_REQUIRE_POSTGRES").as_deref() == Ok("1") {
                panic!("{test}: {why}, and SALUS_TUNE_REQUIRE_POSTGRES=1");
            }
            eprintln!("skip {test}: {why}");
            return None;
        };
        let dir = tempfile::Builder::new().prefix("pg").tempdir().unwrap();
        let as_postgres = is_root();
        if as_postgres {
            let status = Command::new("chown")
                .args(["postgres:", &dir.path().display().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "chown to postgres");
        }
        let mut cluster = Cluster {
            dir,
            bin,
            as_postgres,
            tls_port: None,
            port: 5432,
        };
        let data = cluster.data();
        cluster.pg(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth-local=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        // The superuser by trust; every other role by its password; over
        // TCP, TLS or nothing.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all postgres trust\nlocal all all scram-sha-256\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n",
        )
        .unwrap();
        let mut options = format!(
            "-k {} -c fsync=off -c max_connections=200",
            cluster.socket_dir().display()
        );
        if tls {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let (crt, key) = (data.join("server.crt"), data.join("server.key"));
            let made = Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                ])
                .args(["-subj", "/CN=localhost", "-keyout"])
                .arg(&key)
                .arg("-out")
                .arg(&crt)
                .output()
                .expect("openssl");
            assert!(
                made.status.success(),
                "openssl: {}",
                String::from_utf8_lossy(&made.stderr)
            );
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            if cluster.as_postgres {
                for f in [&crt, &key] {
                    Command::new("chown")
                        .arg("postgres:")
                        .arg(f)
                        .status()
                        .unwrap();
                }
            }
            options.push_str(&format!(
                " -c listen_addresses=127.0.0.1 -p {port} -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                crt.display(),
                key.display()
            ));
            cluster.tls_port = Some(port);
            cluster.port = port;
        } else {
            options.push_str(" -c listen_addresses=''");
        }
        cluster.pg(
            "pg_ctl",
            &[
                "-D",
                &data.display().to_string(),
                "-o",
                &options,
                "-l",
                &cluster.dir.path().join("log").display().to_string(),
                "-w",
                "start",
            ],
        );
        cluster.psql(
            "postgres",
            &format!("CREATE ROLE tuner LOGIN PASSWORD '{TUNER_PASSWORD}'"),
        );
        Some(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// PostgreSQL's program `name`, to run as `postgres` when root.
    fn program(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    /// Runs PostgreSQL's program `name`; panics with its output on failure.
    fn pg(&self, name: &str, args: &[&str]) {
        let out = self
            .program(name)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            out.status.success(),
            "{name} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs one SQL statement as the superuser on database `db`.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let bundled = self.bin.join("psql");
        let psql = if bundled.is_file() {
            bundled
        } else {
            PathBuf::from("psql")
        };
        let socket = self.socket_dir().display().to_string();
        let out = Command::new(psql)
            .args(["-h", &socket, "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db])
            .args(["-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A new empty database owned by `tuner`; its URL for the superuser.
    pub fn database(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE {name} OWNER tuner"));
        self.url(name)
    }

    /// The socket's URL of database `name` for role `tuner`, without its
    /// password (given by `PGPASSWORD`, `~/.pgpass` or the URL).
    pub fn tuner_url(&self, name: &str) -> String {
        format!(
            "postgresql://tuner@localhost:{}/{name}?host={}",
            self.port,
            self.socket_dir().display()
        )
    }

    /// Every row of database `name`, as `pg_dump --data-only` prints it.
    pub fn dump(&self, name: &str) -> String {
        let out = Command::new(self.bin.join("pg_dump"))
            .args(["-h", &self.socket_dir().display().to_string()])
            .args(["-p", &self.port.to_string()])
            .args(["-U", "postgres", "--data-only", name])
            .output()
            .expect("pg_dump");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The superuser's URL of database `name`, as salus-tune takes it.
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgresql://postgres@localhost:{}/{name}?host={}",
            self.port,
            self.socket_dir().display()
        )
    }

    /// The same database as Optuna (SQLAlchemy with psycopg2) names it.
    pub fn optuna_url(&self, name: &str) -> String {
        format!(
            "postgresql+psycopg2://postgres@/{name}?host={}&port={}",
            self.socket_dir().display(),
            self.port
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data().display().to_string();
        let _ = self
            .program("pg_ctl")
            .args(["-D", &data, "-m", "immediate", "stop"])
            .output();
    }
}
