#!/bin/bash
# run3.sh BIN STUDY AGG FIRST LAST OUT: two processes (one lane each) on one SQLite study per seed, 60 s deadline each
bin=$1; study=$2; agg=$3; from=$4; to=$5; out=$6
: > $out
for s in $(seq $from $to); do
  d=$(mktemp -d); cp $study $d/study.toml; cd $d
  start=$(date +%s.%N)
  timeout 60 $bin study.toml --no-progress --seed $s > log1 2>&1 &
  sleep 0.5
  timeout 60 $bin study.toml --no-progress --seed $s > log2 2>&1
  wait
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  python3 -c "
import sqlite3; c=sqlite3.connect('digits-mlp-asha.db')
best=c.execute(\"SELECT $agg(v.value) FROM trials t JOIN trial_values v ON v.trial_id=t.trial_id WHERE t.state='COMPLETE'\").fetchone()[0]
n=dict(c.execute('SELECT state, COUNT(*) FROM trials GROUP BY state').fetchall())
r=c.execute('SELECT AVG(i.intermediate_value) FROM trials t JOIN trial_intermediate_values i ON i.trial_id=t.trial_id WHERE t.number>=10 AND i.step=3').fetchone()[0]
n['rung0']=r; n['seconds']=round($secs, 2)
print($s, best, n)" >> $out
  cd - >/dev/null; rm -rf $d
done
