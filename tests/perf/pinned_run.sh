#!/usr/bin/env bash
# One modelled benchmark run with the agent and the client on separate cores
# (docs/benchmarks.md §20 on; §27 names it):
#
#   tests/perf/pinned_run.sh NAME BINDIR FLUSH WORKLOAD [weir-bench args...]
#
# The `s3-express` latency model over three memory:// buckets, quorum 2, the agent (BINDIR/weir)
# on CPU 0 and BINDIR/weir-bench on CPU 1, 5 s warm-up, 30 s measured. FLUSH is the agent's
# --flush-interval, or `default` for the configured one (auto). WORKLOAD is a file name in
# deploy/omb/workloads/. EXTRA holds more weir-bench arguments (e.g. "-P linger.ms=1"); WEIR_*
# variables reach the agent. The report goes to $OUT/NAME.txt and NAME.json (OUT default
# /tmp/weir-perf), the load average before and after to $OUT/loads.txt. PIN=0 runs both
# unpinned, free to share the two cores (docs/benchmarks.md §32).
set -euo pipefail
name=$1 bindir=$2 flush=$3 workload=$4
shift 4
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/weir-perf}"
mkdir -p "$out"
wrap=$(mktemp /tmp/weir-pinned-XXXX.sh)
trap 'rm -f "$wrap"' EXIT
agent_cpu=(taskset -c 0) bench_cpu=(taskset -c 1)
[ "${PIN:-1}" = 0 ] && agent_cpu=() bench_cpu=()
printf '#!/bin/sh\nexec %s %s/weir "$@"\n' "${agent_cpu[*]}" "$bindir" > "$wrap"
chmod +x "$wrap"
flush_args=()
[ "$flush" = default ] || flush_args=(--agent-arg=--flush-interval "--agent-arg=$flush")
load=$(cut -d' ' -f1 /proc/loadavg)
# shellcheck disable=SC2086 # EXTRA is split on purpose
WEIR_STORAGE_INGEST_BUCKETS='["memory://a","memory://b","memory://c"]' WEIR_STORAGE_QUORUM=2 \
  "${bench_cpu[@]}" "$bindir/weir-bench" "$root/deploy/omb/workloads/$workload" --spawn-agent \
  --weir-bin "$wrap" --agent-arg=--storage-profile --agent-arg=s3-express "${flush_args[@]}" \
  --warmup 5 --duration 30 --progress-interval 0 --json-out "$out/$name.json" ${EXTRA:-} "$@" \
  > "$out/$name.txt" 2>&1
echo "$name load_before=$load load_after=$(cut -d' ' -f1 /proc/loadavg) $(date -u +%H:%M:%S)" \
  >> "$out/loads.txt"
