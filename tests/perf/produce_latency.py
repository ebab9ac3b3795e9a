#!/usr/bin/env python3
"""Produce throughput and latency with a real client (confluent-kafka / librdkafka).

Starts its own `weir agent` (on a free loopback port, fresh data dir) under the given storage
profile, produces for a fixed duration at full speed or at a fixed rate, and reports MiB/s plus
p50/p99/p99.9 latency from produce() to delivery report (acks=all, so every ack is durable).

This is the stop-gap measurement until `weir bench` lands; see docs/benchmarks.md.

    .venv/bin/python tests/perf/produce_latency.py --profile s3-express --seconds 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("agent did not start")


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[index]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "weir"))
    parser.add_argument("--profile", default="local")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.0, help="messages/s; 0 = as fast as possible")
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--agent-arg", action="append", default=[])
    args = parser.parse_args()

    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="weir-perf-")
    log = open(os.path.join(data_dir, "agent.log"), "wb")
    cmd = [args.bin, "agent", "--listen", f"127.0.0.1:{port}", "--http-listen", "127.0.0.1:0", "--data-dir", os.path.join(data_dir, "data"),
           "--storage-profile", args.profile, *args.agent_arg]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, proc)
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic("perf", args.partitions, 1)]).values():
            future.result(30)
        producer = Producer({
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": args.linger_ms,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "message.timeout.ms": 120_000,
        })
        payload = os.urandom(args.message_bytes)
        latencies: list[float] = []
        errors = 0

        def delivered(err, _msg, sent=None):
            nonlocal errors
            if err is not None:
                errors += 1

        start = time.perf_counter()
        end = start + args.seconds
        sent = 0
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            if args.rate > 0 and sent >= (now - start) * args.rate:
                producer.poll(0.0005)
                continue
            stamp = time.perf_counter()

            def callback(err, msg, stamp=stamp):
                delivered(err, msg)
                latencies.append(time.perf_counter() - stamp)

            try:
                producer.produce("perf", payload, partition=sent % args.partitions, on_delivery=callback)
                sent += 1
            except BufferError:
                producer.poll(0.001)
            producer.poll(0)
        producer.flush(120)
        elapsed = time.perf_counter() - start
        latencies.sort()
        mib = len(latencies) * args.message_bytes / (1024 * 1024)
        print(f"profile={args.profile} messages={len(latencies)} errors={errors} "
              f"message_bytes={args.message_bytes} partitions={args.partitions} rate={args.rate or 'max'}")
        print(f"throughput: {mib / elapsed:.1f} MiB/s ({len(latencies) / elapsed:.0f} msg/s) over {elapsed:.1f}s")
        print("latency ms: p50={:.2f} p99={:.2f} p99.9={:.2f} max={:.2f}".format(
            1000 * percentile(latencies, 0.50), 1000 * percentile(latencies, 0.99),
            1000 * percentile(latencies, 0.999), 1000 * (latencies[-1] if latencies else float("nan"))))
    finally:
        if proc.poll() is not None:
            log.flush()
            print(f"agent exited with {proc.returncode}; log tail:")
            print(open(os.path.join(data_dir, "agent.log"), errors="replace").read()[-4000:])
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
