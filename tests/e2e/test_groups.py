"""Consumer groups with real clients: the classic protocol through Weir's
coordinator, committed offsets in the control plane.

Members run as separate processes (group_member.py) so a test can SIGTERM
one (clean LeaveGroup) or SIGKILL it (found only by the session timeout).
Correctness is checked from both sides: the coordinator's view
(DescribeGroups through the AdminClient: a stable generation covers every
partition) and the members' own records (their rebalance callbacks, stamped
with the system-wide monotonic clock: no partition is ever held by two members
at once, in any generation, however short; every produced record consumed at
least once). Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState, KafkaException, TopicPartition

from conftest import _PDEATHSIG_PREFIX
from weirtest import (Rec, ck_admin, ck_consumer, ck_create_topics, ck_produce,
                      kcat_run, unique)

MEMBER_SCRIPT = Path(__file__).with_name("group_member.py")
GROUP_WAIT_S = 90.0
SESSION_MS = 6000


class Member:
    """One group member process; its events are read back from a JSON-lines file."""

    def __init__(self, tmp_path: Path, name: str, **conf):
        self.name = name
        self.out = tmp_path / f"member-{name}.jsonl"
        self.conf = {"client": "ck", "instance_id": None,
                     "session_timeout_ms": SESSION_MS, "out": str(self.out), **conf}
        self.proc: subprocess.Popen | None = None
        # time.monotonic() once the process is gone (it holds nothing after that).
        self.dead_at: float | None = None

    def start(self) -> "Member":
        log = open(self.out.with_suffix(".log"), "ab")
        self.proc = subprocess.Popen(
            _PDEATHSIG_PREFIX + [sys.executable, str(MEMBER_SCRIPT), json.dumps(self.conf)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def events(self) -> list:
        if not self.out.exists():
            return []
        out = []
        for line in self.out.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by kill -9
                pass
        return out

    def consumed(self) -> set:
        return {(e["p"], e["o"]) for e in self.events() if e["ev"] == "msg"}

    def last_assignment(self) -> list | None:
        assigns = [e["parts"] for e in self.events() if e["ev"] in ("assign", "revoke")
                   and e["ev"] == "assign"]
        return assigns[-1] if assigns else None

    def holdings(self) -> list:
        """(partition, from, to) for every time this member held a partition, from its
        callbacks: held from its assign until its revoke, its "closing", or its death."""
        out, held = [], {}
        for e in self.events():
            if e["ev"] == "assign":
                for p in e["parts"]:
                    held.setdefault(p, e["t"])
            elif e["ev"] == "revoke":
                for p in e["parts"]:
                    if p in held:
                        out.append((p, held.pop(p), e["t"]))
            elif e["ev"] == "closing":
                out += [(p, t, e["t"]) for p, t in held.items()]
                held = {}
        end = self.dead_at if self.dead_at is not None else float("inf")
        return out + [(p, t, end) for p, t in held.items()]

    def stop(self) -> None:
        """SIGTERM: the member closes its consumer (LeaveGroup) and exits."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill9()
                raise AssertionError(f"member {self.name} did not exit after SIGTERM")
            self.dead_at = time.monotonic()

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.dead_at = time.monotonic()


@pytest.fixture
def members(tmp_path):
    started: list[Member] = []

    def make(name: str, **conf) -> Member:
        m = Member(tmp_path, name, **conf).start()
        started.append(m)
        return m

    yield make
    for m in started:
        m.kill9()


def describe(admin, group: str):
    return admin.describe_consumer_groups([group], request_timeout=15)[group].result(timeout=30)


def wait_stable(admin, group: str, topic: str, n_members: int, n_partitions: int,
                bootstrap: str | None = None):
    """Wait until the coordinator reports a Stable group of `n_members` whose
    assignments cover every partition of `topic` exactly once.

    With `bootstrap`, an observer whose describes time out twice in a row is replaced by a
    fresh AdminClient: across an agent's kill -9 a CI run once saw the old client time out
    every describe for 90 s while the tests around it went on. A fresh client still fails the
    test if the agent itself does not answer."""
    deadline = time.monotonic() + GROUP_WAIT_S
    last = None
    failures = 0
    while time.monotonic() < deadline:
        try:
            d = describe(admin, group)
            failures = 0
        except KafkaException as e:
            last = repr(e)
            failures += 1
            if bootstrap is not None and failures >= 2:
                admin, failures = ck_admin(bootstrap), 0
            time.sleep(0.3)
            continue
        parts = sorted(tp.partition for m in d.members
                       for tp in (m.assignment.topic_partitions if m.assignment else [])
                       if tp.topic == topic)
        last = (d.state, len(d.members), parts)
        if d.state == ConsumerGroupState.STABLE:
            assert len(parts) == len(set(parts)), f"a partition is assigned twice: {parts}"
            # A leader whose metadata is not yet fresh may assign nothing for a moment;
            # it rejoins once it sees the topic, so wait for full coverage.
            if len(d.members) == n_members and parts == list(range(n_partitions)):
                return d
        time.sleep(0.3)
    raise AssertionError(f"group {group} not stable with {n_members} members: last {last}")


