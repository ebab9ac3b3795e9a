"""Record-level validation of Produce (issue 9 §3).

- A batch whose attributes name a codec but whose payload is not a stream of that codec gets
  CORRUPT_MESSAGE, and the partition's consumers never see it.
- Produce v3+ carries one batch per partition: two is INVALID_RECORD and nothing is written.
- A compacted topic refuses keyless records with INVALID_RECORD and KIP-467 record_errors
  naming each bad record; the other partitions of the same request are written.
"""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import KafkaError

import kafka_raw as raw
from weirtest import (Rec, ck_consume, ck_create_topics, ck_producer, ck_produce,
                      ck_watermarks, now_ms, unique)

CORRUPT_MESSAGE = 2
INVALID_RECORD = 87
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def reflag(batch: bytes, codec: int) -> bytes:
    """The same bytes with the attributes naming `codec`, CRC32C recomputed: garbage that
    claims to be compressed but passes every header check."""
    from kafka.record.util import calc_crc32c
    b = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", b, 21)
    struct.pack_into(">h", b, 21, (attributes & ~0x07) | codec)
    struct.pack_into(">I", b, 17, calc_crc32c(bytes(b[21:])))
    return bytes(b)


def produce_v8(sock, topic: str, partitions: dict, corr_id: int = 31) -> dict:
    """Produce v8 (record_errors, error_message; not flexible). partitions: {index: records}.
    Returns {index: (error, base_offset, [(batch_index, message)], error_message)}."""
    body = raw.string(None) + raw.i16(-1) + raw.i32(30000) + raw.i32(1) + raw.string(topic)
    body += raw.i32(len(partitions))
    for index, records in partitions.items():
        body += raw.i32(index) + raw.bytes_(records)
    r = raw.roundtrip(sock, raw.request(raw.API_PRODUCE, 8, corr_id, body), corr_id)
    out = {}
    assert r.i32() == 1
    assert r.string() == topic
    for _ in range(r.i32()):
        index, err, base = r.i32(), r.i16(), r.i64()
        r.i64()  # log_append_time
        r.i64()  # log_start_offset
        record_errors = [(r.i32(), r.string()) for _ in range(r.i32())]
        out[index] = (err, base, record_errors, r.string())
    return out


def good_batch(n: int, key_every: int = 1) -> bytes:
    ts = now_ms()
    return raw.build_batch([(f"k{i}".encode() if i % key_every == 0 else None,
                             f"v{i}".encode(), ts) for i in range(n)])


@pytest.mark.parametrize("codec", list(CODECS))
def test_garbage_flagged_as_compressed_is_corrupt_message(agent, codec):
    t = unique(f"garbage-{codec}")
    ck_create_topics(agent.bootstrap, {t: 1})
    ck_produce(agent.bootstrap, [Rec(t, 0, b"a", b"before")])
    garbage = reflag(good_batch(3), CODECS[codec])
    with raw.connect(agent.bootstrap) as s:
        err, _ = raw.produce_v3(s, t, 0, garbage)
    assert err == CORRUPT_MESSAGE, f"garbage flagged as {codec}: error {err}"
    ck_produce(agent.bootstrap, [Rec(t, 0, b"b", b"after")])
    # The partition's consumers are unaffected: both good records, nothing else, no error.
    got = ck_consume(agent.bootstrap, t, [0])
    assert [g.value for g in got[0]] == [b"before", b"after"], got
    assert ck_watermarks(agent.bootstrap, t, [0])[0] == (0, 2)


def test_two_batches_in_one_partition_is_invalid_record(agent):
    t = unique("two-batches")
    ck_create_topics(agent.bootstrap, {t: 1})
    with raw.connect(agent.bootstrap) as s:
        err, base = raw.produce_v3(s, t, 0, good_batch(2) + good_batch(3))
        assert (err, base) == (INVALID_RECORD, -1)
        # Nothing of it was written, and a retry as one batch starts at offset 0.
        assert ck_watermarks(agent.bootstrap, t, [0])[0] == (0, 0)
        assert raw.produce_v3(s, t, 0, good_batch(5), corr_id=8) == (0, 0)


def test_compacted_topic_refuses_keyless_records(agent):
    t = unique("compacted")
    ck_create_topics(agent.bootstrap, {t: (2, {"cleanup.policy": "compact"})})
    # Records 1 and 3 of partition 0's batch have no key; partition 1's batch is fine.
    with raw.connect(agent.bootstrap) as s:
        answer = produce_v8(s, t, {0: good_batch(4, key_every=2), 1: good_batch(2)})
    err, base, record_errors, message = answer[0]
    assert (err, base) == (INVALID_RECORD, -1), answer
    assert [index for index, _ in record_errors] == [1, 3], record_errors
    assert all("key" in m for _, m in record_errors), record_errors
    assert message and "key" in message, message
    assert answer[1][:3] == (0, 0, []), answer
    assert ck_watermarks(agent.bootstrap, t, [0, 1]) == {0: (0, 0), 1: (0, 2)}

    # confluent-kafka sees a permanent INVALID_RECORD for a keyless record; keyed ones land.
    p = ck_producer(agent.bootstrap, {"linger.ms": 0})
    reports = []
    p.produce(t, value=b"no key", partition=0, on_delivery=lambda e, m: reports.append(e))
    assert p.flush(30) == 0
    assert len(reports) == 1 and reports[0] is not None, reports
    assert reports[0].code() == KafkaError.INVALID_RECORD, reports[0]
    acked = ck_produce(agent.bootstrap, [Rec(t, 0, b"key", b"value")])
    assert acked[0].offset == 0
