#!/usr/bin/env bash
# PostgreSQL and Redis for moot serve, from Debian's packages, in a folder of this project's own:
# no system service, loopback ports only. Safe to run twice.
#
#   tools/services.sh up       # install the packages if missing (as root), create and start both
#   tools/services.sh status   # is each one running, and where
#   tools/services.sh env      # MOOT_DB_URL=... and MOOT_REDIS_URL=... (export $(tools/services.sh env))
#   tools/services.sh down     # stop both (the data stays in the folder; rm -r it to start afresh)
#   tools/services.sh restart-pg   # restart PostgreSQL alone (what replicas outlive: docs/scale-out.md)
#   tools/services.sh psql [ARGS]  # psql on the database `moot`, as its owner (e.g. -c "SELECT ...")
#
# Settings (environment): MOOT_SERVICES_DIR (default: .services/ in the repository's root),
# MOOT_PG_PORT (default 55432), MOOT_REDIS_PORT (default 56379).
#
# PostgreSQL refuses to run as root: as root, initdb and pg_ctl run as the `postgres` user that
# Debian's package creates (runuser -u postgres). Its unix socket lives in the folder, readable by
# that user alone; TCP listens on 127.0.0.1 with a password (role `moot`, database `moot`, both
# made by `up`; the password is generated once and kept in the folder, mode 600). Redis listens on
# 127.0.0.1 with a generated password, and keeps nothing on disk (no RDB, no AOF).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${MOOT_SERVICES_DIR:-$ROOT/.services}"
PG_PORT="${MOOT_PG_PORT:-55432}"
REDIS_PORT="${MOOT_REDIS_PORT:-56379}"
PG_DIR="$DIR/pg"
PG_DATA="$PG_DIR/data"
PG_RUN="$PG_DIR/run"
PG_LOG="$PG_DIR/postgresql.log"
PG_PASSWORD_FILE="$PG_DIR/password"
REDIS_DIR="$DIR/redis"
REDIS_CONF="$REDIS_DIR/redis.conf"
REDIS_PASSWORD_FILE="$REDIS_DIR/password"

say() { printf 'services: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

pg_bin() {
    # Debian installs each major version's programs under /usr/lib/postgresql/N/bin: the newest.
    local dir
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -n "$dir" && -x "$dir/pg_ctl" ]]; then
        printf '%s\n' "$dir"
    elif command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v pg_ctl)"
    fi
}