def assert_never_held_twice(all_members: list) -> int:
    """Exact, from the members' own callbacks: no partition was held by two members at the same
    time in any generation (eager rebalancing: a member's revoke callback runs before it rejoins,
    and the coordinator must not hand its partitions to anyone before every member has rejoined
    or been removed). Returns how many holdings were checked."""
    spans = sorted((p, start, end, m.name) for m in all_members for p, start, end in m.holdings())
    for (p1, _s1, e1, m1), (p2, s2, _e2, m2) in zip(spans, spans[1:]):
        assert not (p1 == p2 and s2 < e1), \
            f"partition {p1} held by {m2} from {s2:.3f} while {m1} held it until {e1:.3f}"
    assert spans, "no member ever recorded an assignment"
    return len(spans)


def wait_members_hold(live: list, n_partitions: int):
    """Wait until the live members' own latest assignments partition the topic."""
    deadline = time.monotonic() + GROUP_WAIT_S
    while time.monotonic() < deadline:
        held = [m.last_assignment() or [] for m in live]
        flat = sorted(p for parts in held for p in parts)
        if flat == list(range(n_partitions)):
            return held
        time.sleep(0.2)
    raise AssertionError(f"members never held every partition once: {held}")


def produce_round(bootstrap: str, topic: str, n_partitions: int, count: int, tag: str) -> list:
    recs = [Rec(topic, i % n_partitions, f"{tag}-{i}".encode(), f"v-{tag}-{i}".encode())
            for i in range(count)]
    return [(a.partition, a.offset) for a in ck_produce(bootstrap, recs)]


def wait_consumed(all_members: list, produced: set, timeout: float = GROUP_WAIT_S) -> set:
    deadline = time.monotonic() + timeout
    seen: set = set()
    while time.monotonic() < deadline:
        seen = set().union(*(m.consumed() for m in all_members))
        if produced <= seen:
            return seen
        time.sleep(0.3)
    missing = sorted(produced - seen)
    raise AssertionError(f"{len(missing)} produced records never consumed, first {missing[:10]}")


def run_membership_churn(agent, members, client: str, n_partitions: int, per_round: int):
    """Three members join one by one, then one leaves cleanly and one is
    kill -9'd; after each change the coordinator's stable generation must
    assign every partition exactly once, and every record produced along the
    way must be consumed at least once."""
    topic, group = unique("grp"), unique("g")
    ck_create_topics(agent.bootstrap, {topic: n_partitions})
    admin = ck_admin(agent.bootstrap)
    produced = set(produce_round(agent.bootstrap, topic, n_partitions, per_round, "r0"))
    conf = dict(client=client, bootstrap=agent.bootstrap, topic=topic, group=group)
    a = members("a", **conf)
    wait_stable(admin, group, topic, 1, n_partitions)
    b = members("b", **conf)
    wait_stable(admin, group, topic, 2, n_partitions)
    produced |= set(produce_round(agent.bootstrap, topic, n_partitions, per_round, "r1"))
    c = members("c", **conf)
    wait_stable(admin, group, topic, 3, n_partitions)
    wait_members_hold([a, b, c], n_partitions)
    produced |= set(produce_round(agent.bootstrap, topic, n_partitions, per_round, "r2"))
    c.stop()  # clean leave
    wait_stable(admin, group, topic, 2, n_partitions)
    produced |= set(produce_round(agent.bootstrap, topic, n_partitions, per_round, "r3"))
    b.kill9()  # only the session timeout can find this one
    wait_stable(admin, group, topic, 1, n_partitions)
    wait_members_hold([a], n_partitions)
    produced |= set(produce_round(agent.bootstrap, topic, n_partitions, per_round, "r4"))
    seen = wait_consumed([a, b, c], produced)
    assert seen <= produced, f"consumed records that were never produced: {sorted(seen - produced)[:10]}"
    a.stop()
    # Every generation went through: 1, 2, 3, 2, 1 members (and the transient ones between).
    assert assert_never_held_twice([a, b, c]) >= 5 * n_partitions
    d = describe(admin, group)
    assert d.state == ConsumerGroupState.EMPTY and not d.members


def test_confluent_group_join_leave_kill(agent, members):
    run_membership_churn(agent, members, "ck", n_partitions=12, per_round=240)


def test_kafka_python_group_join_leave_kill(agent, members):
    run_membership_churn(agent, members, "kp", n_partitions=6, per_round=60)


