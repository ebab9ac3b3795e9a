"""Resource limits under load (BAD-1: never unbounded memory).

Many connections, slow readers that never drain their sockets, and clients asking for the largest
fetches they can. Each test starts the agent with small explicit limits (environment
`WEIR_<SECTION>_<KEY>`), measures its peak resident memory (VmHWM, the kernel's high-water mark of
RSS) and asserts that what the scenario added stays below a bound derived from those limits, while
real confluent-kafka clients keep working. Figures are printed as JSON lines (`-s` shows them).

Nothing here asserts on durations; every wait is bounded on its own.
"""

from __future__ import annotations

import json
import resource
import socket
from pathlib import Path

import pytest

import kafka_raw as raw
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, ck_producer, unique, wait_until)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# The limits every test here runs with. The request budget cannot be below max_frame_bytes (the
# agent clamps it up), so the frame limit is lowered too; 8 MiB still fits any produce request
# of the producers below (message.max.bytes 1 MB).
MAX_FETCH_BYTES = 8 * MiB            # kafka.max_fetch_bytes
MAX_FRAME_BYTES = 8 * MiB            # kafka.max_frame_bytes
INFLIGHT_BYTES = 32 * MiB            # kafka.max_inflight_request_bytes
# Fetch responses held in memory (built, or waiting for a socket to drain) have their own
# agent-wide budget; a fetch takes at most what is free of it, but always at least its first
# batch (KIP-74), so the worst case is the budget plus two copies (records and encoded frame) of
# one batch per connection with a fetch in flight.
FETCH_BUDGET = 32 * MiB              # kafka.max_inflight_fetch_bytes
CACHE_BYTES = 16 * MiB               # storage.cache_bytes
LIMIT_ENV = {
    "WEIR_KAFKA_MAX_FETCH_BYTES": MAX_FETCH_BYTES,
    "WEIR_KAFKA_MAX_FRAME_BYTES": MAX_FRAME_BYTES,
    "WEIR_KAFKA_MAX_INFLIGHT_REQUEST_BYTES": INFLIGHT_BYTES,
    "WEIR_KAFKA_MAX_INFLIGHT_FETCH_BYTES": FETCH_BUDGET,
    "WEIR_STORAGE_CACHE_BYTES": CACHE_BYTES,
    # glibc raises its mmap threshold (up to 32 MiB) after the first large free, and from then
    # on keeps freed multi-MiB buffers in per-thread arenas: RSS then follows the allocator's
    # retention policy rather than the agent's live memory (by 30-50 MiB in these scenarios). A
    # fixed threshold (glibc's own initial 128 KiB) returns large buffers to the kernel when they
    # are freed, so peak RSS measures what the agent holds, which is what the limits bound.
    "MALLOC_MMAP_THRESHOLD_": 128 * KiB,
}

# The producer that fills topics: 1 KiB values in batches of at most 64 KiB (librdkafka
# batch.size), so one batch is small next to the fetch budget.
VALUE_BYTES = 1 * KiB
MAX_BATCH_BYTES = 64 * KiB + 4 * KiB   # batch.size plus the batch and record headers
FILL_CONF = {"batch.size": 64 * KiB, "linger.ms": 5, "compression.type": "none",
             "queue.buffering.max.kbytes": 64 * 1024}

# Allocator and runtime noise on top of the scenario's own bound: small allocations kept in
# glibc arenas, tokio's blocking threads (file I/O), the control plane's state.
SLACK_BYTES = 32 * MiB


def memory_kib(agent) -> dict:
    """VmRSS and VmHWM (peak RSS) of the agent, in KiB."""
    assert agent.alive(), f"agent died (exit code {agent.proc.returncode})"
    status = Path(f"/proc/{agent.pid}/status").read_text()
    values = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(value.split()[0])
    return values


def report(scenario: str, **figures) -> None:
    print(json.dumps({"scenario": scenario, **figures}, sort_keys=True))


def limited_agent(agent_factory, monkeypatch, **extra_env):
    for key, value in {**LIMIT_ENV, **extra_env}.items():
        monkeypatch.setenv(key, str(value))
    return agent_factory()




def fill(bootstrap: str, topic: str, total_bytes: int) -> list:
    """Produces `total_bytes` of 1 KiB values to partition 0; returns the acks."""
    count = total_bytes // VALUE_BYTES
    recs = [Rec(topic, 0, None, f"{i:09d}".encode().ljust(VALUE_BYTES, b".")) for i in range(count)]
    return ck_produce(bootstrap, recs, conf=FILL_CONF, flush_timeout=120)