install_missing() {
    local want=()
    [[ -n "$(pg_bin)" ]] || want+=(postgresql)
    command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
    [[ ${#want[@]} -eq 0 ]] && return 0
    if [[ "$(id -u)" -ne 0 ]]; then
        die "missing: ${want[*]}; install them (sudo apt-get install -y ${want[*]}) and run this again"
    fi
    say "installing ${want[*]} (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # policy-rc.d 101: the packages' own system services are not started (this recipe runs its own).
    local policy=/usr/sbin/policy-rc.d created=0
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
    fi
    apt-get install -y -qq "${want[@]}" >/dev/null || { [[ $created -eq 1 ]] && rm -f "$policy"; die "apt-get install ${want[*]} failed"; }
    [[ $created -eq 1 ]] && rm -f "$policy"
    [[ -n "$(pg_bin)" ]] || die "postgresql is installed but no pg_ctl was found under /usr/lib/postgresql/*/bin"
}

# PostgreSQL's programs run as the folder's owner: `postgres` when we are root.
as_pg() {
    if [[ "$(id -u)" -eq 0 ]]; then
        id postgres >/dev/null 2>&1 || die "no postgres user (Debian's postgresql package creates it): apt-get install -y postgresql"
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

secret() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

pg_running() { [[ -f "$PG_DATA/PG_VERSION" ]] && as_pg "$(pg_bin)/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; }

redis_pid() {
    local pid
    [[ -f "$REDIS_DIR/redis.pid" ]] || return 1
    pid="$(cat "$REDIS_DIR/redis.pid")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && printf '%s\n' "$pid"
}

# The port the running server listens on (postmaster.pid's fourth line), else the configured one.
pg_port() {
    local port=""
    [[ -f "$PG_DATA/postmaster.pid" ]] && port="$(sed -n 4p "$PG_DATA/postmaster.pid" 2>/dev/null || true)"
    printf '%s\n' "${port:-$PG_PORT}"
}

# The port the running Redis listens on (its config, written when it started), else the configured one.
redis_port() {
    local port=""
    redis_pid >/dev/null && [[ -f "$REDIS_CONF" ]] && port="$(sed -n 's/^port //p' "$REDIS_CONF" 2>/dev/null || true)"
    printf '%s\n' "${port:-$REDIS_PORT}"
}

psql_admin() { as_pg "$(pg_bin)/psql" -h "$PG_RUN" -p "$(pg_port)" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt "$@"; }

pg_up() {
    local bin
    bin="$(pg_bin)"
    mkdir -p "$PG_DIR"
    if [[ ! -f "$PG_DATA/PG_VERSION" ]]; then
        [[ -f "$PG_PASSWORD_FILE" ]] || (umask 077 && secret >"$PG_PASSWORD_FILE")
        mkdir -p "$PG_DATA" "$PG_RUN"
        [[ "$(id -u)" -eq 0 ]] && chown -R postgres: "$PG_DIR"
        chmod 700 "$PG_DATA" "$PG_RUN"
        say "initdb $PG_DATA"
        # Local (socket) connections: trust, but the socket's folder is the postgres user's alone.
        as_pg "$bin/initdb" -D "$PG_DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
            -E UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 || die "initdb failed: see $PG_DIR/initdb.log"
    fi
    if pg_running; then
        say "PostgreSQL already running ($PG_DATA)"
    else
        [[ "$(id -u)" -eq 0 ]] && chown postgres: "$PG_DIR" "$PG_RUN" && touch "$PG_LOG" && chown postgres: "$PG_LOG"
        say "starting PostgreSQL on 127.0.0.1:$PG_PORT"
        as_pg "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$PG_RUN -c unix_socket_permissions=0700" \
            start >/dev/null || die "PostgreSQL did not start: see $PG_LOG"
    fi
    # The role and database moot uses (created once; the password is the folder's).
    local password
    password="$(cat "$PG_PASSWORD_FILE")"
    if [[ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = 'moot'")" != 1 ]]; then
        psql_admin -c "CREATE ROLE moot LOGIN CREATEDB PASSWORD '$password'" >/dev/null
    fi
    if [[ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = 'moot'")" != 1 ]]; then
        psql_admin -c "CREATE DATABASE moot OWNER moot" >/dev/null
    fi
}

redis_up() {
    mkdir -p "$REDIS_DIR"
    if redis_pid >/dev/null; then
        say "Redis already running on 127.0.0.1:$(redis_port) (pid $(redis_pid))"
        return 0
    fi
    [[ -f "$REDIS_PASSWORD_FILE" ]] || (umask 077 && secret >"$REDIS_PASSWORD_FILE")
    # Written on every start, so a changed port takes effect; the password stays. The running
    # server's port is read back from it (redis_port).
    (
        umask 077
        cat >"$REDIS_CONF" <<EOF
bind 127.0.0.1
port $REDIS_PORT
protected-mode yes
requirepass $(cat "$REDIS_PASSWORD_FILE")
daemonize yes
pidfile $REDIS_DIR/redis.pid
logfile $REDIS_DIR/redis.log
dir $REDIS_DIR
save ""
appendonly no
EOF
    )
    say "starting Redis on 127.0.0.1:$REDIS_PORT"
    redis-server "$REDIS_CONF" || die "Redis did not start: see $REDIS_DIR/redis.log"
    for _ in $(seq 1 50); do
        redis_pid >/dev/null && return 0
        sleep 0.1
    done
    die "Redis did not start: see $REDIS_DIR/redis.log"
}

cmd_up() {
    install_missing
    pg_up
    redis_up
    say "up; export \$($0 env) sets MOOT_DB_URL and MOOT_REDIS_URL"
}

cmd_down() {
    local bin
    bin="$(pg_bin)"
    if [[ -n "$bin" ]] && pg_running; then
        as_pg "$bin/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null && say "PostgreSQL stopped"
    else
        say "PostgreSQL not running"
    fi
    local pid
    if pid="$(redis_pid)"; then
        kill "$pid"
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        say "Redis stopped"
    else
        say "Redis not running"
    fi
}

cmd_restart_pg() {
    pg_running || die "PostgreSQL is not running here ($PG_DATA): run $0 up"
    as_pg "$(pg_bin)/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -m fast -w -t 60 restart >/dev/null
    say "PostgreSQL restarted on 127.0.0.1:$(pg_port)"
}

cmd_psql() {
    pg_running || die "PostgreSQL is not running here ($PG_DATA): run $0 up"
    as_pg "$(pg_bin)/psql" -h "$PG_RUN" -p "$(pg_port)" -d moot "$@"
}

cmd_status() {
    local rc=0
    if [[ -n "$(pg_bin)" ]] && pg_running; then
        echo "postgresql: running on 127.0.0.1:$(pg_port) ($PG_DATA)"
    else
        echo "postgresql: not running ($PG_DATA)"
        rc=3
    fi
    if redis_pid >/dev/null; then
        echo "redis: running on 127.0.0.1:$(redis_port) (pid $(redis_pid))"
    else
        echo "redis: not running ($REDIS_DIR)"
        rc=3
    fi
    return $rc
}

cmd_env() {
    [[ -f "$PG_PASSWORD_FILE" && -f "$REDIS_PASSWORD_FILE" ]] || die "not set up yet: run $0 up"
    echo "MOOT_DB_URL=postgresql://moot:$(cat "$PG_PASSWORD_FILE")@127.0.0.1:$(pg_port)/moot"
    echo "MOOT_REDIS_URL=redis://default:$(cat "$REDIS_PASSWORD_FILE")@127.0.0.1:$(redis_port)/0"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    restart-pg) cmd_restart_pg ;;
    psql) shift; cmd_psql "$@" ;;
    *)
        echo "usage: $0 up|down|status|env|restart-pg|psql [ARGS]" >&2
        exit 2
        ;;
esac
