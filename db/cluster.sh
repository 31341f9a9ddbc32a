#!/usr/bin/env bash
# Manages Herald's project-local PostgreSQL clusters, so that a fresh machine
# needs nothing but the installed PostgreSQL binaries.
#
#   db/cluster.sh start dev|test   start (or reuse) a cluster; prints its URL on stdout
#   db/cluster.sh stop  dev|test   stop it if it runs
#   db/cluster.sh reset dev        stop it and delete its data
#   db/cluster.sh url   dev|test   print the URL without starting anything
#
# dev keeps its data under .dev/pg in the project and is durable; test lives in
# /dev/shm with fsync and synchronous_commit off, because test data is thrown
# away and speed is all that matters there. Both listen only on a Unix socket
# in a short private directory, so they never collide with another PostgreSQL
# on the machine or with another checkout of Herald.
#
# A cluster holds device tokens and runs with a superuser, so only the user
# who runs it gets in: the socket's directory is the cluster owner's alone
# (0700; root, which runs the tests as the owner's superuser, passes), and
# local connections are authenticated by peer, mapped to the postgres role
# for the owner and for whoever started it (root, when the owner is
# postgres). Every start writes both, so a cluster made before they were
# added is brought in line too.
set -euo pipefail

kind=${2:-dev}
cmd=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)
id=$(printf '%s' "$root" | sha1sum | cut -c1-8)

case "$kind" in
dev)
	data="$root/.dev/pg"
	sock="/tmp/herald-pg-$id-dev"
	dbname=herald
	settings=(-c max_connections=200)
	;;
test)
	base="/dev/shm/herald-pg-$id-test"
	data="$base/data"
	sock="$base"
	dbname=postgres
	settings=(-c max_connections=400 -c fsync=off -c synchronous_commit=off
		-c full_page_writes=off -c shared_buffers=256MB -c max_wal_size=4GB)
	;;
*)
	echo "cluster.sh: unknown cluster '$kind' (want dev or test)" >&2
	exit 2
	;;
esac
url="postgres://postgres@/$dbname?host=$sock&sslmode=disable"

log() { echo "cluster.sh: $*" >&2; }

find_bindir() {
	local dir=""
	if command -v pg_config >/dev/null 2>&1; then dir=$(pg_config --bindir); fi
	if [ -z "$dir" ] || [ ! -x "$dir/pg_ctl" ]; then
		dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	fi
	if [ -z "$dir" ] || [ ! -x "$dir/pg_ctl" ] || [ ! -x "$dir/initdb" ]; then
		cat >&2 <<MSG
cluster.sh: no PostgreSQL server binaries (initdb, pg_ctl) were found.
  Install PostgreSQL 15 or newer, for example: apt-get install postgresql
  or point Herald at an existing database: export DATABASE_URL=postgres://user:pass@host:5432/herald
MSG
		exit 1
	fi
	echo "$dir"
}

# PostgreSQL refuses to run as root, so as root we run it as the postgres
# user; anyone else runs it as themselves.
as_owner() {
	if [ "$(id -u)" = 0 ]; then
		if ! id postgres >/dev/null 2>&1; then
			log "running as root but there is no 'postgres' user to own the cluster; create one (useradd -r postgres) or run as a normal user"
			exit 1
		fi
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

own() {
	if [ "$(id -u)" = 0 ]; then chown -R postgres: "$@"; fi
}

# secure restricts who can connect, as the header says: run before the
# server starts, and again (with a reload) when it is already running.
secure() {
	chmod 700 "$sock"
	local me owner
	me=$(id -un)
	owner=$me
	if [ "$(id -u)" = 0 ]; then owner=postgres; fi
	printf '%s\n' "# Written by db/cluster.sh on every start: local connections only, by peer." \
		"local all all peer map=herald" | as_owner tee "$data/pg_hba.conf" >/dev/null
	printf 'herald %s postgres\n' $(printf '%s\n' "$owner" "$me" | sort -u) |
		as_owner tee "$data/pg_ident.conf" >/dev/null
}

running() {
	[ -f "$data/PG_VERSION" ] && as_owner "$bindir/pg_ctl" status -D "$data" >/dev/null 2>&1
}

start() {
	if running; then
		secure
		as_owner "$bindir/pg_ctl" reload -D "$data" >/dev/null
		echo "$url"
		return
	fi
	mkdir -p "$data" "$sock"
	chmod 700 "$data"
	own "$data" "$sock"
	if [ ! -f "$data/PG_VERSION" ]; then
		log "initialising the $kind cluster in $data"
		as_owner "$bindir/initdb" -D "$data" -U postgres --auth-local=peer --auth-host=reject -E UTF8 --locale=C >/dev/null
	fi
	secure
	log "starting the $kind cluster (socket in $sock)"
	as_owner "$bindir/pg_ctl" start -D "$data" -l "$data/server.log" -w -t 60 \
		-o "-k $sock -c listen_addresses='' -c unix_socket_permissions=0700 ${settings[*]}" >/dev/null || {
		log "PostgreSQL did not start; its log says:"
		tail -n 20 "$data/server.log" >&2
		exit 1
	}
	if [ "$dbname" != postgres ]; then
		if ! as_owner "$bindir/psql" -h "$sock" -U postgres -d postgres -tAc \
			"SELECT 1 FROM pg_database WHERE datname = '$dbname'" | grep -q 1; then
			as_owner "$bindir/createdb" -h "$sock" -U postgres "$dbname"
		fi
	fi
	echo "$url"
}

stop() {
	if running; then
		as_owner "$bindir/pg_ctl" stop -D "$data" -m fast -w >/dev/null
		log "stopped the $kind cluster"
	fi
}

case "$cmd" in
url) echo "$url" ;;
start) bindir=$(find_bindir); start ;;
stop) bindir=$(find_bindir); stop ;;
reset)
	bindir=$(find_bindir)
	stop
	if [ "$kind" = test ]; then rm -rf "$base"; else rm -rf "$data"; fi
	log "deleted the $kind cluster's data"
	;;
*)
	echo "usage: db/cluster.sh start|stop|reset|url dev|test" >&2
	exit 2
	;;
esac
