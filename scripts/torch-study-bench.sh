#!/usr/bin/env bash
# PyTorch trials per hour, the same trials four ways, in one run: the small
# ResNet of studies/workers/torch_resnet.py on CIFAR-shaped images, N trials
# with TPE, tuned by
#   optuna-jobs1   Optuna, one trial at a time (scripts/anchors/optuna_torch.py)
#   optuna-jobsJ   Optuna with n_jobs = J threads on the same device
#   salus-lanes    salus-tune, one process per trial, L lanes
#                  (studies/external_torch_resnet.toml)
#   salus-mps      the same with [scheduler] mps = true (CUDA only)
# and the pause-to-resume of a trial in process against checkpoint and
# restart (salus-tune bench swap). One JSON line per mode on stdout (and in
# OUT/torch-study.jsonl), with the GPU's mean utilisation where nvidia-smi
# samples it.
#
#   bash scripts/torch-study-bench.sh [--device cpu|cuda] [--trials N] [--epochs E]
#        [--images N] [--jobs J] [--lanes L] [--out DIR] [--bin PATH] [--python PATH]
#
# The CPU form (the test command runs a small one) checks that every mode
# works; the GPU form is phase 20 of scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

device=auto trials=16 epochs=3 images=2048 jobs=4 lanes=4 out="" bin="" python=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) device=$2 ;;
        --trials) trials=$2 ;;
        --epochs) epochs=$2 ;;
        --images) images=$2 ;;
        --jobs) jobs=$2 ;;
        --lanes) lanes=$2 ;;
        --out) out=$2 ;;
        --bin) bin=$2 ;;
        --python) python=$2 ;;
        *) echo "unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
    esac
    shift 2
done
if [[ $device == auto ]]; then
    device=cpu
    timeout 10 nvidia-smi -L >/dev/null 2>&1 && device=cuda
fi
[[ -n $python ]] || python=$([[ -x .venv/bin/python ]] && echo "$PWD/.venv/bin/python" || command -v python3)
[[ -n $bin ]] || bin=$([[ -x target/release/salus-tune ]] && echo target/release/salus-tune || echo target/debug/salus-tune)
bin=$(realpath "$bin")
[[ -n $out ]] || out=$(mktemp -d /tmp/torch-study.XXXX)
mkdir -p "$out"
results="$out/torch-study.jsonl"
: > "$results"

# GPU utilisation: nvidia-smi samples every 200 ms while a mode runs.
sampler=""
util_start() {
    [[ $device == cuda ]] && command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$out/util-$1.txt" 2>/dev/null &
    sampler=$!
}
util_stop() {
    [[ -n $sampler ]] || { echo null; return; }
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
    sampler=""
    awk '{ s += $1; n++ } END { if (n) printf "%.1f", s / n; else print "null" }' "$out/util-$1.txt"
}

# mode NAME COMMAND...: runs it, timed, and writes its JSON line. A mode
# that fails is recorded as failed and the others still run (the script
# exits 1 at the end), so that one broken mode, say MPS on a machine that
# refuses its daemon, does not hide the rest.
failed=0
mode() {
    local name=$1 start seconds util
    shift
    echo "$name..." >&2
    util_start "$name"
    start=$(date +%s%N)
    if ! "$@" > "$out/$name.log" 2>&1; then
        util_stop "$name" >/dev/null
        echo "$name failed: see $out/$name.log" >&2
        tail -20 "$out/$name.log" >&2
        echo "{\"mode\": \"$name\", \"device\": \"$device\", \"failed\": true}" | tee -a "$results"
        failed=1
        return 0
    fi
    seconds=$(awk -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "%.3f", ns / 1e9 }')
    util=$(util_stop "$name")
    echo "{\"mode\": \"$name\", \"device\": \"$device\", \"trials\": $trials, \"seconds\": $seconds, \"trials_per_hour\": $(awk -v n="$trials" -v s="$seconds" 'BEGIN { printf "%.1f", 3600 * n / s }'), \"gpu_util_mean\": $util}" | tee -a "$results"
}

optuna() {
    "$python" scripts/anchors/optuna_torch.py --trials "$trials" --jobs "$1" --device "$device" --epochs "$epochs" --images "$images"
}

# The study file, sized as asked, with this Python and client.
study() {
    sed -e "s#command = \[\"python3\", \"workers/torch_resnet.py\"\]#command = [\"$python\", \"$PWD/studies/workers/torch_resnet.py\"]#" \
        -e "s#PYTHONPATH = \"../clients/python\"#PYTHONPATH = \"$PWD/clients/python\"#" \
        -e "s/^trials = 16/trials = $trials/" -e "s/^epochs = 3/epochs = $epochs/" \
        -e "s/^iterations = 3/iterations = $epochs/" -e "s/^images = 2048/images = $images/" \
        -e "s/^lanes = 4/lanes = $lanes/" -e "s/^max_concurrency = 4/max_concurrency = $lanes/" \
        studies/external_torch_resnet.toml
    [[ ${1:-} == mps ]] && printf 'mps = true\n'
    return 0
}
salus() {
    study "$1" > "$out/salus-$1.toml"
    "$bin" "$out/salus-$1.toml" --no-progress --device "$([[ $device == cuda ]] && echo cuda:0 || echo cpu)" \
        --storage "$out/salus-$1.db"
}

mode optuna-jobs1 optuna 1
mode "optuna-jobs$jobs" optuna "$jobs"
mode salus-lanes salus lanes
if [[ $device == cuda ]]; then
    mode salus-mps salus mps
else
    echo '{"mode": "salus-mps", "skipped": "MPS needs a CUDA device"}' | tee -a "$results"
fi
echo "pause-to-resume..." >&2
"$bin" bench swap --json --python "$python" --device "$device" --megabytes "${SWAP_MB:-256}" --rounds 3 \
    > "$out/swap.json" 2> "$out/swap.log" || { tail -20 "$out/swap.log" >&2; exit 1; }
"$python" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(json.dumps({"mode": "pause-to-resume", "device": r["device"], "state_bytes": r["state_bytes"], "in_process_ms": r["in_process_median_ms"], "checkpoint_ms": r["checkpoint_median_ms"]}))' "$out/swap.json" | tee -a "$results"
echo "results in $results" >&2
exit $failed
