#!/usr/bin/env python3
"""Catch-up read throughput: a consumer reading a backlog that is no longer in the read cache.

Starts its own `weir agent` (free loopback port, in-memory bucket under the given storage
profile, a read cache too small to hold the backlog), produces `--mib` MiB of 16 KiB records to
one partition, then times one confluent-kafka consumer reading all of it from offset 0 with
large fetches. Every fetch then reads cold files from the (modelled) bucket, so the number shows
how the fetch path overlaps object-store GETs.

    .venv/bin/python tests/perf/catchup_read.py --bin $CARGO_TARGET_DIR/release/weir \\
        --profile s3-standard --mib 200
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from produce_latency import free_port, wait_ready

MIB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "weir"))
    parser.add_argument("--profile", default="s3-standard")
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--cache-mib", type=int, default=1)
    parser.add_argument("--fetch-mib", type=int, default=64)
    parser.add_argument("--value-bytes", type=int, default=16 * 1024,
                        help="record size; large so the Python consumer loop is not the limit")
    args = parser.parse_args()

    port = free_port()
    data = tempfile.mkdtemp(prefix="weir-catchup-")
    env = dict(os.environ,
               WEIR_STORAGE_INGEST_BUCKETS='["memory://"]',
               WEIR_STORAGE_CACHE_BYTES=str(args.cache_mib * MIB),
               WEIR_KAFKA_MAX_FETCH_BYTES=str(args.fetch_mib * MIB),
               RUST_LOG="warn")
    log = open(os.path.join(data, "agent.log"), "w")
    agent = subprocess.Popen([args.bin, "agent", "--listen", f"127.0.0.1:{port}", "--http-listen", "127.0.0.1:0", "--data-dir", data,
                              "--storage-profile", args.profile], env=env, stdout=log, stderr=log)
    try:
        wait_ready(port, agent)
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics(
            [NewTopic("backlog", num_partitions=1, replication_factor=1)])["backlog"].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                             "acks": "all", "queue.buffering.max.kbytes": 1_048_576})
        value = b"x" * args.value_bytes
        records = args.mib * MIB // args.value_bytes
        for _ in range(records):
            while True:
                try:
                    producer.produce("backlog", value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(300)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "catchup", "enable.auto.commit": False,
                             "fetch.max.bytes": args.fetch_mib * MIB,
                             "max.partition.fetch.bytes": args.fetch_mib * MIB,
                             "fetch.wait.max.ms": 100})
        consumer.assign([TopicPartition("backlog", 0, 0)])
        seen = 0
        start = time.monotonic()
        while seen < records:
            for message in consumer.consume(64, timeout=0.2):
                if message.error() is None:
                    seen += 1
            if time.monotonic() - start > 600:
                raise RuntimeError(f"read only {seen} of {records} records in 600 s")
        took = time.monotonic() - start
        consumer.close()
        print(f"profile {args.profile}: read {args.mib} MiB backlog in {took:.2f} s = "
              f"{args.mib / took:.1f} MiB/s (cache {args.cache_mib} MiB, fetch {args.fetch_mib} MiB, "
              f"{args.value_bytes} B records)")
    finally:
        agent.terminate()
        agent.wait(30)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
