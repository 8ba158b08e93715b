#!/bin/bash
# usage: BIN_DIR=dir STUDY_DIR=dir STUDY=file.toml AGG=MIN|MAX run.sh BIN TRIALS FIRST_SEED LAST_SEED OUT
# Per seed: the best COMPLETE value, the trials per state, and rung0: the mean value at epoch 3
# (the first rung, which every trial reaches) of the trials TPE proposed (number 10 on).
bin=$1; trials=$2; from=$3; to=$4; out=$5
: > $out
for s in $(seq $from $to); do
  d=$(mktemp -d); cp $STUDY_DIR/$STUDY $d/study.toml; cd $d
  $BIN_DIR/$bin study.toml --no-progress --seed $s --trials $trials > log 2>&1
  python3 -c "
import sqlite3; c=sqlite3.connect('digits-mlp-asha.db')
best=c.execute(\"SELECT $AGG(v.value) FROM trials t JOIN trial_values v ON v.trial_id=t.trial_id WHERE t.state='COMPLETE'\").fetchone()[0]
n=dict(c.execute('SELECT state, COUNT(*) FROM trials GROUP BY state').fetchall())
r=c.execute('SELECT AVG(i.intermediate_value) FROM trials t JOIN trial_intermediate_values i ON i.trial_id=t.trial_id WHERE t.number>=10 AND i.step=3').fetchone()[0]
n['rung0']=r
print($s, best, n)" >> $out
  cd - >/dev/null; rm -rf $d
done
