#!/usr/bin/env bash
# The GPU check, in two halves.
#
#   bash scripts/gpu-check.sh prepare   # here: build, stage into gpu-build/ and gpu-anchors/
#   bash scripts/gpu-check.sh           # on the device machine, with $OUT set
#
# The device machine has no compiler, so `prepare` builds the release
# binary and the test binaries that hold CUDA tests, and copies the PyTorch
# anchors from ../shared/gpu/ into gpu-anchors/. Both folders are ignored by
# git and must be carried (the device tool's `carry`); the anchors are never
# committed. The device half keeps the whole call under 5 minutes and writes
# everything under $OUT: tests.txt, devices.txt, bench_packing.json,
# torch_anchor.txt, torch_anchor_graphs.txt and summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "prepare" ]]; then
    set -e
    rm -rf gpu-build gpu-anchors && mkdir -p gpu-build gpu-anchors
    cargo build --release --bin salus-tune
    cp target/release/salus-tune gpu-build/
    # Test binaries with CUDA bodies: kernels/tests/ops.rs, workers/tests/{gradients,devices}.rs.
    cargo test --release --no-run --message-format=json -p kernels -p workers 2>/dev/null |
        python3 -c '
import json, sys, shutil
want = {"ops", "gradients", "devices"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want and "test" in m["target"]["kind"]:
        shutil.copy(m["executable"], "gpu-build/test-" + m["target"]["name"])
        print("staged", m["target"]["name"])
'
    cp ../shared/gpu/torch_anchor.py ../shared/gpu/torch_anchor_graphs.py gpu-anchors/
    ls -la gpu-build gpu-anchors
    exit 0
fi

: "${OUT:?set OUT to the folder for results}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# A test that finds no GPU here fails instead of skipping.
export SALUS_TUNE_REQUIRE_CUDA=1
start=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - start )) s)" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1
gpu-build/salus-tune devices > "$OUT/devices.txt" 2>&1
step "devices: $(tr '\n' ';' < "$OUT/devices.txt")"

: > "$OUT/tests.txt"
for t in ops gradients devices; do
    # The cuda:: tests of kernels/ops; every test of the workers files (CPU and CUDA).
    filter=""
    [[ $t == ops ]] && filter="cuda::"
    timeout 120 "gpu-build/test-$t" $filter --nocapture --test-threads 1 >> "$OUT/tests.txt" 2>&1
    step "tests $t: rc=$? $(grep -E '^test result' "$OUT/tests.txt" | tail -1)"
done

timeout 150 gpu-build/salus-tune bench packing --device cuda:0 --json --h 256,1024,4096 --k 1,8,64 --gflop 200 \
    > "$OUT/bench_packing.json" 2> "$OUT/bench_packing.log"
step "bench packing: rc=$?"

PROBE_S=0.2 timeout 60 python3 gpu-anchors/torch_anchor.py > "$OUT/torch_anchor.txt" 2>&1
step "torch_anchor: rc=$?"
timeout 60 python3 gpu-anchors/torch_anchor_graphs.py > "$OUT/torch_anchor_graphs.txt" 2>&1
step "torch_anchor_graphs: rc=$?"

tail -5 "$OUT/bench_packing.log" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
