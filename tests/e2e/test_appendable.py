"""The appendable ingest path (issue 12) with real clients against a real agent.

Three file:// ingest buckets under a zonal latency profile (gcs-rapid: the GCS Rapid double with
its generation fence; s3-express: the S3 Express double with its write-offset fence), quorum 2,
`--ingest-writes append`: every sealed file is an append + flush into an object the WriterPool
created ahead of need. On file:// the double writes every flush through to the file, so appended
data survives kill -9 like a PUT does.

The fault scenarios reuse the reliability checker (test_faults.py): 0 lost, duplicated,
reordered or gapped records from idempotent producers.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from checker import Report
from test_faults import PARTITIONS, WAIT_S, acked, finish, start_producers
from weirtest import Rec, assert_dense, ck_consume, ck_create_topics, ck_produce, unique, wait_until


def zonal(agent, profile: str, extra=()) -> list[str]:
    """Flags for three file:// zonal buckets, quorum 2, appends, and a storage report."""
    root = agent.data_dir.parent / "zonal"
    layout = [arg for i in range(3) for arg in ("--ingest-bucket", f"file://{root}/b{i}")]
    return layout + ["--quorum", "2", "--storage-profile", profile, "--ingest-writes", "append",
                     "--storage-report", str(report_path(agent)), *extra]


def report_path(agent):
    return agent.data_dir.parent / "storage-report.json"


def pool_stats(agent) -> dict:
    return json.loads(report_path(agent).read_text())["pool"]


@pytest.mark.parametrize("profile", ["gcs-rapid", "s3-express"])
def test_appendable_roundtrip_through_the_pool(agent, profile):
    agent.stop()
    agent.start(extra_args=zonal(agent, profile))
    assert "ingest files are appended into pooled objects" in agent.log_text()
    # The metadata log (in bucket 0) appends its slots into pre-warmed objects where a create
    # costs more than an append (RFC 0004); on S3 Express each slot is one create-only PUT.
    prewarmed = "metadata log slots are appended into pre-warmed objects" in agent.log_text()
    assert prewarmed == (profile == "gcs-rapid"), agent.log_text()[-3000:]
    topic = unique("append")
    ck_create_topics(agent.bootstrap, {topic: 3})
    recs = [Rec(topic, i % 3, f"k{i}".encode(), f"value-{i}".encode() * 8) for i in range(600)]
    acks = ck_produce(agent.bootstrap, recs, {"acks": "all", "linger.ms": 2})
    got = ck_consume(agent.bootstrap, topic, range(3))
    assert_dense(got, topic)
    by_offset = {(g.partition, g.offset): g.value for part in got.values() for g in part}
    for ack in acks:
        assert by_offset[(ack.partition, ack.offset)] == ack.rec.value
    wait_until(lambda: report_path(agent).exists() and pool_stats(agent)["hits"] > 0, 10,
               "the storage report to show pool hits")
    stats = pool_stats(agent)
    assert stats["load_errors"] == 0, stats
    # Each file was one pooled object per bucket: the three buckets hold the same file names.
    root = agent.data_dir.parent / "zonal"
    agent.stop()
    names = [{p.name for p in (root / f"b{i}" / "ingest").rglob("*.weir")} for i in range(3)]
    assert names[0] and names[0] & names[1], [len(n) for n in names]
    # The pool deleted its unused objects at shutdown: no empty file is left behind in any bucket.
    for i in range(3):
        empty = [p for p in (root / f"b{i}" / "ingest").rglob("*.weir") if p.stat().st_size == 0]
        assert not empty, f"bucket {i}: {len(empty)} empty pooled objects left"


