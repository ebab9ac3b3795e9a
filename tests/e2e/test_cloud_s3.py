"""`weir agent` on S3 (moto's server, cloud.py): three `s3://` ingest buckets (quorum 2) and a
separate `s3://` metadata bucket. Round trip with every client and a restart; kill -9 under load
(credentials and endpoint from the standard AWS variables); one ingest bucket failing every
request, then hanging, behind the fault proxy; startup refused when a bucket ignores conditional
writes; a hung PUT failing produces retriably until the bucket recovers.

Every other test names the endpoint and keys in the bucket URL's query. Checks run with the
reliability checker (checker.py): 0 lost, 0 duplicated, 0 reordered, no gaps."""

from __future__ import annotations

import subprocess
import threading

import kafka_raw
from checker import CheckedProducer, Report
from cloud import s3_env, s3_url
from test_faults import IDEMPOTENT, PARTITIONS, acked, finish, start_producers
from test_roundtrip import N_PARTITIONS, make_records
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, ck_watermarks, kcat_consume, kp_consume, kp_produce, unique,
                      wait_readable, wait_topic, wait_until)

WAIT_S = 90.0
REQUEST_TIMED_OUT = 7
REFUSAL_TIMEOUT_S = 120.0


def s3_layout(moto, ingest_endpoints, quorum: int, meta_endpoint=None, query: bool = True):
    """Creates len(ingest_endpoints) ingest buckets and a metadata bucket on moto; each bucket's
    URL names its endpoint (moto's, or a fault proxy's in front of it). With query=False the URLs
    are bare and the endpoint and keys must come from the environment (s3_env)."""
    ingest = [moto.create_bucket("ingest") for _ in ingest_endpoints]
    meta = moto.create_bucket("meta")

    def url(bucket, endpoint):
        return s3_url(bucket, (endpoint or moto.endpoint) if query else None)

    args = [a for b, e in zip(ingest, ingest_endpoints) for a in ("--ingest-bucket", url(b, e))]
    args += ["--quorum", str(quorum), "--metadata-bucket", url(meta, meta_endpoint)]
    return ingest, meta, args


def assert_bucket_roles(list_keys, ingest, meta, min_holders: int) -> None:
    """Data files (ingest/) reached at least `min_holders` ingest buckets; the metadata log
    (meta/) is in the metadata bucket and in no ingest bucket."""
    holders = [b for b in ingest if list_keys(b, "ingest/")]
    assert len(holders) >= min_holders, f"data files in {len(holders)} of {len(ingest)} buckets"
    assert list_keys(meta, "meta/"), "no metadata log in the metadata bucket"
    assert not any(list_keys(b, "meta/") for b in ingest), "metadata log in an ingest bucket"


def roundtrip_and_restart(agent, kcat) -> None:
    """Records with keys, null keys, tombstones, headers and timestamps from confluent-kafka and
    kafka-python, read back by all three clients; then a graceful restart: everything is still
    there, and offsets continue after the old high watermark."""
    ck_topic, kp_topic = unique("cloud-ck"), unique("cloud-kp")
    ck_create_topics(agent.bootstrap, {ck_topic: N_PARTITIONS, kp_topic: N_PARTITIONS})
    acked = ck_produce(agent.bootstrap, make_records([ck_topic], headers=True, timestamps=True,
                                                     none_header_values=True))
    acked += kp_produce(agent.bootstrap, make_records([kp_topic], headers=True, timestamps=True,
                                                      none_header_values=False,
                                                      null_key_and_value=False))
    parts = range(N_PARTITIONS)

    def check_all(topic, topic_acked, clients):
        expected = len(topic_acked)
        if "ck" in clients:
            got = ck_consume(agent.bootstrap, topic, parts)
            assert_dense(got, topic)
            assert sum(len(v) for v in got.values()) == expected
            assert_acked_present(topic_acked, got)
        if "kp" in clients:
            got = kp_consume(agent.bootstrap, topic, parts)
            assert_dense(got, topic)
            assert_acked_present(topic_acked, got)
        if "kcat" in clients:
            got = {p: kcat_consume(kcat, agent.bootstrap, topic, p) for p in parts}
            assert_dense(got, topic)
            assert_acked_present(topic_acked, got, check_headers=False)

    by_topic = {t: [a for a in acked if a.rec.topic == t] for t in (ck_topic, kp_topic)}
    check_all(ck_topic, by_topic[ck_topic], ("ck", "kp", "kcat"))
    check_all(kp_topic, by_topic[kp_topic], ("ck", "kp"))
    before = ck_watermarks(agent.bootstrap, ck_topic, parts)

    agent.restart()
    wait_topic(agent.bootstrap, ck_topic, N_PARTITIONS)
    assert ck_watermarks(agent.bootstrap, ck_topic, parts) == before
    check_all(kp_topic, by_topic[kp_topic], ("ck",))
    more = ck_produce(agent.bootstrap, make_records([ck_topic], headers=False, timestamps=False,
                                                    none_header_values=False))
    for p in parts:
        offsets = [a.offset for a in more if a.partition == p]
        assert offsets == list(range(before[p][1], before[p][1] + len(offsets))), \
            f"partition {p}: offsets after the restart {offsets}, high watermark was {before[p]}"
    check_all(ck_topic, by_topic[ck_topic] + more, ("ck", "kcat"))


