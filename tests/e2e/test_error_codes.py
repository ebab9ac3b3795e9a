"""The error codes docs/compatibility.md promises, one raw-frame probe per row that no client
library can be made to send: reserved compression codecs, transactional and control batches,
`transactional_id` on Produce, invalid `acks`, Fetch sessions, OffsetForLeaderEpoch. (The
"agent shutting down" row is a unit test: `test_produce_and_init_producer_id_while_shutting_down`
in crates/weir-server/src/tests.rs.)

Each probe also checks that nothing was appended and that the connection keeps working."""

from __future__ import annotations

import struct

import pytest
from kafka.record.util import calc_crc32c

import kafka_raw as raw
from weirtest import ck_create_topics, ck_watermarks, now_ms, unique

ERR_UNSUPPORTED_COMPRESSION_TYPE = 76
ERR_INVALID_REQUEST = 42
ERR_INVALID_REQUIRED_ACKS = 21
ERR_FETCH_SESSION_ID_NOT_FOUND = 70
ERR_UNKNOWN_LEADER_EPOCH = 75
API_OFFSET_FOR_LEADER_EPOCH = 23

# Record batch v2 layout: baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8,
# crc u32 (offset 17), attributes i16 (offset 21) .. end: the CRC32C covers attributes..end.
CRC_AT, ATTRIBUTES_AT = 17, 21
CODEC_MASK, TRANSACTIONAL_BIT, CONTROL_BIT = 0x07, 0x10, 0x20


def with_attributes(batch: bytes, set_bits: int, clear_bits: int = 0) -> bytes:
    """The batch with attribute bits changed and its CRC recomputed (so only the attribute is
    wrong, not the checksum)."""
    b = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", b, ATTRIBUTES_AT)
    struct.pack_into(">h", b, ATTRIBUTES_AT, (attributes & ~clear_bits) | set_bits)
    struct.pack_into(">I", b, CRC_AT, calc_crc32c(bytes(b[ATTRIBUTES_AT:])))
    return bytes(b)


def produce_v3_body(transactional_id: str | None, acks: int, topic: str,
                    batches: dict) -> bytes:
    body = raw.string(transactional_id) + raw.i16(acks) + raw.i32(30000) + raw.i32(1)
    body += raw.string(topic) + raw.i32(len(batches))
    for partition, batch in sorted(batches.items()):
        body += raw.i32(partition) + raw.bytes_(batch)
    return body


def produce_v3_partitions(sock, topic: str, batches: dict, transactional_id=None, acks=-1,
                          corr_id: int = 7) -> dict:
    """Produce v3 to several partitions of one topic; returns {partition: (error, base)}."""
    r = raw.roundtrip(sock, raw.request(raw.API_PRODUCE, 3, corr_id,
                                        produce_v3_body(transactional_id, acks, topic, batches)),
                      corr_id)
    assert r.i32() == 1
    assert r.string() == topic
    out = {}
    for _ in range(r.i32()):
        partition, err, base = r.i32(), r.i16(), r.i64()
        r.i64()  # log_append_time
        out[partition] = (err, base)
    return out


@pytest.fixture
def topic(agent):
    t = unique("codes")
    ck_create_topics(agent.bootstrap, {t: 2})
    return t


def batch(value: bytes = b"v") -> bytes:
    return raw.build_batch([(b"k", value, now_ms())])


def assert_nothing_appended_and_still_served(agent, topic: str, sock) -> None:
    assert ck_watermarks(agent.bootstrap, topic, [0, 1]) == {0: (0, 0), 1: (0, 0)}
    err, base = raw.produce_v3(sock, topic, 0, batch(b"good"), corr_id=99)
    assert (err, base) == (0, 0), "the connection stopped working after the refused request"


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_produce_reserved_compression_codec_is_unsupported(agent, topic, codec):
    with raw.connect(agent.bootstrap) as s:
        bad = with_attributes(batch(), codec, clear_bits=CODEC_MASK)
        err, _ = raw.produce_v3(s, topic, 0, bad, corr_id=10 + codec)
        assert err == ERR_UNSUPPORTED_COMPRESSION_TYPE, f"codec {codec}: error {err}"
        assert_nothing_appended_and_still_served(agent, topic, s)


@pytest.mark.parametrize("bits", [TRANSACTIONAL_BIT, CONTROL_BIT, TRANSACTIONAL_BIT | CONTROL_BIT],
                         ids=["transactional", "control", "transactional-control"])
def test_produce_transactional_or_control_batch_is_invalid_record(agent, topic, bits):
    with raw.connect(agent.bootstrap) as s:
        err, _ = raw.produce_v3(s, topic, 0, with_attributes(batch(), bits), corr_id=20)
        assert err == raw.ERR_INVALID_RECORD, f"attributes {bits:#x}: error {err}"
        assert_nothing_appended_and_still_served(agent, topic, s)


def test_produce_with_transactional_id_is_invalid_request_for_every_partition(agent, topic):
    with raw.connect(agent.bootstrap) as s:
        got = produce_v3_partitions(s, topic, {0: batch(), 1: batch()}, transactional_id="tx-1",
                                    corr_id=30)
        assert {p: err for p, (err, _) in got.items()} == \
            {0: ERR_INVALID_REQUEST, 1: ERR_INVALID_REQUEST}, got
        assert_nothing_appended_and_still_served(agent, topic, s)


