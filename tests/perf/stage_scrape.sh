#!/usr/bin/env bash
# A pinned_run.sh run whose agent's /metrics are scraped 12 s and 32 s after it starts (inside
# the measured window), for stage_means.py (docs/benchmarks.md §27):
#
#   tests/perf/stage_scrape.sh NAME BINDIR FLUSH WORKLOAD [weir-bench args...]
#
# Writes $OUT/NAME.m1 and NAME.m2 beside pinned_run.sh's report.
set -euo pipefail
name=$1 bindir=$2
here="$(dirname "$0")"
out="${OUT:-/tmp/weir-perf}"
mkdir -p "$out"
"$here/pinned_run.sh" "$@" &
run=$!
sleep 12
pid=$(pgrep -f "^$bindir/weir agent" | head -1)
port=""
for candidate in $(ss -ltnp | grep "pid=$pid," | awk '{print $4}' | sed 's/.*://'); do
  if curl -sf -m1 "http://127.0.0.1:$candidate/metrics" > /dev/null; then port=$candidate; break; fi
done
[ -n "$port" ] || { echo "no metrics port for agent pid $pid" >&2; wait $run; exit 1; }
curl -sf "http://127.0.0.1:$port/metrics" > "$out/$name.m1"
sleep 20
curl -sf "http://127.0.0.1:$port/metrics" > "$out/$name.m2"
wait $run
