# Sourced by the bench scripts: starts a throwaway PostgreSQL cluster in a
# temporary folder, on a Unix socket, with database $1, and stops and
# removes it when the script exits. Sets pg_url to the database's URL.
# Runs the server as `postgres` when the script runs as root.
start_throwaway_postgres() {
    local db=$1
    pg_bin=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")")
    pg_dir=$(mktemp -d)
    pg_as=()
    if [[ "$(id -u)" == 0 ]]; then
        chown postgres: "$pg_dir"
        pg_as=(runuser -u postgres --)
    fi
    trap '"${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$pg_dir"' EXIT
    "${pg_as[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -U postgres --auth-local=trust --no-sync >/dev/null 2>&1
    "${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/log" -w \
        -o "-k $pg_dir -c listen_addresses='' -c max_connections=200" start >/dev/null
    "$pg_bin/psql" -h "$pg_dir" -U postgres -qc "CREATE DATABASE $db"
    pg_url="postgresql://postgres@localhost/$db?host=$pg_dir"
}
