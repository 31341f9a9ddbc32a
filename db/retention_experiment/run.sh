#!/usr/bin/env bash
# Time-partitioning against batched deletes, for the ledger's retention
# (docs/performance.md, Retention). Usage: db/retention_experiment/run.sh DATABASE_URL [messages] [partitions]
# It creates two scratch tables in that database and drops them at the end.
set -euo pipefail
url=$1 messages=${2:-200} partitions=${3:-20}
cd "$(dirname "$0")"
p() { psql "$url" -X -q -v messages="$messages" -v partitions="$partitions" "$@"; }
echo "ledger of $((messages * 25000)) rows, $partitions partitions"
p -f setup.sql
p -Atc "SELECT 'sizes: flat ' || pg_size_pretty(pg_total_relation_size('ledger_flat'))"
for t in ledger_flat ledger_part; do
	sed "s/LEDGER/$t/" update.sql >"/tmp/ledger-update-$t.sql"
	lat=$(pgbench -n -M prepared -T 20 -D messages="$messages" -f "/tmp/ledger-update-$t.sql" "$url" 2>/dev/null | sed -n 's/^latency average = //p')
	rm -f "/tmp/ledger-update-$t.sql"
	echo "dispatch write (500 rows, generic plan) on $t: $lat"
done
for i in 1 2 3; do
	p -c '\timing on' -f delete.sql | sed -n "s/^Time: /batched delete of 10,000 rows, batch $i: /p"
done
p -c '\timing on' -c 'DROP TABLE ledger_part_0' | sed -n "s/^Time: /drop of the oldest partition ($((messages / partitions * 25000)) rows): /p"
p -c 'DROP TABLE ledger_flat, ledger_part CASCADE'
