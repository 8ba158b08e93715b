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
source scripts/lib/throwaway-postgres.sh
start_throwaway_postgres chaos
SALUS_TUNE_PYTHON="${SALUS_TUNE_PYTHON:-$PWD/.venv/bin/python}" \
    target/release/salus-tune bench chaos --postgres "$pg_url" "$@"