def test_s3_roundtrip_and_restart(agent_factory, moto_server, cloud_env, kcat):
    ingest, meta, args = s3_layout(moto_server, [None] * 3, quorum=2)
    agent = agent_factory(extra_args=args)
    roundtrip_and_restart(agent, kcat)
    assert_bucket_roles(moto_server.keys, ingest, meta, min_holders=2)


def test_s3_kill9_during_produce_env_credentials(agent_factory, moto_server, cloud_env):
    """Bare `s3://bucket` URLs: endpoint, region and keys from AWS_ENDPOINT_URL, AWS_REGION,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ALLOW_HTTP. Two idempotent producers run
    while the agent is killed twice."""
    for key, value in s3_env(moto_server.endpoint).items():
        cloud_env.setenv(key, value)
    ingest, meta, args = s3_layout(moto_server, [None] * 3, quorum=2, query=False)
    assert all("?" not in a for a in args)
    agent = agent_factory(extra_args=args)
    topic = unique("cloud-kill9")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    producers = start_producers(agent, topic)
    report = Report("s3-moto-kill9", 0)
    for kill in range(2):
        target = acked(producers) + 1000
        wait_until(lambda: acked(producers) >= target, WAIT_S, f"acks before kill {kill}")
        agent.kill9()
        report.crashes += 1
        agent.start()
    after = acked(producers) + 500
    wait_until(lambda: acked(producers) >= after, WAIT_S, "acks after the last restart")
    finish(agent, topic, producers, report)
    assert_bucket_roles(moto_server.keys, ingest, meta, min_holders=2)


def test_s3_one_ingest_bucket_failing_then_hanging(agent_factory, moto_server, cloud_env,
                                                   fault_proxy):
    """Ingest bucket 1 of 3 (quorum 2) sits behind a fault proxy answering every request 503 for
    the whole run, agent start included; then the same proxy stops answering at all. Produce and
    fetch keep working throughout, nothing acked is lost or duplicated, and the failing bucket
    holds no data."""
    cloud_env.setenv("WEIR_STORAGE_REQUEST_TIMEOUT", "5s")
    proxy = fault_proxy(moto_server, mode="fail", name="ingest1")
    ingest, meta, args = s3_layout(moto_server, [None, proxy.endpoint, None], quorum=2)
    agent = agent_factory(extra_args=args)
    topic = unique("cloud-onedown")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})

    producers = start_producers(agent, topic)
    wait_until(lambda: acked(producers) >= 3000, WAIT_S, "acks with bucket 1 failing")
    assert proxy.count("failed") > 0, f"no request reached the failing bucket: {proxy.counts()}"
    finish(agent, topic, producers, Report("s3-2-of-3-one-bucket-503", 0))
    assert proxy.count("forwarded") == 0
    assert moto_server.keys(ingest[1]) == []

    proxy.set_mode("hang")
    hung_before = proxy.count("hung")
    producers = [CheckedProducer(agent.bootstrap, topic, PARTITIONS, f"q{i}", IDEMPOTENT)
                 for i in range(2)]
    for producer in producers:
        producer.start()
    wait_until(lambda: acked(producers) >= 3000 and proxy.count("hung") > hung_before, WAIT_S,
               "acks with bucket 1 hanging, and requests held by its proxy")
    finish(agent, topic, producers, Report("s3-2-of-3-one-bucket-hung", 0))
    agent.check_still_running()
    assert moto_server.keys(ingest[1]) == []
    assert_bucket_roles(moto_server.keys, [ingest[0], ingest[2]], meta, min_holders=2)


def refused_start(agent, proxy, bucket: str) -> None:
    """The agent exits by itself, non-zero, naming the bucket and the missing capability, after
    its requests went through the proxy that dropped the conditions."""
    try:
        result = subprocess.run(agent.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, timeout=REFUSAL_TIMEOUT_S,
                                cwd=str(agent.data_dir.parent))
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"weir agent kept running against a bucket without create-only "
                             f"writes\n{(e.output or b'').decode(errors='replace')[-5000:]}")
    output = result.stdout.decode(errors="replace")
    print(f"weir agent exited {result.returncode}: "
          f"{[line for line in output.splitlines() if 'create-only' in line][:2]}")
    assert result.returncode not in (0, None), f"exit code {result.returncode}\n{output[-5000:]}"
    assert f"s3://{bucket}" in output, f"output does not name s3://{bucket}:\n{output[-5000:]}"
    assert "create-only" in output, f"output does not say create-only:\n{output[-5000:]}"
    assert proxy.count("stripped") > 0, f"no conditional request reached the proxy: " \
                                        f"{proxy.counts()}"


