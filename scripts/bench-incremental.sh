#!/usr/bin/env bash
set -u
# usage: scripts/bench-incremental.sh FILE...: after an edit that shifts every line of the file
# (n comment lines inserted at its top, n new each time), times `cargo build`
# then `cargo test --workspace --no-run`.
cd "$(dirname "$0")/.."
ins() { for i in $(seq $2); do sed -i "1i // incr $RANDOM" $1; done; }
for f in "$@"; do
  for rep in 1 2; do
    cp $f /tmp/incr.bak; ins $f $((rep*3))
    s=$(date +%s.%N); cargo build -q 2>&1|tail -1; b=$(date +%s.%N)
    ins $f 1
    cargo test --workspace --no-run -q 2>&1 | tail -1; e=$(date +%s.%N)
    cp /tmp/incr.bak $f
    printf "%s build %.1f s, tests --no-run %.1f s\n" $f $(echo "$b-$s"|bc) $(echo "$e-$b"|bc)
  done
done
cargo build -q; cargo test --workspace --no-run -q 2>&1 | tail -1