def assignment_by_instance(d) -> dict:
    return {m.group_instance_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
            for m in d.members}


def committed_since(member: Member, since: float) -> bool:
    return any(e["ev"] == "commit" and e["t"] > since for e in member.events())


def test_static_member_restart_gets_its_partitions_back_without_rebalance(agent, members):
    """KIP-345: a member restarted with the same group.instance.id (within the
    session timeout) replaces its old self; the others are not revoked."""
    n_partitions = 6
    session_ms = 10000
    topic, group = unique("static"), unique("g")
    ck_create_topics(agent.bootstrap, {topic: n_partitions})
    admin = ck_admin(agent.bootstrap)
    conf = dict(bootstrap=agent.bootstrap, topic=topic, group=group, session_timeout_ms=session_ms)
    live = []
    for i in range(3):
        live.append(members(f"s{i}", instance_id=f"instance-{i}", **conf))
        wait_stable(admin, group, topic, i + 1, n_partitions)
    wait_members_hold(live, n_partitions)
    before = assignment_by_instance(describe(admin, group))
    old_member_ids = {m.member_id for m in describe(admin, group).members}
    revokes_before = [sum(e["ev"] == "revoke" for e in m.events()) for m in live[:2]]
    live[2].kill9()  # a static member's close sends no LeaveGroup either; kill is the harsher case
    killed_at = live[2].dead_at
    restarted = members("s2-again", instance_id="instance-2", **conf)
    deadline = time.monotonic() + GROUP_WAIT_S
    while time.monotonic() < deadline and restarted.last_assignment() is None:
        time.sleep(0.2)
    assert restarted.last_assignment() == before["instance-2"], \
        f"restarted member got {restarted.last_assignment()}, had {before['instance-2']}"
    after = describe(admin, group)
    assert after.state == ConsumerGroupState.STABLE
    assert assignment_by_instance(after) == before
    new_ids = {m.member_id for m in after.members}
    assert len(new_ids - old_member_ids) == 1, "only the restarted member has a new member id"
    # A rebalance can still come late: on a later heartbeat, or when the killed member's old
    # session runs out. Keep the group working until each other member has committed (with its
    # generation, which a rebalance would refuse) after that session would have expired: a
    # rebalance started any time before shows as a revoke or a failed commit.
    quiet_after = killed_at + session_ms / 1000 + 1.0
    deadline = time.monotonic() + GROUP_WAIT_S
    rounds = 0
    while not all(committed_since(m, quiet_after) for m in live[:2]):
        assert time.monotonic() < deadline, "the other members stopped committing"
        produced = set(produce_round(agent.bootstrap, topic, n_partitions, 60, f"after{rounds}"))
        wait_consumed([live[0], live[1], restarted], produced)
        rounds += 1
    revokes_after = [sum(e["ev"] == "revoke" for e in m.events()) for m in live[:2]]
    assert revokes_after == revokes_before, "the other members were revoked"
    failed = [e for m in live[:2] for e in m.events()
              if e["ev"] == "commit_failed" and e["t"] > killed_at]
    assert not failed, f"commits refused after the restart: {failed[:3]}"
    assert assignment_by_instance(describe(admin, group)) == before
    assert_never_held_twice(live + [restarted])


