"""Parallel persistence (RFC 0006) with real clients: on S3 (moto) with two buckets failing, and
on local files with the agent aborted between a reservation and its upload.

With `produce.parallel_persistence`, a file's offsets are reserved in the metadata log while the
file uploads. Here ingest buckets fail (through a fault proxy) while idempotent producers run:
reservations are durable but their files cannot reach a quorum, so their produces fail
retriably and the files stay pending. Once the buckets are back the resolver settles them:
- two of three buckets failed: each file is in the third; the resolver copies it to a quorum
  and confirms it, and the producers' retries are answered as duplicates (no holes);
- all three failed: no bucket holds them; the resolver aborts them (their offsets become empty
  batches) and the retries append anew.

Afterwards nothing acknowledged is lost, duplicated or reordered (the checker), aborted offsets
are the only holes in the record offsets, and librdkafka (confluent-kafka, kcat) and
kafka-python all read every partition through them to the end."""

from __future__ import annotations

import time

import pytest

from checker import CheckedProducer, Report, verify
from cloud import s3_url
from test_faults import (IDEMPOTENT, PARTITIONS, acked, assert_failpoint_abort, publish,
                         start_producers, stop_producers)
from confluent_kafka import TopicPartition
from weirtest import (Rec, ck_admin, ck_consume, ck_consumer, ck_create_topics, ck_produce,
                      ck_producer, ck_watermarks, kcat_consume, kp_consume, unique, wait_topic,
                      wait_until)

WAIT_S = 90.0


@pytest.fixture(params=["two", "all"])
def parallel_agent(request, agent_factory, cloud_env, moto_server, fault_proxy):
    """(agent, proxy, failing): three ingest buckets (quorum 2) and a metadata bucket on moto;
    buckets 1 and 2 (`failing` "two") or all three ("all") are reached through `proxy`, the
    others and the metadata bucket directly."""
    failing = request.param
    cloud_env.setenv("WEIR_PRODUCE_PARALLEL_PERSISTENCE", "true")
    cloud_env.setenv("WEIR_PRODUCE_ACK_DEADLINE", "2s")
    cloud_env.setenv("WEIR_PRODUCE_CLOCK_SKEW_MARGIN", "1s")
    # An upload gives up within the outage, so its file never reaches a quorum (nor any bucket
    # when all three fail): the resolver must repair or abort it.
    cloud_env.setenv("WEIR_PRODUCE_UPLOAD_ATTEMPTS", "1")
    cloud_env.setenv("WEIR_STORAGE_REQUEST_TIMEOUT", "1s")
    ingest = [moto_server.create_bucket("ingest") for _ in range(3)]
    meta = moto_server.create_bucket("meta")
    proxy = fault_proxy(moto_server, name=f"buckets-{failing}")
    direct = moto_server.endpoint
    first = direct if failing == "two" else proxy.endpoint
    urls = [s3_url(ingest[0], first), s3_url(ingest[1], proxy.endpoint),
            s3_url(ingest[2], proxy.endpoint)]
    args = [a for url in urls for a in ("--ingest-bucket", url)]
    agent = agent_factory([*args, "--quorum", "2", "--metadata-bucket", s3_url(meta, direct)])
    return agent, proxy, failing


def settle(agent, topic: str, producers, report: Report) -> Report:
    """Stops the producers and checks what the log holds: nothing acknowledged lost, duplicated
    or reordered, every delivery succeeded (librdkafka retries until message.timeout.ms). Holes
    in the record offsets are allowed: aborted files leave empty batches."""
    stop_producers(producers)
    # verify() waits until every acknowledged offset is below its partition's high watermark:
    # after a crash a file that never landed holds later records back until the resolver
    # aborts it.
    verify(agent.bootstrap, topic, PARTITIONS, producers, report)
    publish(report)
    assert report.acked >= 400
    assert report.lost == 0, report.line()
    assert report.duplicated == 0, report.line()
    assert report.reordered == 0, report.line()
    assert report.failed_deliveries == 0, report.line()
    return report


def records(got_by_partition: dict) -> dict:
    """{partition: [(offset, value)]}."""
    return {p: [(g.offset, g.value) for g in got] for p, got in got_by_partition.items()}


def test_files_that_never_reach_a_quorum_are_repaired_or_aborted_and_every_client_reads_them(
        parallel_agent, kcat):
    agent, proxy, failing = parallel_agent
    topic = unique("parallel")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    wait_topic(agent.bootstrap, topic, PARTITIONS)
    producers = [CheckedProducer(agent.bootstrap, topic, PARTITIONS, f"p{n}", IDEMPOTENT)
                 for n in range(2)]
    for producer in producers:
        producer.start()
    wait_until(lambda: acked(producers) >= 200, WAIT_S, "acks before the outage")

    proxy.set_mode("fail")
    time.sleep(5)
    assert "abandoning the reserving incarnation" in agent.log_text(), agent.log_tail()
    proxy.set_mode("pass")
    settled = "resolver repaired a pending file" if failing == "two" else \
        "resolver aborted pending files"
    wait_until(lambda: settled in agent.log_text(), WAIT_S,
               f"the files that never reached a quorum settled: {settled}")
    at_heal = acked(producers)
    wait_until(lambda: acked(producers) >= at_heal + 200, WAIT_S, "acks after the outage")

    report = settle(agent, topic, producers,
                    Report(f"parallel-persistence-{failing}-buckets-503", 0))
    log = agent.log_text()
    if failing == "two":
        # Every file was in bucket 0: repaired, none aborted, so no holes.
        assert "resolver aborted pending files" not in log, agent.log_tail()
        assert report.gaps == 0, report.line()
    else:
        # The aborted files' offsets hold empty batches: holes in the record offsets only.
        assert report.gaps > 0, report.line()

    everything = records(ck_consume(agent.bootstrap, topic, range(PARTITIONS)))
    assert records(kp_consume(agent.bootstrap, topic, range(PARTITIONS))) == everything
    for partition in range(PARTITIONS):
        got = [(g.offset, g.value) for g in kcat_consume(kcat, agent.bootstrap, topic, partition)]
        assert got == everything[partition], f"kcat, partition {partition}"


