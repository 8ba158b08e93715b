#!/bin/bash
# alt.sh BEFORE AFTER STUDY AGG FIRST LAST TAG: the two binaries alternately per seed,
# each seed through ../../asha-2026-12-05/two-processes/run3.sh (two processes on
# one SQLite study); writes m-TAG-before.txt and m-TAG-after.txt here. AGG is MIN
# (val_loss) or MAX. The figures: python3 ../../asha-2026-12-05/two-processes/msum.py before after
before=$1; after=$2; study=$3; agg=$4; from=$5; to=$6; tag=$7
here=$(cd "$(dirname "$0")" && pwd)
run3=$here/../../asha-2026-12-05/two-processes/run3.sh
: > m-$tag-before.txt; : > m-$tag-after.txt
for s in $(seq $from $to); do
  bash $run3 $before $study $agg $s $s $here/one.txt; cat $here/one.txt >> m-$tag-before.txt
  bash $run3 $after $study $agg $s $s $here/one.txt; cat $here/one.txt >> m-$tag-after.txt
done
rm -f $here/one.txt