def committed_offsets(bootstrap: str, group: str, topic: str, n_partitions: int) -> dict:
    c = ck_consumer(bootstrap, {"group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(n_partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def test_committed_offsets_survive_agent_restart(agent, members):
    n_partitions = 4
    topic, group = unique("durable"), unique("g")
    ck_create_topics(agent.bootstrap, {topic: n_partitions})
    first = set(produce_round(agent.bootstrap, topic, n_partitions, 200, "first"))
    conf = dict(bootstrap=agent.bootstrap, topic=topic, group=group)
    m1 = members("m1", **conf)
    wait_consumed([m1], first)
    m1.stop()
    committed = committed_offsets(agent.bootstrap, group, topic, n_partitions)
    assert committed == {p: 50 for p in range(n_partitions)}, committed
    agent.restart(kill=True)  # offsets must come back from the metadata log
    assert committed_offsets(agent.bootstrap, group, topic, n_partitions) == committed
    second = set(produce_round(agent.bootstrap, topic, n_partitions, 100, "second"))
    m2 = members("m2", **conf)
    seen = wait_consumed([m2], second)
    assert not (seen & first), "the group resumed before its committed offsets"
    m2.stop()
    assert committed_offsets(agent.bootstrap, group, topic, n_partitions) == \
        {p: 75 for p in range(n_partitions)}


def test_admin_list_describe_delete_groups_and_kcat(agent, members, kcat):
    n_partitions = 3
    topic, group = unique("admin"), unique("g")
    ck_create_topics(agent.bootstrap, {topic: n_partitions})
    produced = set(produce_round(agent.bootstrap, topic, n_partitions, 30, "x"))
    admin = ck_admin(agent.bootstrap)
    m = members("only", bootstrap=agent.bootstrap, topic=topic, group=group)
    d = wait_stable(admin, group, topic, 1, n_partitions)
    assert not d.is_simple_consumer_group
    assert d.partition_assignor in ("range", "roundrobin"), d.partition_assignor
    assert d.coordinator.id >= 0
    assert d.members[0].client_id == "weir-e2e-member"
    listed = admin.list_consumer_groups(request_timeout=15).result(timeout=30)
    by_id = {g.group_id: g for g in listed.valid}
    assert by_id[group].state == ConsumerGroupState.STABLE, by_id
    assert not by_id[group].is_simple_consumer_group
    wait_consumed([m], produced)
    # A group with members cannot be deleted.
    with pytest.raises(KafkaException) as refused:
        admin.delete_consumer_groups([group], request_timeout=15)[group].result(timeout=30)
    assert "NON_EMPTY_GROUP" in str(refused.value) or "not empty" in str(refused.value).lower()
    m.stop()
    assert describe(admin, group).state == ConsumerGroupState.EMPTY
    admin.delete_consumer_groups([group], request_timeout=15)[group].result(timeout=30)
    listed = admin.list_consumer_groups(request_timeout=15).result(timeout=30)
    assert group not in {g.group_id for g in listed.valid}
    assert committed_offsets(agent.bootstrap, group, topic, n_partitions) == \
        {p: -1001 for p in range(n_partitions)}, "offsets deleted with the group"
    # kcat -G: a balanced consumer of its own group reads everything.
    r = kcat_run(kcat, ["-b", agent.bootstrap, "-G", unique("kcat"), topic, "-c", str(len(produced)),
                        "-J", "-q", "-X", "auto.offset.reset=earliest",
                        "-X", "session.timeout.ms=6000"], timeout=120)
    got = {(j["partition"], j["offset"]) for j in map(json.loads, r.stdout.decode().splitlines())
           if j.get("partition") is not None}
    assert got == produced


def test_live_group_rejoins_after_agent_crash(agent, members):
    """Membership lives in the coordinator's memory: after the agent is killed
    and restarted the members find out (UNKNOWN_MEMBER_ID), rejoin, and carry
    on from their committed offsets with nothing skipped."""
    n_partitions = 4
    topic, group = unique("crash"), unique("g")
    ck_create_topics(agent.bootstrap, {topic: n_partitions})
    admin = ck_admin(agent.bootstrap)
    conf = dict(bootstrap=agent.bootstrap, topic=topic, group=group)
    live = [members("x", **conf), members("y", **conf)]
    wait_stable(admin, group, topic, 2, n_partitions)
    produced = set(produce_round(agent.bootstrap, topic, n_partitions, 80, "before"))
    wait_consumed(live, produced)
    agent.restart(kill=True)
    wait_stable(admin, group, topic, 2, n_partitions, bootstrap=agent.bootstrap)
    produced |= set(produce_round(agent.bootstrap, topic, n_partitions, 80, "after"))
    wait_consumed(live, produced)
    assert_never_held_twice(live)


def test_never_held_twice_check_catches_an_overlap(tmp_path):
    """The check itself, on recorded events (no agent): a partition handed to a member before
    its previous holder revoked it, or while a killed holder was still alive, is reported;
    a clean hand-over is not."""
    def member(name, events, dead_at=None):
        m = Member(tmp_path, name)
        m.out.write_text("".join(json.dumps(e) + "\n" for e in events))
        m.dead_at = dead_at
        return m

    a = member("a", [{"ev": "assign", "parts": [0, 1], "t": 1.0},
                     {"ev": "revoke", "parts": [0, 1], "t": 5.0},
                     {"ev": "assign", "parts": [0], "t": 6.0}])
    b = member("b", [{"ev": "assign", "parts": [1], "t": 6.0}])
    assert assert_never_held_twice([a, b]) == 4
    early = member("c", [{"ev": "assign", "parts": [1], "t": 4.0}])
    with pytest.raises(AssertionError, match="partition 1 held by"):
        assert_never_held_twice([a, early])
    killed = member("k", [{"ev": "assign", "parts": [2], "t": 1.0}], dead_at=9.0)
    successor = member("s", [{"ev": "assign", "parts": [2], "t": 8.0}])
    with pytest.raises(AssertionError, match="partition 2 held by"):
        assert_never_held_twice([killed, successor])
    closed = member("x", [{"ev": "assign", "parts": [3], "t": 1.0},
                          {"ev": "closing", "t": 2.0}])
    after = member("y", [{"ev": "assign", "parts": [3], "t": 3.0}])
    assert assert_never_held_twice([closed, after]) == 2