def check_topic(bootstrap: str, topic: str, acked: list, conf=None) -> None:
    got = ck_consume(bootstrap, topic, [0], conf=conf, timeout=120)
    assert_dense(got, topic)
    assert len(got[0]) == len(acked), f"{topic}: read {len(got[0])} records, acked {len(acked)}"
    assert_acked_present(acked, got, check_ts=False, check_headers=False)


def real_clients_work(bootstrap: str, tag: str) -> None:
    """A confluent-kafka producer and consumer round trip on a fresh topic."""
    topic = unique(f"limits-{tag}")
    ck_create_topics(bootstrap, {topic: 1})
    recs = [Rec(topic, 0, f"k{i}".encode(), f"{tag}-{i}".encode()) for i in range(500)]
    acked = ck_produce(bootstrap, recs)
    check_topic(bootstrap, topic, acked)


def api_versions_answered(sock: socket.socket, corr_id: int) -> bool:
    """Sends ApiVersions v0; True if answered, False if the agent closed the connection."""
    try:
        err, _ = raw.api_versions_v0(sock, corr_id=corr_id)
    except (raw.Closed, ConnectionResetError, BrokenPipeError):
        return False
    assert err == 0, f"ApiVersions error {err}"
    return True


# ------------------------------------------------------------------ many connections

IDLE_CONNECTIONS = 2000
ACTIVE_CONNECTIONS = 300
MAX_CONNECTIONS = 2400
# What one open connection may cost the agent: its reader and writer tasks, the response queue
# and the request buffers of a small request. Measured at ~5 KiB; kernel socket buffers are not
# part of the process's RSS.
PER_CONNECTION_BYTES = 16 * KiB


# Open files this module needs in the test process and in the agent it starts (which inherits the
# limit): ~2,450 sockets each, plus the agent's own files and the clients' threads' descriptors.
NEEDED_OPEN_FILES = 8192


