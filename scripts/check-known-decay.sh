#!/usr/bin/env bash
# The decay task of scripts/bench-pbt-quality.sh (TASK=decay) with fixed
# learning rates and with fixed schedules, no search: each setting trains
# TRIALS trials (each its own seed) and reports the median, lowest and
# highest validation RMSE. It shows the task has a known best decay: a
# learning rate stepped down beats every constant one.
#
#   scripts/check-known-decay.sh [TRIALS] [BINARY] > out.json
set -euo pipefail
trials=${1:-16}
bin=${2:-target/release/salus-tune}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

study() { # name lr [schedule]
    printf '[study]\nname = "%s"\nseed = 0\nmetric = "val_rmse"\ntrials = %s\n\n' "$1" "$trials"
    # The task as the PBT bench defines it, its searched rate fixed.
    TASK=decay "$(dirname "$0")/bench-pbt-quality.sh" --task-toml |
        sed "s|^lr = .*|lr = $2${3:+\nschedule = $3}|"
}

settings=(
    "lr0.015|0.015|" "lr0.02|0.02|" "lr0.03|0.03|" "lr0.04|0.04|" "lr0.05|0.05|" "lr0.07|0.07|" "lr0.1|0.1|"
    "step-0.1-0.01-0.001|0.1|[{ step = 6, lr = 0.01 }, { step = 9, lr = 0.001 }]"
    "step-0.1-0.003|0.1|[{ step = 8, lr = 0.003 }]"
    "step-0.05-0.005-0.001|0.05|[{ step = 6, lr = 0.005 }, { step = 9, lr = 0.001 }]"
)
for s in "${settings[@]}"; do
    IFS='|' read -r name lr schedule <<<"$s"
    study "$name" "$lr" "$schedule" > "$work/$name.toml"
    "$bin" "$work/$name.toml" --no-progress > "$work/$name.log" 2>&1
done

python3 - "$work" "${settings[@]}" <<'PY'
import json, sqlite3, statistics, sys
work, out = sys.argv[1], {}
for s in sys.argv[2:]:
    name, lr, schedule = s.split("|")
    db = sqlite3.connect(f"{work}/{name}.db")
    v = [r[0] for r in db.execute("SELECT v.value FROM trial_values v JOIN trials t ON t.trial_id = v.trial_id WHERE t.state = 'COMPLETE'")]
    out[name] = {"lr": float(lr), "schedule": schedule or None, "trials": len(v),
                 "median": statistics.median(v), "min": min(v), "max": max(v), "values": v}
print(json.dumps(out, indent=1))
PY
