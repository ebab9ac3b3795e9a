"""ListOffsets: earliest, latest, by timestamp, max timestamp.

Each record is its own batch (flush after each), so the broker's answer at
batch granularity is the record-level answer."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from weirtest import (Rec, ck_admin, ck_consumer, ck_create_topics, ck_produce, ck_producer,
                      ck_watermarks, kp_consumer, now_ms, unique)

N = 10
STEP = 1000


def produce_one_batch_each(bootstrap, topic, timestamps, partition=0):
    p = ck_producer(bootstrap, {"linger.ms": 0})
    offsets = []
    for i, ts in enumerate(timestamps):
        acked = ck_produce(bootstrap, [Rec(topic, partition, f"k{i}".encode(), f"v{i}".encode(),
                                          (), ts)], producer=p)
        offsets.append(acked[0].offset)
    assert offsets == list(range(len(timestamps))), offsets
    return offsets


def test_offsets_for_times(agent):
    t = unique("lo")
    ck_create_topics(agent.bootstrap, {t: 2})
    base = now_ms() - 600_000
    tss = [base + i * STEP for i in range(N)]
    produce_one_batch_each(agent.bootstrap, t, tss)

    # watermarks: partition 0 has N records, partition 1 is empty
    wm = ck_watermarks(agent.bootstrap, t, [0, 1])
    assert wm[0] == (0, N)
    assert wm[1] == (0, 0)

    # --- confluent-kafka (librdkafka) offsets_for_times
    c = ck_consumer(agent.bootstrap)
    try:
        cases = [(base - 10_000, 0)]                       # before everything -> first
        cases += [(tss[i], i) for i in range(N)]           # exact hit
        cases += [(tss[i] - STEP // 2, i) for i in range(1, N)]  # between -> next
        cases += [(tss[-1] + 1, -1)]                        # after everything -> none (-1)
        got = []
        for ts, _ in cases:  # one lookup per request: no duplicate partitions in a request
            (r,) = c.offsets_for_times([TopicPartition(t, 0, ts)], timeout=30)
            assert r.error is None, r.error
            got.append(r.offset)
        assert got == [o for _, o in cases], list(zip([ts - base for ts, _ in cases], got))
        # an empty partition has no offset for any timestamp
        (r1,) = c.offsets_for_times([TopicPartition(t, 1, base)], timeout=30)
        assert r1.offset == -1, r1
    finally:
        c.close()

    # --- kafka-python
    from kafka import TopicPartition as KTP
    kc = kp_consumer(agent.bootstrap)
    try:
        tp = KTP(t, 0)
        for i in range(N):
            r = kc.offsets_for_times({tp: tss[i]}, timeout_ms=30000)[tp]
            assert r is not None and r.offset == i and r.timestamp == tss[i], (i, r)
            r = kc.offsets_for_times({tp: tss[i] - STEP // 2}, timeout_ms=30000)[tp]
            assert r is not None and r.offset == i and r.timestamp == tss[i], (i, r)
        assert kc.offsets_for_times({tp: tss[-1] + 1}, timeout_ms=30000)[tp] is None
        assert kc.beginning_offsets([tp], timeout_ms=30000)[tp] == 0
        assert kc.end_offsets([tp], timeout_ms=30000)[tp] == N
    finally:
        kc.close()


def test_list_offsets_admin_specs(agent):
    """AdminClient.list_offsets: earliest, latest, max-timestamp, for-timestamp,
    with timestamps that are not monotonic in offset order."""
    t = unique("lo-admin")
    ck_create_topics(agent.bootstrap, {t: 1})
    base = now_ms() - 600_000
    tss = [base, base + 1000, base + 9000, base + 2000, base + 3000]  # max at offset 2
    produce_one_batch_each(agent.bootstrap, t, tss)
    tp = TopicPartition(t, 0)
    admin = ck_admin(agent.bootstrap)

    def one(spec):
        futs = admin.list_offsets({tp: spec}, request_timeout=30)
        return futs[tp].result(timeout=35)

    assert one(OffsetSpec.earliest()).offset == 0
    assert one(OffsetSpec.latest()).offset == len(tss)
    mx = one(OffsetSpec.max_timestamp())
    assert (mx.offset, mx.timestamp) == (2, base + 9000), mx
    # first offset whose timestamp >= target
    r = one(OffsetSpec.for_timestamp(base + 1500))
    assert (r.offset, r.timestamp) == (2, base + 9000), r
    r = one(OffsetSpec.for_timestamp(base + 1000))
    assert (r.offset, r.timestamp) == (1, base + 1000), r


def test_latest_moves_with_produce(agent):
    t = unique("lo-latest")
    ck_create_topics(agent.bootstrap, {t: 1})
    for n in (1, 5, 17):
        ck_produce(agent.bootstrap, [Rec(t, 0, None, b"x") for _ in range(n)])
    assert ck_watermarks(agent.bootstrap, t, [0])[0] == (0, 23)
