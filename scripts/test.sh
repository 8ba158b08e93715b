#!/usr/bin/env bash
# The project's one test command: sets up what the tests need, then runs
# formatting, lint and the whole test suite. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust from https://rustup.rs" >&2
    exit 1
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
