"""Admin APIs and metadata: CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs, DescribeCluster, Metadata (incl. auto-create on/off and
invalid topic names)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic, ResourceType

import kafka_raw as raw
from weirtest import (Rec, assert_dense, ck_admin, ck_consume, ck_create_topics, ck_produce,
                      kcat_metadata, unique, wait_topic)

INVALID_NAMES = ["bad name", "bad/name", "a" * 250, ".", "..", "tab\tname", "ünïcode"]


def create_error(admin, topic: NewTopic):
    futs = admin.create_topics([topic], operation_timeout=30, request_timeout=30)
    try:
        futs[topic.topic].result(timeout=35)
    except KafkaException as e:
        return e.args[0]
    return None


def test_create_list_delete_topics(agent_factory):
    agent = agent_factory(["--auto-create-topics", "false"])
    admin = ck_admin(agent.bootstrap)
    a, b = unique("adm-a"), unique("adm-b")
    futs = admin.create_topics([NewTopic(a, 3, 1), NewTopic(b, 1, 1)],
                               operation_timeout=30, request_timeout=30)
    for f in futs.values():
        f.result(timeout=35)
    wait_topic(agent.bootstrap, a, 3)
    wait_topic(agent.bootstrap, b, 1)

    md = admin.list_topics(timeout=30)
    assert {a, b} <= set(md.topics), sorted(md.topics)
    assert len(md.topics[a].partitions) == 3
    assert all(p.leader == 1 for p in md.topics[a].partitions.values())
    assert set(md.brokers) == {1}
    assert (md.brokers[1].host, md.brokers[1].port) == ("127.0.0.1", agent.port)

    # creating it again: TOPIC_ALREADY_EXISTS
    err = create_error(admin, NewTopic(a, 3, 1))
    assert err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS, err

    # delete one; it disappears from metadata and cannot be produced to
    admin.delete_topics([b], operation_timeout=30, request_timeout=30)[b].result(timeout=35)
    deadline = time.monotonic() + 30
    while b in admin.list_topics(timeout=30).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    md = admin.list_topics(timeout=30)
    assert b not in md.topics and a in md.topics
    md_b = admin.list_topics(topic=b, timeout=30).topics[b]
    assert md_b.error is not None and md_b.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, md_b

    # deleting an unknown topic: UNKNOWN_TOPIC_OR_PARTITION
    ghost = unique("ghost")
    with pytest.raises(KafkaException) as ei:
        admin.delete_topics([ghost], operation_timeout=30, request_timeout=30)[ghost].result(timeout=35)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    # a deleted name can be created again, empty
    admin.create_topics([NewTopic(b, 2, 1)], operation_timeout=30)[b].result(timeout=35)
    wait_topic(agent.bootstrap, b, 2)
    acked = ck_produce(agent.bootstrap, [Rec(b, 1, None, b"again")])
    assert acked[0].offset == 0


def test_kafka_python_admin(agent_factory):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic
    agent = agent_factory(["--auto-create-topics", "false"])
    t = unique("adm-kp")
    admin = KafkaAdminClient(bootstrap_servers=agent.bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([KNewTopic(t, 2, 1)], timeout_ms=30000)
        wait_topic(agent.bootstrap, t, 2)
        assert t in admin.list_topics()
        admin.delete_topics([t], timeout_ms=30000)
        deadline = time.monotonic() + 30
        while t in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert t not in admin.list_topics()
    finally:
        admin.close()


def test_create_partitions(agent):
    t = unique("adm-parts")
    ck_create_topics(agent.bootstrap, {t: 2})
    ck_produce(agent.bootstrap, [Rec(t, p, None, f"p{p}".encode()) for p in range(2)])
    admin = ck_admin(agent.bootstrap)
    admin.create_partitions([NewPartitions(t, 5)], operation_timeout=30,
                            request_timeout=30)[t].result(timeout=35)
    wait_topic(agent.bootstrap, t, 5)
    acked = ck_produce(agent.bootstrap, [Rec(t, p, None, f"new{p}".encode()) for p in range(5)])
    assert [(a.partition, a.offset) for a in acked] == [(0, 1), (1, 1), (2, 0), (3, 0), (4, 0)]
    got = ck_consume(agent.bootstrap, t, range(5))
    assert_dense(got, t)
    assert [g.value for g in got[4]] == [b"new4"]
    # shrinking is refused with INVALID_PARTITIONS
    with pytest.raises(KafkaException) as ei:
        admin.create_partitions([NewPartitions(t, 3)], operation_timeout=30,
                                request_timeout=30)[t].result(timeout=35)
    assert ei.value.args[0].code() == KafkaError.INVALID_PARTITIONS


def test_describe_configs(agent_factory):
    agent = agent_factory(["--num-partitions", "3"])
    t = unique("adm-cfg")
    ck_create_topics(agent.bootstrap, {t: (1, {"retention.ms": 3_600_000})})
    admin = ck_admin(agent.bootstrap)
    res = ConfigResource(ResourceType.TOPIC, t)
    cfg = admin.describe_configs([res], request_timeout=30)[res].result(timeout=35)
    for name in ("retention.ms", "max.message.bytes", "cleanup.policy", "retention.bytes",
                 "segment.bytes", "message.timestamp.type"):
        assert name in cfg, f"topic config {name} missing; have {sorted(cfg)}"
    values = {k: v.value for k, v in cfg.items()}
    assert values["retention.ms"] == "3600000"
    assert not cfg["retention.ms"].is_default
    assert values["max.message.bytes"] == "1048588"
    assert values["cleanup.policy"] == "delete"
    assert values["message.timestamp.type"] == "CreateTime"
    assert all(v.value is not None for k, v in cfg.items() if not v.is_sensitive), \
        [k for k, v in cfg.items() if v.value is None]

    broker = ConfigResource(ResourceType.BROKER, "1")
    bcfg = admin.describe_configs([broker], request_timeout=30)[broker].result(timeout=35)
    assert bcfg, "broker has no configs"
    for name in ("num.partitions", "auto.create.topics.enable"):
        assert name in bcfg, f"broker config {name} missing; have {sorted(bcfg)}"
    assert bcfg["num.partitions"].value == "3"
    assert bcfg["auto.create.topics.enable"].value == "true"

    # unknown topic
    ghost = ConfigResource(ResourceType.TOPIC, unique("ghost"))
    with pytest.raises(KafkaException) as ei:
        admin.describe_configs([ghost], request_timeout=30)[ghost].result(timeout=35)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_cluster_and_metadata(agent, kcat):
    admin = ck_admin(agent.bootstrap)
    if not hasattr(admin, "describe_cluster"):
        pytest.skip("confluent-kafka without describe_cluster")
    d = admin.describe_cluster(request_timeout=30).result(timeout=35)
    assert [(n.id, n.host, n.port) for n in d.nodes] == [(1, "127.0.0.1", agent.port)]
    assert d.controller is not None and d.controller.id == 1
    assert d.cluster_id, "empty cluster id"
    md = kcat_metadata(kcat, agent.bootstrap)
    assert [(b["id"], b["name"]) for b in md["brokers"]] == [(1, agent.bootstrap)]
    # the cluster id is stable across restarts
    agent.restart()
    admin2 = ck_admin(agent.bootstrap)
    d2 = admin2.describe_cluster(request_timeout=30).result(timeout=35)
    assert d2.cluster_id == d.cluster_id


def test_invalid_topic_names(agent):
    admin = ck_admin(agent.bootstrap, **{"allow.auto.create.topics": True})
    for name in INVALID_NAMES:
        err = create_error(admin, NewTopic(name, 1, 1))
        assert err is not None, f"CreateTopics accepted invalid name {name!r}"
        assert err.code() == KafkaError.TOPIC_EXCEPTION, f"{name!r}: {err}"
    # Metadata with auto-create on must not create it either
    for name in ("bad name", "a" * 250):
        t = admin.list_topics(topic=name, timeout=30).topics[name]
        assert t.error is not None and t.error.code() == KafkaError.TOPIC_EXCEPTION, (name, t.error)
    assert not set(INVALID_NAMES) & set(admin.list_topics(timeout=30).topics)
    raw.check_api_versions(agent.bootstrap)


def test_create_topics_bad_arguments(agent):
    admin = ck_admin(agent.bootstrap)
    err = create_error(admin, NewTopic(unique("zero"), 0, 1))
    assert err is not None and err.code() == KafkaError.INVALID_PARTITIONS, err
    err = create_error(admin, NewTopic(unique("cfg"), 1, 1, config={"no.such.config": "1"}))
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG, err


def test_auto_create_off_unknown_topic(agent_factory):
    agent = agent_factory(["--auto-create-topics", "false"])
    admin = ck_admin(agent.bootstrap)
    t = unique("nope")
    md = admin.list_topics(topic=t, timeout=30).topics[t]
    assert md.error is not None and md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, md.error
    # still not there, and a raw Produce gets UNKNOWN_TOPIC_OR_PARTITION
    assert t not in admin.list_topics(timeout=30).topics
    with raw.connect(agent.bootstrap) as s:
        err, _ = raw.produce_v3(s, t, 0, raw.build_batch([(None, b"x", int(time.time() * 1000))]))
    assert err == raw.ERR_UNKNOWN_TOPIC_OR_PARTITION, err
    # a partition beyond the count of an existing topic is unknown too
    ck_create_topics(agent.bootstrap, {t: 1})
    with raw.connect(agent.bootstrap) as s:
        err, _ = raw.produce_v3(s, t, 7, raw.build_batch([(None, b"x", int(time.time() * 1000))]))
    assert err == raw.ERR_UNKNOWN_TOPIC_OR_PARTITION, err
    raw.check_api_versions(agent.bootstrap)


def test_auto_create_on_uses_num_partitions(agent_factory):
    agent = agent_factory(["--auto-create-topics", "true", "--num-partitions", "3"])
    t = unique("auto")
    # Metadata with allow_auto_topic_creation=true creates it
    ck_admin(agent.bootstrap, **{"allow.auto.create.topics": True}).list_topics(topic=t, timeout=30)
    wait_topic(agent.bootstrap, t, 3)
    # produce to a never-seen topic creates it as well
    t2 = unique("auto-produce")
    acked = ck_produce(agent.bootstrap, [Rec(t2, None, b"k", b"v")])
    assert acked[0].offset == 0
    wait_topic(agent.bootstrap, t2, 3)


def test_default_agent_auto_creates_one_partition(agent):
    t = unique("auto-default")
    acked = ck_produce(agent.bootstrap, [Rec(t, None, None, b"v")])
    assert (acked[0].partition, acked[0].offset) == (0, 0)
    wait_topic(agent.bootstrap, t, 1)
