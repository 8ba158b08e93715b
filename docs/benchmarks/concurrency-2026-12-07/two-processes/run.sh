#!/usr/bin/env bash
# Two processes started at once on one SQLite study, RUNS times, with the
# binary BIN: the most trials alive where a trial of each window starts,
# then how many trials of the random start and of the rest each process
# (by its index) made. Usage: run.sh BIN [RUNS]
set -euo pipefail
bin=$1 runs=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/study.toml" "$work/s.toml"
cd "$work"
alive() {
    sqlite3 two.db "SELECT MAX(c) FROM (SELECT (SELECT COUNT(*) FROM trials b \
        WHERE b.datetime_start <= a.datetime_start AND b.datetime_complete > a.datetime_start) AS c \
        FROM trials a WHERE a.number BETWEEN $1 AND $2)"
}
made() {
    sqlite3 two.db "SELECT group_concat(n) FROM (SELECT r.process_index || ':' || COUNT(*) n \
        FROM trials t JOIN salus_claims c ON c.trial_id = t.trial_id \
        JOIN salus_runs r ON r.run_id = c.run_id WHERE $1 GROUP BY r.process_index)"
}
for _ in $(seq "$runs"); do
    rm -f two.db*
    "$bin" s.toml --no-progress > a.log 2>&1 &
    "$bin" s.toml --no-progress > b.log 2>&1
    wait
    echo "alive 0-9: $(alive 0 9)  10-29: $(alive 10 29)  30-49: $(alive 30 49) | made 0-9 $(made 't.number < 10') | 10-49 $(made 't.number >= 10')"
done
