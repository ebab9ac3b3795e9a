"""Compaction (RFC 0005) with real clients against a real agent.

Three file:// ingest buckets, quorum 2; compacted files go to `compacted/` beside them. Short
ages and a short grace make the planner, the worker, the swap and the deleter run within the
test. Waits poll with a deadline; nothing asserts how long anything took."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from test_buckets import bucket_layout
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_consumer,
                      ck_create_topics, ck_produce, ck_producer, kp_consume, now_ms, unique,
                      wait_until)

WAIT_S = 90.0
PARTITIONS = 3


def fast_compaction(monkeypatch) -> None:
    for key, value in {
        "WEIR_COMPACTION_MIN_INPUT_AGE": "0s",
        "WEIR_COMPACTION_MAX_INPUT_AGE": "1s",
        "WEIR_COMPACTION_PLAN_INTERVAL": "500ms",
        "WEIR_GC_GRACE": "3s",
        "WEIR_GC_FETCH_PLAN_TTL": "1s",
        "WEIR_GC_INTERVAL": "500ms",
    }.items():
        monkeypatch.setenv(key, value)


def report(agent) -> dict:
    path = agent.data_dir.parent / "storage-report.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ingest_files(dirs: list[Path]) -> int:
    return sum(1 for d in dirs for _ in (d / "ingest").rglob("*.weir"))


def compacted_files(root: Path) -> list[Path]:
    return sorted((root / "compacted" / "compacted").glob("*.weir"))


def produce_rounds(bootstrap: str, topic: str, rounds: int, per_round: int, tag: str):
    """`rounds` flushes of `per_round` records each (so several files), with keys, headers and
    timestamps to compare after compaction."""
    producer = ck_producer(bootstrap, {"linger.ms": 0, "acks": "all"})
    # Recent timestamps: the default retention (7 days) keeps them.
    base_ms = now_ms() - 60_000
    acked = []
    for r in range(rounds):
        recs = [Rec(topic, i % PARTITIONS, f"{tag}-k{r}-{i}".encode(),
                    f"{tag}-v{r}-{i}-".encode() * 10, (("h", f"{r}-{i}".encode()),),
                    base_ms + r * 1000 + i)
                for i in range(per_round)]
        acked += ck_produce(bootstrap, recs, producer=producer)
    return acked


def check_all(bootstrap: str, topic: str, acked) -> None:
    got = ck_consume(bootstrap, topic, range(PARTITIONS), start=OFFSET_BEGINNING)
    assert_dense(got, topic)
    assert_acked_present(acked, got)
    assert sum(len(v) for v in got.values()) == len(acked)


def offsets_for_times(bootstrap: str, topic: str, acked) -> list[tuple[int, int]]:
    """librdkafka's offsets_for_times for every fifth acked record's timestamp: (expected,
    answered). Timestamps rise within a partition, so the answer is the record's own offset."""
    c = ck_consumer(bootstrap)
    try:
        out = []
        for a in acked[::5]:
            (r,) = c.offsets_for_times([TopicPartition(topic, a.partition, a.rec.timestamp)],
                                       timeout=30)
            assert r.error is None, r.error
            out.append((a.offset, r.offset))
        return out
    finally:
        c.close()


def sweeping_agent(agent_factory, monkeypatch):
    """A started agent with fast compaction and an orphan sweep that runs within the test:
    (agent, bucket root, ingest dirs, start args)."""
    fast_compaction(monkeypatch)
    monkeypatch.setenv("WEIR_GC_SWEEP_INTERVAL", "1s")
    monkeypatch.setenv("WEIR_GC_ORPHAN_AGE", "10s")
    agent = agent_factory(start=False)
    root = agent.data_dir.parent / "buckets"
    dirs, layout = bucket_layout(root)
    report_path = agent.data_dir.parent / "storage-report.json"
    args = layout + ["--storage-report", str(report_path)]
    agent.start(extra_args=args)
    return agent, root, dirs, args


def only_named_compacted_files(agent, root: Path) -> bool:
    """Nothing released waits for the deleter and every compacted file is one the log names."""
    tiers = report(agent).get("tiers", {})
    return tiers.get("released_files") == 0 and \
        len(compacted_files(root)) == tiers.get("regional_files")


