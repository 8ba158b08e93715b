#!/usr/bin/env bash
# ramp-cost.sh BIN DEVICE [LANES]: what the runner's start (`InFlight::ramp`)
# costs in time. The digits study with TPE, 100 trials and LANES lanes (4,
# the default on a GPU), run under the default in flight (two per lane for
# TPE's 10 random trials, 2 in flight until the study holds 30 trials, 4
# (at most one per lane) until 60, doubling as the trials double, then two
# per lane), then with `max_concurrent` at two per
# lane, at one per lane and at half the lanes throughout (the last: the
# pace of the start's first step, 2 in flight on a GPU's 4 lanes,
# docs/benchmarks/concurrency.md); prints each run's
# wall time and best value. Each run gets a fresh database in a temporary
# folder.
set -euo pipefail
bin=$1 device=$2 lanes=${3:-4}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for mc in default two-per-lane one-per-lane half-the-lanes; do
    toml=$work/$mc.toml
    sed -e 's/^trials = 32/trials = 100/' -e 's/^kind = "random"/kind = "tpe"/' studies/digits.toml > "$toml"
    printf '\n[scheduler]\nlanes = %s\n' "$lanes" >> "$toml"
    case $mc in
        two-per-lane) echo "max_concurrent = $((2 * lanes))" >> "$toml" ;;
        one-per-lane) echo "max_concurrent = $lanes" >> "$toml" ;;
        half-the-lanes) echo "max_concurrent = $(( (lanes + 1) / 2 ))" >> "$toml" ;;
    esac
    start=$(date +%s%N)
    "$bin" "$toml" --device "$device" --storage "$work/$mc.db" --no-progress > "$work/$mc.log" 2>&1 ||
        { tail -5 "$work/$mc.log"; exit 1; }
    wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    best=$("$bin" best "$toml" --storage "$work/$mc.db" --format csv | tail -1)
    echo "$mc: wall_ms $wall_ms; best: $best"
done
