"""Tiny hand-written Kafka wire-protocol helpers for the raw-socket tests.

Only what the tests need: request framing, ApiVersions v0, Produce v3
(non-flexible), InitProducerId v0/v1 (non-flexible) or v2+ (flexible),
and record batches built with kafka-python's DefaultRecordBatchBuilder
(magic 2, CRC32C filled in by the builder).
"""

from __future__ import annotations

import socket
import struct
import time

API_PRODUCE = 0
API_METADATA = 3
API_VERSIONS = 18
API_INIT_PRODUCER_ID = 22

ERR_NONE = 0
ERR_CORRUPT_MESSAGE = 2
ERR_UNKNOWN_TOPIC_OR_PARTITION = 3
ERR_MESSAGE_TOO_LARGE = 10
ERR_INVALID_TOPIC_EXCEPTION = 17
ERR_UNSUPPORTED_VERSION = 35
ERR_OUT_OF_ORDER_SEQUENCE_NUMBER = 45
ERR_INVALID_RECORD = 87

CLIENT_ID = "weir-e2e-raw"


class Closed(Exception):
    """The peer closed the connection."""


# ------------------------------------------------------------ primitives

def i8(v): return struct.pack(">b", v)
def i16(v): return struct.pack(">h", v)
def i32(v): return struct.pack(">i", v)
def i64(v): return struct.pack(">q", v)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def bytes_(b: bytes | None) -> bytes:
    if b is None:
        return i32(-1)
    return i32(len(b)) + bytes(b)


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def compact_string(s: str | None) -> bytes:
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