def test_compaction_moves_ingest_files_and_reads_back_identical(agent_factory, monkeypatch):
    fast_compaction(monkeypatch)
    agent = agent_factory(start=False)
    root = agent.data_dir.parent / "buckets"
    dirs, layout = bucket_layout(root)
    report_path = agent.data_dir.parent / "storage-report.json"
    agent.start(extra_args=layout + ["--storage-report", str(report_path)])
    assert "compaction on" in agent.log_text()
    topic = unique("compact")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    acked = produce_rounds(agent.bootstrap, topic, rounds=12, per_round=30, tag="a")
    assert ingest_files(dirs) >= 12 * 2, "every round is a file in at least the quorum"

    # The planner and the worker move everything; the deleter then removes the inputs.
    wait_until(lambda: report(agent).get("compaction", {}).get("jobs_done", 0) >= 1, WAIT_S,
               "a compaction job to finish")
    wait_until(lambda: ingest_files(dirs) == 0, WAIT_S,
               "the compacted ingest files to leave every bucket")
    assert compacted_files(root), "the compacted files are in the regional bucket"
    # The report's tier view agrees: nothing live in the ingest tier, data in the regional one.
    wait_until(lambda: report(agent).get("tiers", {}).get("ingest_files") == 0, WAIT_S,
               "the report to show an empty ingest tier")
    tiers = report(agent)["tiers"]
    assert tiers["regional_files"] >= 1 and tiers["regional_bytes"] > 0, tiers
    assert tiers["lag_ms"] == 0, tiers
    # ListOffsets by timestamp walks the batches of a compacted run to the exact record.
    answers = offsets_for_times(agent.bootstrap, topic, acked)
    assert all(want == got for want, got in answers), answers
    stats = report(agent)["compaction"]
    assert stats["input_files"] >= 12 and stats["batches_moved"] >= 12 * PARTITIONS, stats
    # Consecutive batches of a partition became one index entry (RFC 0005 §3).
    assert 0 < tiers["regional_entries"] < stats["batches_moved"], (tiers, stats)
    check_all(agent.bootstrap, topic, acked)
    # kafka-python reads the same records.
    got = kp_consume(agent.bootstrap, topic, range(PARTITIONS))
    assert sorted((g.partition, g.offset, g.value) for p in got.values() for g in p) == \
        sorted((a.partition, a.offset, a.rec.value) for a in acked)

    # Across a clean restart and a kill -9, the same bytes from offset 0, and produce goes on
    # into new ingest files that are compacted in turn.
    agent.restart(extra_args=layout + ["--storage-report", str(report_path)])
    check_all(agent.bootstrap, topic, acked)
    acked += produce_rounds(agent.bootstrap, topic, rounds=4, per_round=30, tag="b")
    agent.restart(kill=True, extra_args=layout + ["--storage-report", str(report_path)])
    check_all(agent.bootstrap, topic, acked)
    wait_until(lambda: ingest_files(dirs) == 0, WAIT_S,
               "the second round's ingest files to be compacted and deleted")
    check_all(agent.bootstrap, topic, acked)


def test_compaction_off_keeps_ingest_files(agent_factory, monkeypatch):
    fast_compaction(monkeypatch)
    agent = agent_factory(start=False)
    root = agent.data_dir.parent / "buckets"
    dirs, layout = bucket_layout(root)
    agent.start(extra_args=layout + ["--no-compaction"])
    # Logged just after the listener is up, so it may trail the start by a moment.
    wait_until(lambda: "compaction is off" in agent.log_text(), 30, "the agent says compaction is off")
    topic = unique("nocompact")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    acked = produce_rounds(agent.bootstrap, topic, rounds=3, per_round=9, tag="c")
    before = ingest_files(dirs)
    # Several planning intervals and grace periods pass without anything moving.
    time.sleep(4)
    check_all(agent.bootstrap, topic, acked)
    assert ingest_files(dirs) == before and not compacted_files(root)


