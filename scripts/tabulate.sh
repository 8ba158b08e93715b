#!/usr/bin/env bash
# The tabulated benchmark of `salus-tune bench samplers`: every
# configuration of one grid of MLP knobs, trained once by the built-in
# trainer on each of four data sets, written to
# orchestrator/src/bench/tables/<data set>.csv (which the binary carries).
#
#   bash scripts/tabulate.sh            # all four, about 10 minutes on 2 cores
#   bash scripts/tabulate.sh digits     # one
#
# The grid (5 x 3 x 5 x 3 x 3 = 675 configurations): width 16-256, depth
# 1-3, Adam's learning rate 3e-4 to 3e-2, batch size 16-64 and the
# activation; 10 epochs, seed 0, 20% held out for validation. Each row is
# one configuration's knobs, then its final val_loss, val_accuracy and
# parameter count (a trial that diverged has nan for the first two).
# The data sets: the built-in digits; two synthetic classification sets
# (Gaussian clusters: 4 classes in 3 of 20 features, 6 in 4 of 40);
# and scikit-learn's breast-cancer CSV (installed with the tests' venv),
# whose first line is its shape, not a header, so a header is written.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SALUS_TUNE_BIN:-target/release/salus-tune}
PY=${SALUS_TUNE_PYTHON:-.venv/bin/python}
OUT=orchestrator/src/bench/tables
[ -x "$BIN" ] || cargo build --release
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PY" - "$work/breast_cancer.csv" <<'EOF'
import csv, os, sys
import sklearn
src = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "breast_cancer.csv")
with open(src) as f:
    rows = list(csv.reader(f))
n = int(rows[0][1])
with open(sys.argv[1], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow([f"f{i}" for i in range(n)] + ["target"])
    w.writerows(rows[1:])
EOF

data_of() {
    case $1 in
        digits) echo 'source = "digits"' ;;
        synthetic-a) printf 'source = "synthetic-classification"\nrows = 1000\nfeatures = 20\nclasses = 4\ninformative = 3\n' ;;
        synthetic-b) printf 'source = "synthetic-classification"\nrows = 1500\nfeatures = 40\nclasses = 6\ninformative = 4\n' ;;
        breast-cancer) printf 'source = "csv"\npath = "breast_cancer.csv"\ntarget = "target"\n' ;;
        *) echo "unknown data set $1 (digits, synthetic-a, synthetic-b, breast-cancer)" >&2; exit 2 ;;
    esac
}

sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(digits synthetic-a synthetic-b breast-cancer)
for name in "${sets[@]}"; do
    cat > "$work/$name.toml" <<EOF
[study]
name = "tab-$name"
metric = ["val_loss", "val_accuracy", "params"]
trials = 675
seed = 0
storage = "$name.db"

[data]
$(data_of "$name")
validation = 0.2

[model]
width = { choices = [16, 32, 64, 128, 256] }
depth = { choices = [1, 2, 3] }
activation = { choices = ["relu", "tanh", "gelu"] }

[train]
optimizer = "adam"
lr = { choices = [0.0003, 0.001, 0.003, 0.01, 0.03] }
batch_size = { choices = [16, 32, 64] }
epochs = 10

[sampler]
kind = "grid"
EOF
    echo "tabulating $name (675 configurations) ..." >&2
    (cd "$work" && "$OLDPWD/$BIN" run "$name.toml" --no-progress >/dev/null)
    (cd "$work" && "$OLDPWD/$BIN" trials "$name.toml" --format json) > "$work/$name.json"
    "$PY" - "$work/$name.json" "$OUT/$name.csv" <<'EOF'
import csv, json, sys
trials = json.load(open(sys.argv[1]))
keys = ["width", "depth", "lr", "batch_size", "activation"]
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(keys + ["val_loss", "val_accuracy", "params"])
    # A diverged trial's parameter count: that of its shape's others.
    size = {(t["params"]["width"], t["params"]["depth"]): int(t["values"][2])
            for t in trials if t["state"] == "COMPLETE"}
    for t in sorted(trials, key=lambda t: [str(t["params"][k]) for k in keys]):
        v = t["values"] if t["state"] == "COMPLETE" else None
        loss, acc = (repr(float(v[0])), repr(float(v[1]))) if v else ("nan", "nan")
        w.writerow([t["params"][k] for k in keys] + [loss, acc, size[(t["params"]["width"], t["params"]["depth"])]])
print(f"  {len(trials)} rows in {sys.argv[2]}", file=sys.stderr)
EOF
done
