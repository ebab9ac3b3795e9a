"""A cluster on S3 (moto): three agents share the buckets, each reaching moto through its own
fault proxy, so one agent's buckets can fail while its peers' do not (issue 14, RFC 0002 §4).

The leader losing its buckets is replaced: it cannot renew its lease, a follower takes over
once the lease stood still for the lease timeout, and when the buckets come back the old leader
finds the later epoch and follows. Idempotent producers bootstrapped at the followers run
through it all; the checker reports nothing lost, duplicated, reordered or skipped."""

from __future__ import annotations

import re
import time

import pytest

from checker import CheckedProducer, Report, verify
from cloud import s3_url
from conftest import _AGENTS_BY_TEST, Agent, pick_free_port, teardown_all
from test_cluster import clean, joined_as, partition_leaders
from test_faults import IDEMPOTENT, PARTITIONS, acked, finish, stop_producers
from weirtest import ck_consume, ck_create_topics, unique, wait_topic, wait_until

WAIT_S = 90.0


@pytest.fixture
def s3_cluster(request, weir_bin, tmp_path, monkeypatch, cloud_env, moto_server, fault_proxy):
    """make(node_id) -> (started Agent, its FaultProxy): agents on three shared ingest buckets
    (quorum 2) and a metadata bucket on moto, each through a proxy of its own."""
    monkeypatch.setenv("WEIR_CLUSTER_LEASE_RENEW", "200ms")
    monkeypatch.setenv("WEIR_CLUSTER_LEASE_TIMEOUT", "2s")
    monkeypatch.setenv("WEIR_CLUSTER_FORWARD_TIMEOUT", "3s")
    monkeypatch.setenv("WEIR_CLUSTER_AGENT_TIMEOUT", "2s")
    ingest = [moto_server.create_bucket("ingest") for _ in range(3)]
    meta = moto_server.create_bucket("meta")
    agents: list[Agent] = []
    _AGENTS_BY_TEST[request.node.nodeid] = agents

    def make(node_id: int):
        proxy = fault_proxy(moto_server, name=f"node{node_id}")
        buckets = [a for bucket in ingest
                   for a in ("--ingest-bucket", s3_url(bucket, proxy.endpoint))]
        base = tmp_path / f"node{node_id}"
        agent = Agent(weir_bin, pick_free_port(), base / "data", base / "agent.log",
                      [*buckets, "--quorum", "2",
                       "--metadata-bucket", s3_url(meta, proxy.endpoint),
                       "--node-id", str(node_id), "--control-listen", "127.0.0.1:0"])
        agents.append(agent)
        return agent.start(), proxy

    yield make
    teardown_all(agents)


def plain(agent: Agent) -> str:
    """The agent's log without colour codes."""
    return clean(agent.log_text())


