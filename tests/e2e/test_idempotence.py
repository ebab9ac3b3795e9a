"""Idempotent producers (IDM-1): no duplicates, order kept, retries return
the original offsets, sequence gaps are refused."""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING

import kafka_raw as raw
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, ck_watermarks, kp_consume, kp_produce, now_ms, unique)

PARTITIONS = 4


def check_exactly_once_in_order(bootstrap, topic, acked, n):
    got = ck_consume(bootstrap, topic, range(PARTITIONS))
    assert_dense(got, topic)
    values = [g.value for p in range(PARTITIONS) for g in got[p]]
    assert len(values) == n, f"read {len(values)} records, produced {n}"
    assert len(set(values)) == n, "duplicates in the log"
    assert sorted(values) == sorted(a.rec.value for a in acked)
    # per partition, log order == send order
    for p in range(PARTITIONS):
        sent = [a.rec.value for a in acked if a.partition == p]
        assert [g.value for g in got[p]] == sent, f"partition {p} out of order"
    assert_acked_present(acked, got)


def test_confluent_idempotent_producer(agent):
    n = 5000
    t = unique("idem-ck")
    ck_create_topics(agent.bootstrap, {t: PARTITIONS})
    recs = [Rec(t, None, f"key-{i % 97}".encode(), f"value-{i:06d}".encode()) for i in range(n)]
    acked = ck_produce(agent.bootstrap, recs,
                       conf={"enable.idempotence": True, "acks": "all",
                             "max.in.flight.requests.per.connection": 5, "linger.ms": 2,
                             "batch.num.messages": 100})
    check_exactly_once_in_order(agent.bootstrap, t, acked, n)


def test_kafka_python_idempotent_producer(agent):
    n = 2000
    t = unique("idem-kp")
    ck_create_topics(agent.bootstrap, {t: PARTITIONS})
    recs = [Rec(t, i % PARTITIONS, f"key-{i}".encode(), f"value-{i:06d}".encode())
            for i in range(n)]
    acked = kp_produce(agent.bootstrap, recs,
                       conf={"enable_idempotence": True, "acks": "all", "batch_size": 4096})
    check_exactly_once_in_order(agent.bootstrap, t, acked, n)
    # kafka-python reads the same log: every record, once, at the offset librdkafka saw, in order.
    kp_got = kp_consume(agent.bootstrap, t, range(PARTITIONS))
    ck_got = ck_consume(agent.bootstrap, t, range(PARTITIONS))
    assert_dense(kp_got, t)
    for p in range(PARTITIONS):
        assert [(g.offset, g.value) for g in kp_got[p]] == \
            [(g.offset, g.value) for g in ck_got[p]], f"partition {p}: kafka-python read differs"
    assert sum(len(v) for v in kp_got.values()) == n


def _init_pid_version(keys: dict) -> int:
    assert raw.API_INIT_PRODUCER_ID in keys, "InitProducerId not advertised"
    lo, hi = keys[raw.API_INIT_PRODUCER_ID]
    v = min(hi, 4)
    assert v >= lo, f"no InitProducerId version this test can speak in {lo}..{hi}"
    return v


def test_retried_batch_returns_original_offsets_and_gap_is_refused(agent):
    """Raw protocol: the same idempotent batch sent twice lands once and the
    retry gets the original base offset; a sequence gap gets
    OUT_OF_ORDER_SEQUENCE_NUMBER; the next in-sequence batch is accepted."""
    t = unique("idem-raw")
    ck_create_topics(agent.bootstrap, {t: 1})
    keys = raw.check_api_versions(agent.bootstrap)
    ts = now_ms()
    with raw.connect(agent.bootstrap) as s:
        err, pid, epoch = raw.init_producer_id(s, _init_pid_version(keys))
        assert err == 0 and pid >= 0 and epoch >= 0, (err, pid, epoch)

        first = raw.build_batch([(b"a", b"0", ts), (b"a", b"1", ts), (b"a", b"2", ts)],
                                producer_id=pid, producer_epoch=epoch, base_sequence=0)
        assert raw.produce_v3(s, t, 0, first, corr_id=11) == (0, 0)
        # retry of the very same batch: original offsets, nothing appended
        assert raw.produce_v3(s, t, 0, first, corr_id=12) == (0, 0)
        assert ck_watermarks(agent.bootstrap, t, [0])[0] == (0, 3)

        gap = raw.build_batch([(b"a", b"gap", ts)], producer_id=pid, producer_epoch=epoch,
                              base_sequence=5)
        err, _ = raw.produce_v3(s, t, 0, gap, corr_id=13)
        assert err == raw.ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence gap got error {err}"

        nxt = raw.build_batch([(b"a", b"3", ts), (b"a", b"4", ts)], producer_id=pid,
                              producer_epoch=epoch, base_sequence=3)
        assert raw.produce_v3(s, t, 0, nxt, corr_id=14) == (0, 3)
        assert raw.produce_v3(s, t, 0, nxt, corr_id=15) == (0, 3)

    got = ck_consume(agent.bootstrap, t, [0], start=OFFSET_BEGINNING)
    assert_dense(got, t)
    assert [g.value for g in got[0]] == [b"0", b"1", b"2", b"3", b"4"]
    raw.check_api_versions(agent.bootstrap)
