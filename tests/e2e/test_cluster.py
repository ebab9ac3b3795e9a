"""Agents on one data dir as a cluster (issue 14, RFC 0002; `--control-listen`, experimental).

Two `weir agent` processes share the buckets: one leads the metadata log, the other follows
it over gRPC on 127.0.0.1. What one agent acknowledges, the other serves; kill -9 of the
leader loses nothing and the follower takes over once the lease times out. Clients bootstrap
at one agent each (Metadata does not list the cluster yet); compaction is off (its queue is not
networked yet)."""

from __future__ import annotations

import re
import time

import pytest

from conftest import _AGENTS_BY_TEST, Agent, pick_free_port, teardown_all
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, ck_producer, unique, wait_topic, wait_until)

PARTITIONS = 2


@pytest.fixture
def cluster(request, weir_bin, tmp_path, monkeypatch):
    """make(node_id) -> a started Agent on the shared data dir, joined to the cluster."""
    # Short leases so a take-over happens within the test (the defaults are 2 s / 10 s).
    monkeypatch.setenv("WEIR_CLUSTER_LEASE_RENEW", "200ms")
    monkeypatch.setenv("WEIR_CLUSTER_LEASE_TIMEOUT", "2s")
    monkeypatch.setenv("WEIR_CLUSTER_FORWARD_TIMEOUT", "3s")
    data = tmp_path / "shared-data"
    agents: list[Agent] = []
    # Their logs are attached to a failed test's report, as agent_factory's are.
    _AGENTS_BY_TEST[request.node.nodeid] = agents

    def make(node_id: int) -> Agent:
        base = tmp_path / f"node{node_id}"
        agent = Agent(weir_bin, pick_free_port(), data, base / "agent.log",
                      ["--node-id", str(node_id), "--control-listen", "127.0.0.1:0",
                       "--no-compaction"])
        agents.append(agent)
        return agent.start()

    yield make
    teardown_all(agents)


def joined_as(agent: Agent) -> str:
    """The role the agent logged when it joined at its latest start: Leader or Follower."""
    def latest() -> str:
        text = agent.log_text().split(f"start #{agent.starts}")[-1]
        return re.sub(r"\x1b\[[0-9;]*m", "", text)

    wait_until(lambda: "joined the cluster" in latest(), 30, "the agent joined")
    match = re.search(r"joined the cluster.*role=(Leader|Follower)", latest())
    assert match, agent.log_tail()
    return match.group(1)


def produce_retrying(bootstrap: str, recs, conf=None, attempts: int = 20) -> list:
    """ck_produce, retried while a follower has not reached the leader yet."""
    for attempt in range(attempts):
        try:
            return ck_produce(bootstrap, recs, conf)
        except AssertionError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def test_a_follower_forwards_produces_and_serves_what_the_leader_acknowledged(cluster):
    a = cluster(1)
    b = cluster(2)
    assert joined_as(a) == "Leader"
    assert joined_as(b) == "Follower"
    topic = unique("cluster")
    ck_create_topics(a.bootstrap, {topic: PARTITIONS})
    wait_topic(b.bootstrap, topic, PARTITIONS)
    through_a = ck_produce(a.bootstrap, [Rec(topic, i % PARTITIONS, None, b"a%d" % i)
                                         for i in range(200)])
    through_b = produce_retrying(b.bootstrap, [Rec(topic, i % PARTITIONS, None, b"b%d" % i)
                                               for i in range(200)])
    for reader in (a, b):
        got = ck_consume(reader.bootstrap, topic, range(PARTITIONS))
        assert_dense(got, topic)
        assert_acked_present(through_a + through_b, got)
        assert sum(len(v) for v in got.values()) == 400
    # Idle for five lease timeouts: the follower stays a follower, no epoch is claimed.
    epochs = sorted(p.name for p in (a.data_dir / "bucket" / "meta" / "epoch").iterdir())
    time.sleep(10)
    assert sorted(p.name for p in (a.data_dir / "bucket" / "meta" / "epoch").iterdir()) == epochs
    assert "taking over" not in b.log_text()
    assert "stepping down" not in a.log_text()


def test_kill_9_of_the_leader_loses_nothing_and_the_follower_takes_over(cluster):
    a = cluster(1)
    b = cluster(2)
    assert joined_as(a) == "Leader" and joined_as(b) == "Follower"
    topic = unique("failover")
    ck_create_topics(a.bootstrap, {topic: PARTITIONS})
    wait_topic(b.bootstrap, topic, PARTITIONS)
    conf = {"enable.idempotence": True, "message.timeout.ms": 60000}
    producer = ck_producer(b.bootstrap, conf)
    before = produce_retrying(b.bootstrap, [Rec(topic, i % PARTITIONS, None, b"before%d" % i)
                                            for i in range(300)], conf)
    a.kill9()
    killed_at = time.monotonic()
    after = ck_produce(b.bootstrap, [Rec(topic, i % PARTITIONS, None, b"after%d" % i)
                                     for i in range(300)], conf, flush_timeout=60,
                       producer=producer)
    first_ack_s = time.monotonic() - killed_at
    assert "taking over" in b.log_text(), b.log_tail()
    print(f"kill -9 of the leader to the follower's acks: {first_ack_s:.1f} s "
          f"(lease timeout 2 s, renew 200 ms)")
    got = ck_consume(b.bootstrap, topic, range(PARTITIONS))
    assert_dense(got, topic)
    assert_acked_present(before + after, got)
    values = [g.value for part in got.values() for g in part]
    assert len(values) == len(set(values)) == 600, "idempotent: no duplicates, nothing lost"
    # The killed node restarts and follows the new leader.
    a.start()
    assert joined_as(a) == "Follower"
    got_a = ck_consume(a.bootstrap, topic, range(PARTITIONS))
    assert got_a == got