def test_compacted_bucket_cannot_change(agent_factory, monkeypatch):
    """The first start with compaction records its bucket; a start with another one refuses."""
    fast_compaction(monkeypatch)
    agent = agent_factory(start=False)
    root = agent.data_dir.parent / "buckets"
    _, layout = bucket_layout(root)
    agent.start(extra_args=layout)
    agent.stop()
    other = f"file://{agent.data_dir.parent / 'elsewhere'}"
    # The command still carries the bucket layout of the last start.
    proc = subprocess.run(agent.command() + ["--compacted-bucket", other],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "compacted files were written to the bucket" in proc.stderr + proc.stdout, \
        (proc.stderr + proc.stdout)[-2000:]


def test_compaction_survives_kill9_mid_job(agent_factory, monkeypatch):
    """kill -9 while jobs run (many inputs, short ages), three times: every acknowledged record
    still reads back identical, every ingest file is compacted and deleted in the end, and the
    orphan sweep leaves no compacted file the log does not name."""
    agent, root, dirs, args = sweeping_agent(agent_factory, monkeypatch)
    topic = unique("kill")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    acked = []
    for round_ in range(3):
        acked += produce_rounds(agent.bootstrap, topic, rounds=20, per_round=15, tag=f"r{round_}")
        # Kill as soon as a job has started reading or writing (or right away if none yet).
        wait_until(lambda: report(agent).get("compaction", {}).get("input_files", 0) > 0
                   or ingest_files(dirs) > 0, WAIT_S, "work for compaction")
        agent.restart(kill=True, extra_args=args)
        check_all(agent.bootstrap, topic, acked)
    wait_until(lambda: ingest_files(dirs) == 0, WAIT_S,
               "every ingest file compacted and deleted after the kills")

    # Outputs of killed jobs that never committed are orphans: the sweep removes them once
    # they are older than gc.orphan_age. (The kills land wherever the jobs are; the simulator
    # covers each point of a job systematically.)
    wait_until(lambda: only_named_compacted_files(agent, root), WAIT_S,
               "no compacted file the log does not name")
    check_all(agent.bootstrap, topic, acked)


def test_compaction_waits_out_a_compacted_bucket_outage(agent_factory, monkeypatch):
    """The compacted bucket goes away for a while (its directory replaced by a plain file, so
    every write to it fails): jobs fail and are retried, produce and reads of what is still in
    the ingest tier go on, nothing is deleted from the ingest tier; when it is back the backlog
    is compacted and everything reads back identical, with no compacted file the log does not
    name."""
    agent, root, dirs, _ = sweeping_agent(agent_factory, monkeypatch)
    topic = unique("outage")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    first = produce_rounds(agent.bootstrap, topic, rounds=4, per_round=15, tag="a")
    wait_until(lambda: ingest_files(dirs) == 0, WAIT_S, "the first rounds compacted")

    bucket = root / "compacted"
    away = root / "compacted.away"
    bucket.rename(away)
    bucket.write_text("the compacted bucket is down\n")
    try:
        retried = report(agent).get("compaction", {}).get("jobs_retried", 0)
        second = produce_rounds(agent.bootstrap, topic, rounds=4, per_round=15, tag="b")
        wait_until(lambda: report(agent).get("compaction", {}).get("jobs_retried", 0) > retried,
                   WAIT_S, "a compaction job to fail on the missing bucket")
        assert ingest_files(dirs) >= 4, "the second rounds stay in the ingest tier"
        # What the ingest tier holds still reads (librdkafka), from the first new offset on.
        for p in range(PARTITIONS):
            mine = sorted(a.offset for a in second if a.partition == p)
            got = ck_consume(agent.bootstrap, topic, [p], start=mine[0])[p]
            assert [g.offset for g in got] == mine
    finally:
        bucket.unlink()
        away.rename(bucket)
    wait_until(lambda: ingest_files(dirs) == 0, WAIT_S, "the backlog compacted after the outage")
    check_all(agent.bootstrap, topic, first + second)
    wait_until(lambda: only_named_compacted_files(agent, root), WAIT_S,
               "no compacted file the log does not name")
