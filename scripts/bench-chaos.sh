#!/usr/bin/env bash
# `salus-tune bench chaos` on SQLite and on a throwaway PostgreSQL cluster:
# processes on one study stopped past the liveness limit, killed and
# restarted, and sent dashboard commands, then every write checked. The
# cluster lives in a temporary folder, on a Unix socket, and is stopped at
# the end; nothing else is touched.
#
#   scripts/bench-chaos.sh [BENCH FLAGS...]   e.g. --processes 8 --seconds 600 --trials 200
#
# Needs PostgreSQL's server programs and .venv with NumPy (scripts/test.sh
# sets up both).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
pg_bin=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")")
dir=$(mktemp -d)
as_pg=()
if [[ "$(id -u)" == 0 ]]; then
    chown postgres: "$dir"
    as_pg=(runuser -u postgres --)
fi
stop() { "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap stop EXIT
"${as_pg[@]}" "$pg_bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --no-sync >/dev/null
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-k $dir -c listen_addresses='' -c max_connections=200" start >/dev/null
"$pg_bin/psql" -h "$dir" -U postgres -qc "CREATE DATABASE chaos"
SALUS_TUNE_PYTHON="${SALUS_TUNE_PYTHON:-$PWD/.venv/bin/python}" \
    target/release/salus-tune bench chaos --postgres "postgresql://postgres@localhost/chaos?host=$dir" "$@"