def test_s3_startup_refused_when_metadata_bucket_ignores_create_only(agent_factory, moto_server,
                                                                    cloud_env, fault_proxy):
    proxy = fault_proxy(moto_server, mode="strip_if_none_match", name="meta")
    agent = agent_factory(start=False)
    _, meta, args = s3_layout(moto_server, [None] * 3, quorum=2, meta_endpoint=proxy.endpoint)
    agent.extra_args = args
    agent.data_dir.mkdir(parents=True, exist_ok=True)
    refused_start(agent, proxy, meta)


def test_s3_startup_refused_when_an_ingest_bucket_ignores_create_only(agent_factory, moto_server,
                                                                     cloud_env, fault_proxy):
    proxy = fault_proxy(moto_server, mode="strip_if_none_match", name="ingest1")
    agent = agent_factory(start=False)
    ingest, _, args = s3_layout(moto_server, [None, proxy.endpoint, None], quorum=2)
    agent.extra_args = args
    agent.data_dir.mkdir(parents=True, exist_ok=True)
    refused_start(agent, proxy, ingest[1])


def test_s3_hung_put_fails_produce_retriably_then_recovers(agent_factory, moto_server, cloud_env,
                                                          fault_proxy):
    """The only ingest bucket (quorum 1) behind a proxy whose PUTs never answer (switched on once
    the agent is up: the startup probe writes to it); the metadata bucket direct. A produce gets
    REQUEST_TIMED_OUT (retriable; possibly written, since its offsets are reserved while it
    uploads and the resolver may yet find it) once the upload attempts hit
    storage.request_timeout, the agent keeps answering, and when the proxy passes again a
    retrying producer delivers every record."""
    cloud_env.setenv("WEIR_STORAGE_REQUEST_TIMEOUT", "2s")
    cloud_env.setenv("WEIR_PRODUCE_UPLOAD_ATTEMPTS", "2")
    proxy = fault_proxy(moto_server, mode="pass", name="ingest0")
    ingest, meta, args = s3_layout(moto_server, [proxy.endpoint], quorum=1)
    agent = agent_factory(extra_args=args)
    topic = unique("cloud-hungput")
    ck_create_topics(agent.bootstrap, {topic: 1})

    proxy.set_mode("hang_puts")
    batch = kafka_raw.build_batch([(b"k", b"v", 1_700_000_000_000)])
    sock = kafka_raw.connect(agent.bootstrap, timeout=120.0)
    try:
        err, base = kafka_raw.produce_v3(sock, topic, 0, batch, corr_id=21)
        assert err == REQUEST_TIMED_OUT, f"produce to a hung bucket answered {err} at {base}"
    finally:
        sock.close()
    assert proxy.count("hung", "PUT") > 0
    kafka_raw.check_api_versions(agent.bootstrap)
    agent.check_still_running()
    assert "did not finish within" in agent.log_text(), "no timeout in the agent log"

    # A producer starts while PUTs still hang; its first attempts fail retriably. Once its
    # uploads are being held, the bucket recovers and the producer's retries go through.
    records = [(f"k{i}".encode(), f"after-hang-{i}".encode()) for i in range(200)]
    hung_before = proxy.count("hung", "PUT")
    result: dict = {}

    def produce():
        try:
            result["acked"] = ck_produce(
                agent.bootstrap, [Rec(topic, 0, k, v) for k, v in records],
                conf={"enable.idempotence": True, "message.timeout.ms": 120_000,
                      "retry.backoff.ms": 200},
                flush_timeout=150)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            result["error"] = e

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    proxy.wait_for(lambda p: p.count("hung", "PUT") > hung_before, WAIT_S,
                   "the producer's upload to hang")
    proxy.set_mode("pass")
    thread.join(200)
    assert not thread.is_alive(), "producer did not finish"
    assert "error" not in result, result.get("error")
    acked_after = result["acked"]
    # With parallel persistence the raw produce's failed file keeps its reserved offset 0 until
    # the resolver aborts it (at its next pass: the agent abandoned that incarnation itself), and
    # readers see nothing past it until then. When the producer's upload is released at once,
    # its acks can arrive before that pass.
    last = {0: max(a.offset for a in acked_after)}
    assert wait_readable(agent.bootstrap, topic, last, WAIT_S), \
        "acknowledged records still above the high watermark"
    got = ck_consume(agent.bootstrap, topic, [0])
    # The record of the failed raw produce may or may not have been stored (an upload that timed
    # out is not a write that failed): offset 0 holds it, or the producer's first record, or
    # (with parallel persistence, whose failed files keep their reserved offsets) the empty
    # batch of its aborted file, which consumers step over. Dense from there.
    offsets = [g.offset for g in got[0]]
    assert offsets and offsets[0] in (0, 1), offsets[:5]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), offsets[:20]
    assert_acked_present(acked_after, got)
    # The producer's records are all there exactly once.
    values = [g.value for g in got[0]]
    assert sorted(v for v in values if v.startswith(b"after-hang-")) == sorted(v for _, v in records)
    assert proxy.count("forwarded", "PUT") > 0
    assert_bucket_roles(moto_server.keys, ingest, meta, min_holders=1)
