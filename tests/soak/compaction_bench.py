"""Compaction benchmark (not a test; prints the tables for docs/benchmarks.md): a release
`weir agent` on the default local bucket (ingest + metadata) with compaction into
`{data_dir}/compacted`, a steady produce load with a 20 ms flush, and every SAMPLE_S seconds the
ingest and compacted file counts, the age of the oldest ingest file and compaction's counters.
Before the first compaction and at the end, a consumer reads everything from offset 0 with the
agent's read cache off, and the GETs it caused are counted.

    python tests/soak/compaction_bench.py --weir target/release/weir --minutes 15 --rate 2000

Defaults are the agent's (`[compaction]` in config/weir.toml) unless flags say otherwise."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from soak import free_port, rss_mib  # noqa: E402  (tests/soak, this script's directory)

GIB = 1 << 30
PARTITIONS = 8
VALUE = 1024


def report(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def requests(doc: dict, bucket_part: str, kind: str) -> int:
    total = 0
    for b in doc.get("buckets", []):
        if bucket_part in b["name"]:
            total += sum(b["requests"][kind].values())
    return total


def files(root: Path) -> list[Path]:
    return list(root.rglob("*.weir")) if root.exists() else []


def read_all(bootstrap: str, topic: str) -> int:
    """Reads every partition from offset 0 to its high watermark; returns the bytes read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
             for p in range(PARTITIONS)}
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    done = {p for p, h in highs.items() if h == 0}
    got = 0
    deadline = time.monotonic() + 900
    while len(done) < PARTITIONS and time.monotonic() < deadline:
        for m in c.consume(num_messages=10000, timeout=1.0):
            if m.error():
                continue
            got += len(m.value() or b"")
            if m.offset() + 1 >= highs[m.partition()]:
                done.add(m.partition())
    c.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weir", required=True)
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--rate", type=int, default=2000, help="messages/s of 1 KiB")
    ap.add_argument("--sample", type=float, default=30)
    ap.add_argument("--early-read", type=float, default=100,
                    help="seconds into the run of the read before any compaction")
    ap.add_argument("--settle", type=float, default=0,
                    help="seconds to keep sampling after producing stops, before the final read")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="weir-compaction-bench-"))
    data = root / "data"
    port = free_port()
    report_path = root / "report.json"
    env = dict(os.environ, WEIR_STORAGE_CACHE_BYTES="0", MALLOC_ARENA_MAX="2")
    log = open(root / "agent.log", "w")
    agent = subprocess.Popen([args.weir, "agent", "--listen", f"127.0.0.1:{port}", "--http-listen", "127.0.0.1:0",
                              "--data-dir", str(data), "--flush-interval", "20ms",
                              "--storage-report", str(report_path)],
                             stdout=log, stderr=subprocess.STDOUT, env=env)
    bootstrap = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        topic = "compaction-bench"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        stop = threading.Event()
        produced = [0]

        def produce() -> None:
            p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                          "queue.buffering.max.messages": 1000000})
            value = os.urandom(VALUE)
            start = time.monotonic()
            n = 0
            while not stop.is_set():
                due = int((time.monotonic() - start) * args.rate)
                while n < due:
                    try:
                        p.produce(topic, value, partition=n % PARTITIONS)
                    except BufferError:
                        p.poll(0.05)
                        continue
                    n += 1
                p.poll(0.01)
            p.flush(60)
            produced[0] = n * VALUE

        producer = threading.Thread(target=produce)
        started = time.monotonic()
        producer.start()
        ingest_dir = data / "bucket" / "ingest"
        compacted_dir = data / "compacted" / "compacted"
        rows = []
        early = None
        end = started + args.minutes * 60
        settle_end = end + args.settle
        next_sample = started + args.sample
        while time.monotonic() < settle_end:
            if time.monotonic() >= end and not stop.is_set():
                stop.set()
                producer.join()
            time.sleep(1)
            now = time.monotonic()
            if early is None and now - started >= args.early_read:
                before = report(report_path)
                read = read_all(bootstrap, topic)
                after = report(report_path)
                early = (read, requests(after, "bucket", "get") - requests(before, "bucket", "get"),
                         (after.get("compaction") or {}).get("jobs_done", 0))
            if now >= next_sample:
                next_sample += args.sample
                ingest = files(ingest_dir)
                oldest = max((time.time() - f.stat().st_mtime for f in ingest), default=0.0)
                comp = files(compacted_dir)
                doc = report(report_path)
                stats = doc.get("compaction", {})
                rows.append((round(now - started), len(ingest),
                             round(sum(f.stat().st_size for f in ingest) / (1 << 20), 1),
                             round(oldest), len(comp),
                             round(sum(f.stat().st_size for f in comp) / (1 << 20), 1),
                             stats.get("jobs_done", 0),
                             (doc.get("tiers") or {}).get("ingest_entries", 0),
                             (doc.get("tiers") or {}).get("regional_entries", 0),
                             round(rss_mib(agent.pid))))
                print("t=%5ss ingest files %6d (%7.1f MiB, oldest %4ss)  compacted %4d (%8.1f MiB)"
                      "  jobs %d  index entries %d + %d  rss %d MiB" % rows[-1], flush=True)
        stop.set()
        producer.join()
        doc = report(report_path)
        before = doc
        final_read = read_all(bootstrap, topic)
        after = report(report_path)
        final_gets = requests(after, "bucket", "get") + requests(after, "compacted", "get") \
            - requests(before, "bucket", "get") - requests(before, "compacted", "get")
        gib = produced[0] / GIB
        ingest_puts = requests(doc, "bucket", "put")
        regional_puts = requests(doc, "compacted", "put")
        comp_bytes = sum(f.stat().st_size for f in files(compacted_dir))
        print()
        print(f"produced {produced[0] / (1 << 20):.0f} MiB in {args.minutes} min "
              f"({produced[0] / (1 << 20) / (args.minutes * 60):.2f} MiB/s)")
        print(f"PUTs to the ingest+metadata bucket: {ingest_puts} ({ingest_puts / gib:.0f} per GiB produced)")
        print(f"PUTs to the regional bucket: {regional_puts}, {comp_bytes / (1 << 20):.0f} MiB stored "
              f"({regional_puts / max(comp_bytes / GIB, 1e-9):.1f} per GiB stored)")
        print(f"end-to-end PUTs per GiB: {(ingest_puts + regional_puts) / gib:.0f}")
        if early:
            read, gets, jobs = early
            print(f"read from 0 at t={args.early_read:.0f}s ({jobs} jobs done): {read / (1 << 20):.0f} MiB, "
                  f"{gets} GETs ({gets / max(read / GIB, 1e-9):.0f} per GiB)")
        print(f"read from 0 at the end: {final_read / (1 << 20):.0f} MiB, {final_gets} GETs "
              f"({final_gets / max(final_read / GIB, 1e-9):.0f} per GiB)")
        tiers = doc.get("tiers") or {}
        if tiers:
            reg_gib = max(tiers.get("regional_bytes", 0) / GIB, 1e-9)
            ing_gib = max(tiers.get("ingest_bytes", 0) / GIB, 1e-9)
            print(f"index entries: regional {tiers.get('regional_entries')} "
                  f"({tiers.get('regional_entries', 0) / reg_gib:.0f} per GiB), ingest "
                  f"{tiers.get('ingest_entries')} ({tiers.get('ingest_entries', 0) / ing_gib:.0f} per GiB), "
                  f"batches moved by compaction {(doc.get('compaction') or {}).get('batches_moved')}")
        print(json.dumps({"samples": rows, "compaction": doc.get("compaction"), "tiers": tiers}))
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(60)
        except subprocess.TimeoutExpired:
            agent.kill()
        log.close()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
