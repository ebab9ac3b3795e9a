#!/usr/bin/env python3
"""The produce latency floor of the storage model alone (docs/benchmarks.md §26 b).

An agent answers a request once its file reached the upload quorum and the file's log slot is
durable, in request order on the connection, so an answer also waits for every earlier file. This
draws exactly that from a latency profile (lognormal PUTs given by p50 and p99, as
weir-storage's `OpLatency::sample`, plus the file's size at the profile's bandwidth) for files
sealed every T ms at a given rate, with requests arriving evenly between seals, and prints the
time from a request's arrival at the agent to its answer: no CPU, network or client time.

Log slots are written at most `--window` at a time (`control.max_inflight_writes`, default 8;
0: unlimited); a file sealed while the window is full waits, and every file waiting when a
write starts shares its slot (group commit), as the agent's log writer does.

    python3 tests/perf/latency_floor.py --rate-mib 48.8 --every 1 2 3 5 [--window 4]
"""

import argparse
import collections
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
    parser.add_argument("--window", type=int, default=8,
                        help="log slots written at once (control.max_inflight_writes; 0: unlimited)")
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
        durable = slot_durability(args.files, every, args.window, put)
        done = 0.0
        latencies, commits = [], []
        for k in range(args.files):
            sealed = k * every
            upload = sorted(put() for _ in range(args.buckets))[args.quorum - 1] + transfer
            committed = max(done, durable[k])  # what the agent's commit stage measures
            commits.append(committed - sealed)
            done = max(committed, sealed + upload)
            latencies.append(done - (sealed - rng.random() * every))
        latencies.sort()
        n = len(latencies)
        print(f"{every:8.1f} ms {size / 1024:9.0f} {latencies[n // 2]:8.1f} "
              f"{latencies[int(n * 0.99)]:8.1f} {sum(latencies) / n:9.1f} {sum(commits) / n:11.1f}")


def slot_durability(files: int, every: float, window: int, put) -> list:
    """When each file's log slot is durable: slots are durable in order; at most `window` are
    written at once, and a write takes every file sealed and waiting when it starts."""
    durable = [0.0] * files
    inflight = collections.deque()  # (durable at, files) in slot order
    waiting = []
    k = 0
    while k < files or waiting or inflight:
        next_seal = k * every if k < files else math.inf
        head = inflight[0][0] if inflight else math.inf
        if next_seal <= head:
            now = next_seal
            waiting.append(k)
            k += 1
        else:
            now, done_files = inflight.popleft()
            for f in done_files:
                durable[f] = now
        if waiting and (window <= 0 or len(inflight) < window):
            at = max(now + put(), inflight[-1][0] if inflight else 0.0)
            inflight.append((at, waiting))
            waiting = []
    return durable


if __name__ == "__main__":
    main()
