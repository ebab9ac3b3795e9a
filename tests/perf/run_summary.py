#!/usr/bin/env python3
"""One line per weir-bench run: publish latency, rate, PUTs per GiB and the agent's CPU, from
the runs' --json-out reports (pinned_run.sh's $OUT/NAME.json; docs/benchmarks.md §33). Files
sealed per second are in stage_means.py's line.

    python3 tests/perf/run_summary.py [--dir /tmp/weir-perf] NAME...
"""

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/weir-perf")
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    print(f"{'run':<24} {'MiB/s':>6} {'p50':>7} {'p99':>7} {'p99.9':>7} {'max':>7} "
          f"{'PUTs/GiB':>9} {'cpu s/MiB':>9} {'errors':>6}")
    for name in args.names:
        with open(f"{args.dir}/{name}.json") as f:
            r = json.load(f)
        lat = r["publish_latency"]
        storage = r.get("storage") or {}
        agent = r.get("agent") or {}
        print(f"{name:<24} {r['publish_rate_mib']:>6.2f} {lat['p50_ms']:>7.2f} "
              f"{lat['p99_ms']:>7.2f} {lat['p999_ms']:>7.2f} {lat['max_ms']:>7.2f} "
              f"{storage.get('puts_per_gib', 0.0):>9.0f} "
              f"{agent.get('cpu_seconds_per_mib', 0.0):>9.4f} {r['errors']:>6}")


if __name__ == "__main__":
    main()
