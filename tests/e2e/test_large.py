"""1 MiB+ messages round trip; a message over the topic's max.message.bytes is
refused with MESSAGE_TOO_LARGE (10) and leaves nothing in the log."""

from __future__ import annotations

import os

import pytest
from confluent_kafka import KafkaError

from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, ck_producer, ck_watermarks, kp_consume, kp_produce, kp_producer,
                      unique)

MiB = 1024 * 1024
TOPIC_MAX = 4 * MiB
BIG_CK = {"message.max.bytes": 8 * MiB}
BIG_KP = {"max_request_size": 8 * MiB}
# consumers sized so that one partition fetch holds a whole big batch
BIG_FETCH_CK = {"max.partition.fetch.bytes": 8 * MiB, "fetch.max.bytes": 64 * MiB,
                "receive.message.max.bytes": 100 * MiB}
BIG_FETCH_KP = {"max_partition_fetch_bytes": 8 * MiB, "fetch_max_bytes": 64 * MiB}


def big_records(topic: str) -> list:
    sizes = [MiB + 1, int(1.5 * MiB), 3 * MiB, 100, MiB + 12345]
    return [Rec(topic, 0, f"big-{i}".encode(), os.urandom(n)) for i, n in enumerate(sizes)]


def check(bootstrap, topic, acked, ck_conf=None, kp_conf=None):
    for name, got in (("confluent-kafka", ck_consume(bootstrap, topic, [0], conf=ck_conf)),
                      ("kafka-python", kp_consume(bootstrap, topic, [0], conf=kp_conf))):
        assert_dense(got, topic)
        assert len(got[0]) == len(acked), f"{name}: {len(got[0])} records, want {len(acked)}"
        assert_acked_present(acked, got)


def test_large_messages_confluent(agent):
    t = unique("large-ck")
    ck_create_topics(agent.bootstrap, {t: (1, {"max.message.bytes": TOPIC_MAX})})
    acked = ck_produce(agent.bootstrap, big_records(t), conf=BIG_CK)
    check(agent.bootstrap, t, acked, BIG_FETCH_CK, BIG_FETCH_KP)


def test_large_messages_kafka_python(agent):
    t = unique("large-kp")
    ck_create_topics(agent.bootstrap, {t: (1, {"max.message.bytes": TOPIC_MAX})})
    acked = kp_produce(agent.bootstrap, big_records(t), conf=BIG_KP)
    check(agent.bootstrap, t, acked, BIG_FETCH_CK, BIG_FETCH_KP)


def test_large_messages_default_consumer_fetch_sizes(agent):
    """Consumers with default max.partition.fetch.bytes (1 MiB) still get a
    bigger batch: the first batch of a partition is returned even when it
    exceeds the partition limit (KIP-74), as Kafka does."""
    t = unique("large-default-fetch")
    ck_create_topics(agent.bootstrap, {t: (1, {"max.message.bytes": TOPIC_MAX})})
    acked = ck_produce(agent.bootstrap, big_records(t), conf=BIG_CK)
    check(agent.bootstrap, t, acked)


def _ck_produce_one(bootstrap, topic, value, conf):
    p = ck_producer(bootstrap, conf)
    res = []
    p.produce(topic, value=value, partition=0, on_delivery=lambda e, m: res.append(e))
    assert p.flush(60) == 0, "delivery report not received within 60s"
    assert len(res) == 1
    return res[0]


@pytest.mark.parametrize("topic_max", [None, TOPIC_MAX])
def test_message_too_large_confluent(agent, topic_max):
    """Default topic limit (1048588) and a raised one (4 MiB): a message 64 KiB
    over the limit is refused by the broker (the client allows 8 MiB)."""
    t = unique("toolarge-ck")
    cfg = {} if topic_max is None else {"max.message.bytes": topic_max}
    ck_create_topics(agent.bootstrap, {t: (1, cfg)})
    limit = topic_max or 1048588
    err = _ck_produce_one(agent.bootstrap, t, os.urandom(limit + 64 * 1024),
                          {**BIG_CK, "compression.type": "none"})
    assert err is not None, "oversized message was accepted"
    assert err.code() == KafkaError.MSG_SIZE_TOO_LARGE, f"got {err} (code {err.code()})"
    # nothing landed, and the topic still takes normal messages
    assert ck_watermarks(agent.bootstrap, t, [0])[0] == (0, 0)
    acked = ck_produce(agent.bootstrap, [Rec(t, 0, b"k", b"small")])
    assert acked[0].offset == 0


def test_message_too_large_kafka_python(agent):
    from kafka.errors import MessageSizeTooLargeError
    t = unique("toolarge-kp")
    ck_create_topics(agent.bootstrap, {t: 1})
    p = kp_producer(agent.bootstrap, {**BIG_KP, "enable_idempotence": False, "retries": 0})
    try:
        fut = p.send(t, value=os.urandom(2 * MiB), partition=0)
        p.flush(timeout=60)
        with pytest.raises(MessageSizeTooLargeError):
            fut.get(timeout=60)
    finally:
        p.close(timeout=10)
    assert ck_watermarks(agent.bootstrap, t, [0])[0] == (0, 0)
    got = kp_produce(agent.bootstrap, [Rec(t, 0, None, b"after")])
    assert got[0].offset == 0
    assert_dense(ck_consume(agent.bootstrap, t, [0]), t)
