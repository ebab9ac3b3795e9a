"""Round trips over 3 topics x 8 partitions with each producer client, each
read back by every consumer client (confluent-kafka, kafka-python, kcat).

Records carry keys, null keys, null values (tombstones), headers (incl. a
repeated header name and an empty header value) and explicit create-time
timestamps. Every record read back must equal what was produced, at the
offset the producer was told, and offsets must be dense from 0.
"""

from __future__ import annotations

import time

import pytest

from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, ck_watermarks, kcat_consume, kcat_metadata, kcat_produce, kp_consume,
                      kp_produce, now_ms, unique, wait_topic)

N_TOPICS = 3
N_PARTITIONS = 8
PER_PARTITION = 12


def make_records(topics, *, headers: bool, timestamps: bool, none_header_values: bool,
                 null_key_and_value: bool = True) -> list:
    base_ts = now_ms() - 3_600_000  # an hour ago: well inside any timestamp window
    recs = []
    for ti, t in enumerate(topics):
        for p in range(N_PARTITIONS):
            for i in range(PER_PARTITION):
                key = None if i % 4 == 0 else f"key-{ti}-{p}-{i}".encode()
                value = None if i % 5 == 3 else (f"val-{ti}-{p}-{i}-".encode() + b"x" * (i * 13))
                if key is None and value is None and not null_key_and_value:
                    value = b""  # kafka-python refuses a record with neither key nor value
                hdrs = ()
                if headers and i % 3 != 0:
                    hdrs = (("h-index", str(i).encode()), ("dup", b"first"), ("dup", b"second"),
                            ("empty", b""))
                    if none_header_values and i % 3 == 2:
                        hdrs += (("null-value", None),)
                ts = base_ts + ti * 100_000 + p * 1000 + i if timestamps else None
                recs.append(Rec(t, p, key, value, hdrs, ts))
    return recs


def by_topic(acked):
    out = {}
    for a in acked:
        out.setdefault(a.rec.topic, []).append(a)
    return out


def check_producer_offsets(acked) -> None:
    """Within each partition the producer was acked offsets 0..n-1 in send order."""
    per = {}
    for a in acked:
        per.setdefault((a.rec.topic, a.partition), []).append(a.offset)
    for (t, p), offs in per.items():
        assert offs == list(range(PER_PARTITION)), f"{t}[{p}] acked offsets {offs}"


def verify_with_all_consumers(bootstrap: str, kcat: str, acked, *, kcat_headers=True) -> None:
    assert acked, "nothing was produced"
    for a in acked:
        assert a.partition == a.rec.partition, f"record went to {a.partition}, asked {a.rec.partition}"
    parts = range(N_PARTITIONS)
    for topic, t_acked in by_topic(acked).items():
        # confluent-kafka
        got = ck_consume(bootstrap, topic, parts)
        assert_dense(got, topic)
        assert sum(len(v) for v in got.values()) == len(t_acked)
        assert_acked_present(t_acked, got)
        # kafka-python
        got = kp_consume(bootstrap, topic, parts)
        assert_dense(got, topic)
        assert sum(len(v) for v in got.values()) == len(t_acked)
        assert_acked_present(t_acked, got)
        # kcat (Debian: librdkafka 2.0.2)
        got = {p: kcat_consume(kcat, bootstrap, topic, p) for p in parts}
        assert_dense(got, topic)
        assert sum(len(v) for v in got.values()) == len(t_acked)
        assert_acked_present(t_acked, got, check_headers=kcat_headers)


def test_roundtrip_confluent_kafka(agent, kcat):
    topics = [unique("rt-ck") for _ in range(N_TOPICS)]
    ck_create_topics(agent.bootstrap, {t: N_PARTITIONS for t in topics})
    recs = make_records(topics, headers=True, timestamps=True, none_header_values=True)
    acked = ck_produce(agent.bootstrap, recs)
    check_producer_offsets(acked)
    verify_with_all_consumers(agent.bootstrap, kcat, acked)


def test_roundtrip_kafka_python(agent, kcat):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topics = [unique("rt-kp") for _ in range(N_TOPICS)]
    admin = KafkaAdminClient(bootstrap_servers=agent.bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(t, N_PARTITIONS, 1) for t in topics], timeout_ms=30000)
    finally:
        admin.close()
    for t in topics:
        wait_topic(agent.bootstrap, t, N_PARTITIONS)
    recs = make_records(topics, headers=True, timestamps=True, none_header_values=False,
                        null_key_and_value=False)
    acked = kp_produce(agent.bootstrap, recs)
    check_producer_offsets(acked)
    verify_with_all_consumers(agent.bootstrap, kcat, acked)


def test_roundtrip_kcat_auto_created_topics(agent_factory, kcat):
    """kcat creates the topics through Metadata auto-create (num.partitions=8),
    produces with a key delimiter and -Z (empty key/value = NULL) plus a header."""
    agent = agent_factory(["--auto-create-topics", "true", "--num-partitions", str(N_PARTITIONS)])
    topics = [unique("rt-kcat") for _ in range(N_TOPICS)]
    for t in topics:
        md = kcat_metadata(kcat, agent.bootstrap, t, auto_create=True)
        assert any(b["id"] == 1 for b in md["brokers"]), md
        wait_topic(agent.bootstrap, t, N_PARTITIONS)

    hdr = (("src", b"kcat"),)
    expected = {}
    for ti, t in enumerate(topics):
        for p in range(N_PARTITIONS):
            kvs = []
            for i in range(PER_PARTITION):
                key = None if i % 4 == 0 else f"key-{ti}-{p}-{i}".encode()
                value = None if i % 5 == 3 else f"val-{ti}-{p}-{i}-{'x' * i}".encode()
                kvs.append((key, value))
            kcat_produce(kcat, agent.bootstrap, t, p, kvs, headers=hdr)
            expected[(t, p)] = kvs

    for t in topics:
        parts = range(N_PARTITIONS)
        for name, got in (
                ("confluent-kafka", ck_consume(agent.bootstrap, t, parts)),
                ("kafka-python", kp_consume(agent.bootstrap, t, parts)),
                ("kcat", {p: kcat_consume(kcat, agent.bootstrap, t, p) for p in parts})):
            assert_dense(got, t)
            for p in parts:
                want = expected[(t, p)]
                have = [(g.key, g.value) for g in got[p]]
                assert have == want, f"{name}: {t}[{p}] records differ:\n{have}\n!=\n{want}"
                for g in got[p]:
                    assert g.headers == hdr, f"{name}: {t}[{p}]@{g.offset} headers {g.headers}"
                    assert g.timestamp is not None and g.timestamp > 0


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks_levels(agent, acks):
    """acks=0 gets no response from the broker, but the data still lands."""
    t = unique(f"acks{acks}")
    ck_create_topics(agent.bootstrap, {t: 2})
    recs = [Rec(t, i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(200)]
    ck_produce(agent.bootstrap, recs, conf={"acks": acks})
    # acks=0: the producer cannot know when it landed; consume up to 200 records
    # with a bounded wait instead of trusting the watermark taken at once.
    deadline = time.monotonic() + 60
    while True:
        wm = ck_watermarks(agent.bootstrap, t, [0, 1])
        if sum(h for _, h in wm.values()) >= 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    got = ck_consume(agent.bootstrap, t, [0, 1])
    assert_dense(got, t)
    values = sorted(g.value for v in got.values() for g in v)
    assert values == sorted(r.value for r in recs)
