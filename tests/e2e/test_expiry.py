"""Bounded producer and group state (RFC 0003 §4): idle producer ids expire and their clients
resume with a fresh id; a client looping on InitProducerId is throttled; committed offsets of a
group without members expire, those of a live group do not."""

from __future__ import annotations

from confluent_kafka import TopicPartition
import pytest
from kafka import KafkaProducer
from kafka.errors import UnknownProducerIdError

from weirtest import (Rec, assert_dense, ck_consume, ck_consumer, ck_create_topics, ck_produce,
                      ck_producer, unique, wait_until)

EXPIRY_TIMEOUT_S = 60.0


def fast_expiry(monkeypatch, **extra):
    monkeypatch.setenv("WEIR_RETENTION_CHECK_INTERVAL", "300ms")
    monkeypatch.setenv("WEIR_PRODUCE_PRODUCER_ID_EXPIRATION", "2s")
    for key, value in extra.items():
        monkeypatch.setenv(key, value)


def log_mentions(agent, text: str) -> bool:
    return text in agent.log_path.read_text(errors="replace")


def producer_expirations(agent) -> int:
    return agent.log_path.read_text(errors="replace").count("expired idle producer ids")


def check_once_in_order(bootstrap, topic, values):
    got = ck_consume(bootstrap, topic, [0])
    assert_dense(got, topic)
    assert [g.value for g in got[0]] == values


def test_confluent_idle_idempotent_producer_resumes_after_its_id_expired(agent_factory,
                                                                          monkeypatch):
    fast_expiry(monkeypatch)
    agent = agent_factory()
    t = unique("expire-ck")
    ck_create_topics(agent.bootstrap, {t: 1})
    producer = ck_producer(agent.bootstrap, {"enable.idempotence": True, "linger.ms": 1})
    first = [Rec(t, 0, None, f"a-{i}".encode()) for i in range(20)]
    ck_produce(agent.bootstrap, first, producer=producer)
    wait_until(lambda: producer_expirations(agent) >= 1, EXPIRY_TIMEOUT_S,
               "the idle producer id to expire")
    # The same client resumes: its next batch gets UNKNOWN_PRODUCER_ID, it takes a new id
    # (KIP-360 epoch bump answered with a fresh id) and delivers exactly once.
    second = [Rec(t, 0, None, f"b-{i}".encode()) for i in range(20)]
    ck_produce(agent.bootstrap, second, producer=producer)
    check_once_in_order(agent.bootstrap, t, [r.value for r in first + second])


def test_kafka_python_idle_idempotent_producer_sees_unknown_producer_id_after_expiry(
        agent_factory, monkeypatch):
    """kafka-python has no KIP-360: after its id expired, its next batch (sequence > 0) fails
    with UnknownProducerIdError instead of restarting the sequence (docs/compatibility.md). Weir
    refuses it rather than accept a sequence it cannot check; nothing is duplicated, and a new
    producer works at once."""
    fast_expiry(monkeypatch)
    agent = agent_factory()
    t = unique("expire-kp")
    ck_create_topics(agent.bootstrap, {t: 1})
    values = [f"a-{i}".encode() for i in range(10)]
    producer = KafkaProducer(bootstrap_servers=agent.bootstrap, enable_idempotence=True,
                             acks="all", linger_ms=1)
    try:
        for v in values:
            producer.send(t, value=v, partition=0).get(timeout=60)
        wait_until(lambda: producer_expirations(agent) >= 1, EXPIRY_TIMEOUT_S,
                   "the idle producer id to expire")
        with pytest.raises(UnknownProducerIdError):
            producer.send(t, value=b"refused", partition=0).get(timeout=60)
    finally:
        producer.close(timeout=10)
    fresh = KafkaProducer(bootstrap_servers=agent.bootstrap, enable_idempotence=True,
                          acks="all", linger_ms=1)
    try:
        more = [f"b-{i}".encode() for i in range(10)]
        for v in more:
            fresh.send(t, value=v, partition=0).get(timeout=60)
    finally:
        fresh.close(timeout=10)
    check_once_in_order(agent.bootstrap, t, values + more)


def test_init_producer_id_flood_is_throttled_and_clients_retry(agent_factory, monkeypatch):
    monkeypatch.setenv("WEIR_PRODUCE_INIT_PRODUCER_ID_RATE", "2.0")
    monkeypatch.setenv("WEIR_PRODUCE_INIT_PRODUCER_ID_BURST", "2")
    monkeypatch.setenv("RUST_LOG", "info,weir_server=debug")
    agent = agent_factory()
    t = unique("init-flood")
    ck_create_topics(agent.bootstrap, {t: 1})
    producers = [ck_producer(agent.bootstrap, {"enable.idempotence": True,
                                               "client.id": "flooder"}) for _ in range(6)]
    for i, p in enumerate(producers):
        p.produce(t, value=f"p{i}".encode(), partition=0)
    for p in producers:
        assert p.flush(60) == 0, "a throttled producer did not retry InitProducerId"
    got = ck_consume(agent.bootstrap, t, [0])
    assert sorted(g.value for g in got[0]) == sorted(f"p{i}".encode() for i in range(6))
    assert log_mentions(agent, "InitProducerId throttled"), "the flood was never throttled"


def committed(bootstrap, group, topic):
    c = ck_consumer(bootstrap, {"group.id": group})
    try:
        return c.committed([TopicPartition(topic, 0)], timeout=30)[0].offset
    finally:
        c.close()


def test_offsets_of_an_empty_group_expire_and_a_live_groups_stay(agent_factory, monkeypatch):
    fast_expiry(monkeypatch, WEIR_GROUPS_OFFSETS_RETENTION="2s",
                WEIR_GROUPS_EXPIRY_STARTUP_DELAY="1s")
    agent = agent_factory()
    t = unique("group-expiry")
    ck_create_topics(agent.bootstrap, {t: 1})
    ck_produce(agent.bootstrap, [Rec(t, 0, None, b"x") for _ in range(5)])
    live = ck_consumer(agent.bootstrap, {"group.id": "live", "session.timeout.ms": 6000})
    live.subscribe([t])
    gone = ck_consumer(agent.bootstrap, {"group.id": "gone"})
    gone.subscribe([t])
    for c in (live, gone):
        wait_until(lambda c=c: c.poll(0.2) is not None, 60, "a record")
        c.commit(offsets=[TopicPartition(t, 0, 3)], asynchronous=False)
    gone.close()
    assert committed(agent.bootstrap, "gone", t) == 3
    # The live member keeps polling (and heartbeating) but never commits again.
    def expired():
        live.poll(0.1)
        return committed(agent.bootstrap, "gone", t) < 0
    wait_until(expired, EXPIRY_TIMEOUT_S, "the empty group's offsets to expire")
    assert committed(agent.bootstrap, "live", t) == 3, "a group with members kept its offsets"
    live.close()
