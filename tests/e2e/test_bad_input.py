"""Bad input on raw sockets (BAD-1). Each case gets its documented outcome,
the agent stays up, a connection opened before the bad input keeps working,
and a fresh ApiVersions round trip works afterwards."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct

import pytest

import kafka_raw as raw
from weirtest import Rec, ck_consume, ck_create_topics, ck_produce, now_ms, unique

MiB = 1024 * 1024
GiB = 1024 * MiB


@pytest.fixture
def bystander(agent):
    """A healthy client connection opened before the bad input."""
    s = raw.connect(agent.bootstrap)
    err, _ = raw.api_versions_v0(s, corr_id=100)
    assert err == 0
    yield s
    s.close()


def assert_agent_healthy(agent, bystander=None, corr_id: int = 200):
    assert agent.alive(), f"agent died (exit code {agent.proc.returncode})"
    agent.check_still_running()
    if bystander is not None:
        err, _ = raw.api_versions_v0(bystander, corr_id=corr_id)
        assert err == 0, "the pre-existing connection stopped working"
    raw.check_api_versions(agent.bootstrap)


GARBAGE = {
    "http": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",           # size prefix ~1.2 GB
    "tls-hello": bytes.fromhex("16030100a5010000a10303") + os.urandom(64),
    # api key 0x7fff (unknown) followed by deterministic junk
    "small-frame-random-body": struct.pack(">i", 32) + b"\x7f\xff" + bytes(
        (i * 151 + 7) & 0xFF for i in range(30)),
    "zero-size-frame": struct.pack(">i", 0),
    "negative-size": struct.pack(">i", -1),
    "header-only-api-key": struct.pack(">i", 2) + b"\x00\x12",     # frame too short for a header
    "bad-client-id-length": struct.pack(">i", 10) + struct.pack(">hhih", 18, 0, 1, 500),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_closes_connection(agent, bystander, name):
    with raw.connect(agent.bootstrap) as s:
        s.sendall(GARBAGE[name])
        data = raw.expect_closed(s)
        # whatever came back (ideally nothing) must not be a whole bogus stream
        assert len(data) < 64 * 1024
    assert_agent_healthy(agent, bystander)


def test_random_garbage_streams(agent, bystander):
    rnd = random.Random(1234)
    for i in range(20):
        with raw.connect(agent.bootstrap) as s:
            blob = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 4096)))
            with contextlib.suppress(OSError):
                s.sendall(blob)
                s.shutdown(socket.SHUT_WR)
            # either closed at once or after our half-close; must not hang
            raw.expect_closed(s)
    assert_agent_healthy(agent, bystander)


@pytest.mark.parametrize("size", [100 * MiB + 1, 1 * GiB, 2 * GiB - 1, 2 * GiB],
                         ids=["100MiB+1", "1GiB", "2GiB-1", "2GiB(negative)"])
def test_oversized_frame_header_closes_without_allocating(agent, bystander, size):
    before = agent.rss_and_peak_kib()
    socks = []
    try:
        # several at once: an agent that allocated on the header would need GiBs
        for _ in range(4):
            s = raw.connect(agent.bootstrap)
            s.sendall(struct.pack(">I", size) + b"\x00\x12\x00\x00\x00\x00\x00\x01")
            socks.append(s)
        for s in socks:
            raw.expect_closed(s)
    finally:
        for s in socks:
            s.close()
    after = agent.rss_and_peak_kib()
    if before and after:
        rss0, peak0 = before
        rss1, peak1 = after
        # Resident memory must not grow by anything like a frame.
        assert rss1 - rss0 < 300 * 1024, f"VmRSS grew {rss0} -> {rss1} KiB"
        # VmPeak counts even untouched allocations. Only meaningful for the
        # GiB-sized claims: 4 of them would add >= 4 GiB, far above the
        # virtual-memory noise of new threads / malloc arenas.
        if size >= GiB:
            assert peak1 - peak0 < 2 * GiB // 1024, f"VmPeak grew {peak0} -> {peak1} KiB"
    assert_agent_healthy(agent, bystander)


def test_truncated_frame_then_close(agent, bystander):
    # a valid-looking ApiVersions frame cut short, then the client goes away
    frame = raw.request(raw.API_VERSIONS, 0, 5, b"")
    for cut in (2, 4, 6, len(frame) - 1):
        with raw.connect(agent.bootstrap) as s:
            s.sendall(frame[:cut])
    # a big frame announced (within limits), a little of it sent, then close
    with raw.connect(agent.bootstrap) as s:
        s.sendall(struct.pack(">i", 50 * MiB) + os.urandom(1000))
    # half-close after a partial frame: the agent must not wait forever
    with raw.connect(agent.bootstrap) as s:
        s.sendall(frame[:-1])
        s.shutdown(socket.SHUT_WR)
        raw.expect_closed(s)
    assert_agent_healthy(agent, bystander)


def test_api_versions_unsupported_version(agent, bystander):
    """ApiVersions v99: error UNSUPPORTED_VERSION (35) in a v0-format response
    that still lists the supported keys (so the client can pick a version)."""
    corr = 777
    # header v2 (flexible) and a v3-shaped body, as a newer client would send
    body = raw.compact_string("weir-e2e") + raw.compact_string("0.0.1") + raw.uvarint(0)
    frame = raw.request(raw.API_VERSIONS, 99, corr, body, header_version=2)
    with raw.connect(agent.bootstrap) as s:
        s.sendall(frame)
        r = raw.Reader(raw.recv_frame(s))
        assert r.i32() == corr
        err, keys = raw.parse_api_versions_v0(r)
        assert err == raw.ERR_UNSUPPORTED_VERSION, f"error code {err}"
        assert raw.API_VERSIONS in keys, f"key list lacks ApiVersions: {keys}"
        lo, hi = keys[raw.API_VERSIONS]
        assert lo == 0 and hi >= 3, (lo, hi)
        assert r.pos == len(r.buf), f"{len(r.buf) - r.pos} trailing bytes after a v0 body"
    assert_agent_healthy(agent, bystander)


def test_api_versions_v0_lists_the_contract(agent):
    keys = raw.check_api_versions(agent.bootstrap)
    want = {0: (3, 12), 1: (4, 16), 2: None, 3: None, 18: (0, 3), 19: None, 20: None,
            22: None, 23: None, 32: None, 37: None, 60: None}
    missing = [k for k in want if k not in keys]
    assert not missing, f"ApiVersions lacks keys {missing}; has {sorted(keys)}"
    for k, rng in want.items():
        if rng is not None:
            lo, hi = keys[k]
            assert lo <= rng[0] and hi >= rng[1], f"api {k}: {lo}..{hi}, want {rng[0]}..{rng[1]}"


def test_unknown_api_key_closes_connection(agent, bystander):
    with raw.connect(agent.bootstrap) as s:
        s.sendall(raw.request(9999, 0, 31, b"\x00" * 16))
        raw.expect_closed(s)
    assert_agent_healthy(agent, bystander)


def test_unsupported_version_of_other_api_does_not_kill_agent(agent, bystander):
    """Metadata v99: an error response or a closed connection; either way the
    agent keeps serving."""
    with raw.connect(agent.bootstrap) as s:
        s.sendall(raw.request(raw.API_METADATA, 99, 32, b"\x00" * 8, header_version=2))
        s.settimeout(15)
        try:
            r = raw.Reader(raw.recv_frame(s))
        except (raw.Closed, ConnectionResetError):
            pass  # closed: one of the two documented outcomes
        except socket.timeout:
            raise AssertionError("no answer and no close 15 s after Metadata v99: "
                                 "the connection hangs") from None
        else:
            assert r.i32() == 32, "an answer to Metadata v99 with the wrong correlation id"
    assert_agent_healthy(agent, bystander)


def test_corrupt_crc_is_refused(agent, bystander):
    t = unique("crc")
    ck_create_topics(agent.bootstrap, {t: 1})
    ts = now_ms()
    good = raw.build_batch([(b"k0", b"good-0", ts)])
    bad = bytearray(raw.build_batch([(b"k1", b"evil-1", ts)]))
    bad[-1] ^= 0xFF                      # last byte of the record: covered by the CRC
    flipped_attr = bytearray(raw.build_batch([(b"k2", b"evil-2", ts)]))
    flipped_attr[22] ^= 0x01             # attributes (offset 21..22): covered too
    truncated = raw.build_batch([(b"k3", b"evil-3", ts)])[:-5]
    good2 = raw.build_batch([(b"k4", b"good-4", ts)])
    with raw.connect(agent.bootstrap) as s:
        assert raw.produce_v3(s, t, 0, good, corr_id=41) == (0, 0)
        err, _ = raw.produce_v3(s, t, 0, bytes(bad), corr_id=42)
        assert err == raw.ERR_CORRUPT_MESSAGE, f"flipped record byte: error {err}"
        err, _ = raw.produce_v3(s, t, 0, bytes(flipped_attr), corr_id=43)
        assert err == raw.ERR_CORRUPT_MESSAGE, f"flipped attributes bit: error {err}"
        err, _ = raw.produce_v3(s, t, 0, truncated, corr_id=44)
        assert err in (raw.ERR_CORRUPT_MESSAGE, raw.ERR_INVALID_RECORD), f"truncated batch: error {err}"
        # the same connection still works, and nothing corrupt was appended
        assert raw.produce_v3(s, t, 0, good2, corr_id=45) == (0, 1)
    got = ck_consume(agent.bootstrap, t, [0])
    assert [(g.offset, g.value) for g in got[0]] == [(0, b"good-0"), (1, b"good-4")]
    assert_agent_healthy(agent, bystander)


def test_many_bad_connections_then_real_client(agent, bystander):
    """A burst of bad connections does not starve a real client."""
    for i in range(50):
        with raw.connect(agent.bootstrap) as s:
            with contextlib.suppress(OSError):
                s.sendall(GARBAGE[sorted(GARBAGE)[i % len(GARBAGE)]])
    t = unique("after-burst")
    ck_create_topics(agent.bootstrap, {t: 1})
    assert ck_produce(agent.bootstrap, [Rec(t, 0, None, b"ok")])[0].offset == 0
    assert_agent_healthy(agent, bystander)