@pytest.fixture(autouse=True, scope="module")
def enough_open_files():
    """Raises RLIMIT_NOFILE for this process (and so for the agents it starts) to
    NEEDED_OPEN_FILES, also the hard limit where allowed (root); restores it afterwards. Fails,
    with what to do, where the limit cannot be raised: the tests must not depend on the machine's
    default (often 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= NEEDED_OPEN_FILES:
        yield
        return
    new_hard = hard if hard == resource.RLIM_INFINITY or hard >= NEEDED_OPEN_FILES \
        else NEEDED_OPEN_FILES
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NEEDED_OPEN_FILES, new_hard))
    except (ValueError, OSError) as e:
        pytest.fail(f"test_limits.py needs {NEEDED_OPEN_FILES} open files; the limit is {soft} "
                    f"(hard {hard}) and raising it failed ({e}): run as root or raise the hard "
                    f"limit (ulimit -Hn {NEEDED_OPEN_FILES})", pytrace=False)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, new_hard))


def test_many_connections_then_real_clients(agent_factory, monkeypatch):
    agent = limited_agent(agent_factory, monkeypatch, WEIR_KAFKA_MAX_CONNECTIONS=MAX_CONNECTIONS)
    raw.check_api_versions(agent.bootstrap)
    start = memory_kib(agent)
    sockets: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sockets.append(raw.connect(agent.bootstrap))
        active = [raw.connect(agent.bootstrap) for _ in range(ACTIVE_CONNECTIONS)]
        sockets += active
        for i, s in enumerate(active):
            s.sendall(raw.request(raw.API_VERSIONS, 0, 10_000 + i, b""))
        for i, s in enumerate(active):
            r = raw.Reader(raw.recv_frame(s))
            assert r.i32() == 10_000 + i
            err, keys = raw.parse_api_versions_v0(r)
            assert err == 0 and raw.API_FETCH in keys
        # Every idle connection is still served: ask a sample of them.
        for i, s in enumerate(sockets[:IDLE_CONNECTIONS:100]):
            assert api_versions_answered(s, 20_000 + i), "an idle connection was dropped"
        held = memory_kib(agent)
        real_clients_work(agent.bootstrap, "conns")

        # Beyond max_connections the agent refuses (closes) new connections and stays healthy.
        answered = refused = 0
        extra = []
        for i in range(MAX_CONNECTIONS - len(sockets) + 50):
            s = raw.connect(agent.bootstrap)
            extra.append(s)
            if api_versions_answered(s, 30_000 + i):
                answered += 1
            else:
                refused += 1
        sockets += extra
        assert refused > 0, f"no connection refused with {len(sockets)} open and a limit of " \
                            f"{MAX_CONNECTIONS}"
        assert len(sockets) - refused <= MAX_CONNECTIONS
        assert "connection limit reached" in agent.log_text()
        end = memory_kib(agent)
    finally:
        for s in sockets:
            s.close()
    # Closed connections free their slots.
    wait_until(lambda: _fresh_connection_answered(agent), 30, "a connection after closing all")
    real_clients_work(agent.bootstrap, "after-conns")

    growth = end["VmHWM"] - start["VmRSS"]
    bound = (MAX_CONNECTIONS * PER_CONNECTION_BYTES + INFLIGHT_BYTES + SLACK_BYTES) // KiB
    report("many-connections", connections=len(sockets) - refused, refused=refused,
           rss_start_kib=start["VmRSS"], rss_with_connections_kib=held["VmRSS"],
           peak_rss_kib=end["VmHWM"], growth_kib=growth, bound_kib=bound)
    # Bound: every connection up to the limit at PER_CONNECTION_BYTES, plus the request budget
    # (the real clients' requests), plus allocator slack.
    assert growth <= bound, f"peak RSS grew by {growth} KiB, bound {bound} KiB"


def _fresh_connection_answered(agent) -> bool:
    with raw.connect(agent.bootstrap) as s:
        return api_versions_answered(s, 4242)


# ------------------------------------------------------------------ slow readers

SLOW_READERS = 100
FETCHES_PER_SLOW_READER = 3
HUGE = 2 * GiB - 1          # the largest max_bytes a Fetch request can carry (int32)
FILL_BYTES = 64 * MiB


def fetch_v4_frame(topic: str, offset: int, corr_id: int, max_bytes: int = HUGE) -> bytes:
    body = (raw.i32(-1) + raw.i32(500) + raw.i32(1) + raw.i32(max_bytes) + raw.i8(0) +
            raw.i32(1) + raw.string(topic) + raw.i32(1) + raw.i32(0) + raw.i64(offset) +
            raw.i32(max_bytes))
    return raw.request(raw.API_FETCH, 4, corr_id, body)


def slow_reader(addr: str, frames: list) -> socket.socket:
    """A connection with a tiny receive buffer that sends `frames` and never reads."""
    host, port = addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KiB)
    s.settimeout(30)
    s.connect((host, int(port)))
    s.sendall(b"".join(frames))
    return s


def response_started(s: socket.socket) -> bool:
    """Whether the agent has started writing a response to `s` (bytes wait in its buffer)."""
    try:
        return len(s.recv(4, socket.MSG_PEEK | socket.MSG_DONTWAIT)) == 4
    except BlockingIOError:
        return False


def test_slow_readers_do_not_pin_unbounded_memory(agent_factory, monkeypatch):
    agent = limited_agent(agent_factory, monkeypatch)
    topic = unique("slow")
    ck_create_topics(agent.bootstrap, {topic: 1})
    acked = fill(agent.bootstrap, topic, FILL_BYTES)
    after_fill = memory_kib(agent)
    readers = []
    try:
        for i in range(SLOW_READERS):
            # Different offsets, so that the responses are different data.
            offset = (i * 97) % (len(acked) // 2)
            frames = [fetch_v4_frame(topic, offset, 100 * i + j)
                      for j in range(FETCHES_PER_SLOW_READER)]
            readers.append(slow_reader(agent.bootstrap, frames))
        # Every slow reader has a response built and stuck in its socket.
        wait_until(lambda: all(response_started(s) for s in readers), 60,
                   "every slow reader's first fetch response")
        pinned = memory_kib(agent)
        # Real clients work meanwhile: the whole topic reads back, a producer is answered.
        check_topic(agent.bootstrap, topic, acked)
        real_clients_work(agent.bootstrap, "slow")
        during = memory_kib(agent)
        agent.check_still_running()
    finally:
        for s in readers:
            s.close()
    real_clients_work(agent.bootstrap, "after-slow")

    growth = during["VmHWM"] - after_fill["VmRSS"]
    # Bound on what the scenario may add: the fetch-response budget, plus two copies of one batch
    # per slow reader (the KIP-74 first batch a fetch gets even when the budget is used up), plus
    # the request budget (the real clients), plus allocator slack. The read cache was already
    # full after the fill. Without a fetch budget every slow reader pins a whole
    # max_fetch_bytes response: 100 x 8 MiB.
    bound = (FETCH_BUDGET + SLOW_READERS * 2 * MAX_BATCH_BYTES + INFLIGHT_BYTES
             + SLACK_BYTES) // KiB
    report("slow-readers", slow_readers=SLOW_READERS, rss_after_fill_kib=after_fill["VmRSS"],
           peak_after_fill_kib=after_fill["VmHWM"], rss_pinned_kib=pinned["VmRSS"],
           peak_rss_kib=during["VmHWM"], growth_kib=growth, bound_kib=bound,
           unbounded_would_be_kib=SLOW_READERS * MAX_FETCH_BYTES // KiB)
    assert growth <= bound, f"peak RSS grew by {growth} KiB with {SLOW_READERS} slow readers, " \
                            f"bound {bound} KiB"


# ------------------------------------------------------------------ huge client fetches

HUGE_FETCH_CONF = {
    # librdkafka's maxima (fetch.max.bytes <= 2147483135, max.partition.fetch.bytes <= 1e9), and
    # the receive buffer must exceed fetch.max.bytes.
    "fetch.max.bytes": 2147483135,
    "max.partition.fetch.bytes": 1000000000,
    "receive.message.max.bytes": 2147483647,
}
HUGE_FETCH_CONSUMERS = 3


def test_huge_fetch_sizes_from_real_clients(agent_factory, monkeypatch):
    agent = limited_agent(agent_factory, monkeypatch)
    topic = unique("hugefetch")
    ck_create_topics(agent.bootstrap, {topic: 1})
    acked = fill(agent.bootstrap, topic, FILL_BYTES)
    after_fill = memory_kib(agent)
    for _ in range(HUGE_FETCH_CONSUMERS):
        check_topic(agent.bootstrap, topic, acked, conf=HUGE_FETCH_CONF)
    end = memory_kib(agent)
    agent.check_still_running()
    growth = end["VmHWM"] - after_fill["VmRSS"]
    # One consumer at a time with one fetch in flight: a response is at most max_fetch_bytes
    # whatever the client asks, held as two copies (records, then the encoded frame) charged to
    # the response budget, plus the storage range it was copied from (at most as large again);
    # plus allocator slack.
    bound = (min(FETCH_BUDGET, 2 * MAX_FETCH_BYTES) + MAX_FETCH_BYTES + SLACK_BYTES) // KiB
    report("huge-client-fetches", consumers=HUGE_FETCH_CONSUMERS,
           rss_after_fill_kib=after_fill["VmRSS"], peak_rss_kib=end["VmHWM"],
           growth_kib=growth, bound_kib=bound)
    assert growth <= bound, f"peak RSS grew by {growth} KiB, bound {bound} KiB"


# ------------------------------------------------------------------ idle connections

IDLE = "2s"  # kafka.connections_max_idle for this test (must exceed kafka.max_fetch_wait)


def test_idle_connections_are_closed_and_clients_reconnect(agent_factory, monkeypatch):
    """kafka.connections_max_idle: a connection that sends nothing is closed by the agent, and
    a real producer whose connection was closed while it was quiet reconnects transparently."""
    agent = limited_agent(agent_factory, monkeypatch, WEIR_KAFKA_CONNECTIONS_MAX_IDLE=IDLE,
                          WEIR_KAFKA_MAX_FETCH_WAIT="1s", RUST_LOG="info,weir_server=debug")
    quiet = raw.connect(agent.bootstrap)
    try:
        quiet.settimeout(30)
        try:
            data = quiet.recv(1)
        except ConnectionResetError:
            data = b""
        assert data == b"", "the agent answered a connection that sent nothing"
    finally:
        quiet.close()

    topic = unique("limits-idle")
    ck_create_topics(agent.bootstrap, {topic: 1})
    producer = ck_producer(agent.bootstrap, {"enable.idempotence": True})

    def idle_closes() -> int:
        return agent.log_text().count("no request for the idle period")

    delivered = []

    def produce(tag: str) -> None:
        for i in range(100):
            producer.produce(topic, f"{tag}-{i}".encode(), partition=0,
                             on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(60) == 0

    produce("before")
    before = idle_closes()
    # The agent closes the producer's connections once they have been quiet for the idle period.
    wait_until(lambda: idle_closes() >= before + 2, 30, "the agent to close the quiet producer")
    produce("after")
    assert len(delivered) == 200 and all(err is None for err in delivered), delivered[:3]
    got = ck_consume(agent.bootstrap, topic, [0])
    values = [g.value for g in got[0]]
    assert values == [f"before-{i}".encode() for i in range(100)] + \
        [f"after-{i}".encode() for i in range(100)]
