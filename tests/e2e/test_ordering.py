"""Requests on one connection take effect in the order they were sent (docs/compatibility.md,
"Request order"). Before the fix an OffsetFetch ran as soon as it was read, racing the commits
before it: librdkafka's committed() right after an asynchronous commit answered the previous
commit."""

from __future__ import annotations

import uuid

from confluent_kafka import TopicPartition
from kafka import KafkaConsumer
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KpTopicPartition

from weirtest import ck_consumer, ck_create_topics, unique

ROUNDS = 200


def test_confluent_async_commit_then_committed_sees_the_commit(agent):
    topic = unique("ordering")
    ck_create_topics(agent.bootstrap, {topic: 1})
    group = "ordering-" + uuid.uuid4().hex[:8]
    consumer = ck_consumer(agent.bootstrap, {"group.id": group})
    try:
        # Until librdkafka knows the coordinator it queues both requests and may send them in
        # either order itself; a synchronous commit first makes the connection exist.
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        stale = []
        for offset in range(1, ROUNDS + 1):
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=True)
            [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
            assert committed.error is None, committed.error
            if committed.offset != offset:
                stale.append((offset, committed.offset))
        assert not stale, f"{len(stale)} of {ROUNDS} committed() answers were stale: {stale[:5]}"
    finally:
        consumer.close()


def test_kafka_python_async_commit_then_committed_sees_the_commit(agent):
    topic = unique("ordering-kp")
    ck_create_topics(agent.bootstrap, {topic: 1})
    group = "ordering-kp-" + uuid.uuid4().hex[:8]
    consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, group_id=group,
                             enable_auto_commit=False, request_timeout_ms=30000)
    tp = KpTopicPartition(topic, 0)
    try:
        stale = []
        for offset in range(1, ROUNDS + 1):
            consumer.commit_async(offsets={tp: OffsetAndMetadata(offset, "", -1)})
            # Not assigned: committed() asks the coordinator on the same connection.
            committed = consumer.committed(tp)
            if committed != offset:
                stale.append((offset, committed))
        assert not stale, f"{len(stale)} of {ROUNDS} committed() answers were stale: {stale[:5]}"
    finally:
        consumer.close()
