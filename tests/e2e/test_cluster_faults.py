"""Faults in a cluster of three agents on one data dir (RFC 0002 step 5; `--control-listen`).

Raw Fetch of every partition returns the same bytes from every agent. kill -9 of a follower under
producers loses nothing, claims no epoch, and the follower registers again when it restarts.
Agents armed with a durability fail point abort there (the leader first); a follower takes over
from each aborted leader, which then rejoins as a follower. Idempotent producers: 0 lost,
duplicated, reordered, no gaps; plain producers: 0 lost (a retried batch may be stored twice)."""

from __future__ import annotations

import random
import re
import struct
import threading
import time

import pytest

from checker import CheckedProducer, Report, analyze, parse
from conftest import Agent
from kafka_raw import connect, fetch_v4
from test_cluster import (clean, cluster, epochs, joined_as, partition_leaders,  # noqa: F401
                          produce_retrying, wait_registry)
from test_faults import assert_failpoint_abort, publish, stop_producers
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_watermarks, unique, wait_topic, wait_until)

NODES = (1, 2, 3)
PARTITIONS = 6
IDEMPOTENT = {"enable.idempotence": True}
LOG_WRITE = "after-log-write-before-publish"
NO_ZONES = {node: None for node in NODES}  # no --zone: no rack in DescribeCluster


@pytest.fixture
def nodes(cluster):
    """make(node_id, failpoints="") -> a started agent of test_cluster's `cluster` (shared
    data dir, short leases); `agent.base_args` restarts it without the fail points."""
    def make(node_id: int, failpoints: str = "") -> Agent:
        armed = ["--failpoints", failpoints] if failpoints else []
        agent = cluster(node_id, extra=armed)
        agent.base_args = agent.extra_args[:len(agent.extra_args) - len(armed)]
        return agent

    return make


def start_three(make, failpoints: dict | None = None) -> dict:
    """Nodes 1, 2, 3 (1 leads), each registered with every agent: node id -> Agent."""
    agents = {}
    for node in NODES:
        agents[node] = make(node, (failpoints or {}).get(node, ""))
        assert joined_as(agents[node]) == ("Leader" if node == 1 else "Follower")
    wait_registry(agents, NO_ZONES)
    return agents


def topic_on_every_agent(agents: dict, prefix: str) -> str:
    """A new topic of PARTITIONS partitions, seen by every agent, with at least one partition led
    by each agent (clients with no zone; leaders are a hash of the topic id, so a topic whose
    partitions miss an agent is replaced by another)."""
    for _ in range(10):
        topic = unique(prefix)
        ck_create_topics(agents[1].bootstrap, {topic: PARTITIONS})
        for agent in agents.values():
            wait_topic(agent.bootstrap, topic, PARTITIONS)
        if set(partition_leaders(agents[1].bootstrap, topic, "rdkafka").values()) == set(agents):
            return topic
    raise AssertionError("ten topics in a row left an agent without a partition to lead")


def rejoined(agent: Agent) -> str:
    """joined_as, then until the agent registered: a restarted node waits for its previous
    incarnation's fence, and until then the registry lists the old one at the same address."""
    role = joined_as(agent)
    wait_until(lambda: "registered in the cluster" in
               agent.log_text().split(f"start #{agent.starts}")[-1], 30, "the agent registered")
    return role


def led_epochs(agent: Agent) -> list:
    """The epochs this agent has led (its "control plane recovered" lines, every start)."""
    return [int(e) for e in re.findall(r"control plane recovered epoch=(\d+)",
                                       clean(agent.log_text()))]


def led_at_exit(agent: Agent) -> bool:
    """Whether the agent still led when its latest run ended: it became leader in that run
    ("control plane recovered") and was not deposed after."""
    text = clean(agent.log_text()).split(f"start #{agent.starts}")[-1]
    _, recovered, after = text.rpartition("control plane recovered")
    return bool(recovered) and not any(
        line in after for line in ("stepping down", "deposed by a later leader",
                                   "a later leader took over while we recovered"))


class DeathWatch(threading.Thread):
    """Notes when each agent process is first seen gone (every 10 ms), while the test waits
    elsewhere."""

    def __init__(self, agents: dict):
        super().__init__(daemon=True, name="death-watch")
        self.agents, self.died, self.halt = agents, {}, threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.01):
            for agent in self.agents.values():
                proc = agent.proc
                if proc is not None and proc not in self.died and proc.poll() is not None:
                    self.died[proc] = time.monotonic()

    def when(self, agent: Agent) -> float:
        return self.died.get(agent.proc, time.monotonic())