def test_a_leader_that_loses_its_buckets_is_replaced_and_follows_when_they_return(s3_cluster):
    (a, to_a), (b, _), (c, _) = s3_cluster(1), s3_cluster(2), s3_cluster(3)
    assert [joined_as(x) for x in (a, b, c)] == ["Leader", "Follower", "Follower"]
    topic = unique("cluster-outage")
    ck_create_topics(b.bootstrap, {topic: PARTITIONS})
    for agent in (a, b, c):
        wait_topic(agent.bootstrap, topic, PARTITIONS)
    producers = [CheckedProducer(agent.bootstrap, topic, PARTITIONS, f"p{n}", IDEMPOTENT)
                 for n, agent in ((2, b), (3, c))]
    for producer in producers:
        producer.start()
    wait_until(lambda: acked(producers) >= 200, WAIT_S, "acks before the outage")

    to_a.set_mode("fail")
    outage_at = time.monotonic()
    # Both followers may try ("taking over"); one claim wins, and only the winner recovers
    # (the other logs "could not take over; following on").
    def leaders() -> list:
        return [x for x in (b, c) if "control plane recovered" in x.log_text()]

    wait_until(leaders, WAIT_S, "a follower took over")
    took_over = leaders()
    assert len(took_over) == 1, "one follower took over"
    at_takeover = acked(producers)
    wait_until(lambda: acked(producers) >= at_takeover + 200, WAIT_S, "acks after the take-over")
    print(f"the leader's buckets failing to 200 acks through the new leader: "
          f"{time.monotonic() - outage_at:.1f} s (lease timeout 2 s, renew 200 ms)")
    new_leader = took_over[0]
    # The new leader fences the silent old one out of the registry.
    wait_until(lambda: re.search(r"fencing it.* node_id=1 ", plain(new_leader)), WAIT_S,
               "the old leader fenced")
    # An outage of several lease timeouts: the old leader keeps failing meanwhile.
    time.sleep(max(0.0, outage_at + 8 - time.monotonic()))
    assert a.alive()

    to_a.set_mode("pass")
    # Back on its buckets, the old leader finds the later epoch (from its lease task, or from
    # the recovery its failed log writes started) and follows: it registers again.
    wait_until(lambda: a.log_text().count("registered in the cluster") >= 2, WAIT_S,
               "the old leader registered again")
    assert ("a later epoch was claimed; stepping down" in a.log_text()
            or "a later leader took over while we recovered, following" in a.log_text()), \
        a.log_tail()
    report = finish(new_leader, topic, producers, Report("cluster-s3-leader-buckets-503", 0))
    assert report.acked >= 400
    # The old leader follows the new one and serves what it acknowledged.
    assert "taking over" not in a.log_text()
    want = ck_consume(new_leader.bootstrap, topic, range(PARTITIONS))
    wait_until(lambda: ck_consume(a.bootstrap, topic, range(PARTITIONS)) == want, WAIT_S,
               "the old leader serves the new leader's log")


def test_clients_of_a_leader_that_loses_its_buckets_move_to_the_other_agents(s3_cluster):
    """Every partition the producers write is placed on the agent whose buckets fail (a
    one-partition topic that Metadata places on node 1). librdkafka asks the broker it uses most
    for Metadata, often that agent, which cannot read the log that fenced it. It stops listing
    itself once its control plane has been unavailable for the registration grace, so acks resume
    through the other agents while its buckets still fail. Without that, this test timed out in 3
    of 5 runs, and the test above can fail so when all four of its partitions land on node 1
    (1 run in 81; CI saw it once)."""
    (a, to_a), (b, _), (c, _) = s3_cluster(1), s3_cluster(2), s3_cluster(3)
    assert [joined_as(x) for x in (a, b, c)] == ["Leader", "Follower", "Follower"]
    topic = None
    for _ in range(30):  # each topic lands on node 1 with p = 1/3
        name = unique("cluster-outage-one")
        ck_create_topics(b.bootstrap, {name: 1})
        for agent in (a, b, c):
            wait_topic(agent.bootstrap, name, 1)
        if partition_leaders(b.bootstrap, name, "placement") == {0: 1}:
            topic = name
            break
    assert topic, "no one-partition topic placed on node 1 in 30 tries"
    producers = [CheckedProducer(agent.bootstrap, topic, 1, f"p{n}", IDEMPOTENT)
                 for n, agent in ((2, b), (3, c))]
    for producer in producers:
        producer.start()
    wait_until(lambda: acked(producers) >= 200, WAIT_S, "acks before the outage")
    to_a.set_mode("fail")
    wait_until(lambda: any("control plane recovered" in x.log_text() for x in (b, c)), WAIT_S,
               "a follower took over")
    at_takeover = acked(producers)
    wait_until(lambda: acked(producers) >= at_takeover + 200, WAIT_S,
               "acks through the other agents while the old leader's buckets fail")
    to_a.set_mode("pass")
    wait_until(lambda: a.log_text().count("registered in the cluster") >= 2, WAIT_S,
               "the old leader registered again")
    stop_producers(producers)
    report = verify(b.bootstrap, topic, 1, producers,
                    Report("cluster-s3-leader-buckets-503-clients-move", 0))
    assert (report.lost, report.duplicated, report.reordered, report.gaps) == (0, 0, 0, 0), \
        report.line()