class Reader:
    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise ValueError(f"short response: need {n} at {self.pos}, have {len(self.buf)}")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def i16(self): return struct.unpack(">h", self.take(2))[0]
    def i32(self): return struct.unpack(">i", self.take(4))[0]
    def i64(self): return struct.unpack(">q", self.take(8))[0]

    def string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def uvarint(self):
        shift = result = 0
        while True:
            b = self.take(1)[0]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def skip_tagged(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


# ------------------------------------------------------------ framing

def request(api_key: int, api_version: int, corr_id: int, body: bytes,
            header_version: int = 1, client_id: str | None = CLIENT_ID) -> bytes:
    """A complete frame (size prefix included). header_version 1: key, version,
    corr id, client id; 2: the same plus an empty tagged-field section."""
    hdr = i16(api_key) + i16(api_version) + i32(corr_id) + string(client_id)
    if header_version >= 2:
        hdr += uvarint(0)
    payload = hdr + body
    return i32(len(payload)) + payload


def connect(addr: str, timeout: float = 30.0) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.settimeout(timeout)
    return s


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise Closed(f"connection closed after {len(buf)}/{n} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    assert 0 <= size <= 256 * 1024 * 1024, f"absurd response size {size}"
    return recv_exact(sock, size)


def roundtrip(sock: socket.socket, frame: bytes, corr_id: int,
              flexible_response_header: bool = False) -> Reader:
    sock.sendall(frame)
    r = Reader(recv_frame(sock))
    got = r.i32()
    assert got == corr_id, f"correlation id {got} != {corr_id}"
    if flexible_response_header:
        r.skip_tagged()
    return r


def expect_closed(sock: socket.socket, timeout: float = 15.0) -> bytes:
    """Wait (bounded) until the peer closes. Returns whatever bytes arrived
    before the close; raises AssertionError if the connection stays open."""
    sock.settimeout(1.0)
    deadline = time.monotonic() + timeout
    received = bytearray()
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            return bytes(received)
        if not chunk:
            return bytes(received)
        received += chunk
        if len(received) > 1 << 20:
            break
    raise AssertionError(
        f"connection still open {timeout:.0f}s after bad input (received {len(received)} bytes)")


# ------------------------------------------------------------ ApiVersions

def parse_api_versions_v0(r: Reader) -> tuple[int, dict]:
    err = r.i16()
    n = r.i32()
    keys = {}
    for _ in range(max(n, 0)):
        k, lo, hi = r.i16(), r.i16(), r.i16()
        keys[k] = (lo, hi)
    return err, keys


def api_versions_v0(sock: socket.socket, corr_id: int = 1) -> tuple[int, dict]:
    r = roundtrip(sock, request(API_VERSIONS, 0, corr_id, b""), corr_id)
    return parse_api_versions_v0(r)


def check_api_versions(addr: str, timeout: float = 30.0) -> dict:
    """Fresh connection, ApiVersions v0; asserts error 0 and returns the key map."""
    with connect(addr, timeout) as s:
        err, keys = api_versions_v0(s, corr_id=4242)
    assert err == 0, f"ApiVersions v0 error {err}"
    assert API_VERSIONS in keys, f"ApiVersions missing from its own key list: {keys}"
    return keys


# ------------------------------------------------------------ record batches

def build_batch(records, producer_id: int = -1, producer_epoch: int = -1,
                base_sequence: int = -1, compression: int = 0) -> bytes:
    """records: [(key, value, timestamp_ms)]. Returns a v2 record batch."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                  producer_id=producer_id, producer_epoch=producer_epoch,
                                  base_sequence=base_sequence, batch_size=16 * 1024 * 1024)
    for i, (k, v, ts) in enumerate(records):
        assert b.append(i, timestamp=ts, key=k, value=v, headers=[]) is not None
    return bytes(b.build())


# ------------------------------------------------------------ Produce v3

def produce_v3(sock: socket.socket, topic: str, partition: int, batch: bytes,
               acks: int = -1, timeout_ms: int = 30000, corr_id: int = 7) -> tuple[int, int]:
    """Produce v3 (non-flexible). Returns (error_code, base_offset) of the partition."""
    body = (string(None) + i16(acks) + i32(timeout_ms) +
            i32(1) + string(topic) + i32(1) + i32(partition) + bytes_(batch))
    r = roundtrip(sock, request(API_PRODUCE, 3, corr_id, body), corr_id)
    n_topics = r.i32()
    assert n_topics == 1, f"produce response has {n_topics} topics"
    name = r.string()
    assert name == topic, f"produce response for topic {name!r}"
    n_parts = r.i32()
    assert n_parts == 1
    idx, err, base = r.i32(), r.i16(), r.i64()
    assert idx == partition
    r.i64()  # log_append_time
    return err, base


# ------------------------------------------------------------ InitProducerId

def init_producer_id(sock: socket.socket, version: int, corr_id: int = 9) -> tuple[int, int, int]:
    """Non-transactional InitProducerId. Returns (error, producer_id, epoch)."""
    if version <= 1:
        body = string(None) + i32(60000)
        r = roundtrip(sock, request(API_INIT_PRODUCER_ID, version, corr_id, body), corr_id)
    else:
        body = compact_string(None) + i32(60000)
        if version >= 3:
            body += i64(-1) + i16(-1)
        body += uvarint(0)
        r = roundtrip(sock, request(API_INIT_PRODUCER_ID, version, corr_id, body,
                                    header_version=2),
                      corr_id, flexible_response_header=True)
    r.i32()  # throttle
    err = r.i16()
    pid = r.i64()
    epoch = r.i16()
    return err, pid, epoch


# ------------------------------------------------------------ Fetch v4

API_FETCH = 1


def fetch_v4(sock: socket.socket, topic: str, partition: int, offset: int,
             max_bytes: int = 32 * 1024 * 1024, max_wait_ms: int = 5000,
             corr_id: int = 21) -> tuple[int, int, bytes]:
    """Fetch v4 (non-flexible, read_uncommitted). Returns (error, high_watermark, records)."""
    body = (i32(-1) + i32(max_wait_ms) + i32(1) + i32(max_bytes) + i8(0) +
            i32(1) + string(topic) + i32(1) + i32(partition) + i64(offset) + i32(max_bytes))
    r = roundtrip(sock, request(API_FETCH, 4, corr_id, body), corr_id)
    r.i32()  # throttle
    assert r.i32() == 1, "fetch response: expected one topic"
    assert r.string() == topic
    assert r.i32() == 1, "fetch response: expected one partition"
    assert r.i32() == partition
    err = r.i16()
    hw = r.i64()
    r.i64()  # last stable offset
    n_aborted = r.i32()
    for _ in range(max(n_aborted, 0)):
        r.i64()
        r.i64()
    n = r.i32()
    records = b"" if n < 0 else r.take(n)
    return err, hw, records


def iter_batch_headers(records: bytes):
    """Yield (base_offset, record_count, attributes) of each complete v2 batch."""
    pos = 0
    while pos + 61 <= len(records):
        base_offset, batch_len = struct.unpack_from(">qi", records, pos)
        end = pos + 12 + batch_len
        if end > len(records):
            break  # a trailing partial batch is allowed in fetch responses
        magic = records[pos + 16]
        assert magic == 2, f"batch at {base_offset}: magic {magic}"
        (attributes,) = struct.unpack_from(">h", records, pos + 21)
        (count,) = struct.unpack_from(">i", records, pos + 57)
        yield base_offset, count, attributes
        pos = end


def stored_codecs(addr: str, topic: str, partition: int) -> list:
    """Compression codec (attributes & 7) of every batch in the partition, via raw Fetch."""
    codecs = []
    offset = 0
    with connect(addr) as s:
        for i in range(10_000):
            err, hw, records = fetch_v4(s, topic, partition, offset, corr_id=1000 + i)
            assert err == 0, f"fetch error {err}"
            if offset >= hw:
                break
            got_any = False
            for base, count, attrs in iter_batch_headers(records):
                if base + count <= offset:
                    continue
                codecs.append(attrs & 0x7)
                offset = base + count
                got_any = True
            assert got_any, f"fetch at {offset} (hw {hw}) returned no complete batch"
    return codecs


def metadata_brokers(addr: str, timeout: float = 15.0) -> set:
    """The node ids a Metadata v1 request (no topics) to `addr` itself lists: unlike a client
    library's admin calls, which may send it to any broker they know, this asks that agent."""
    with connect(addr, timeout) as sock:
        r = roundtrip(sock, request(3, 1, 7, i32(0)), 7)
        nodes = set()
        for _ in range(r.i32()):
            nodes.add(r.i32())
            r.string()  # host
            r.i32()  # port
            r.string()  # rack
        return nodes


def metadata_leaders(addr: str, topic: str, client_id: str, timeout: float = 15.0) -> dict:
    """Partition -> leader id for `topic`, as a Metadata v1 request sent to `addr` itself
    under `client_id` answers: for placement that depends on which agent answers (a client
    that names no zone gets the answering agent's), where a client library may ask any."""
    body = i32(1) + string(topic)
    with connect(addr, timeout) as sock:
        r = roundtrip(sock, request(3, 1, 11, body, client_id=client_id), 11)
        for _ in range(r.i32()):  # brokers
            r.i32(); r.string(); r.i32(); r.string()  # noqa: E702
        r.i32()  # controller id
        leaders = {}
        for _ in range(r.i32()):
            error, name = r.i16(), r.string()
            r.take(1)  # is_internal
            assert error == 0, f"metadata for {name}: error {error}"
            for _ in range(r.i32()):
                p_error, p, leader = r.i16(), r.i32(), r.i32()
                assert p_error == 0, f"metadata for {name}/{p}: error {p_error}"
                r.take(4 * r.i32())  # replicas
                r.take(4 * r.i32())  # isr
                if name == topic:
                    leaders[p] = leader
        return leaders
