"""Client helpers for the Weir end-to-end tests.

Three clients: confluent-kafka (librdkafka 2.x), kafka-python (pure Python)
and kcat (Debian's, librdkafka 2.0.2). These helpers' consumers use assign()
with explicit partitions and read up to the high watermark taken before
reading; consumer groups are exercised in test_groups.py.

Every wait here is bounded; none asserts on wall-clock durations.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError,
                             Producer, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

FLUSH_TIMEOUT_S = 60.0
CONSUME_TIMEOUT_S = 60.0
ADMIN_TIMEOUT_S = 30.0

Header = tuple  # (str, bytes | None)


def poll_until(pred, timeout: float, interval: float = 0.05) -> bool:
    """Polls `pred` every `interval` seconds until it holds (True) or `timeout` seconds passed
    (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False


def wait_until(pred, timeout: float, what: str) -> None:
    """Polls `pred` every 50 ms until it holds, or fails after `timeout` seconds."""
    if not poll_until(pred, timeout):
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Rec:
    """A record to produce. partition=None lets the client's partitioner pick."""
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple = ()
    timestamp: int | None = None


@dataclass(frozen=True)
class Got:
    """A record as read back by a consumer."""
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()
    timestamp: int | None = None


@dataclass
class Acked:
    rec: Rec
    partition: int
    offset: int


def norm_headers(h) -> tuple:
    if not h:
        return ()
    out = []
    for k, v in h:
        if isinstance(k, bytes):
            k = k.decode()
        out.append((k, None if v is None else bytes(v)))
    return tuple(out)


# ===================================================================== admin

def ck_admin(bootstrap: str, **conf) -> AdminClient:
    # Metadata from the admin client never auto-creates unless a test asks for
    # it (librdkafka warns that this is a consumer property, but honours it
    # for list_topics()).
    c = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 30000,
         "allow.auto.create.topics": False, "log.connection.close": False}
    c.update(conf)
    return AdminClient(c)


def ck_create_topics(bootstrap: str, topics: dict, timeout: float = ADMIN_TIMEOUT_S) -> None:
    """topics: {name: partitions} or {name: (partitions, {config})}. Raises on error
    and waits until metadata shows every topic with all its partitions led by a broker."""
    admin = ck_admin(bootstrap)
    new = []
    for name, spec in topics.items():
        parts, cfg = (spec, {}) if isinstance(spec, int) else spec
        new.append(NewTopic(name, num_partitions=parts, replication_factor=1,
                            config={k: str(v) for k, v in cfg.items()}))
    futs = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    for name, f in futs.items():
        f.result(timeout=timeout + 5)
    for name, spec in topics.items():
        parts = spec if isinstance(spec, int) else spec[0]
        wait_topic(bootstrap, name, parts, admin=admin)


def wait_topic(bootstrap: str, topic: str, partitions: int, admin: AdminClient | None = None,
               timeout: float = ADMIN_TIMEOUT_S):
    """Wait until Metadata shows `topic` with `partitions` partitions, each with a leader."""
    admin = admin or ck_admin(bootstrap)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=10)
        t = md.topics.get(topic)
        last = t
        if t is not None and t.error is None and len(t.partitions) == partitions and \
                all(p.leader >= 0 and p.error is None for p in t.partitions.values()):
            return t
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} not ready with {partitions} partitions: {last!r} "
                         f"(error={getattr(last, 'error', None)}, "
                         f"partitions={sorted(getattr(last, 'partitions', {}) or {})})")


def ck_watermarks(bootstrap: str, topic: str, partitions, conf=None) -> dict:
    """{partition: (low, high)} via ListOffsets (earliest/latest)."""
    c = ck_consumer(bootstrap, conf)
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
                for p in partitions}
    finally:
        c.close()


