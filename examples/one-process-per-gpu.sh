#!/usr/bin/env bash
# One salus-tune process per GPU of this machine, all on one study: the
# database is their only coordination point (see docs/running-at-scale.md).
# Each process packs its own trials onto its GPU; together they
# stop at the study's `trials`.
#
#   examples/one-process-per-gpu.sh STUDY.toml [GPUS]
#
# GPUS defaults to the number `nvidia-smi -L` lists. DEVICE_PREFIX=cpu runs
# the same loop on the CPU (as the tests do): every process gets --device cpu.
set -euo pipefail
study="${1:?usage: $0 STUDY.toml [GPUS]}"
gpus="${2:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
[[ "$gpus" -ge 1 ]] || { echo "no GPU found; give the count, or DEVICE_PREFIX=cpu" >&2; exit 2; }
prefix="${DEVICE_PREFIX:-cuda:}"
pids=()
for ((i = 0; i < gpus; i++)); do
    device="${prefix}${i}"
    [[ "$prefix" == cpu ]] && device=cpu
    salus-tune "$study" --device "$device" --no-progress > "gpu-$i.log" 2>&1 &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
done
exit "$status"
