#!/bin/bash
# Multi-objective TPE's clip exponent on continuous dimensions, seeds 100-199,
# ours only, two runs at once (the bench is single-threaded).
# BIN: a build whose exponent for several objectives' continuous dimensions
# is read from SALUS_EXP_MO_CLIP (a change to `TpeSampler::clip_exponent`
# made for this run only, not committed).
BIN=${1:?usage: run.sh BIN}
run() {
  SALUS_EXP_MO_CLIP=$1 "$BIN" bench samplers --seeds 100 --first-seed 100 --samplers tpe \
    --no-optuna --problems zdt1,zdt2,dtlz2,bnh --json > "tpe-clip-$1-seeds100-199.json"
}
(run 1.25; run 1.15) &
run 1.0
wait