def leader(agents: dict) -> int | None:
    """The live agent that leads the highest epoch any agent has led, or None."""
    led = {node: max(led_epochs(agent), default=0) for node, agent in agents.items()}
    node = max(led, key=led.get)
    return node if agents[node].alive() else None


# --------------------------------------------------------------- raw bytes


def raw_partition(addr: str, topic: str, partition: int, high: int) -> bytes:
    """The record batches of `partition` from offset 0 up to `high`, as the agent sends them
    (raw Fetch v4; a trailing partial batch is dropped and fetched again)."""
    out, offset = bytearray(), 0
    with connect(addr) as sock:
        for i in range(10_000):
            if offset >= high:
                return bytes(out)
            err, hw, records = fetch_v4(sock, topic, partition, offset, max_wait_ms=500,
                                        corr_id=100 + i)
            assert err == 0, f"fetch {topic}[{partition}]@{offset} from {addr}: error {err}"
            assert hw == high, f"{addr}: high watermark of {topic}[{partition}] moved to {hw}"
            pos = 0
            while pos + 61 <= len(records):
                base, length = struct.unpack_from(">qi", records, pos)
                end = pos + 12 + length
                if end > len(records):
                    break
                count = struct.unpack_from(">i", records, pos + 57)[0]
                if base + count > offset:
                    assert base == offset, f"{addr}: batch at {base}, expected {offset}"
                    out += records[pos:end]
                    offset = base + count
                pos = end
    raise AssertionError(f"{addr}: {topic}[{partition}] not read to {high}")


def high_watermark(addr: str, topic: str, partition: int) -> int:
    with connect(addr) as sock:
        err, hw, _ = fetch_v4(sock, topic, partition, 0, max_bytes=1, max_wait_ms=0)
    assert err == 0, err
    return hw


def test_raw_fetch_returns_the_same_bytes_from_every_agent(nodes):
    agents = start_three(nodes)
    topic = topic_on_every_agent(agents, "same-bytes")
    acked = []
    # Through each agent, batches of different shapes: plain, idempotent and lz4, long linger.
    confs = {1: {}, 2: {**IDEMPOTENT, "compression.type": "lz4"}, 3: {"linger.ms": 50}}
    for node, conf in confs.items():
        recs = [Rec(topic, i % PARTITIONS, b"k%d" % i if i % 3 else None,
                    b"node%d-%d-" % (node, i) * (1 + i % 7),
                    (("h", b"%d" % i),) if i % 5 == 0 else ())
                for i in range(150)]
        acked += produce_retrying(agents[node].bootstrap, recs, conf)

    # Followers apply the log a little after the leader acknowledged it.
    highs = {p: high_watermark(agents[1].bootstrap, topic, p) for p in range(PARTITIONS)}
    assert sum(highs.values()) >= 450, highs
    for node, agent in agents.items():
        wait_until(lambda: all(high_watermark(agent.bootstrap, topic, p) == highs[p]
                               for p in range(PARTITIONS)),
                   30, f"node {node} at the leader's high watermarks {highs}")
    for p in range(PARTITIONS):
        raw = {node: raw_partition(agent.bootstrap, topic, p, highs[p])
               for node, agent in agents.items()}
        assert raw[1], f"partition {p} is empty"
        for node in (2, 3):
            assert raw[node] == raw[1], (
                f"{topic}[{p}]: node {node} sent {len(raw[node])} bytes, node 1 "
                f"{len(raw[1])}; first difference at byte "
                f"{next((i for i, (x, y) in enumerate(zip(raw[node], raw[1])) if x != y), '-')}")
    # And they are what was acknowledged, read by a client through each agent.
    for agent in agents.values():
        got = ck_consume(agent.bootstrap, topic, range(PARTITIONS))
        assert_dense(got, topic)
        assert_acked_present(acked, got)


# --------------------------------------------------------------- producers