def wait_readable(bootstrap: str, topic: str, last: dict, timeout: float) -> bool:
    """Polls until every partition's high watermark is above `last[partition]` (the highest
    acknowledged offset): with parallel persistence a pending file below it holds readers until
    the resolver settles it. False if `timeout` seconds passed first."""
    def readable() -> bool:
        marks = ck_watermarks(bootstrap, topic, list(last))
        return all(marks[p][1] > offset for p, offset in last.items())

    return poll_until(readable, timeout, interval=0.2)


# ========================================================= confluent-kafka

def ck_producer(bootstrap: str, conf=None) -> Producer:
    c = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "acks": "all",
        "message.timeout.ms": 60000,
        "socket.timeout.ms": 30000,
        "log.connection.close": False,
    }
    c.update(conf or {})
    return Producer(c)


def ck_produce(bootstrap: str, recs, conf=None, flush_timeout: float = FLUSH_TIMEOUT_S,
               producer: Producer | None = None) -> list:
    """Produce `recs` with confluent-kafka; return [Acked] in production order.
    Raises AssertionError listing every failed delivery."""
    p = producer or ck_producer(bootstrap, conf)
    results: list = [None] * len(recs)

    def make_cb(i):
        def cb(err, msg):
            results[i] = (err, msg.partition() if msg is not None else None, msg.offset() if msg is not None else None)
        return cb

    for i, r in enumerate(recs):
        kw = {"value": r.value, "key": r.key, "on_delivery": make_cb(i)}
        if r.partition is not None:
            kw["partition"] = r.partition
        if r.headers:
            kw["headers"] = list(r.headers)
        if r.timestamp is not None:
            kw["timestamp"] = r.timestamp
        for _ in range(10_000):  # bounded retry on a full local queue
            try:
                p.produce(r.topic, **kw)
                break
            except BufferError:
                p.poll(0.05)
        else:
            raise AssertionError("local producer queue stayed full")
        p.poll(0)
    remaining = p.flush(flush_timeout)
    assert remaining == 0, f"{remaining} messages still undelivered after {flush_timeout}s flush"
    errors = [(i, r) for i, r in enumerate(results) if r is None or r[0] is not None]
    assert not errors, f"{len(errors)} deliveries failed, first: {errors[:5]}"
    acks_zero = str((conf or {}).get("acks", "all")) == "0"
    missing = [(i, r) for i, r in enumerate(results) if not acks_zero and (r[2] is None or r[2] < 0)]
    assert not missing, f"{len(missing)} deliveries without offset, first: {missing[:5]}"
    return [Acked(rec, part, off) for rec, (_, part, off) in zip(recs, results)]


def ck_consumer(bootstrap: str, conf=None) -> Consumer:
    c = {
        "bootstrap.servers": bootstrap,
        # librdkafka wants a group.id even for assign()-only consumers; with no
        # commits and no subscribe() no group API is used.
        "group.id": "weir-e2e-" + uuid.uuid4().hex[:8],
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "socket.timeout.ms": 30000,
        "log.connection.close": False,
    }
    c.update(conf or {})
    return Consumer(c)


def _msg_to_got(m) -> Got:
    ts_type, ts = m.timestamp()
    return Got(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
               norm_headers(m.headers()), ts if ts_type != 0 else None)


def ck_consume(bootstrap: str, topic: str, partitions, conf=None,
               timeout: float = CONSUME_TIMEOUT_S, start=OFFSET_BEGINNING,
               until: dict | None = None) -> dict:
    """Read every partition from `start` up to its high watermark (taken before
    reading, or `until[p]`). Returns {partition: [Got]} in offset order."""
    partitions = list(partitions)
    c = ck_consumer(bootstrap, conf)
    try:
        if until is None:
            until = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30,
                                                cached=False)[1] for p in partitions}
        out = {p: [] for p in partitions}
        todo = {p for p in partitions if until[p] > (0 if start == OFFSET_BEGINNING else start)}
        c.assign([TopicPartition(topic, p, start) for p in partitions])
        deadline = time.monotonic() + timeout
        errors = []
        while todo and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    e = m.error()
                    if e.code() == KafkaError._PARTITION_EOF:
                        continue
                    # transient client-side events (e.g. a reconnect) are
                    # informational; anything fatal or a partition error is not
                    if e.fatal() or m.partition() is not None and m.partition() >= 0 \
                            and e.code() >= 0:
                        raise AssertionError(f"consumer error: {e} (partition {m.partition()})")
                    errors.append(str(e))
                    continue
                p = m.partition()
                if m.offset() < until[p]:
                    out[p].append(_msg_to_got(m))
                if m.offset() + 1 >= until[p]:
                    todo.discard(p)
        assert not todo, (f"timed out reading {topic}: partitions {sorted(todo)} short; "
                          f"got {{p: n}}={ {p: len(v) for p, v in out.items()} }, "
                          f"wanted up to {until}; client errors: {errors[-5:]}")
        return out
    finally:
        c.close()


