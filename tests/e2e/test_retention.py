"""Log start moves: DeleteRecords (API 21), retention by time and by size, and the deleter that
removes swept files from every ingest bucket (RFC 0003 §3, §5).

Every record is its own batch and file (one produce per flush, linger 0), so offsets map to
files one to one. Waits poll with a deadline; nothing asserts how long anything took."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

import kafka_raw as raw
from test_buckets import bucket_layout
from weirtest import (Rec, ck_admin, ck_consume, ck_consumer, ck_create_topics, ck_produce,
                      ck_producer, ck_watermarks, kp_consumer, now_ms, unique, wait_until)

WAIT_S = 60.0
N = 10


def produce_separately(bootstrap: str, topic: str, values, partition: int = 0,
                       timestamp: int | None = None) -> list[int]:
    """One produce and flush per value: each becomes its own batch (and file). Offsets."""
    producer = ck_producer(bootstrap, {"linger.ms": 0})
    offsets = []
    for value in values:
        (acked,) = ck_produce(bootstrap, [Rec(topic, partition, None, value, (), timestamp)],
                              producer=producer)
        offsets.append(acked.offset)
    return offsets


def values(prefix: str, n: int = N, start: int = 0) -> list[bytes]:
    return [f"{prefix}-{i:04d}".encode() for i in range(start, start + n)]


def low_high(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    return ck_watermarks(bootstrap, topic, [partition])[partition]


def ck_delete_many(admin, moves) -> list:
    """AdminClient.delete_records for (topic, partition, offset)s: per move, in order,
    (low watermark, None) or (None, error)."""
    tps = [TopicPartition(topic, partition, offset) for topic, partition, offset in moves]
    futures = admin.delete_records(tps, request_timeout=30, operation_timeout=30)
    out = []
    for tp in tps:
        try:
            out.append((futures[tp].result(timeout=35).low_watermark, None))
        except KafkaException as e:
            out.append((None, e.args[0]))
    return out


def ck_delete(admin, topic: str, partition: int, offset: int):
    (result,) = ck_delete_many(admin, [(topic, partition, offset)])
    return result


def test_delete_records_confluent(agent):
    """delete_records answers the low watermark; ListOffsets earliest (watermarks and
    AdminClient.list_offsets) follows it; above the high watermark → OFFSET_OUT_OF_RANGE;
    an unknown topic → UNKNOWN_TOPIC_OR_PART; OFFSET_END deletes everything."""
    t = unique("dr")
    ck_create_topics(agent.bootstrap, {t: 2})
    assert produce_separately(agent.bootstrap, t, values("a")) == list(range(N))
    produce_separately(agent.bootstrap, t, values("b"), partition=1)
    admin = ck_admin(agent.bootstrap)

    assert ck_delete(admin, t, 0, 4) == (4, None)
    assert low_high(agent.bootstrap, t) == (4, N)
    tp = TopicPartition(t, 0)
    listed = admin.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=30)[tp]
    assert listed.result(timeout=35).offset == 4
    # Lower than the current start: answered with the current start, nothing moves back.
    assert ck_delete(admin, t, 0, 2) == (4, None)

    low, error = ck_delete(admin, t, 0, N + 1)
    assert low is None and error.code() == KafkaError.OFFSET_OUT_OF_RANGE, error
    assert low_high(agent.bootstrap, t) == (4, N)

    # librdkafka looks the partitions' leaders up first: an unknown topic alone fails the whole
    # call locally (_NOENT, "No leaders found"); next to a known one it gets the broker's 3.
    (_, missing) = ck_delete_many(admin, [(t, 1, 2), (unique("dr-missing"), 0, 1)])
    assert missing[0] is None and missing[1].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, missing
    assert low_high(agent.bootstrap, t, 1) == (2, N)

    assert ck_delete(admin, t, 0, OFFSET_END) == (N, None)
    assert low_high(agent.bootstrap, t) == (N, N)
    # The other partition was not touched; the emptied one takes new records at N.
    assert low_high(agent.bootstrap, t, 1) == (2, N)
    assert produce_separately(agent.bootstrap, t, values("a", 1, N)) == [N]
    got = ck_consume(agent.bootstrap, t, [0])[0]
    assert [(g.offset, g.value) for g in got] == [(N, values("a", 1, N)[0])]


def test_delete_records_compacted_topic_is_a_policy_violation(agent):
    """As in Kafka, records of a topic with cleanup.policy=compact cannot be deleted."""
    t = unique("dr-compact")
    ck_create_topics(agent.bootstrap, {t: (1, {"cleanup.policy": "compact"})})
    ck_produce(agent.bootstrap, [Rec(t, 0, b"k", b"v")])
    low, error = ck_delete(ck_admin(agent.bootstrap), t, 0, 1)
    assert low is None and error.code() == KafkaError.POLICY_VIOLATION, error
    assert low_high(agent.bootstrap, t) == (0, 1)


def test_delete_records_kafka_python(agent):
    """KafkaAdminClient.delete_records (kafka-python): the low watermark, then the errors as
    the broker answers them (sent to the broker directly, no client-side metadata check)."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    from kafka.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError

    t = unique("dr-kp")
    ck_create_topics(agent.bootstrap, {t: 1})
    produce_separately(agent.bootstrap, t, values("k"))
    admin = KafkaAdminClient(bootstrap_servers=agent.bootstrap, request_timeout_ms=30000)
    try:
        result = admin.delete_records({KTP(t, 0): 3}, timeout_ms=30000)
        assert result[KTP(t, 0)]["low_watermark"] == 3, result
        assert low_high(agent.bootstrap, t) == (3, N)
        node = admin.describe_cluster()["brokers"][0]["broker_id"]
        with pytest.raises(OffsetOutOfRangeError):
            admin.delete_records({KTP(t, 0): N + 5}, timeout_ms=30000, partition_leader_id=node)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_records({KTP(unique("dr-kp-missing"), 0): 0}, timeout_ms=30000,
                                 partition_leader_id=node)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_records({KTP(t, 7): 0}, timeout_ms=30000, partition_leader_id=node)
        assert low_high(agent.bootstrap, t) == (3, N)
    finally:
        admin.close()


