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
source scripts/lib/throwaway-postgres.sh
start_throwaway_postgres bench
SALUS_TUNE_PYTHON="${SALUS_TUNE_PYTHON:-$PWD/.venv/bin/python}" \
    target/release/salus-tune bench storage --postgres "$pg_url" "$@"
