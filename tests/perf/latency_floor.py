#!/usr/bin/env python3
"""The produce latency floor of the storage model alone (docs/benchmarks.md §26 b).

An agent answers a request once its file reached the upload quorum and the file's log slot is
durable, in request order on the connection, so an answer also waits for every earlier file. This
draws exactly that from a latency profile (lognormal PUTs given by p50 and p99, as
weir-storage's `OpLatency::sample`, plus the file's size at the profile's bandwidth) for files
sealed every T ms at a given rate, with requests arriving evenly between seals, and prints the
time from a request's arrival at the agent to its answer: no CPU, network or client time.

    python3 tests/perf/latency_floor.py --rate-mib 48.8 --every 1 2 3 5
"""

import argparse
import math
import random

Z_P99 = 2.326


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-mib", type=float, default=48.8, help="MiB/s produced")
    parser.add_argument("--every", type=float, nargs="+", default=[1, 2, 3, 5],
                        help="ms between seals (one file each)")
    parser.add_argument("--put-p50", type=float, default=6.0, help="PUT p50, ms (s3-express: 6)")
    parser.add_argument("--put-p99", type=float, default=15.0, help="PUT p99, ms (s3-express: 15)")
    parser.add_argument("--bandwidth-mb", type=float, default=200.0,
                        help="per-request MB/s (s3-express: 200)")
    parser.add_argument("--buckets", type=int, default=3)
    parser.add_argument("--quorum", type=int, default=2)
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sigma = math.log(args.put_p99 / args.put_p50) / Z_P99

    def put() -> float:
        return min(args.put_p50 * math.exp(sigma * rng.gauss(0, 1)), 10 * args.put_p99)

    print("seal every  file KiB   p50 ms   p99 ms   mean ms   commit ms")
    for every in args.every:
        size = args.rate_mib * 1024 * 1024 * every / 1000
        transfer = size / (args.bandwidth_mb * 1e6) * 1000
        done = slots = 0.0
        latencies, commits = [], []
        for k in range(args.files):
            sealed = k * every
            upload = sorted(put() for _ in range(args.buckets))[args.quorum - 1] + transfer
            slots = max(slots, sealed + put())  # slots become durable in order
            committed = max(done, slots)  # what the agent's commit stage measures
            commits.append(committed - sealed)
            done = max(committed, sealed + upload)
            latencies.append(done - (sealed - rng.random() * every))
        latencies.sort()
        n = len(latencies)
        print(f"{every:8.1f} ms {size / 1024:9.0f} {latencies[n // 2]:8.1f} "
              f"{latencies[int(n * 0.99)]:8.1f} {sum(latencies) / n:9.1f} {sum(commits) / n:11.1f}")


if __name__ == "__main__":
    main()