class TimedProducer(CheckedProducer):
    """A CheckedProducer that also notes when each acknowledgement arrived (monotonic)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ack_times: list[float] = []

    def _delivered(self, err, msg) -> None:
        super()._delivered(err, msg)
        if err is None:
            with self.lock:
                self.ack_times.append(time.monotonic())


def start_producers(topic: str, plan: list) -> list:
    """plan: [(name, bootstrap agent, conf)] -> started producers."""
    producers = [TimedProducer(agent.bootstrap, topic, PARTITIONS, name, conf)
                 for name, agent, conf in plan]
    for producer in producers:
        producer.start()
    return producers


def acked(producers) -> int:
    return sum(p.n_acked() for p in producers)


def ack_pause(producers, died_at: float, until: float) -> tuple:
    """(seconds from an abort to the end of the longest pause in acknowledgements between the
    abort and `until`, that pause's length)."""
    times = sorted(t for p in producers for t in p.ack_times if died_at <= t < until)
    gaps = [(b - a, b) for a, b in zip([died_at] + times, times)]
    if not gaps:
        return float("nan"), float("nan")
    length, end = max(gaps)
    return end - died_at, length


def finish(agents: dict, topic: str, producers: list, scenario: str) -> None:
    """Stops the producers, reads every partition through every live agent (they must agree)
    and checks: idempotent producers 0 lost, duplicated, reordered; plain producers 0 lost (a
    plain producer's retry of a batch the agent stored but did not acknowledge is stored again,
    and may land after the batches sent behind it: their duplicates and order are reported, not
    checked); no gaps; no failed deliveries."""
    stop_producers(producers)
    live = [agent for agent in agents.values() if agent.alive()]
    watermarks = ck_watermarks(live[0].bootstrap, topic, range(PARTITIONS))
    for agent in live[1:]:
        wait_until(lambda: ck_watermarks(agent.bootstrap, topic, range(PARTITIONS)) == watermarks,
                   30, f"{agent.bootstrap} at {watermarks}")
    until = {p: high for p, (_, high) in watermarks.items()}
    stored = None
    for agent in live:
        got = ck_consume(agent.bootstrap, topic, range(PARTITIONS), timeout=120, until=until)
        at = {(p, r.offset): r.value for p, records in got.items() for r in records}
        assert stored is None or at == stored, f"{agent.bootstrap} serves other records"
        stored = at

    idempotent = {p.producer_name for p in producers if p.conf.get("enable.idempotence")}

    def report(which: set, name: str, gaps: bool) -> Report:
        chosen = [p for p in producers if p.producer_name in which]
        result = Report(f"{scenario}:{name}", 0)
        result.failed_deliveries = sum(len(p.failed) for p in chosen)
        acks = [a for p in chosen for a in p.acked]
        mine = {k: v for k, v in stored.items() if parse(v)[0] in which}
        analyze(mine, watermarks if gaps else {}, acks, result)
        publish(result)
        return result

    every = report({p.producer_name for p in producers}, "all", gaps=True)
    idem = report(idempotent, "idempotent", gaps=False)
    report({p.producer_name for p in producers} - idempotent, "plain", gaps=False)
    assert idem.acked > 0 and every.acked > idem.acked
    assert every.lost == 0 and every.gaps == 0 and every.failed_deliveries == 0, every.line()
    assert idem.duplicated == 0 and idem.reordered == 0, idem.line()


def test_kill_9_of_a_follower_under_producers_loses_nothing_and_claims_no_epoch(nodes):
    agents = start_three(nodes)
    topic = topic_on_every_agent(agents, "follower-kill")
    epochs_before = epochs(agents[1])
    producers = start_producers(topic, [(f"{kind}{node}", agents[node], conf)
                                        for node in (1, 2)
                                        for kind, conf in (("idem", IDEMPOTENT), ("plain", {}))])
    wait_until(lambda: acked(producers) >= 2000, 60, "acks before the kill")
    # Node 3 leads some partitions for these clients: their batches are in flight to it.
    agents[3].kill9()
    before = acked(producers)
    wait_registry({n: agents[n] for n in (1, 2)}, {1: None, 2: None})  # fenced
    wait_until(lambda: acked(producers) >= before + 2000, 60, "acks after the kill")
    agents[3].start()
    assert rejoined(agents[3]) == "Follower"
    wait_registry(agents, NO_ZONES)
    before = acked(producers)
    wait_until(lambda: acked(producers) >= before + 1000, 60, "acks after the restart")
    finish(agents, topic, producers, "cluster-follower-kill9")
    assert epochs(agents[1]) == epochs_before, "an epoch was claimed"
    for agent in agents.values():
        assert "taking over" not in agent.log_text(), agent.log_tail()
        assert "stepping down" not in agent.log_text(), agent.log_tail()


@pytest.mark.parametrize("point", ["after-upload-before-commit", "after-commit-before-ack",
                                   LOG_WRITE])
def test_agents_abort_at_a_durability_fail_point_and_followers_take_over(nodes, point):
    """All three agents are armed. Only a leader writes the log, so at LOG_WRITE each leader
    aborts after its own `hit` slots (node 1's count starts at its start, a follower's when it
    takes over): at least two leaders in a row abort. Every agent commits the files it wrote, so
    at the commit points the followers' counts are larger: node 1 aborts first, as the leader,
    then nodes 2 and 3, as whatever they are by then. Each aborted agent restarts without the
    fail point, a leader once another agent has taken over (it rejoins as a follower)."""
    hit = random.Random(sum(map(ord, point))).randint(40, 80)
    hits = {node: hit for node in NODES} if point == LOG_WRITE else \
        {1: hit, 2: hit + 250, 3: hit + 500}
    agents = start_three(nodes, {node: f"{point}=abort@{n}" for node, n in hits.items()})
    topic = topic_on_every_agent(agents, "fp")
    producers = start_producers(topic, [("idem2", agents[2], IDEMPOTENT),
                                        ("idem3", agents[3], IDEMPOTENT),
                                        ("plain2", agents[2], {})])
    armed = set(NODES)
    aborts: list = []  # (node, was the leader, when)
    watch = DeathWatch(agents)
    watch.start()
    deadline = time.monotonic() + 75

    def done() -> bool:
        leaders_aborted = sum(1 for _, led, _ in aborts if led)
        # Every abort is handled first: an armed agent that led and died meanwhile too.
        return not armed or (point == LOG_WRITE and leaders_aborted >= 2
                             and all(agents[n].alive() for n in armed)
                             and leader(agents) not in (None, *armed))

    while not done():
        wait_until(lambda: done() or any(not agents[n].alive() for n in armed),
                   max(deadline - time.monotonic(), 1), f"an agent to abort at {point}")
        if done():
            break
        _, node = min((watch.when(agents[n]), n) for n in armed if not agents[n].alive())
        agent = agents[node]
        assert_failpoint_abort(agent, point, hits[node])
        was_leader = led_at_exit(agent)
        aborts.append((node, was_leader, watch.when(agent)))
        agent.kill9()  # reap, and mark as expected
        armed.discard(node)

        def others() -> list:
            return [n for n in NODES if n != node and agents[n].alive()]

        if was_leader:
            wait_until(lambda: leader(agents) not in (None, node) or not others(), 30,
                       f"a follower to take over from node {node}")
            if others():
                assert "the leader stopped; taking over" in agents[leader(agents)].log_text()
        else:
            wait_until(lambda: leader(agents) is not None or not others(), 30, "a leader")
        leading = leader(agents)
        agent.start(extra_args=agent.base_args)
        role = rejoined(agent)
        # With no live leader (every other agent aborted too) it leads by itself.
        assert leading is None or role == "Follower", f"node {node} took over as it restarted"
    watch.halt.set()
    aborts.sort(key=lambda abort: abort[2])
    # At LOG_WRITE, a follower still armed never led: restart it without its fail point.
    for node in sorted(armed):
        agents[node].restart(extra_args=agents[node].base_args)
        assert rejoined(agents[node]) == "Follower"
    print(f"{point}: aborted (node, leader) in order: {[(n, led) for n, led, _ in aborts]}")
    assert aborts[0][:2] == (1, True), aborts
    if point == LOG_WRITE:
        assert sum(1 for _, led, _ in aborts if led) >= 2, aborts
    else:
        assert len(aborts) == 3, aborts
    wait_registry(agents, NO_ZONES)
    before = acked(producers)
    wait_until(lambda: acked(producers) >= before + 1000, 60, "acks after the last restart")
    finish(agents, topic, producers, f"cluster-failpoint:{point}")
    ends = [died_at for _, _, died_at in aborts[1:]] + [time.monotonic()]
    for (node, led, died_at), until in zip(aborts, ends):
        resumed, pause = ack_pause(producers, died_at, until)
        firsts = {p.producer_name: min((t for t in p.ack_times if t >= died_at), default=None)
                  for p in producers}
        print(f"{point}: node {node} ({'leader' if led else 'follower'}) aborted; first ack "
              f"after it per producer: "
              f"{ {n: round(t - died_at, 2) if t else None for n, t in firsts.items()} } s; "
              f"longest pause in acks before the next abort: {pause:.2f} s, ending {resumed:.2f} s "
              f"after the abort (lease 200 ms / 2 s)")
