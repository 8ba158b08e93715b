#!/usr/bin/env bash
# `salus-tune bench storage` on SQLite and on a throwaway PostgreSQL
# cluster, with Optuna 5.0's processes on the same database beside ours.
# The cluster lives in a temporary folder, on a Unix socket, and is
# stopped at the end; nothing else is touched.
#
#   scripts/bench-storage.sh [BENCH FLAGS...]   e.g. --processes 1,2,4,8 --trials 200
#
# Needs PostgreSQL's server programs and .venv (scripts/test.sh sets up
# both).
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
"$pg_bin/psql" -h "$dir" -U postgres -qc "CREATE DATABASE bench"
SALUS_TUNE_PYTHON="${SALUS_TUNE_PYTHON:-$PWD/.venv/bin/python}" \
    target/release/salus-tune bench storage --postgres "postgresql://postgres@localhost/bench?host=$dir" "$@"
