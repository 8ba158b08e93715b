#!/usr/bin/env bash
# run.sh on PostgreSQL: a throwaway cluster (PostgreSQL's initdb and
# pg_ctl under /usr/lib/postgresql; as root, run as the postgres user),
# the same study, two processes started at once, RUNS times.
# Usage: run-postgres.sh BIN [RUNS]
set -euo pipefail
bin=$1 runs=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
work=$(mktemp -d)
as_pg() { if [[ $(id -u) == 0 ]]; then su postgres -c "$*"; else bash -c "$*"; fi; }
[[ $(id -u) == 0 ]] && chown postgres: "$work"
as_pg "$pgbin/initdb -D $work/data -A trust > /dev/null"
as_pg "$pgbin/pg_ctl -D $work/data -o '-p 5544 -k $work' -l $work/log -w start > /dev/null"
trap 'as_pg "$pgbin/pg_ctl -D $work/data -m immediate stop > /dev/null"; rm -rf "$work"' EXIT
psql() { as_pg "$pgbin/psql -h $work -p 5544 -U postgres -At $*"; }
cp "$here/study.toml" "$work/s.toml"
cd "$work"
url=postgresql://postgres@localhost:5544/two
alive() {
    psql -d two -c "\"SELECT MAX(c) FROM (SELECT (SELECT COUNT(*) FROM trials b \
        WHERE b.datetime_start <= a.datetime_start AND b.datetime_complete > a.datetime_start) AS c \
        FROM trials a WHERE a.number BETWEEN $1 AND $2) x\""
}
for _ in $(seq "$runs"); do
    psql -q -c "'DROP DATABASE IF EXISTS two'" -c "'CREATE DATABASE two'" 2> /dev/null
    "$bin" s.toml --no-progress --storage "$url" > a.log 2>&1 &
    "$bin" s.toml --no-progress --storage "$url" > b.log 2>&1
    wait
    echo "alive 0-9: $(alive 0 9)  10-29: $(alive 10 29)  30-49: $(alive 30 49)"
done
