#!/usr/bin/env bash
# `make run`: a local Herald wired to a local fakepush, with a development
# API key and admin password, on a local PostgreSQL unless DATABASE_URL names
# one. It prints the banner only once Herald answers /readyz.
#
# Settings (environment or make variables):
#   DATABASE_URL      a database of your own; unset: the development cluster
#   HERALD_ADDR       Herald's listen address            (127.0.0.1:8080)
#   FAKEPUSH_ADDR     fakepush's listen address          (127.0.0.1:8443)
#   FAKEPUSH_LATENCY  the round trip fakepush adds       (20ms)
#   FAKEPUSH_DELIVERED, FAKEPUSH_OPENED
#                     shares of pushes whose device fakepush plays confirms
#                     delivery, and opening, to Herald   (0.9, 0.1)
#   HERALD_LOG_FORMAT Herald's log format                (text)
#   DEV               where the key, password and fakepush's files live (.dev)
#
# One `make run` per DEV directory: a second one says so and touches
# nothing of the first's.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=${DEV:-.dev}
addr=${HERALD_ADDR:-127.0.0.1:8080}
fpaddr=${FAKEPUSH_ADDR:-127.0.0.1:8443}
latency=${FAKEPUSH_LATENCY:-20ms}
say() { echo "make run: $*" >&2; }

mkdir -p "$dev"
exec 9>"$dev/run.lock"
if ! flock -n 9; then
	say "another make run is using $dev (it holds $dev/run.lock): stop it first, or give this one a directory of its own with DEV=<dir> (and HERALD_ADDR, FAKEPUSH_ADDR)"
	exit 1
fi

secret() { # a random secret, made once and kept
	[ -s "$1" ] || (umask 077 && head -c "$2" /dev/urandom | base64 | tr '+/' '-_' >"$1")
}
secret "$dev/api-key" 24
secret "$dev/admin-password" 12
# The key apps' stored credentials are sealed with (docs/apps.md).
secret "$dev/secret-key" 32
key=$(cat "$dev/api-key")
pass=$(cat "$dev/admin-password")

if [ -n "${DATABASE_URL:-}" ]; then
	url=$DATABASE_URL
else
	say "starting the development PostgreSQL (.dev/pg)"
	url=$(db/cluster.sh start dev)
fi
say "migrating"
DATABASE_URL=$url HERALD_LOG_FORMAT=text bin/herald migrate >&2

pids=()
stop() {
	trap - EXIT INT TERM
	[ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM

# fakepush writes its env file once it listens; this run holds the lock, so
# the file it removes is its own instance's.
say "starting fakepush on $fpaddr"
rm -f "$dev/fakepush/env"
# It plays the devices too: their receipts go back to this Herald.
bin/herald fakepush --addr "$fpaddr" --tls-dir "$dev/fakepush" --latency "$latency" \
	--receipts-url "http://$addr" --delivered "${FAKEPUSH_DELIVERED:-0.9}" --opened "${FAKEPUSH_OPENED:-0.1}" \
	>"$dev/fakepush.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
	[ -s "$dev/fakepush/env" ] && break
	if ! kill -0 "${pids[0]}" 2>/dev/null; then
		cat "$dev/fakepush.log" >&2
		say "fakepush could not start on $fpaddr: if the port is taken, set FAKEPUSH_ADDR to a free address"
		exit 1
	fi
	sleep 0.1
done
[ -s "$dev/fakepush/env" ] || { say "fakepush wrote no $dev/fakepush/env within 30 s (its log: $dev/fakepush.log)"; exit 1; }
set -a
# shellcheck disable=SC1091
. "$dev/fakepush/env"
set +a

# Ready is this Herald saying it listens (on stdout, once it has bound) and
# then answering /readyz: whatever else may answer on the address is not it.
say "starting Herald on $addr"
: >"$dev/herald.out"
DATABASE_URL=$url HERALD_ADDR=$addr HERALD_API_KEYS=$key HERALD_ADMIN_PASSWORD=$pass HERALD_SECRET_KEY=$(cat "$dev/secret-key") \
	HERALD_LOG_FORMAT=${HERALD_LOG_FORMAT:-text} bin/herald serve >"$dev/herald.out" &
pids+=($!)
ready=
for _ in $(seq 600); do
	if ! kill -0 "${pids[1]}" 2>/dev/null; then
		wait "${pids[1]}" || true
		say "Herald stopped before it was ready (above: why; a taken port names HERALD_ADDR)"
		exit 1
	fi
	if grep -q "listening on" "$dev/herald.out" && curl -sf -o /dev/null "http://$addr/readyz"; then
		ready=1
		break
	fi
	sleep 0.1
done
[ -n "$ready" ] || { say "Herald did not become ready within 60 s"; exit 1; }

cat <<BANNER

  Herald:       http://$addr   (dashboard: user admin, password $pass)
  API key:      $key
  try:          curl -H 'Authorization: Bearer $key' http://$addr/v1/providers
  fakepush:     https://$fpaddr   (curl -k https://$fpaddr/_stats; its log: $dev/fakepush.log)
  database:     $url

  The README's quick start and docs/api.md's walkthrough run against this as written.

BANNER
wait "${pids[1]}"
