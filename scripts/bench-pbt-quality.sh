#!/usr/bin/env bash
# PBT against ASHA and random search on one task, at about the same total
# training iterations, over several seeds: the median best validation
# accuracy of each, and the iterations each spent (summed over trials).
#
# The task: a 2-layer MLP (width 64, Adam) on the built-in digits, searching
# the learning rate and weight decay, 12 epochs per full trial.
# - pbt: a population of 8 (POPULATION), an exploit point every epoch
#   (INTERVAL=44: every 2 epochs);
# - random: as many trials of 12 epochs (the same iterations as PBT's);
# - asha: random proposals under ASHA (min 1 epoch, factor 3) with as many
#   trials as give about the same iterations (TRIALS_ASHA, 36 by default).
#
# METRIC=val_loss ranks and scores by validation loss (minimised) instead
# of accuracy. TASK=sgd trains with plain SGD (momentum 0.9) and a wider
# learning-rate range (1e-3 to 1) instead: a task where a learning rate
# that falls as training goes on should beat any fixed one. TASK=noisy:
# plain SGD (no momentum, batches of 8) on synthetic regression with label
# noise of standard deviation 1 (no model's RMSE goes below about 1),
# learning rate 1e-3 to 0.3, where the last iterate's noise decides much
# of a trial's value (the metric is val_rmse, and an exploit point comes
# every epoch, 200 iterations). TASK=decay: the noisy task with twice the
# rows, half of them for validation (2,000 rows, so that the validation
# RMSE's own noise is small): a task with a known best decay, where a
# learning rate stepped down (0.1, 0.01 from the 6th epoch, 0.001 from
# the 9th) beats every fixed one (docs/benchmarks/pbt.md; an exploit point
# every epoch, 250 iterations).
#
#   scripts/bench-pbt-quality.sh [SEEDS] [BINARY] > out.json
#   TASK=decay scripts/bench-pbt-quality.sh --task-toml
set -euo pipefail
seeds=${1:-10}
bin=${2:-target/release/salus-tune}
asha_trials=${TRIALS_ASHA:-36}
task=${TASK:-adam}
case "$task" in
noisy) default_metric=val_rmse; epoch=200 ;;
decay) default_metric=val_rmse; epoch=250 ;;
*) default_metric=val_accuracy; epoch=22 ;;
esac
metric=${METRIC:-$default_metric}
# Iterations between exploit points: one epoch by default, as a PBT study
# without `interval` does.
interval=${INTERVAL:-$epoch}
# Members of PBT's population, and trials of random search.
population=${POPULATION:-8}
common() {
    if [ "$task" = noisy ] || [ "$task" = decay ]; then
        local rows=2000 validation=0.2
        [ "$task" = decay ] && rows=4000 validation=0.5
        cat <<TOML
[data]
source = "synthetic-regression"
rows = $rows
features = 20
informative = 20
noise = 1.0
validation = $validation
split_seed = 0

[model]
kind = "mlp"
depth = 1
width = 16

[train]
optimizer = "sgd"
lr = { float = [1e-3, 0.3], log = true }
batch_size = 8
epochs = 12

[train.sgd]
momentum = 0.0
TOML
        return
    fi
    cat <<TOML
[data]
source = "digits"
validation = 0.2

[model]
kind = "mlp"
depth = 2
width = 64

TOML
    case "$task" in
    adam) cat <<TOML
[train]
optimizer = "adam"
lr = { float = [1e-4, 1e-1], log = true }
weight_decay = { float = [1e-6, 1e-2], log = true }
batch_size = 64
epochs = 12
TOML
    ;;
    sgd) cat <<TOML
[train]
optimizer = "sgd"
lr = { float = [1e-3, 1.0], log = true }
weight_decay = { float = [1e-6, 1e-2], log = true }
batch_size = 64
epochs = 12

[train.sgd]
momentum = 0.9
TOML
    ;;
    *) echo "TASK is adam, sgd, noisy or decay, not $task" >&2; exit 2 ;;
    esac
}

# --task-toml prints the task's [data], [model] and [train] sections and
# stops: scripts/check-known-decay.sh trains the decay task's fixed
# settings from them.
if [ "${1:-}" = --task-toml ]; then
    common
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT


for seed in $(seq 0 $((seeds - 1))); do
    dir="$work/$seed"
    mkdir -p "$dir"
    { printf '[study]\nname = "pbt"\nseed = %s\nmetric = "%s"\n\n' "$seed" "$metric"; common
      printf '\n[pbt]\npopulation = %s\ninterval = %s\n' "$population" "$interval"; } > "$dir/pbt.toml"
    { printf '[study]\nname = "random"\nseed = %s\nmetric = "%s"\ntrials = %s\n\n' "$seed" "$metric" "$population"; common
      printf '\n[sampler]\nkind = "random"\n'; } > "$dir/random.toml"
    { printf '[study]\nname = "asha"\nseed = %s\nmetric = "%s"\ntrials = %s\n\n' "$seed" "$metric" "$asha_trials"; common
      printf '\n[sampler]\nkind = "random"\n\n[pruner]\nkind = "asha"\nmin_resource = 1\nreduction_factor = 3\n'; } > "$dir/asha.toml"
    for m in pbt random asha; do
        "$bin" "$dir/$m.toml" --no-progress > "$dir/$m.log" 2>&1
    done
done

python3 - "$work" "$seeds" "$metric" "$interval" "$task" "$population" <<'PY'
import json, sqlite3, statistics, sys
work, seeds, metric = sys.argv[1], int(sys.argv[2]), sys.argv[3]
best_of = "MIN" if metric.endswith(("loss", "rmse")) else "MAX"
out = {"metric": metric, "pbt_interval": int(sys.argv[4]), "task": sys.argv[5], "population": int(sys.argv[6])}
for m in ["pbt", "asha", "random"]:
    best, iters = [], []
    for s in range(seeds):
        db = sqlite3.connect(f"{work}/{s}/{m}.db")
        best.append(db.execute(f"SELECT {best_of}(v.value) FROM trial_values v JOIN trials t ON t.trial_id = v.trial_id WHERE t.state = 'COMPLETE'").fetchone()[0])
        iters.append(db.execute("SELECT SUM(iterations) FROM salus_trials").fetchone()[0])
    out[m] = {"median_best": statistics.median(best), "best_per_seed": best,
              "median_iterations": statistics.median(iters), "iterations_per_seed": iters}
print(json.dumps(out, indent=1))
PY
