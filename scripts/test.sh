#!/usr/bin/env bash
# The project's one test command: sets up what the tests need, then runs
# formatting, lint and the whole test suite. CI (.ci/run) calls exactly this.
#
# Set-up: a Python virtualenv in .venv with Optuna 5.0 and pandas, for the
# test that checks Optuna itself reads our database, and NVIDIA's NVRTC
# wheel, so that the CUDA kernels are compiled by the real compiler even on
# a machine without a GPU (NVRTC needs none), and psycopg2, for Optuna on
# PostgreSQL. It installs tmux (the dashboard's end-to-end test) and
# PostgreSQL's server programs (the tests start throwaway clusters of their
# own with initdb and pg_ctl, never a system service) with apt-get when
# they are missing, and mdBook (cargo install, into ~/.cargo/bin) to build
# the docs book.
#
# Device tests that could not run (no CUDA device here) print `ok` to cargo,
# so each one records itself (kernels::device_tests) and the last two lines
# count them apart from the passes:
#   device tests: 0 run, 24 skipped (backend unavailable: ...)
#   total: 155 passed, 0 failed, 24 skipped
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust from https://rustup.rs" >&2
    exit 1
fi

# A full disk otherwise shows up minutes later as pip's "[Errno 28]" in the
# middle of torch, or as a linker error. A fresh clone needs about 7 GB for
# .venv (torch's CUDA libraries, unpacked through the temp folder) and 5 GB
# for target/; a warm one a little for the tests' own files.
need_gb=1
.venv/bin/python -c "import torch" >/dev/null 2>&1 || need_gb=$((need_gb + 7))
[[ -d target/release ]] || need_gb=$((need_gb + 5))
free_gb=$(( $(df -Pk . | awk 'NR == 2 { print $4 }') / 1024 / 1024 ))
if (( free_gb < need_gb )); then
    echo "scripts/test.sh: $free_gb GB free on the disk of $PWD, and this run needs about $need_gb GB (.venv with torch, target/); free some and rerun" >&2
    exit 1
fi

if ! .venv/bin/python -c "import optuna, pandas, psycopg2, optuna_dashboard" >/dev/null 2>&1; then
    echo "setting up .venv with optuna 5.0, pandas, psycopg2 and optuna-dashboard (for the interop tests)"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check "optuna>=5.0,<5.1" pandas psycopg2-binary optuna-dashboard
fi
# PyTorch and scikit-learn, for the PyTorch example study and its tests
# (tests/it/external_torch.rs). torch from PyPI brings its CUDA libraries
# (about 5 GB of .venv, a few minutes on a fresh machine): its CPU code
# needs them loaded even without a GPU. pip keeps the wheels in its cache
# (~/.cache/pip), so a rebuilt .venv does not download them again.
if ! .venv/bin/python -c "import torch, sklearn" >/dev/null 2>&1; then
    echo "installing torch and scikit-learn into .venv (the PyTorch example's tests; about 5 GB, a few minutes)"
    .venv/bin/pip install --quiet --disable-pip-version-check "torch>=2.4" scikit-learn
fi
export SALUS_TUNE_REQUIRE_TORCH=1
# maturin builds the wheel (clients/python/pyproject.toml) in tests/it/wheel.rs.
if [[ ! -x .venv/bin/maturin ]]; then
    echo "installing maturin into .venv (the wheel's test)"
    .venv/bin/pip install --quiet --disable-pip-version-check "maturin>=1.5,<2"
fi
export SALUS_TUNE_REQUIRE_MATURIN=1
nvrtc_lib() { .venv/bin/python -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null; }
if [[ ! -e "$(nvrtc_lib)/libnvrtc.so.13" ]]; then
    echo "installing NVRTC into .venv (to compile the CUDA kernels in the tests)"
    .venv/bin/pip install --quiet --disable-pip-version-check "nvidia-cuda-nvrtc>=13,<14"
fi
# Appended, so that a machine's own CUDA libraries come first.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(nvrtc_lib)"
export SALUS_TUNE_REQUIRE_NVRTC=1
export SALUS_TUNE_PYTHON="$PWD/.venv/bin/python"

sudo=""
[[ "$(id -u)" != 0 ]] && sudo="sudo"
apt_install() {
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
# tmux drives the real dashboard in its end-to-end test.
if ! command -v tmux >/dev/null 2>&1; then
    echo "installing tmux (for the dashboard's end-to-end test)"
    apt_install tmux
fi
export SALUS_TUNE_REQUIRE_TMUX=1
# PostgreSQL's programs (initdb, pg_ctl, psql, pg_dump), on the PATH or in
# Debian's /usr/lib/postgresql/<version>/bin, and openssl for a test
# certificate.
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "installing PostgreSQL (the tests start throwaway clusters of their own)"
    apt_install postgresql
fi
if ! command -v openssl >/dev/null 2>&1; then
    apt_install openssl
fi
export SALUS_TUNE_REQUIRE_POSTGRES=1
export SALUS_TUNE_REQUIRE_OPTUNA=1
# mdBook builds the docs book (docs/); tests/it/docs.rs checks its links and
# runs its examples.
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
mdbook_version="0.4.52"
if ! mdbook --version 2>/dev/null | grep -q "v$mdbook_version"; then
    echo "installing mdBook $mdbook_version (to build the docs book)"
    cargo install --quiet --locked mdbook --version "$mdbook_version"
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The build without CUDA (kernels' stub in its place), so the stub cannot
# drift from the real backend.
cargo clippy --workspace --all-targets --no-default-features -- -D warnings
mdbook build docs

log="$(mktemp -d)"
trap 'rm -rf "$log"' EXIT
export SALUS_TUNE_DEVICE_TEST_LOG="$log/device-tests"
: > "$SALUS_TUNE_DEVICE_TEST_LOG"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee "$log/cargo-test"
status=${PIPESTATUS[0]}
set -e

# cargo's own counts, summed over every test binary.
read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
} END { print p + 0, f + 0 }' "$log/cargo-test")
ran=$(grep -c '^run ' "$SALUS_TUNE_DEVICE_TEST_LOG" || true)
skipped=$(grep -c '^skip ' "$SALUS_TUNE_DEVICE_TEST_LOG" || true)
# The most common reason, once (on a machine without CUDA they are all the same).
reasons=$(sed -n 's/^skip [^ ]* [^:]*: //p' "$SALUS_TUNE_DEVICE_TEST_LOG" | sort | uniq -c | sort -rn)
why=$(head -1 <<< "$reasons" | sed 's/^ *[0-9]* //')
others=$(($(grep -c . <<< "$reasons" || true) - 1))
[[ $others -gt 0 ]] && why="$why; and $others other reason(s)"
echo
if [[ $skipped -gt 0 ]]; then
    echo "device tests: $ran run, $skipped skipped ($why)"
else
    echo "device tests: $ran run, 0 skipped"
fi
# A skipped device test is not a pass: cargo counted it as one.
echo "total: $((passed - skipped)) passed, $failed failed, $skipped skipped"
exit "$status"
