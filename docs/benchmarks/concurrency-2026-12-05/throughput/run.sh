#!/bin/bash
# Alternating pairs: max_concurrent 2 and 4, random sampler (the same trials either way).
B=/work/main/target/release/salus-tune
cd /tmp/mc
for i in 1 2 3 4 5; do
  for m in 2 4; do
    rm -f mc$m.db*
    s=$(date +%s.%N)
    $B mc$m.toml --no-progress > out$m-$i.txt 2>&1
    e=$(date +%s.%N)
    echo "$i max_concurrent=$m wall $(echo "$e - $s" | bc) s"
  done
done
