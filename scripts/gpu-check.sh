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
# With the conv-net phases (17-19, about 120 s) every phase together no
# longer fits one call: the later phases are skipped at DEADLINE. Split it
# in two calls with SKIP, for example SKIP='^1[4-9]-|^10-' and then
# SKIP='^0[2-9]-|^1[1-3]-' (run 5 to run 9 skipped the MLP phases measured
# before). The call that measures precision and the K=64 cells (mixed
# widths and depths, h = 256, 1024 and 4096 in each precision, cnn-32, and PyTorch in
# each precision), with the device tests, estimated at about 5 minutes
# from the phases' earlier times:
#   SKIP='^08-fused|^1[0-68-9]-|^2[01]-' DEADLINE=420 bash scripts/gpu-check.sh SKIP, a regex, leaves out the
# phases whose file it matches. It stops starting phases at
# DEADLINE seconds (default 450; a call may run 600 s, and a session has
# 900 s of device time in all), and each phase's timeout is cut to what is
# left. The tool brings back at most 8 files from $OUT, so the phases write
# into a work folder that is packed into $OUT/gpu-run.tgz after every phase,
# beside $OUT/summary.txt (a line per phase): a call that times out still
# returns what finished. In the archive:
#   01-devices.txt      nvidia-smi and `salus-tune devices` (target, pool, pinned)
#   02-first-op.txt     one op test: the first kernel and cuBLAS call
#   03-ops.txt          every CUDA op test
#   03-conv-ops.txt     every CUDA conv op test (im2col, col2im, pooling,
#                       batch norm, residual add)
#   04-gradients.txt    gradient checks on every device (MLPs and conv nets)
#   05-devices.txt      CPU against CUDA (MLPs and conv nets)
#   06-graphs.txt       graph replay against eager, bit for bit (a conv net too),
#                       and per-layer optimizer steps on the second stream
#                       against one step after the backward pass
#   06-core.txt         the Salus core's lanes (streaks, switches) against
#                       trials run alone, bit for bit
#   07-bench-graphs.json / .log   bench packing on cuda:0, graphs on:
#                       h = 256 and mixed; K = 1, 8, 64; the core's
#                       overhead and switch latency; mixed's fused rows
#                       are one group of mixed widths (grouped GEMMs), and
#                       the JSON's mixed_group_pays is the runner's choice
#   07-bench-mixed-depths.json / .log   K = 64 widths of 64-1024 with 1-3
#                       hidden layers: lanes against groups of mixed shapes
#   08-bench-1024.json / .log     h = 1024, K = 1, 8, 64
#   08-bench-4096.json / .log     h = 4096, K = 64 (one run of each mode:
#                       its 64 trials hold 15 GB of state to build)
#   08-fused-groups*.json / .log  K = 64 as two fused groups on two lanes
#   25-after-backward.json / .log  h = 256 and 1024, K = 1 and 64, seq and
#                       fused, with one optimizer step after the backward
#                       pass instead of per layer beside it (07-, 08-)
#   09-torch_anchor_graphs.txt   the strongest PyTorch anchor (and its JSON)
#   22-precision-{tf32,bf16}.json / .log   [train] precision: h = 256,
#                       1024, 4096 and mixed at K = 64, lanes and fused
#                       (mixed: grouped GEMMs one per member outside fp32)
#   23-torch_anchor_graphs-tf32.txt   the strongest anchor with TF32 on
#                       (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1)
#   24-torch-precision.txt  PyTorch's fused trials (vmap + CUDA graph) in
#                       fp32, tf32 and bf16 autocast, h = 256, 1024, 4096
#   11-digits-cuda.txt, 12-digits-cpu.txt   studies/digits.toml on each
#   26-ramp-cost.txt    the wall time of a 100-trial TPE digits study on
#                       cuda:0 under the default start (scripts/ramp-cost.sh)
#                       and with 8, 4 and 2 trials in flight throughout
#   14-16-profile-*.txt each kernel's time in fused K=64 iterations (h =
#                       256, 1024) and a lone h=4096 one (ncu)
#   17-bench-cnn-*.json / .log    bench packing's conv-net cells on cuda:0:
#                       cnn-digits and cnn-32, K = 1, 8, 64
#   18-digits-cnn-cuda.txt        studies/digits_cnn.toml on cuda:0 (and
#                       18-digits-cnn-asha-cuda.txt, its ASHA variant)
#   19-torch-cnn.txt    PyTorch on the GPU (scripts/anchors/torch_cnn.py):
#                       each seq cell of 17- again, beside our seq and fused
#   20-torch-study.txt  PyTorch trials per hour (scripts/torch-study-bench.sh
#                       on cuda): a small ResNet on CIFAR-shaped images, 16
#                       trials of 8,192 images (2026-12-04's run 3),
#                       under Optuna one at a time, Optuna with
#                       n_jobs = 4 threads, salus-tune with 4 lanes and
#                       salus-tune with MPS, each with nvidia-smi's mean GPU
#                       utilisation, and pause-to-resume of a 256 MiB trial
#                       (1 GiB of state) in process against checkpoint and
#                       restart. Optuna travels as wheels (gpu-anchors/wheels).
#   21-pbt.txt          PBT on cuda:0: the exploit and schedule tests (a
#                       device-to-device copy, and slot to slot within a
#                       fused group, bit for bit against a resume), bench
#                       pbt (1M and 10M parameters, lone and fused), and
#                       studies/digits_pbt.toml (fused members)
#   10-torch_anchor.txt the plain PyTorch anchor (and its JSON), last: its
#                       K-process mode alone takes tens of seconds
#   device-tests.txt    each device test, run or skipped
set -uo pipefail
cd "$(dirname "$0")/.."