# ------------------------------------------------------------ consumers below the new start

DELETED_UP_TO = 6
BELOW_START = 2


def deleted_topic(agent, prefix: str) -> tuple[str, list[bytes]]:
    """A topic with N records of which those below DELETED_UP_TO are deleted."""
    t = unique(prefix)
    ck_create_topics(agent.bootstrap, {t: 1})
    old = values("old")
    produce_separately(agent.bootstrap, t, old)
    assert ck_delete(ck_admin(agent.bootstrap), t, 0, DELETED_UP_TO) == (DELETED_UP_TO, None)
    return t, old


def produce_until_received(agent, t: str, poll_new) -> list:
    """Produces new records one at a time until `poll_new()` returns something; all returned."""
    producer = ck_producer(agent.bootstrap, {"linger.ms": 0})
    deadline = time.monotonic() + WAIT_S
    got, i = [], 0
    while not got:
        assert time.monotonic() < deadline, "the consumer never received a new record"
        ck_produce(agent.bootstrap, [Rec(t, 0, None, f"new-{i:04d}".encode())], producer=producer)
        i += 1
        got = poll_new()
    return got


def test_confluent_consumer_below_start_resets_earliest(agent):
    t, old = deleted_topic(agent, "dr-ck-early")
    c = ck_consumer(agent.bootstrap, {"auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(t, 0, BELOW_START)])
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < N - DELETED_UP_TO and time.monotonic() < deadline:
            for m in c.consume(num_messages=100, timeout=0.5):
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value()))
        assert got == list(zip(range(DELETED_UP_TO, N), old[DELETED_UP_TO:]))
    finally:
        c.close()


def test_confluent_consumer_below_start_resets_latest(agent):
    t, _ = deleted_topic(agent, "dr-ck-late")
    c = ck_consumer(agent.bootstrap, {"auto.offset.reset": "latest"})
    try:
        c.assign([TopicPartition(t, 0, BELOW_START)])

        def poll_new():
            msgs = c.consume(num_messages=100, timeout=0.5)
            for m in msgs:
                assert m.error() is None, m.error()
            return [(m.offset(), m.value()) for m in msgs]

        got = produce_until_received(agent, t, poll_new)
        assert all(offset >= N and value.startswith(b"new-") for offset, value in got), got
    finally:
        c.close()


