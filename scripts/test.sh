#!/usr/bin/env bash
# The project's one test command: sets up what the tests need, then runs
# formatting, lint and the whole test suite. CI (.ci/run) calls exactly this.
#
# Set-up: a Python virtualenv in .venv with Optuna 5.0 and pandas, for the
# test that checks Optuna itself reads our database, and NVIDIA's NVRTC
# wheel, so that the CUDA kernels are compiled by the real compiler even on
# a machine without a GPU (NVRTC needs none). It installs tmux with apt-get
# when it is missing, for the dashboard's end-to-end test.
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
nvrtc_lib() { .venv/bin/python -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null; }
if [[ ! -e "$(nvrtc_lib)/libnvrtc.so.13" ]]; then
    echo "installing NVRTC into .venv (to compile the CUDA kernels in the tests)"
    .venv/bin/pip install --quiet --disable-pip-version-check "nvidia-cuda-nvrtc>=13,<14"
fi
# Appended, so that a machine's own CUDA libraries come first.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(nvrtc_lib)"
export SALUS_TUNE_REQUIRE_NVRTC=1
export SALUS_TUNE_PYTHON="$PWD/.venv/bin/python"

# tmux drives the real dashboard in its end-to-end test.
if ! command -v tmux >/dev/null 2>&1; then
    echo "installing tmux (for the dashboard's end-to-end test)"
    sudo=""
    [[ "$(id -u)" != 0 ]] && sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq tmux >/dev/null
fi
export SALUS_TUNE_REQUIRE_TMUX=1
export SALUS_TUNE_REQUIRE_OPTUNA=1

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