TESTS=(ops conv_ops gradients devices graphs exploit it)

if [[ "${1:-}" == "prepare" ]]; then
    set -e
    rm -rf gpu-build gpu-anchors && mkdir -p gpu-build gpu-anchors
    cargo build --release --bin salus-tune
    cp target/release/salus-tune gpu-build/
    # kernels/tests/{ops,conv_ops}.rs, workers/tests/{gradients,devices,graphs,exploit}.rs,
    # tests/it/salus_core.rs
    {
        cargo test --release --no-run --message-format=json -p kernels -p training
        cargo test --release --no-run --message-format=json -p salus-tune --test it
    } 2>/dev/null |
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
    # Optuna and what it needs beyond the device image's packages, as
    # wheels for its Python 3.12 (phase 20 installs them under /tmp/site).
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d gpu-anchors/wheels \
        "optuna>=5.0,<5.1" alembic sqlalchemy mako colorlog greenlet
    du -sh gpu-build gpu-anchors
    cat <<'EOF'

Ready. The device call (the run tool):
  carry:     ["gpu-build", "gpu-anchors"]
  command:   bash scripts/gpu-check.sh
  timeout_s: 480
Save what comes back in docs/gpu-runs/DATE/, then give the machine back.
EOF
    exit 0
fi

: "${OUT:?set OUT to the folder for results}"
DEADLINE=${DEADLINE:-450}
WORK=$(mktemp -d /tmp/gpu-run.XXXX)
# The machine's CUDA first, then the NVRTC/cuBLAS wheels of its Python.
wheel_lib=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${wheel_lib:+:$wheel_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A test that finds no GPU here fails instead of skipping.
export SALUS_TUNE_REQUIRE_CUDA=1
export SALUS_TUNE_DEVICE_TEST_LOG="$WORK/device-tests.txt"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
pack() {
    cp "$WORK/summary.txt" "$OUT/summary.txt"
    tar czf "$OUT/gpu-run.tgz" --exclude='*.checkpoints' -C "$WORK" .
}
note() {
    echo "== $* ($(elapsed) s)" | tee -a "$WORK/summary.txt"
    pack
}
# left SECS: SECS, or what is left before DEADLINE if less (0: skip).
left() {
    local rest=$((DEADLINE - $(elapsed)))
    ((rest < $1)) && echo $((rest > 0 ? rest : 0)) || echo "$1"
}

# budget FILE SECS: the seconds phase FILE may run; fails, with a note, when
# SKIP (a regex) names it or the deadline has passed.
budget() {
    local rest
    if [[ -n "${SKIP:-}" && "$1" =~ $SKIP ]]; then
        note "$1: skipped (SKIP)" >&2
        return 1
    fi
    rest=$(left "$2")
    if ((rest < 5)); then
        note "$1: skipped, past the deadline" >&2
        return 1
    fi
    echo "$rest"
}

# phase FILE SECONDS COMMAND...: runs it into $WORK/FILE and notes how it ended.
phase() {
    local file=$1 secs
    secs=$(budget "$1" "$2") || return
    shift 2
    timeout "$secs" "$@" > "$WORK/$file" 2>&1
    local rc=$?
    local last
    last=$(grep -E '^test result' "$WORK/$file" | tail -1)
    [[ $rc == 124 ]] && last="TIMED OUT after $secs s"
    note "$file: rc=$rc ${last}"
}

# bench FILE SECONDS ARGS...: bench packing on cuda:0, JSON to FILE.json,
# progress to FILE.log.
bench() {
    local file=$1 secs
    secs=$(budget "$1" "$2") || return
    shift 2
    timeout "$secs" gpu-build/salus-tune bench packing --device cuda:0 --json "$@" \
        > "$WORK/$file.json" 2> "$WORK/$file.log"
    local rc=$?
    note "$file: rc=$rc $(tail -1 "$WORK/$file.log")"
}

# study FILE SECONDS DEVICE [STUDY]: a study file (studies/digits.toml by
# default) on DEVICE into a fresh database; the wall time and the best trial.
study() {
    local file=$1 secs=$2 device=$3 toml=${4:-studies/digits.toml}
    local db="$WORK/$(basename "$toml" .toml)-${device/:/}.db"
    phase "$file" "$secs" bash -c "
        s=\$(date +%s%N)
        gpu-build/salus-tune $toml --device $device --storage $db --no-progress || exit
        echo \"wall_ms \$(( (\$(date +%s%N) - s) / 1000000 ))\"
        gpu-build/salus-tune best $toml --storage $db"
}

note "start; deadline ${DEADLINE} s; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
{
    timeout 15 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
    timeout 30 gpu-build/salus-tune devices
} > "$WORK/01-devices.txt" 2>&1
note "01-devices.txt: $(tr '\n' ';' < "$WORK/01-devices.txt")"

T=(--test-threads 1 --nocapture)
phase 02-first-op.txt 45 gpu-build/test-ops cuda::gemm_matches_reference --exact "${T[@]}"
phase 03-ops.txt 60 gpu-build/test-ops cuda:: "${T[@]}"
phase 03-conv-ops.txt 60 gpu-build/test-conv_ops cuda:: "${T[@]}"
phase 04-gradients.txt 30 gpu-build/test-gradients "${T[@]}"
phase 05-devices.txt 45 gpu-build/test-devices "${T[@]}"
phase 06-graphs.txt 45 gpu-build/test-graphs "${T[@]}"
phase 06-core.txt 45 gpu-build/test-it salus_core:: "${T[@]}"

# Each cell's work is sized for at least ~20 iterations per trial at K=64
# (the first iteration of a trial runs eagerly and the second captures it).
bench 07-bench-graphs 100 --h 256,mixed --k 1,8,64 --gflop "${GFLOP:-1500}" --repeats 2
# Groups of mixed widths and depths (1-3 hidden layers): one output
# product per depth; the JSON's mixed_group_pays is the runner's choice.
bench 07-bench-mixed-depths 40 --h mixed-depths --k 64 --gflop "${GFLOP:-1500}" --repeats 2 --no-overhead
bench 08-bench-1024 50 --h 1024 --k 1,8,64 --gflop "${GFLOP_1024:-6000}" --repeats 2 --no-overhead
bench 08-bench-4096 70 --h 4096 --k 64 --gflop "${GFLOP_4096:-40000}" --repeats 1 --no-overhead
# The K trials as two fused groups on two lanes instead of one.
bench 08-fused-groups 40 --h 256,1024 --k 64 --modes fused --fused-groups 2 --gflop "${GFLOP_1024:-6000}" --repeats 2 --no-overhead
bench 08-fused-groups-4096 40 --h 4096 --k 64 --modes fused --fused-groups 2 --gflop "${GFLOP_4096:-40000}" --repeats 1 --no-overhead
# 07- and 08- run each layer's optimizer step on the lane's second stream,
# beside the earlier layers' backward GEMMs (CUDA's default order); the
# same cells with one step after the backward pass, to compare.
bench 25-after-backward 45 --h 256,1024 --k 1,64 --modes seq,fused --gflop "${GFLOP_1024:-6000}" \
    --repeats 2 --no-overhead --optimizer-order after-backward

phase 09-torch_anchor_graphs.txt 60 env OUT="$WORK" PROBE_S=0.2 python3 gpu-anchors/torch_anchor_graphs.py

# [train] precision: the K=64 cells in TF32 and BF16 (07- and 08- are
# fp32), and PyTorch's best anchor with TF32 on (its cuBLAS override).
for p in tf32 bf16; do
    bench 22-precision-$p 60 --h 256,1024,4096,mixed --k 64 --modes lanes,fused \
        --gflop "${GFLOP_PRECISION:-20000}" --repeats 1 --no-overhead --precision $p
done
mkdir -p "$WORK/tf32"
phase 23-torch_anchor_graphs-tf32.txt 60 env TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 OUT="$WORK/tf32" \
    PROBE_S=0.2 python3 gpu-anchors/torch_anchor_graphs.py
# PyTorch's fused K trials (vmap and a CUDA graph) in each precision, bf16
# as autocast: scripts/anchors/torch_mlp_precision.py.
phase 24-torch-precision.txt 90 bash -c '
    for p in fp32 tf32 bf16; do
        python3 scripts/anchors/torch_mlp_precision.py --precision $p --h 256,1024,4096 --k 64 --seconds 1 2>&1
    done'

study 11-digits-cuda.txt 45 cuda:0
study 12-digits-cpu.txt 45 cpu

# What the start of one trial per lane costs on a GPU (InFlight::ramp):
# the digits study with TPE and 100 trials under the default (4 in flight
# until the study holds 60 trials, then 8), then 8, 4 and 2 throughout
# (2: the pace of a longer start, docs/benchmarks/concurrency.md).
phase 26-ramp-cost.txt 90 bash scripts/ramp-cost.sh gpu-build/salus-tune cuda:0

# The conv nets: the digits as images (small kernels, launch-bound) and the
# cuda-convnet preset on 32x32x3 images (about 4.7 GFLOP per iteration at
# batch 64), sized for at least ~20 iterations per trial at K = 64.
bench 17-bench-cnn-digits 60 --h cnn-digits --k 1,8,64 --gflop "${GFLOP_CNN_DIGITS:-300}" --repeats 1 --no-overhead
bench 17-bench-cnn-32 90 --h cnn-32 --k 1,8,64 --gflop "${GFLOP_CNN_32:-6000}" --repeats 1 --no-overhead
study 18-digits-cnn-cuda.txt 90 cuda:0 studies/digits_cnn.toml
study 18-digits-cnn-asha-cuda.txt 90 cuda:0 studies/digits_cnn_asha.toml
# PyTorch on the GPU, the same nets and the same iterations per trial as
# each seq cell of 17-, the K trials one after another.
phase 19-torch-cnn.txt 90 python3 -c '
import json, subprocess, sys
for wl in ("cnn-digits", "cnn-32"):
    rows = json.load(open(sys.argv[1] + "/17-bench-" + wl + ".json"))
    for r in rows:
        if r.get("mode") == "seq":
            per_trial = r["iterations"] // r["k"]
            out = subprocess.run([sys.executable, "scripts/anchors/torch_cnn.py", wl, str(r["k"]), str(per_trial), "64", "16", "cuda"], capture_output=True, text=True)
            t = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-500:]}
            t["ours_seq_s"] = r["seconds"]
            fused = [f for f in rows if f.get("mode") == "fused" and f.get("k") == r["k"]]
            t["ours_fused_s"] = fused[0]["seconds"] if fused else None
            print(json.dumps(t), flush=True)