@pytest.mark.parametrize("profile,pooled", [("gcs-rapid", True), ("s3-express", False)])
def test_auto_ingest_writes_pool_only_where_creates_cost_more(agent, profile, pooled):
    """`storage.ingest_writes = "auto"`: GCS Rapid (create ~75 ms, append ~2 ms) appends into
    pooled objects and pre-warms log slots; S3 Express (a create is a PutObject like an append)
    writes one PUT per file and create-only log slots, so each file and slot is one request per
    bucket instead of two. Counted from the agent's own request counters against the objects in
    a data-only bucket."""
    flags = [arg for arg in zonal(agent, profile) if arg not in ("--ingest-writes", "append")]
    agent.stop()
    agent.start(extra_args=flags)
    log = agent.log_text()
    assert ("ingest files are appended into pooled objects" in log) == pooled, log[-3000:]
    assert ("metadata log slots are appended into pre-warmed objects" in log) == pooled
    topic = unique("autowrites")
    ck_create_topics(agent.bootstrap, {topic: 2})
    recs = [Rec(topic, i % 2, None, f"v{i}".encode() * 20) for i in range(300)]
    ck_produce(agent.bootstrap, recs, {"acks": "all", "linger.ms": 2})
    assert_dense(ck_consume(agent.bootstrap, topic, range(2)), topic)
    root = agent.data_dir.parent / "zonal"
    agent.stop()
    # The pool deletes its unused objects at shutdown, and unused pre-warmed slots stay empty:
    # without either, no bucket holds an empty data file or log slot.
    empty = [p for p in root.rglob("*") if p.is_file() and p.stat().st_size == 0
             and (p.suffix == ".weir" or "log" in p.parent.parts)]
    if pooled:
        assert any("log" in p.parent.parts for p in empty), "no pre-warmed slot objects were made"
    else:
        assert not empty, empty[:5]
    # Bucket 1 holds data files only (and the bucket id; the startup probe is deleted). One
    # successful PUT per object ever written there means one request per file; pooling costs a
    # create and an append per file.
    report = json.loads(report_path(agent).read_text())
    assert ("pool" in report) == pooled, sorted(report)
    bucket = next(b for b in report["buckets"] if b["name"].endswith("/zonal/b1"))
    puts = bucket["requests"]["put"]["ok"]
    written = sum(1 for p in (root / "b1").rglob("*") if p.is_file())
    written += bucket["requests"]["delete"]["ok"]
    if pooled:
        assert report["pool"]["created"] > 0 and puts > written, (puts, written)
    else:
        assert puts == written, (puts, written)


@pytest.mark.parametrize("seed", [11])
def test_appendable_kill9_during_appends(agent, seed):
    """kill -9 three times under load while files are appended into pooled objects and log
    slots into pre-warmed ones: each restart takes over the dead process's empty pre-warmed
    slots (RFC 0004 hole filling) before it writes."""
    rng = random.Random(seed)
    flags = zonal(agent, "gcs-rapid")
    agent.stop()
    agent.start(extra_args=flags)
    topic = unique("appendkill")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    producers = start_producers(agent, topic)
    report = Report("appendable-kill9-gcs-rapid", seed)
    for _ in range(3):
        target = acked(producers) + rng.randint(100, 800)
        wait_until(lambda: acked(producers) >= target, WAIT_S, "acks before a kill")
        time.sleep(rng.uniform(0, 0.2))
        agent.kill9()
        report.crashes += 1
        time.sleep(rng.uniform(0.05, 0.3))
        agent.start(extra_args=flags)
    after = acked(producers) + 300
    wait_until(lambda: acked(producers) >= after, WAIT_S, "acks after the last restart")
    finish(agent, topic, producers, report)


def test_appendable_one_of_three_buckets_down(agent):
    """Bucket 2 is down for the whole run: pooled items are made in buckets 0 and 1 only, and
    every file commits with the 2-of-3 quorum."""
    flags = zonal(agent, "s3-express", ("--down-bucket", "2"))
    agent.stop()
    agent.start(extra_args=flags)
    topic = unique("appenddown")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    producers = start_producers(agent, topic)
    report = Report("appendable-one-bucket-down-s3-express", 2)
    wait_until(lambda: acked(producers) >= 1500, WAIT_S, "acks with bucket 2 down")
    finish(agent, topic, producers, report)
    root = agent.data_dir.parent / "zonal"
    assert not list((root / "b2").rglob("*.weir")), "a file reached the bucket that is down"