# ============================================================ kafka-python

def kp_producer(bootstrap: str, conf=None):
    from kafka import KafkaProducer
    c = dict(bootstrap_servers=bootstrap, linger_ms=5, acks="all",
             request_timeout_ms=30000, max_block_ms=60000)
    c.update(conf or {})
    return KafkaProducer(**c)


def kp_produce(bootstrap: str, recs, conf=None, flush_timeout: float = FLUSH_TIMEOUT_S) -> list:
    p = kp_producer(bootstrap, conf)
    try:
        futs = []
        for r in recs:
            futs.append(p.send(r.topic, value=r.value, key=r.key,
                               headers=list(r.headers) if r.headers else None,
                               partition=r.partition, timestamp_ms=r.timestamp))
        p.flush(timeout=flush_timeout)
        acked, errors = [], []
        for r, f in zip(recs, futs):
            try:
                md = f.get(timeout=flush_timeout)
                acked.append(Acked(r, md.partition, md.offset))
            except Exception as e:  # noqa: BLE001
                errors.append((r, repr(e)))
        assert not errors, f"{len(errors)} kafka-python sends failed, first: {errors[:3]}"
        return acked
    finally:
        p.close(timeout=10)


def kp_consumer(bootstrap: str, conf=None):
    from kafka import KafkaConsumer
    c = dict(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
             auto_offset_reset="earliest", request_timeout_ms=30000)
    c.update(conf or {})
    return KafkaConsumer(**c)


def kp_consume(bootstrap: str, topic: str, partitions, conf=None,
               timeout: float = CONSUME_TIMEOUT_S) -> dict:
    from kafka import TopicPartition as KTP
    partitions = list(partitions)
    c = kp_consumer(bootstrap, conf)
    try:
        tps = [KTP(topic, p) for p in partitions]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps, timeout_ms=30000)
        until = {tp.partition: ends[tp] for tp in tps}
        out = {p: [] for p in partitions}
        todo = {p for p in partitions if until[p] > 0}
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            batches = c.poll(timeout_ms=500, max_records=1000)
            for tp, msgs in batches.items():
                for m in msgs:
                    if m.offset < until[tp.partition]:
                        out[tp.partition].append(Got(
                            m.topic, m.partition, m.offset, m.key, m.value,
                            norm_headers(m.headers), m.timestamp))
            for p in list(todo):
                if c.position(KTP(topic, p), timeout_ms=10000) >= until[p]:
                    todo.discard(p)
        assert not todo, (f"kafka-python timed out reading {topic}: partitions {sorted(todo)} "
                          f"short; got { {p: len(v) for p, v in out.items()} }, wanted {until}")
        return out
    finally:
        c.close()


# ==================================================================== kcat

def kcat_env() -> dict:
    env = dict(os.environ)
    env.pop("KCAT_CONFIG", None)
    return env


def kcat_run(kcat: str, args, input_bytes: bytes | None = None, timeout: float = 90.0):
    cmd = [kcat, "-X", "socket.timeout.ms=30000", *args]
    r = subprocess.run(cmd, input=input_bytes, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout, env=kcat_env())
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\n"
                             f"stderr:\n{r.stderr.decode(errors='replace')[-5000:]}")
    return r


