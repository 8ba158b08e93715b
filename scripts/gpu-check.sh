#!/usr/bin/env bash
# The GPU check, in two halves.
#
#   bash scripts/gpu-check.sh prepare   # here: build and stage, print the device call
#   bash scripts/gpu-check.sh           # on the device machine, with $OUT set
#
# The device machine has no compiler, so `prepare` builds the release binary
# and the test binaries that hold CUDA tests, and copies the PyTorch anchors
# from ../shared/gpu/ into gpu-anchors/. Both folders are ignored by git and
# must be carried (the device tool's `carry`); the anchors are never committed.
#
# The device half fits one device call: its phases' timeouts add up to 465 s
# (a call may run 600 s, and a session has 900 s of device time in all).
# Each phase writes its own file under $OUT as soon as it ends, and a line to
# $OUT/summary.txt, so a call that times out still returns what finished:
#   01-devices.txt      nvidia-smi and `salus-tune devices` (target, pool, pinned)
#   02-first-op.txt     one op test: the first kernel and cuBLAS call
#   03-ops.txt          every CUDA op test
#   04-gradients.txt    gradient checks on every device
#   05-devices.txt      CPU against CUDA
#   06-graphs.txt       graph replay against eager, bit for bit
#   07-bench-graphs.json / .log   bench packing on cuda:0, graphs on (h=4096
#                       is issue 21's: its K=64 trials take long to build)
#   08-bench-eager.json  / .log   the same, graphs off
#   09-torch_anchor.txt, 10-torch_anchor_graphs.txt   the PyTorch anchors
set -uo pipefail
cd "$(dirname "$0")/.."

TESTS=(ops gradients devices graphs)

if [[ "${1:-}" == "prepare" ]]; then
    set -e
    rm -rf gpu-build gpu-anchors && mkdir -p gpu-build gpu-anchors
    cargo build --release --bin salus-tune
    cp target/release/salus-tune gpu-build/
    # kernels/tests/ops.rs, workers/tests/{gradients,devices,graphs}.rs
    cargo test --release --no-run --message-format=json -p kernels -p workers 2>/dev/null |
        python3 -c '
import json, sys, shutil
want = set(sys.argv[1:])
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want and "test" in m["target"]["kind"]:
        shutil.copy(m["executable"], "gpu-build/test-" + m["target"]["name"])
        print("staged", m["target"]["name"])
' "${TESTS[@]}"
    for t in "${TESTS[@]}"; do
        [[ -x gpu-build/test-$t ]] || { echo "test binary $t was not built" >&2; exit 1; }
    done
    # A call carries 64 MiB at most: no symbols needed there.
    strip gpu-build/* 2>/dev/null || true
    cp ../shared/gpu/torch_anchor.py ../shared/gpu/torch_anchor_graphs.py gpu-anchors/
    du -sh gpu-build gpu-anchors
    cat <<'EOF'

Ready. The device call (the run tool):
  carry:     ["gpu-build", "gpu-anchors"]
  command:   bash scripts/gpu-check.sh
  timeout_s: 540
Save what comes back in docs/gpu-runs/DATE/, then give the machine back.
EOF
    exit 0
fi

: "${OUT:?set OUT to the folder for results}"
# The machine's CUDA first, then the NVRTC/cuBLAS wheels of its Python.
wheel_lib=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${wheel_lib:+:$wheel_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A test that finds no GPU here fails instead of skipping.
export SALUS_TUNE_REQUIRE_CUDA=1
export SALUS_TUNE_DEVICE_TEST_LOG="$OUT/device-tests.txt"
start=$(date +%s)
note() { echo "== $* ($(($(date +%s) - start)) s)" | tee -a "$OUT/summary.txt"; }

# phase FILE SECONDS COMMAND...: runs it into $OUT/FILE and notes how it ended.
phase() {
    local file=$1 secs=$2
    shift 2
    timeout "$secs" "$@" > "$OUT/$file" 2>&1
    local rc=$?
    local last
    last=$(grep -E '^test result' "$OUT/$file" | tail -1)
    [[ $rc == 124 ]] && last="TIMED OUT after $secs s"
    note "$file: rc=$rc ${last}"
}

note "start; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
{
    timeout 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    timeout 30 gpu-build/salus-tune devices
} > "$OUT/01-devices.txt" 2>&1
note "01-devices.txt: $(tr '\n' ';' < "$OUT/01-devices.txt")"

T=(--test-threads 1 --nocapture)
phase 02-first-op.txt 45 gpu-build/test-ops cuda::gemm_matches_reference --exact "${T[@]}"
phase 03-ops.txt 75 gpu-build/test-ops cuda:: "${T[@]}"
phase 04-gradients.txt 30 gpu-build/test-gradients "${T[@]}"
phase 05-devices.txt 45 gpu-build/test-devices "${T[@]}"
phase 06-graphs.txt 45 gpu-build/test-graphs "${T[@]}"

BENCH=(bench packing --device cuda:0 --json --h 256,1024,mixed --k 1,8,64 --gflop 20)
timeout 70 gpu-build/salus-tune "${BENCH[@]}" --graphs auto > "$OUT/07-bench-graphs.json" 2> "$OUT/07-bench-graphs.log"
note "07-bench-graphs.json: rc=$? $(tail -1 "$OUT/07-bench-graphs.log")"
timeout 50 gpu-build/salus-tune "${BENCH[@]}" --graphs off > "$OUT/08-bench-eager.json" 2> "$OUT/08-bench-eager.log"
note "08-bench-eager.json: rc=$? $(tail -1 "$OUT/08-bench-eager.log")"

PROBE_S=0.2 timeout 30 python3 gpu-anchors/torch_anchor.py > "$OUT/09-torch_anchor.txt" 2>&1
note "09-torch_anchor.txt: rc=$?"
PROBE_S=0.2 timeout 30 python3 gpu-anchors/torch_anchor_graphs.py > "$OUT/10-torch_anchor_graphs.txt" 2>&1
note "10-torch_anchor_graphs.txt: rc=$?"

count() { grep -c "$1" "$OUT/device-tests.txt" 2>/dev/null; }
note "device tests: $(count '^run ') run, $(count '^skip ') skipped (a skip fails here)"
cat "$OUT/summary.txt"
