#!/usr/bin/env bash
# Our conv net against the same net in PyTorch (issue: "the built-in nets
# learn as well as PyTorch's"): studies/cnn_parity.toml once per seed (a
# grid over 3 learning rates) and scripts/anchors/torch_cnn_parity.py over
# the same rates and seeds. One JSON line per trial, then the median
# validation accuracy per side and rate.
#
#   bash scripts/cnn-parity.sh [SEEDS] [PYTHON]
#
# DATA=shapes runs both sides on image data of our own instead of the
# digits: scripts/anchors/make_shapes.py's 16x16 shapes on noise, through
# scripts/anchors/cnn_parity_shapes.toml.
#
# SALUS_TUNE_BIN names the binary (default: target/release/salus-tune,
# built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-5}
python=${2:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
bin=${SALUS_TUNE_BIN:-target/release/salus-tune}
[[ -x $bin ]] || cargo build --release --quiet --bin salus-tune
work=$(mktemp -d /tmp/cnn-parity.XXXX)
trap 'rm -rf "$work"' EXIT
out=$work/rows.jsonl
study=studies/cnn_parity.toml
torch_data=()
case "${DATA:-digits}" in
digits) ;;
shapes)
    "$python" scripts/anchors/make_shapes.py "$work"
    study=scripts/anchors/cnn_parity_shapes.toml
    torch_data=(--npy "$work/shapes-images.npy" "$work/shapes-labels.npy")
    ;;
*) echo "DATA is digits or shapes, not $DATA" >&2; exit 2 ;;
esac
for ((s = 0; s < seeds; s++)); do
    sed -e "s/^seed = 0/seed = $s/" "$study" > "$work/s$s.toml"
    "$bin" "$work/s$s.toml" --device cpu --no-progress --storage "$work/s$s.db" > "$work/s$s.log" 2>&1
    "$bin" trials "$work/s$s.toml" --storage "$work/s$s.db" --format json |
        "$python" -c '
import json, sys
for t in json.load(sys.stdin):
    print(json.dumps({"side": "salus-tune", "lr": float(t["params"]["lr"]), "seed": int(sys.argv[1]), "val_accuracy": t["value"]}))
' "$s" >> "$out"
done
"$python" scripts/anchors/torch_cnn_parity.py --seeds "$seeds" "${torch_data[@]}" >> "$out"
cat "$out"
"$python" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'lr':>8}  {'salus-tune median':>18}  {'pytorch median':>15}  {'salus-tune range':>18}  {'pytorch range':>15}")
for lr in sorted({r["lr"] for r in rows}):
    acc = {s: [r["val_accuracy"] for r in rows if r["lr"] == lr and r["side"] == s] for s in ("salus-tune", "pytorch")}
    med = {s: statistics.median(v) for s, v in acc.items()}
    rng = {s: f"{min(v):.4f}-{max(v):.4f}" for s, v in acc.items()}
    print(f"{lr:>8g}  {med['salus-tune']:>18.4f}  {med['pytorch']:>15.4f}  {rng['salus-tune']:>18}  {rng['pytorch']:>15}")
PY