def kcat_produce(kcat: str, bootstrap: str, topic: str, partition: int, kvs,
                 headers=()) -> None:
    """kvs: [(key|None, value|None)] as ASCII bytes without ':' or newline.
    With -K: -Z, an empty key or value is sent as NULL."""
    lines = []
    for k, v in kvs:
        for part in (k, v):
            assert part is None or (b":" not in part and b"\n" not in part and part != b"")
        lines.append((k or b"") + b":" + (v or b""))
    args = ["-P", "-b", bootstrap, "-t", topic, "-p", str(partition), "-K", ":", "-Z",
            "-X", "acks=all", "-X", "message.timeout.ms=60000"]
    for hk, hv in headers:
        args += ["-H", f"{hk}={hv.decode()}"]
    r = kcat_run(kcat, args, input_bytes=b"\n".join(lines) + b"\n")
    err = r.stderr.decode(errors="replace")
    assert "Delivery failed" not in err and "ERROR" not in err, f"kcat produce: {err[-3000:]}"


def kcat_consume(kcat: str, bootstrap: str, topic: str, partition: int) -> list:
    r = kcat_run(kcat, ["-C", "-b", bootstrap, "-t", topic, "-p", str(partition),
                        "-o", "beginning", "-e", "-q", "-J"])
    out = []
    for line in r.stdout.decode().splitlines():
        line = line.strip()
        if not line:
            continue
        j = json.loads(line)
        hdrs = j.get("headers") or []
        pairs = tuple((hdrs[i], None if hdrs[i + 1] is None else hdrs[i + 1].encode())
                      for i in range(0, len(hdrs), 2))
        enc = (lambda s: None if s is None else s.encode())
        out.append(Got(j["topic"], j["partition"], j["offset"], enc(j["key"]),
                       enc(j["payload"]), pairs, j.get("ts")))
    return out


def kcat_metadata(kcat: str, bootstrap: str, topic: str | None = None,
                  auto_create: bool = False) -> dict:
    args = ["-L", "-b", bootstrap, "-J",
            "-X", f"allow.auto.create.topics={'true' if auto_create else 'false'}"]
    if topic:
        args += ["-t", topic]
    return json.loads(kcat_run(kcat, args).stdout.decode())


# ============================================================= verification

def assert_dense(got_by_partition: dict, topic: str = "") -> None:
    """Offsets of each partition are exactly 0..n-1."""
    for p, got in got_by_partition.items():
        offs = [g.offset for g in got]
        assert offs == list(range(len(offs))), \
            f"{topic}[{p}]: offsets not dense from 0: {offs[:20]}...(n={len(offs)})"


def assert_acked_present(acked, got_by_partition: dict, check_ts: bool = True,
                         check_headers: bool = True) -> None:
    """Every acked record is readable at its acked offset with identical content."""
    problems = []
    # By offset, not position: with parallel persistence an aborted file's offsets hold empty
    # batches, which consumers step over (RFC 0006).
    by_offset = {p: {g.offset: g for g in got} for p, got in got_by_partition.items()}
    for a in acked:
        g = by_offset.get(a.partition, {}).get(a.offset)
        if g is None:
            problems.append(f"[{a.partition}]@{a.offset}: missing")
            continue
        r = a.rec
        if g.key != r.key:
            problems.append(f"[{a.partition}]@{a.offset}: key {g.key!r} != {r.key!r}")
        if g.value != r.value:
            problems.append(f"[{a.partition}]@{a.offset}: value {g.value!r:.80} != {r.value!r:.80}")
        if check_headers and tuple(g.headers) != tuple(r.headers):
            problems.append(f"[{a.partition}]@{a.offset}: headers {g.headers!r} != {r.headers!r}")
        if check_ts and r.timestamp is not None and g.timestamp != r.timestamp:
            problems.append(f"[{a.partition}]@{a.offset}: ts {g.timestamp} != {r.timestamp}")
    assert not problems, f"{len(problems)} mismatches, first: " + "; ".join(problems[:10])