@pytest.mark.parametrize("acks", [2, -2, 5])
def test_produce_with_invalid_acks_is_invalid_required_acks_for_every_partition(agent, topic,
                                                                                 acks):
    with raw.connect(agent.bootstrap) as s:
        got = produce_v3_partitions(s, topic, {0: batch(), 1: batch()}, acks=acks, corr_id=40)
        assert {p: err for p, (err, _) in got.items()} == \
            {0: ERR_INVALID_REQUIRED_ACKS, 1: ERR_INVALID_REQUIRED_ACKS}, got
        assert_nothing_appended_and_still_served(agent, topic, s)


def fetch_v7(sock, topic: str, session_id: int, session_epoch: int, corr_id: int,
             forgotten: str | None = None) -> tuple[int, int, list]:
    """Fetch v7 (sessions, non-flexible). Returns (top-level error, session id,
    [(partition, error, high watermark)])."""
    body = (raw.i32(-1) + raw.i32(0) + raw.i32(1) + raw.i32(1 << 20) + raw.i8(0) +
            raw.i32(session_id) + raw.i32(session_epoch) +
            raw.i32(1) + raw.string(topic) + raw.i32(1) +
            raw.i32(0) + raw.i64(0) + raw.i64(-1) + raw.i32(1 << 20))
    if forgotten is None:
        body += raw.i32(0)
    else:
        body += raw.i32(1) + raw.string(forgotten) + raw.i32(1) + raw.i32(1)
    r = raw.roundtrip(sock, raw.request(raw.API_FETCH, 7, corr_id, body), corr_id)
    r.i32()  # throttle
    err, session = r.i16(), r.i32()
    partitions = []
    for _ in range(r.i32()):
        r.string()
        for _ in range(r.i32()):
            partition, perr, hw = r.i32(), r.i16(), r.i64()
            r.i64()  # last stable offset
            r.i64()  # log start offset
            for _ in range(max(r.i32(), 0)):  # aborted transactions
                r.i64()
                r.i64()
            n = r.i32()
            if n > 0:
                r.take(n)
            partitions.append((partition, perr, hw))
    return err, session, partitions


def test_fetch_sessions_are_never_created_and_unknown_ones_refused(agent, topic):
    """KIP-227 as documented: no sessions. A full fetch asking for a new session (epoch 0) gets
    session id 0 and its data; a fetch naming a session gets FETCH_SESSION_ID_NOT_FOUND."""
    with raw.connect(agent.bootstrap) as s:
        assert raw.produce_v3(s, topic, 0, batch(), corr_id=50) == (0, 0)
        err, session, parts = fetch_v7(s, topic, session_id=0, session_epoch=0, corr_id=51)
        assert (err, session) == (0, 0), (err, session)
        assert parts == [(0, 0, 1)], parts
        err, session, parts = fetch_v7(s, topic, session_id=12345, session_epoch=1, corr_id=52,
                                       forgotten=topic)
        assert err == ERR_FETCH_SESSION_ID_NOT_FOUND, f"error {err} for an unknown session"
        assert session == 0
        # Full fetches keep working on the same connection.
        err, session, parts = fetch_v7(s, topic, session_id=0, session_epoch=-1, corr_id=53)
        assert (err, session, parts) == (0, 0, [(0, 0, 1)])


def offset_for_leader_epoch_v3(sock, topic: str, partitions: list, corr_id: int) -> dict:
    """partitions: [(partition, current_leader_epoch, leader_epoch)].
    Returns {partition: (error, leader_epoch, end_offset)}."""
    body = raw.i32(-1) + raw.i32(1) + raw.string(topic) + raw.i32(len(partitions))
    for partition, current, epoch in partitions:
        body += raw.i32(partition) + raw.i32(current) + raw.i32(epoch)
    r = raw.roundtrip(sock, raw.request(API_OFFSET_FOR_LEADER_EPOCH, 3, corr_id, body), corr_id)
    r.i32()  # throttle
    out = {}
    for _ in range(r.i32()):
        assert r.string() == topic
        for _ in range(r.i32()):
            err, partition, epoch, end = r.i16(), r.i32(), r.i32(), r.i64()
            out[partition] = (err, epoch, end)
    return out


def test_offset_for_leader_epoch_answers_as_documented(agent, topic):
    """The only leader epoch is 0: epoch 0 ends at the high watermark; a current leader epoch
    above 0 is UNKNOWN_LEADER_EPOCH; a requested epoch above 0 is (-1, -1) with no error; an
    unknown partition is UNKNOWN_TOPIC_OR_PARTITION."""
    with raw.connect(agent.bootstrap) as s:
        for i in range(3):
            assert raw.produce_v3(s, topic, 0, batch(b"%d" % i), corr_id=60 + i) == (0, i)
        got = offset_for_leader_epoch_v3(s, topic, [(0, -1, 0)], corr_id=70)
        assert got == {0: (0, 0, 3)}, got
        got = offset_for_leader_epoch_v3(s, topic, [(0, 0, 0), (1, -1, 0)], corr_id=71)
        assert got == {0: (0, 0, 3), 1: (0, 0, 0)}, got
        got = offset_for_leader_epoch_v3(s, topic, [(0, 1, 0)], corr_id=72)
        assert got[0][0] == ERR_UNKNOWN_LEADER_EPOCH, got
        got = offset_for_leader_epoch_v3(s, topic, [(0, -1, 1)], corr_id=73)
        assert got == {0: (0, -1, -1)}, got
        got = offset_for_leader_epoch_v3(s, topic, [(7, -1, 0)], corr_id=74)
        assert got[7][0] == raw.ERR_UNKNOWN_TOPIC_OR_PARTITION, got