' "$WORK"

# Where a fused and a lone iteration spend their time: each kernel's
# duration (one metric, so one pass per kernel), some iterations in.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
profile() {
    local file=$1 secs=$2 skip=$3 count=$4
    shift 4
    phase "$file" "$secs" "$NCU" --clock-control none --metrics gpu__time_duration.sum \
        --launch-skip "$skip" --launch-count "$count" --print-summary per-kernel \
        gpu-build/salus-tune bench packing --device cuda:0 --repeats 1 --no-overhead --graphs off "$@"
}
if [[ -n "$NCU" ]]; then
    profile 14-profile-fused-256.txt 40 600 120 --h 256 --k 64 --gflop 400 --modes fused
    profile 15-profile-fused-1024.txt 40 300 60 --h 1024 --k 64 --gflop 2000 --modes fused
    profile 16-profile-lone-4096.txt 40 200 60 --h 4096 --k 1 --gflop 400 --modes seq
else
    note "no ncu on this machine: no kernel profile"
fi

# PyTorch trials four ways (see scripts/torch-study-bench.sh), with Optuna
# from the carried wheels.
phase 20-torch-study.txt 180 bash -c '
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site gpu-anchors/wheels/*.whl || exit
    export PYTHONPATH=/tmp/site
    bash scripts/torch-study-bench.sh --device cuda --trials 16 --epochs 3 --images 8192 --jobs 4 --lanes 4 \
        --bin gpu-build/salus-tune --python "$(command -v python3)" --out "$0/20-torch-study"
' "$WORK"

phase 21-pbt.txt 60 bash -c '
    gpu-build/test-exploit cuda:: --test-threads 1 --nocapture &&
    gpu-build/salus-tune bench pbt --device cuda:0 --rounds 7 &&
    cp studies/digits_pbt.toml /tmp/pbt.toml &&
    gpu-build/salus-tune /tmp/pbt.toml --device cuda:0 --no-progress'
phase 10-torch_anchor.txt 75 env OUT="$WORK" PROBE_S=0.2 python3 gpu-anchors/torch_anchor.py

count() { grep -c "$1" "$WORK/device-tests.txt" 2>/dev/null; }
note "device tests: $(count '^run ') run, $(count '^skip ') skipped (a skip fails here)"
