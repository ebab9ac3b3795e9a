"""Every codec passes through byte-identical.

The broker keeps record batches as bytes and never recompresses, so what a
producer compressed must come back out of every consumer unchanged.
"""

from __future__ import annotations

import os
import random

import pytest

import kafka_raw as raw
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, kcat_consume, kcat_run, kp_consume, kp_produce, unique)

CODECS = ["gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
N = 300
PARTITIONS = 2


def payloads(seed: int) -> list:
    """Mixed values: compressible text, incompressible random bytes, empty, null, big."""
    rnd = random.Random(seed)
    out = []
    for i in range(N):
        kind = i % 6
        if kind == 0:
            v = (f"record {i} " * rnd.randint(1, 200)).encode()
        elif kind == 1:
            v = rnd.randbytes(rnd.randint(1, 4000))
        elif kind == 2:
            v = b""
        elif kind == 3:
            v = None
        elif kind == 4:
            v = bytes(range(256)) * rnd.randint(1, 40)
        else:
            v = os.urandom(16) + b"\x00" * rnd.randint(0, 100_000)
        out.append(v)
    return out


def records(topic: str, seed: int, null_key_and_value: bool = True) -> list:
    out = []
    for i, v in enumerate(payloads(seed)):
        key = None if i % 7 == 0 else f"k{i}".encode()
        if key is None and v is None and not null_key_and_value:
            key = b""  # kafka-python refuses a record with neither key nor value
        out.append(Rec(topic, i % PARTITIONS, key, v, (("i", str(i).encode()),)))
    return out


def check_stored_compressed(bootstrap: str, topic: str, codec: str, partitions) -> None:
    """The batches as stored and served (raw Fetch) carry the producer's codec:
    the broker never recompresses, and the client really did compress.

    librdkafka silently sends *uncompressed* batches when it believes the
    broker lacks the codec: LZ4 needs FindCoordinator in ApiVersions (its
    0.8.2-era feature probe), ZSTD needs Produce v7+ and Fetch v10+."""
    codecs = []
    for p in partitions:
        codecs += raw.stored_codecs(bootstrap, topic, p)
    want = CODEC_IDS[codec]
    assert codecs, "no batches stored"
    others = sorted({c for c in codecs if c not in (0, want)})
    assert not others, f"batches with unexpected codecs {others} (want {want})"
    assert want in codecs, (
        f"no batch stored with codec {codec} ({want}); codecs seen: {sorted(set(codecs))}. "
        f"If the producer is librdkafka-based, it decided the broker cannot take {codec} "
        f"(lz4: FindCoordinator must be advertised in ApiVersions; zstd: Produce>=7, Fetch>=10)")


def check_all_consumers(bootstrap: str, topic: str, acked) -> None:
    parts = range(PARTITIONS)
    for name, consume in (("confluent-kafka", ck_consume), ("kafka-python", kp_consume)):
        got = consume(bootstrap, topic, parts)
        assert_dense(got, topic)
        n = sum(len(v) for v in got.values())
        assert n == len(acked), f"{name}: read {n} records, produced {len(acked)}"
        assert_acked_present(acked, got)


@pytest.mark.parametrize("codec", CODECS)
def test_compression_confluent_kafka(agent, codec):
    t = unique(f"cmp-ck-{codec}")
    ck_create_topics(agent.bootstrap, {t: PARTITIONS})
    # linger so that many records share one compressed batch
    acked = ck_produce(agent.bootstrap, records(t, 1),
                       conf={"compression.type": codec, "linger.ms": 50,
                             "batch.num.messages": 1000})
    check_all_consumers(agent.bootstrap, t, acked)
    check_stored_compressed(agent.bootstrap, t, codec, range(PARTITIONS))


@pytest.mark.parametrize("codec", CODECS)
def test_compression_kafka_python(agent, codec):
    from kafka import codec as kcodec
    have = {"gzip": kcodec.has_gzip, "snappy": kcodec.has_snappy, "lz4": kcodec.has_lz4,
            "zstd": kcodec.has_zstd}[codec]()
    assert have, f"kafka-python has no {codec} support installed (see tests/requirements.txt)"
    t = unique(f"cmp-kp-{codec}")
    ck_create_topics(agent.bootstrap, {t: PARTITIONS})
    acked = kp_produce(agent.bootstrap, records(t, 2, null_key_and_value=False),
                       conf={"compression_type": codec, "linger_ms": 50,
                             "batch_size": 256 * 1024, "max_request_size": 4 * 1024 * 1024})
    check_all_consumers(agent.bootstrap, t, acked)
    check_stored_compressed(agent.bootstrap, t, codec, range(PARTITIONS))


@pytest.mark.parametrize("codec", CODECS)
def test_compression_kcat(agent, kcat, codec):
    """Debian's kcat (librdkafka 2.0.2) compresses; all three consumers read it."""
    t = unique(f"cmp-kcat-{codec}")
    ck_create_topics(agent.bootstrap, {t: 1})
    kvs = [(f"k{i}".encode(), (f"value-{i}-" + "abc" * (i % 50)).encode()) for i in range(N)]
    lines = b"\n".join(k + b":" + v for k, v in kvs) + b"\n"
    kcat_run(kcat, ["-P", "-b", agent.bootstrap, "-t", t, "-p", "0", "-K", ":", "-z", codec,
                    "-X", "acks=all", "-X", "linger.ms=50"], input_bytes=lines)
    want = kvs
    for name, got in (("confluent-kafka", ck_consume(agent.bootstrap, t, [0])),
                      ("kafka-python", kp_consume(agent.bootstrap, t, [0])),
                      ("kcat", {0: kcat_consume(kcat, agent.bootstrap, t, 0)})):
        assert_dense(got, t)
        have = [(g.key, g.value) for g in got[0]]
        assert have == want, f"{name}: {len(have)} records read, {len(want)} expected, or content differs"
    check_stored_compressed(agent.bootstrap, t, codec, [0])