def kp_positioned(agent, t: str, reset: str):
    from kafka import TopicPartition as KTP
    c = kp_consumer(agent.bootstrap, {"auto_offset_reset": reset})
    tp = KTP(t, 0)
    c.assign([tp])
    c.seek(tp, BELOW_START)
    return c


def kp_records(c) -> list:
    return [(m.offset, m.value) for msgs in c.poll(timeout_ms=500).values() for m in msgs]


def test_kafka_python_consumer_below_start_resets_earliest(agent):
    t, old = deleted_topic(agent, "dr-kp-early")
    c = kp_positioned(agent, t, "earliest")
    try:
        got = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < N - DELETED_UP_TO and time.monotonic() < deadline:
            got += kp_records(c)
        assert got == list(zip(range(DELETED_UP_TO, N), old[DELETED_UP_TO:]))
    finally:
        c.close()


def test_kafka_python_consumer_below_start_resets_latest(agent):
    t, _ = deleted_topic(agent, "dr-kp-late")
    c = kp_positioned(agent, t, "latest")
    try:
        got = produce_until_received(agent, t, lambda: kp_records(c))
        assert all(offset >= N and value.startswith(b"new-") for offset, value in got), got
    finally:
        c.close()


# ------------------------------------------------------------------------------- retention

def test_retention_by_time(agent_factory, monkeypatch):
    """retention.ms=2000: the log start reaches the high watermark once the records are older;
    a new consumer from the beginning then reads only what came later (a record stamped in the
    future, which retention keeps)."""
    monkeypatch.setenv("WEIR_RETENTION_CHECK_INTERVAL", "500ms")
    agent = agent_factory()
    t = unique("ret-ms")
    ck_create_topics(agent.bootstrap, {t: (1, {"retention.ms": 2000})})
    produce_separately(agent.bootstrap, t, values("old"))
    assert low_high(agent.bootstrap, t)[1] == N
    wait_until(lambda: low_high(agent.bootstrap, t) == (N, N), WAIT_S,
               "retention to move the log start to the high watermark")
    future = now_ms() + 3_600_000
    assert produce_separately(agent.bootstrap, t, [b"kept"], timestamp=future) == [N]
    got = ck_consume(agent.bootstrap, t, [0])[0]
    assert [(g.offset, g.value) for g in got] == [(N, b"kept")]
    assert low_high(agent.bootstrap, t) == (N, N + 1)


