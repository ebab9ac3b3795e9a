#!/usr/bin/env python3
"""Soak benchmark for bounded state (RFC 0003, issue 11). Not a test: it prints a table.

Runs one `weir agent` on local files for --minutes with short retention on every topic, a
steady produce rate, a new idempotent producer every second (producer churn) and a new
consumer group every few seconds that reads, commits and leaves (group churn). Every
--sample-seconds it records the agent's RSS, the state held by the newest snapshot (index
entries, files live and released, producer ids, groups), the snapshot size, data objects per
ingest bucket and metadata-log slots. All of them should level off.

  tests/soak/soak.py --minutes 30 --weir /var/tmp/weir-target/release/weir

Agent settings come from WEIR_* variables set below (shortened expiry and GC periods so that
30 minutes cover many of them); the table goes to stdout as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TOPICS = 3
PARTITIONS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    """The process's resident set (VmRSS), MiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


ENVELOPE_HEADER = 27  # magic, version, kind, epoch, seq, payload length
ENVELOPE_TRAILER = 4  # CRC32C


def envelope_payload(raw: bytes) -> bytes:
    return raw[ENVELOPE_HEADER:-ENVELOPE_TRAILER]


def newest_snapshot(meta: Path):
    """The newest readable snapshot: (path, bytes on disk, state JSON, index entries or None).

    A binary snapshot (RFC 0003 §8) is a manifest naming chunks; its `small` section is the state
    JSON without indexes, and the index sections say how many batches they hold. A legacy
    snapshot is one envelope of `{state, fence}` JSON.
    """
    snaps = sorted((meta / "snapshot").glob("*")) if (meta / "snapshot").exists() else []
    for path in reversed(snaps):
        raw = path.read_bytes()
        try:
            doc = json.loads(envelope_payload(raw))
            if "sections" not in doc:
                return path, len(raw), doc.get("state", {}), None
            chunk_dir = meta / "snapshot-chunk" / path.name
            chunks = [(chunk_dir / f"{n:06}").read_bytes() for n in range(len(doc["chunks"]))]
            body = b"".join(envelope_payload(c) for c in chunks)
            small = next(s for s in doc["sections"] if s["kind"] == "small")
            state = json.loads(body[small["offset"]:small["offset"] + small["len"]])["state"]
            entries = sum(s["entries"] for s in doc["sections"] if s["kind"] == "index")
            return path, len(raw) + sum(len(c) for c in chunks), state, entries
        except (ValueError, IndexError, KeyError, OSError, StopIteration):
            continue
    return None, 0, {}, None


def state_counts(state: dict, index_entries) -> dict:
    if index_entries is None:
        index_entries = sum(len(p.get("index", [])) for t in state.get("topics", {}).values()
                            for p in t.get("partitions", []))
    return {
        "index": index_entries,
        "files": len(state.get("files", {})),
        "released": len(state.get("released", {})),
        "producers": len(state.get("producer_epochs", {})),
        "groups": len(state.get("group_offsets", {})),
        "tips": len(state.get("agent_tips", {})),
    }