@pytest.mark.parametrize("hit", [7, 60])
def test_crash_between_a_reservation_and_its_upload(agent_factory, monkeypatch, hit):
    """The agent aborts itself once a file's reservation is durable, before its upload is
    known to be in a quorum (fail point `after-reserve-before-ack`, on the s3-express latency
    model so uploads are in flight). After the restart, the resolver confirms what landed and
    aborts what did not; the idempotent producers' resends fill in the rest."""
    monkeypatch.setenv("WEIR_PRODUCE_PARALLEL_PERSISTENCE", "true")
    monkeypatch.setenv("WEIR_PRODUCE_ACK_DEADLINE", "2s")
    monkeypatch.setenv("WEIR_PRODUCE_CLOCK_SKEW_MARGIN", "1s")
    point = "after-reserve-before-ack"
    profile = ["--storage-profile", "s3-express"]
    agent = agent_factory([*profile, "--failpoints", f"{point}=abort@{hit}"])
    topic = unique("reserve-crash")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    producers = start_producers(agent, topic)
    wait_until(lambda: not agent.alive(), WAIT_S, f"the agent to abort at {point}")
    assert_failpoint_abort(agent, point, hit)
    agent.kill9()  # reap and mark as expected
    acked_at_crash = acked(producers)
    agent.start(extra_args=profile)
    wait_until(lambda: acked(producers) >= acked_at_crash + 500, WAIT_S, "acks after restart")
    # A file the crash left pending and unresolved would hold back every later record of its
    # partition (readers stop at it): those acknowledged records would count as lost here.
    report = Report(f"parallel-failpoint:{point}@{hit}", hit)
    report.crashes = 1
    settle(agent, topic, producers, report)


def test_a_client_lists_reads_and_deletes_its_writes_at_once(agent_factory, monkeypatch):
    """The agent serves a file from the moment it acknowledged it, before the log confirms it
    (RFC 0006, "Serving acknowledged files"; confirmations wait up to 50 ms for the next
    reservation's slot): right after each acknowledgement, ListOffsets' end covers the record
    and a consumer already assigned reads it; DeleteRecords up to that end is then accepted.
    On the s3-express latency model, so log slots take real time."""
    monkeypatch.setenv("WEIR_PRODUCE_PARALLEL_PERSISTENCE", "true")
    agent = agent_factory(["--storage-profile", "s3-express"])
    topic = unique("served")
    ck_create_topics(agent.bootstrap, {topic: 1})
    wait_topic(agent.bootstrap, topic, 1)
    producer = ck_producer(agent.bootstrap, {"linger.ms": 0})
    consumer = ck_consumer(agent.bootstrap)
    # Its own connection: on the consumer's, ListOffsets would queue behind a fetch long-poll,
    # which the confirmation ends.
    lister = ck_consumer(agent.bootstrap)
    tp = TopicPartition(topic, 0)
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        for i in range(20):
            value = f"served-{i}".encode()
            (acked,) = ck_produce(agent.bootstrap, [Rec(topic, 0, None, value)],
                                  producer=producer)
            _, high = lister.get_watermark_offsets(tp, timeout=30, cached=False)
            assert high == acked.offset + 1, f"record {i}: end {high} right after its ack"
            got = None
            deadline = time.monotonic() + WAIT_S
            while got is None and time.monotonic() < deadline:
                for m in consumer.consume(num_messages=10, timeout=0.5):
                    assert not m.error(), m.error()
                    got = (m.offset(), m.value())
            assert got == (acked.offset, value), f"record {i}"
    finally:
        consumer.close()
        lister.close()
    admin = ck_admin(agent.bootstrap)
    futures = admin.delete_records([TopicPartition(topic, 0, high)], request_timeout=30,
                                   operation_timeout=30)
    (future,) = futures.values()
    assert future.result(timeout=35).low_watermark == high
    assert ck_watermarks(agent.bootstrap, topic, [0])[0] == (high, high)


def test_acknowledged_records_are_readable_at_once_after_a_kill9(agent_factory, monkeypatch):
    """Each cycle produces, is acknowledged and is killed (-9) before the 50 ms confirmation
    linger ends, so the restart finds the acknowledged files pending in the log. The agent
    resolves its predecessor's pending files (a HEAD per bucket) before it serves, so a consumer
    right after each restart reads every acknowledged record at its acknowledged offset (without
    that pass, the first resolver pass came 500 ms later and the consumer read nothing)."""
    monkeypatch.setenv("WEIR_PRODUCE_PARALLEL_PERSISTENCE", "true")
    agent = agent_factory([])
    topic = unique("pp-restart")
    ck_create_topics(agent.bootstrap, {topic: 1})
    acked = []
    for cycle in range(4):
        acked += ck_produce(agent.bootstrap,
                            [Rec(topic, 0, None, f"c{cycle}-{i}".encode()) for i in range(25)])
        agent.kill9()
        agent.start()
        got = ck_consume(agent.bootstrap, topic, [0])
        assert [(m.offset, m.value) for m in got[0]] == \
            [(a.offset, a.rec.value) for a in acked], f"after restart {cycle + 1}"
    assert [a.offset for a in acked] == list(range(100))
    assert "resolved pending files of an earlier run before serving" in agent.log_text()
