#!/usr/bin/env bash
# The project's one test command: sets up what the tests need, then runs
# formatting, lint and the whole test suite. CI (.ci/run) calls exactly this.
#
# Set-up: a Python virtualenv in .venv with Optuna 5.0 and pandas, for the
# test that checks Optuna itself reads our database.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust from https://rustup.rs" >&2
    exit 1
fi

if ! .venv/bin/python -c "import optuna, pandas" >/dev/null 2>&1; then
    echo "setting up .venv with optuna 5.0 and pandas (for the interop test)"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check "optuna>=5.0,<5.1" pandas
fi
export SALUS_TUNE_PYTHON="$PWD/.venv/bin/python"
export SALUS_TUNE_REQUIRE_OPTUNA=1

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