def test_retention_defaults_are_what_describe_configs_reports(agent_factory, monkeypatch):
    """A topic without retention configs shows the agent's retention.default_ms/_bytes (what
    retention enforces on it), as defaults; the broker shows them as log.retention.*."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    monkeypatch.setenv("WEIR_RETENTION_DEFAULT_MS", "-1")
    monkeypatch.setenv("WEIR_RETENTION_DEFAULT_BYTES", "1000000")
    agent = agent_factory()
    t = unique("ret-defaults")
    ck_create_topics(agent.bootstrap, {t: 1})
    admin = ck_admin(agent.bootstrap)
    topic = ConfigResource(ResourceType.TOPIC, t)
    cfg = admin.describe_configs([topic], request_timeout=30)[topic].result(timeout=35)
    assert (cfg["retention.ms"].value, cfg["retention.ms"].is_default) == ("-1", True)
    assert (cfg["retention.bytes"].value, cfg["retention.bytes"].is_default) == ("1000000", True)
    broker = ConfigResource(ResourceType.BROKER, "1")
    bcfg = admin.describe_configs([broker], request_timeout=30)[broker].result(timeout=35)
    assert bcfg["log.retention.ms"].value == "-1"
    assert bcfg["log.retention.bytes"].value == "1000000"


def retained_batches(bootstrap: str, topic: str) -> tuple[int, list[tuple[int, int]]] | None:
    """The log start and the (base offset, bytes) of every batch from it to the high watermark
    (raw Fetch v4: the stored batches as they are, whole); None if retention moved the start
    while they were read."""
    low, high = low_high(bootstrap, topic)
    out = []
    offset = low
    with raw.connect(bootstrap) as s:
        for i in range(10_000):
            if offset >= high:
                break
            err, _, records = raw.fetch_v4(s, topic, 0, offset, corr_id=100 + i)
            if err == KafkaError.OFFSET_OUT_OF_RANGE:
                return None
            assert err == 0, f"fetch at {offset}: error {err}"
            pos = 0
            for base, count, _ in raw.iter_batch_headers(records):
                size = 12 + int.from_bytes(records[pos + 8:pos + 12], "big")
                pos += size
                if base + count > offset:
                    out.append((base, size))
                    offset = base + count
    return low, out


def test_retention_by_bytes(agent_factory, monkeypatch):
    """retention.bytes: the log start advances in whole batches and the batches kept hold at
    least retention.bytes; once retention has caught up, dropping one more would go below it
    (Kafka's rule)."""
    monkeypatch.setenv("WEIR_RETENTION_CHECK_INTERVAL", "500ms")
    agent = agent_factory()
    t = unique("ret-bytes")
    limit = 2000
    ck_create_topics(agent.bootstrap, {t: (1, {"retention.bytes": limit})})
    count = 30
    produce_separately(agent.bootstrap, t, [v + b"." * 200 for v in values("big", count)])
    seen = []

    def caught_up() -> bool:
        retained = retained_batches(agent.bootstrap, t)
        if retained is None:
            return False
        low, batches = retained
        kept = sum(size for _, size in batches)
        seen.append((low, kept))
        assert batches and batches[0][0] == low, (low, batches[:2])
        assert kept >= limit, f"retention kept {kept} bytes, below retention.bytes {limit}"
        return low > 0 and kept - batches[0][1] < limit

    wait_until(caught_up, WAIT_S, f"retention by bytes to catch up (seen {seen[-3:]})")
    assert low_high(agent.bootstrap, t)[1] == count


# ------------------------------------------------------------------- files leave the buckets

def test_deleted_files_leave_every_bucket(agent_factory, monkeypatch):
    """Three file:// ingest buckets, quorum 2, a short grace: after DeleteRecords to the middle,
    the files wholly below the start disappear from all three buckets; every file with a record
    at or above the start stays in at least the quorum, and those records read back intact."""
    monkeypatch.setenv("WEIR_GC_GRACE", "3s")
    monkeypatch.setenv("WEIR_GC_FETCH_PLAN_TTL", "1s")
    monkeypatch.setenv("WEIR_GC_INTERVAL", "500ms")
    agent = agent_factory(start=False)
    dirs, layout = bucket_layout(agent.data_dir.parent / "buckets")
    agent.start(extra_args=layout)
    t = unique("gc")
    ck_create_topics(agent.bootstrap, {t: 1})
    recs = values(f"gc-{t}")
    produce_separately(agent.bootstrap, t, recs)
    holders = files_holding(dirs, recs)
    assert set(holders) == set(range(N)), f"files found for offsets {sorted(holders)}"
    assert all(len(files) == 1 for files in holders.values()), holders
    start = N // 2
    assert ck_delete(ck_admin(agent.bootstrap), t, 0, start) == (start, None)
    swept = set().union(*(holders[o] for o in range(start)))
    kept = set().union(*(holders[o] for o in range(start, N)))
    assert not swept & kept

    def copies(name: str) -> int:
        return sum(1 for d in dirs if any((d / "ingest").rglob(name)))

    wait_until(lambda: all(copies(name) == 0 for name in swept), WAIT_S,
               "the swept files to leave all three buckets")
    # The deleter has run past the grace of every swept file; nothing else went.
    assert all(copies(name) >= 2 for name in kept), {name: copies(name) for name in kept}
    got = ck_consume(agent.bootstrap, t, [0], start=OFFSET_BEGINNING)[0]
    assert [(g.offset, g.value) for g in got] == list(zip(range(start, N), recs[start:]))


def files_holding(dirs: list[Path], recs: list[bytes]) -> dict[int, set[str]]:
    """offset → names of the data files (in any bucket) whose bytes contain that record's value.
    Records are produced uncompressed, so each value appears verbatim in its file."""
    holders: dict[int, set[str]] = {}
    for d in dirs:
        for path in (d / "ingest").rglob("*.weir"):
            data = path.read_bytes()
            for offset, value in enumerate(recs):
                if value in data:
                    holders.setdefault(offset, set()).add(path.name)
    return holders
