"""Durability across agent restarts (DUR-1, DUR-2, ORD-1).

A producer loop runs while the agent is killed (SIGKILL) or stopped
(SIGTERM) and started again on the same port and data dir. Afterwards every
acknowledged record must be readable at the offset it was acknowledged at,
and each partition's offsets must be dense from 0 (duplicates of un-acked
retries are allowed for a non-idempotent producer; none at all for an
idempotent one)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, ck_producer, ck_watermarks, unique, wait_readable,
                      wait_topic)

PARTITIONS = 4
MAX_RECORDS = 200_000        # hard bound on the loop
ACKED_BEFORE_STOP = 400      # wait for this many acks before stopping the agent
ACKED_AFTER_RESTART = 400    # and this many more after it is back
WAIT_S = 90.0


class ProducerLoop(threading.Thread):
    """confluent-kafka producer in its own thread, recording every delivery
    report: (partition, offset, value) for successes, (value, error) for failures."""

    def __init__(self, bootstrap: str, topic: str, conf: dict):
        super().__init__(daemon=True, name="producer-loop")
        self.bootstrap = bootstrap
        self.topic = topic
        self.conf = conf
        self.lock = threading.Lock()
        self.acked: list = []
        self.failed: list = []
        self.sent = 0
        self.remaining = None
        self.exc: BaseException | None = None
        self._stop_evt = threading.Event()

    def n_acked(self) -> int:
        with self.lock:
            return len(self.acked)

    def _cb(self, err, msg):
        with self.lock:
            if err is None:
                self.acked.append((msg.partition(), msg.offset(), msg.value()))
            else:
                self.failed.append((msg.value(), str(err)))

    def stop(self):
        self._stop_evt.set()

    def run(self):
        try:
            p = ck_producer(self.bootstrap, {
                "acks": "all", "linger.ms": 2, "message.timeout.ms": 180_000,
                "retry.backoff.ms": 100, "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500, **self.conf})
            i = 0
            while not self._stop_evt.is_set() and i < MAX_RECORDS:
                v = f"v{i:08d}".encode()
                try:
                    p.produce(self.topic, key=str(i).encode(), value=v,
                              partition=i % PARTITIONS, on_delivery=self._cb)
                except BufferError:
                    p.poll(0.05)
                    continue
                i += 1
                self.sent = i
                p.poll(0)
                if i % 20 == 0:
                    time.sleep(0.002)  # pace: keep the in-flight backlog modest
            self.remaining = p.flush(150)
        except BaseException as e:  # noqa: BLE001 - surfaced by the test
            self.exc = e


def wait_until(pred, timeout: float, what: str, agent=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if agent is not None:
            agent.check_still_running()
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def verify_log(bootstrap, topic, acked, idempotent: bool, fillers: bool):
    """The log after the restart. With `fillers` (parallel persistence, RFC 0006), a file that
    was reserved but had not reached a quorum when the agent was killed is aborted by the next
    run's resolver, and its offsets hold an empty batch: a gap consumers skip. Nothing in it
    was acknowledged (an ack waits for the quorum), and the client sends it again. Until the
    resolver settles such a file (a predecessor's missing file waits the ack deadline plus the
    clock-skew margin, 20 s), its partitions' high watermarks stay behind it, below records
    acknowledged after the restart (RFC 0006): the log is read once they are past every one."""
    if fillers:
        last = {}
        for part, off, _ in acked:
            last[part] = max(off, last.get(part, -1))
        assert wait_readable(bootstrap, topic, last, 60), \
            f"acknowledged offsets {last} not below the high watermarks within 60 s"
    wm = ck_watermarks(bootstrap, topic, range(PARTITIONS))
    assert all(lo == 0 for lo, _ in wm.values()), wm
    got = ck_consume(bootstrap, topic, range(PARTITIONS), timeout=120)
    if fillers:
        for p, records in got.items():
            offsets = [g.offset for g in records]
            assert offsets == sorted(set(offsets)), f"{topic}[{p}]: offsets not increasing"
            assert all(o < wm[p][1] for o in offsets), f"{topic}[{p}]: offsets past hw"
    else:
        assert_dense(got, topic)
        for p in range(PARTITIONS):
            assert len(got[p]) == wm[p][1], f"partition {p}: read {len(got[p])}, hw {wm[p][1]}"
    at = {p: {g.offset: g for g in records} for p, records in got.items()}
    missing = []
    for part, off, val in acked:
        g = at[part].get(off)
        if g is None or g.value != val:
            missing.append((part, off, val, g.value if g is not None else None))
    assert not missing, (f"{len(missing)} acked records not at their acked offset; "
                         f"first: {missing[:10]}")
    if idempotent:
        counts = Counter(g.value for p in got for g in got[p])
        dups = [v for v, c in counts.items() if c > 1]
        assert not dups, f"idempotent producer: {len(dups)} duplicated values, e.g. {dups[:5]}"
    return got


def run_loop_with_restart(agent, kill: bool, idempotent: bool, parallel: bool = True):
    t = unique("crash")
    ck_create_topics(agent.bootstrap, {t: PARTITIONS})
    conf = {"enable.idempotence": True} if idempotent else {}
    loop = ProducerLoop(agent.bootstrap, t, conf)
    loop.start()
    try:
        wait_until(lambda: loop.n_acked() >= ACKED_BEFORE_STOP or loop.exc, WAIT_S,
                   "acks before the restart", agent)
        assert loop.exc is None, loop.exc
        if kill:
            agent.kill9()
        else:
            rc = agent.stop()
            assert rc in (0, -15, 143), f"agent exit code after SIGTERM: {rc}"
        acked_at_stop = loop.n_acked()
        time.sleep(0.5)  # let the producer notice the outage
        agent.start()
        wait_until(lambda: loop.n_acked() >= acked_at_stop + ACKED_AFTER_RESTART or loop.exc,
                   WAIT_S, "acks after the restart", agent)
        assert loop.exc is None, loop.exc
    finally:
        loop.stop()
        loop.join(200)
    assert not loop.is_alive(), "producer loop did not finish"
    assert loop.exc is None, loop.exc
    assert loop.remaining == 0, f"{loop.remaining} messages undelivered at the end"
    with loop.lock:
        acked = list(loop.acked)
        failed = list(loop.failed)
    # Every message got a delivery report. With a 180 s message timeout and
    # unlimited retries the client never has to give up on a message, so any
    # failed delivery means the agent answered with a non-retriable error
    # after the restart (e.g. lost idempotent-producer state).
    assert len(acked) + len(failed) == loop.sent
    assert not failed, f"{len(failed)} deliveries failed, first: {failed[:5]}"
    assert len(acked) > acked_at_stop, "nothing acknowledged after the restart"
    got = verify_log(agent.bootstrap, t, acked, idempotent, fillers=kill and parallel)
    return t, acked, failed, got


@pytest.mark.parametrize("idempotent,parallel", [(False, True), (True, True), (True, False)],
                         ids=["plain", "idempotent", "idempotent-serial"])
def test_kill9_during_produce_loop(agent_factory, monkeypatch, idempotent, parallel):
    # Parallel persistence is the default; the serial path (clusters use it) keeps a crash test.
    monkeypatch.setenv("WEIR_PRODUCE_PARALLEL_PERSISTENCE", str(parallel).lower())
    run_loop_with_restart(agent_factory(), kill=True, idempotent=idempotent, parallel=parallel)


def test_sigterm_during_produce_loop(agent):
    run_loop_with_restart(agent, kill=False, idempotent=False)


@pytest.mark.parametrize("kill", [True, False], ids=["kill9", "sigterm"])
def test_restart_keeps_topics_and_offsets_continue(agent, kill):
    """Acked data and topic metadata survive; offsets continue after the old
    high watermark (never reused)."""
    t = unique("restart")
    ck_create_topics(agent.bootstrap, {t: (3, {"retention.ms": 86_400_000})})
    first = [Rec(t, i % 3, f"k{i}".encode(), f"before-{i}".encode()) for i in range(300)]
    acked1 = ck_produce(agent.bootstrap, first)
    agent.restart(kill=kill)
    wait_topic(agent.bootstrap, t, 3)
    wm = ck_watermarks(agent.bootstrap, t, range(3))
    assert wm == {p: (0, 100) for p in range(3)}, wm
    second = [Rec(t, i % 3, f"k{i}".encode(), f"after-{i}".encode()) for i in range(150)]
    acked2 = ck_produce(agent.bootstrap, second)
    for p in range(3):
        offs = [a.offset for a in acked2 if a.partition == p]
        assert offs == list(range(100, 150)), f"partition {p}: offsets after restart {offs}"
    agent.restart(kill=kill)
    got = ck_consume(agent.bootstrap, t, range(3))
    assert_dense(got, t)
    assert_acked_present(acked1 + acked2, got)
    assert sum(len(v) for v in got.values()) == 450


def test_repeated_kill9_with_nothing_in_flight(agent):
    """Several crash/restart cycles in a row, each adding a little data."""
    t = unique("rekill")
    ck_create_topics(agent.bootstrap, {t: 1})
    acked = []
    for cycle in range(4):
        acked += ck_produce(agent.bootstrap,
                            [Rec(t, 0, None, f"c{cycle}-{i}".encode()) for i in range(25)])
        agent.kill9()
        agent.start()
    got = ck_consume(agent.bootstrap, t, [0])
    assert_dense(got, t)
    assert [a.offset for a in acked] == list(range(100))
    assert_acked_present(acked, got)
