#!/usr/bin/env bash
# Builds compared in rounds, one stage_scrape.sh run each per round, so that every build meets
# the same stretch of the machine's weather (docs/benchmarks.md §33):
#
#   ROUNDS=3 tests/perf/interleave.sh PREFIX FLUSH WORKLOAD NAME=BINDIR... [-- weir-bench args...]
#
# Run NAME in round R is reported as $OUT/PREFIX-NAME-R.{txt,json,m1,m2}; PIN, EXTRA, OUT and
# WEIR_* variables reach pinned_run.sh as they are. A run that fails (the harness's free-port pick
# can race) is retried once. Summarise with run_summary.py and stage_means.py.
set -euo pipefail
prefix=$1 flush=$2 workload=$3
shift 3
builds=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do builds+=("$1"); shift; done
[ $# -gt 0 ] && shift
here="$(dirname "$0")"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for build in "${builds[@]}"; do
    name="$prefix-${build%%=*}-$round" bindir="${build#*=}"
    "$here/stage_scrape.sh" "$name" "$bindir" "$flush" "$workload" "$@" \
      || "$here/stage_scrape.sh" "$name" "$bindir" "$flush" "$workload" "$@"
  done
done
