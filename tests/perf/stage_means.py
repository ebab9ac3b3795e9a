#!/usr/bin/env python3
"""Mean produce time, per stage, and log slot time between two /metrics scrapes of an agent
(stage_scrape.sh's NAME.m1 and NAME.m2; docs/benchmarks.md §27).

    python3 tests/perf/stage_means.py [--dir /tmp/weir-perf] NAME...
"""

import argparse
import re

LINE = re.compile(r"^(weir_\w+?)(_sum|_count|_bucket)(\{[^}]*\})? ([0-9.e+-]+)$")


def load(path: str) -> dict:
    values = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                values[(m.group(1), m.group(3) or "", m.group(2))] = float(m.group(4))
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/weir-perf")
    parser.add_argument("--seconds", type=float, default=20.0, help="time between the scrapes")
    parser.add_argument("--wait-over", type=float, metavar="MS",
                        help="also the share of batches whose batch wait exceeded MS (a "
                             "histogram bucket bound: 0.5, 1, 2, 5, ... ms; §33)")
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    for name in args.names:
        a, b = load(f"{args.dir}/{name}.m1"), load(f"{args.dir}/{name}.m2")

        def delta(metric: str, labels: str, part: str) -> float:
            return b.get((metric, labels, part), 0.0) - a.get((metric, labels, part), 0.0)

        def mean_ms(metric: str, labels: str = "") -> float:
            count = delta(metric, labels, "_count")
            return delta(metric, labels, "_sum") / count * 1000 if count else float("nan")

        requests = delta("weir_produce_duration_seconds", "", "_count") / args.seconds
        row = [name, f"produce {mean_ms('weir_produce_duration_seconds'):.2f} ms "
                     f"({requests:.0f} requests/s)"]
        for stage in ("queue", "batch_wait", "upload", "commit"):
            labels = '{stage="%s"}' % stage
            row.append(f"{stage} {mean_ms('weir_produce_stage_duration_seconds', labels):.2f}")
        slots = delta("weir_control_log_slot_duration_seconds", "", "_count") / args.seconds
        row.append(f"slot {mean_ms('weir_control_log_slot_duration_seconds'):.2f} "
                   f"({slots:.0f}/s)")
        files = delta("weir_file_size_bytes", "", "_count") / args.seconds
        row.append(f"files {files:.0f}/s")
        if args.wait_over is not None:
            stage = '{stage="batch_wait"}'
            bound = '{stage="batch_wait",le="%g"}' % (args.wait_over / 1000)
            total = delta("weir_produce_stage_duration_seconds", stage, "_count")
            within = delta("weir_produce_stage_duration_seconds", bound, "_bucket")
            share = 1 - within / total if total else float("nan")
            row.append(f"batch_wait>{args.wait_over:g}ms {share:.1%}")
        print("  ".join(row))


if __name__ == "__main__":
    main()
