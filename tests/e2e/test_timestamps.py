"""Timestamps at record precision (issue 9 §2).

- ListOffsets by timestamp answers the earliest record whose timestamp reaches the target,
  inside a batch too (and inside a compressed batch): confluent-kafka, kafka-python and kcat.
- LogAppendTime topics: the agent stamps the append time; the producer's delivery report and
  every consumer see LogAppendTime.
- message.timestamp.before/after.max.ms (KIP-937) and difference.max.ms: INVALID_TIMESTAMP.
"""

from __future__ import annotations

import pytest
from confluent_kafka import (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaError,
                             TopicPartition)
from confluent_kafka.admin import ConfigResource

import kafka_raw as raw
from weirtest import (ck_admin, ck_consumer, ck_create_topics, ck_producer, kcat_run,
                      kp_consumer, kp_producer, now_ms, unique)

N = 10
STEP = 1000
HOUR = 3_600_000


def produce_one_batch(bootstrap, topic, timestamps, compression="none"):
    """All records in one batch (long linger, one flush); checked via raw Fetch."""
    p = ck_producer(bootstrap, {"linger.ms": 10_000, "batch.num.messages": len(timestamps),
                                "compression.type": compression})
    errors = []
    for i, ts in enumerate(timestamps):
        p.produce(topic, key=f"k{i}".encode(), value=b"value " * 50, partition=0,
                  timestamp=ts, on_delivery=lambda e, m: errors.append(e))
    assert p.flush(60) == 0
    assert errors == [None] * len(timestamps), errors
    with raw.connect(bootstrap) as s:
        err, hw, records = raw.fetch_v4(s, topic, 0, 0)
    batches = list(raw.iter_batch_headers(records))
    assert err == 0 and hw == len(timestamps), (err, hw)
    assert [(b, c) for b, c, _ in batches] == [(0, len(timestamps))], batches
    return batches[0][2] & 0x07


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_offsets_for_times_inside_a_batch(agent, kcat, compression):
    t = unique(f"ts-{compression}")
    ck_create_topics(agent.bootstrap, {t: 1})
    base = now_ms() - 600_000
    tss = [base + i * STEP for i in range(N)]
    codec = produce_one_batch(agent.bootstrap, t, tss, compression)
    assert codec == {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[compression]

    c = ck_consumer(agent.bootstrap)
    try:
        cases = [(base - 1, 0), (base + 3500, 4), (base + 4000, 4), (base + 8001, 9),
                 (base + 9000, 9), (base + 9001, -1)]
        for target, expected in cases:
            (r,) = c.offsets_for_times([TopicPartition(t, 0, target)], timeout=30)
            assert r.error is None, r.error
            assert r.offset == expected, (target - base, r.offset, expected)
    finally:
        c.close()

    from kafka import TopicPartition as KTP
    kc = kp_consumer(agent.bootstrap)
    try:
        tp = KTP(t, 0)
        r = kc.offsets_for_times({tp: base + 3500}, timeout_ms=30000)[tp]
        assert r is not None and (r.offset, r.timestamp) == (4, base + 4000), r
        r = kc.offsets_for_times({tp: base + 6999}, timeout_ms=30000)[tp]
        assert r is not None and (r.offset, r.timestamp) == (7, base + 7000), r
    finally:
        kc.close()

    out = kcat_run(kcat, ["-C", "-b", agent.bootstrap, "-t", t, "-p", "0",
                          "-o", f"s@{base + 3500}", "-c", "1", "-e", "-q", "-f", "%o %T\\n"])
    assert out.stdout.decode().split() == ["4", str(base + 4000)], out.stdout


def test_max_timestamp_inside_a_batch(agent):
    t = unique("ts-max")
    ck_create_topics(agent.bootstrap, {t: 1})
    base = now_ms() - 600_000
    tss = [base, base + 5000, base + 9000, base + 2000, base + 9000, base + 1000]
    produce_one_batch(agent.bootstrap, t, tss, "gzip")
    from confluent_kafka.admin import OffsetSpec
    tp = TopicPartition(t, 0)
    admin = ck_admin(agent.bootstrap)
    r = admin.list_offsets({tp: OffsetSpec.max_timestamp()}, request_timeout=30)[tp].result(35)
    assert (r.offset, r.timestamp) == (2, base + 9000), r


def test_log_append_time_topic(agent):
    t = unique("ts-append")
    ck_create_topics(agent.bootstrap, {t: (1, {"message.timestamp.type": "LogAppendTime"})})
    old = now_ms() - 10 * HOUR
    before = now_ms()
    p = ck_producer(agent.bootstrap, {"linger.ms": 0})
    reports = []
    p.produce(t, key=b"k", value=b"v", partition=0, timestamp=old,
              on_delivery=lambda e, m: reports.append((e, m.timestamp())))
    assert p.flush(30) == 0
    (err, (ts_type, appended)), = reports
    assert err is None, err
    after = now_ms()
    # The delivery report carries the broker's log_append_time, not the producer's time.
    assert ts_type == TIMESTAMP_LOG_APPEND_TIME, (ts_type, appended)
    assert before - 1000 <= appended <= after + 1000, (before, appended, after)

    kp = kp_producer(agent.bootstrap)
    meta = kp.send(t, key=b"k2", value=b"v2", partition=0, timestamp_ms=old).get(timeout=30)
    kp.close()
    assert meta.timestamp >= appended and meta.timestamp != old, meta

    c = ck_consumer(agent.bootstrap)
    try:
        c.assign([TopicPartition(t, 0, 0)])
        got = []
        for _ in range(300):
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got.append(m.timestamp())
            if len(got) == 2:
                break
        assert got == [(TIMESTAMP_LOG_APPEND_TIME, appended),
                       (TIMESTAMP_LOG_APPEND_TIME, meta.timestamp)], got
    finally:
        c.close()
    kc = kp_consumer(agent.bootstrap, {"consumer_timeout_ms": 10_000})
    from kafka import TopicPartition as KTP
    kc.assign([KTP(t, 0)])
    records = [r for _, (r, _) in zip(range(2), ((r, 0) for r in kc))]
    kc.close()
    assert [(r.timestamp_type, r.timestamp) for r in records] == [
        (1, appended), (1, meta.timestamp)], records


@pytest.mark.parametrize("configs,offset", [
    ({"message.timestamp.before.max.ms": HOUR, "message.timestamp.after.max.ms": HOUR}, 0),
    ({"message.timestamp.difference.max.ms": HOUR}, 0),
])
def test_timestamp_bounds_invalid_timestamp(agent, configs, offset):
    t = unique("ts-bounds")
    ck_create_topics(agent.bootstrap, {t: (1, configs)})
    admin = ck_admin(agent.bootstrap)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t)])
    (entries,) = [f.result(30) for f in described.values()]
    for key, value in configs.items():
        assert entries[key].value == str(value), entries[key]

    p = ck_producer(agent.bootstrap, {"linger.ms": 0})
    reports = []
    now = now_ms()
    for ts in (now - 2 * HOUR, now + 2 * HOUR, now):
        p.produce(t, key=b"k", value=b"v", partition=0, timestamp=ts,
                  on_delivery=lambda e, m: reports.append((e, m.offset())))
        assert p.flush(30) == 0
    codes = [e.code() if e else None for e, _ in reports]
    assert codes == [KafkaError.INVALID_TIMESTAMP, KafkaError.INVALID_TIMESTAMP, None], reports
    assert reports[2][1] == offset