class Churn:
    def __init__(self, bootstrap: str, topics: list[str], rate: int):
        self.bootstrap, self.topics, self.rate = bootstrap, topics, rate
        self.stop = threading.Event()
        self.produced = 0
        self.errors = 0
        self.groups = 0

    def steady(self):
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "acks": "all"})
        payload = b"x" * 200
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            topic = random.choice(self.topics)
            p.produce(topic, payload, on_delivery=self._delivered)
            p.poll(0)
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        p.flush(30)

    def _delivered(self, err, _msg):
        if err is None:
            self.produced += 1
        else:
            self.errors += 1

    def producers(self):
        """A new idempotent producer every second: sends a few records and goes away."""
        while not self.stop.wait(1.0):
            p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                          "linger.ms": 1})
            for _ in range(3):
                p.produce(random.choice(self.topics), b"churn", on_delivery=self._delivered)
            p.flush(30)

    def groups_churn(self):
        """A new consumer group every 5 s: reads a little, commits, leaves."""
        while not self.stop.wait(5.0):
            self.groups += 1
            c = Consumer({"bootstrap.servers": self.bootstrap,
                          "group.id": f"soak-group-{self.groups}",
                          "auto.offset.reset": "latest", "enable.auto.commit": False,
                          "session.timeout.ms": 6000})
            c.subscribe([random.choice(self.topics)])
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline and not self.stop.is_set():
                msg = c.poll(0.5)
                if msg is not None and not msg.error():
                    c.commit(message=msg, asynchronous=False)
                    break
            c.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weir", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--sample-seconds", type=float, default=60)
    ap.add_argument("--rate", type=int, default=500, help="steady records per second")
    ap.add_argument("--retention-ms", type=int, default=180_000)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="weir-soak-"))
    port = free_port()
    env = dict(os.environ)
    env.update({
        "RUST_LOG": "info",
        # As `make run` and docs/operations.md: glibc keeps freed memory in per-thread arenas.
        "MALLOC_ARENA_MAX": env.get("MALLOC_ARENA_MAX", "2"),
        "WEIR_RETENTION_CHECK_INTERVAL": "10s",
        "WEIR_GC_GRACE": "1m",
        "WEIR_GC_FETCH_PLAN_TTL": "20s",
        "WEIR_GC_INTERVAL": "10s",
        "WEIR_GC_SWEEP_INTERVAL": "2m",
        "WEIR_GC_ORPHAN_AGE": "5m",
        "WEIR_PRODUCE_PRODUCER_ID_EXPIRATION": "5m",
        "WEIR_GROUPS_OFFSETS_RETENTION": "5m",
        "WEIR_GROUPS_EXPIRY_STARTUP_DELAY": "30s",
        "WEIR_PRODUCE_INIT_PRODUCER_ID_RATE": "100.0",
        "WEIR_PRODUCE_INIT_PRODUCER_ID_BURST": "1000",
    })
    log = open(work / "agent.log", "w")
    agent = subprocess.Popen([args.weir, "agent", "--listen", f"127.0.0.1:{port}", "--http-listen", "127.0.0.1:0",
                              "--data-dir", str(work / "data")],
                             stdout=log, stderr=subprocess.STDOUT, env=env)
    bootstrap = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            print(f"agent exited: see {work / 'agent.log'}", file=sys.stderr)
            return 1
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [f"soak-{i}" for i in range(TOPICS)]
    for f in admin.create_topics([NewTopic(t, PARTITIONS, config={
            "retention.ms": str(args.retention_ms)}) for t in topics]).values():
        f.result()
    churn = Churn(bootstrap, topics, args.rate)
    threads = [threading.Thread(target=fn, daemon=True)
               for fn in (churn.steady, churn.producers, churn.groups_churn)]
    for t in threads:
        t.start()
    bucket = work / "data" / "bucket"
    print(f"soak: {args.minutes} min, {args.rate} rec/s steady + 1 idempotent producer/s + "
          f"1 group/5 s, retention.ms={args.retention_ms}, data in {work}", file=sys.stderr)
    print("| t (min) | RSS MiB | index entries | files live | released | producer ids | groups "
          "| snapshot KiB | data objects | log slots | produced | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    start = time.monotonic()
    try:
        while time.monotonic() - start < args.minutes * 60:
            time.sleep(args.sample_seconds)
            if agent.poll() is not None:
                print("agent exited", file=sys.stderr)
                return 1
            _, snap_bytes, state, index_entries = newest_snapshot(bucket / "meta")
            c = state_counts(state, index_entries)
            objects = sum(1 for _ in (bucket / "ingest").rglob("*.weir"))
            slots = sum(1 for _ in (bucket / "meta" / "log").glob("*"))
            minutes = (time.monotonic() - start) / 60
            print(f"| {minutes:.1f} | {rss_mib(agent.pid):.0f} | {c['index']} | {c['files']} "
                  f"| {c['released']} | {c['producers']} | {c['groups']} "
                  f"| {snap_bytes / 1024:.0f} | {objects} | {slots} | {churn.produced} "
                  f"| {churn.errors} |", flush=True)
    finally:
        churn.stop.set()
        for t in threads:
            t.join(timeout=30)
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
