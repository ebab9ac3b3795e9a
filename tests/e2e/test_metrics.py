"""`/metrics`, `/healthz` and `/readyz` of a real `weir agent` under real clients (issue 15).

The counters must move by what the clients did: records and bytes produced and consumed, one
object-store PUT per sealed file plus one per metadata log slot, and an estimated cost equal to
the requests and bytes times the configured prices. `/readyz` must fail while the metadata
bucket is unreachable and recover after."""

from __future__ import annotations

import math
import socket
import urllib.error
import urllib.request

from confluent_kafka import Producer, TopicPartition

import kafka_raw

from cloud import s3_url
from scrape import get, label_values, scrape, settled, total
from weirtest import (Rec, ck_consume, ck_consumer, ck_create_topics, ck_produce, unique,
                      wait_topic, wait_until)

GIB = float(1 << 30)
# A price table of our own (dollars), so the expected cost is not a built-in table's.
PRICES = {"put_per_1k": 0.007, "get_per_1k": 0.0011, "list_per_1k": 0.013,
          "head_per_1k": 0.0017, "delete_per_1k": 0.0019,
          "upload_per_gib": 0.023, "download_per_gib": 0.029}
CLASS_PRICE = {"put": "put_per_1k", "get": "get_per_1k", "list": "list_per_1k",
               "head": "head_per_1k", "delete": "delete_per_1k"}


def priced_agent(agent_factory, tmp_path):
    config = tmp_path / "prices.toml"
    config.write_text("[storage.prices.test-prices]\n"
                      + "".join(f"{k} = {v}\n" for k, v in PRICES.items()))
    bucket = f"file://{tmp_path / 'bucket'}?price=test-prices"
    # No compaction (its queue and outputs write objects of their own), and a probe that does
    # not fire during the test: every PUT is then a file or a log slot.
    return agent_factory(["--config", str(config), "--ingest-bucket", bucket,
                          "--no-compaction"])


def puts(samples) -> float:
    return total(samples, "weir_object_store_requests_total", **{"class": "put"})


def quiet(samples) -> tuple:
    return (puts(samples), total(samples, "weir_files_sealed_total"),
            total(samples, "weir_control_log_slots_total"))


def test_counters_move_by_what_real_clients_did(agent_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_HTTP_PROBE_INTERVAL", "1h")
    agent = priced_agent(agent_factory, tmp_path)
    assert get(f"{agent.http_url}/healthz") == (200, "ok\n")
    topic, partitions, n, size = unique("metrics"), 3, 3000, 200
    ck_create_topics(agent.bootstrap, {topic: partitions})
    wait_topic(agent.bootstrap, topic, partitions)

    before = settled(agent.http_url, quiet)
    recs = [Rec(topic, i % partitions, f"k{i}".encode(), bytes([i % 251]) * size)
            for i in range(n)]
    ck_produce(agent.bootstrap, recs, conf={"linger.ms": 20})
    got = ck_consume(agent.bootstrap, topic, range(partitions))
    assert sum(len(v) for v in got.values()) == n
    after = settled(agent.http_url, quiet)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    # Records: exactly what was acknowledged and read back.
    assert delta("weir_produced_records_total", topic=topic) == n
    assert delta("weir_fetched_records_total", topic=topic) == n
    # Bytes: the batches as sent, returned unchanged to the consumer, which read each once.
    produced = delta("weir_produced_bytes_total", topic=topic)
    assert n * size <= produced <= n * (size + 64), produced
    assert delta("weir_fetched_bytes_total", topic=topic) == produced
    produces = delta("weir_kafka_requests_total", api="Produce", error="NONE")
    assert produces > 0
    assert delta("weir_kafka_requests_total", api="Fetch") > 0
    # Every produce passed every stage; each file was uploaded and committed once.
    files = delta("weir_files_sealed_total")
    assert files > 0
    for stage in ("queue", "batch_wait"):
        assert delta("weir_produce_stage_duration_seconds_count", stage=stage) == produces
    for stage in ("upload", "commit"):
        assert delta("weir_produce_stage_duration_seconds_count", stage=stage) == files
    assert delta("weir_file_size_bytes_count") == files
    # One PUT per sealed file (one ingest bucket) and one per metadata log slot, nothing else.
    slots = delta("weir_control_log_slots_total")
    assert slots >= files, (slots, files)
    assert puts(after) - puts(before) == files + slots
    assert total(after, "weir_control_leader") == 1
    assert total(after, "weir_control_log_position") >= slots
    assert total(after, "weir_state_topics") >= 1
    assert total(after, "weir_state_partitions") >= partitions

    # The cost is the requests and bytes times the configured prices, per bucket.
    buckets = label_values(after, "weir_object_store_requests_total", "bucket")
    priced = [b for b in buckets if "bucket?" not in b and b.endswith("bucket")]
    assert priced, buckets
    for bucket in priced:
        expected = sum(total(after, "weir_object_store_requests_total", bucket=bucket,
                             **{"class": c}) / 1000 * PRICES[p] for c, p in CLASS_PRICE.items())
        expected += total(after, "weir_object_store_bytes_total", bucket=bucket,
                          direction="up") / GIB * PRICES["upload_per_gib"]
        expected += total(after, "weir_object_store_bytes_total", bucket=bucket,
                          direction="down") / GIB * PRICES["download_per_gib"]
        cost = total(after, "weir_object_store_cost_dollars_total", bucket=bucket,
                     price_class="test-prices")
        assert expected > 0
        assert math.isclose(cost, expected, rel_tol=1e-9), (bucket, cost, expected)
        assert total(after, "weir_object_store_price_dollars", bucket=bucket,
                     item="put_per_1k") == PRICES["put_per_1k"]
    all_cost = total(after, "weir_object_store_cost_dollars_total")
    all_produced = total(after, "weir_produced_bytes_total")
    assert math.isclose(total(after, "weir_object_store_cost_per_gib_dollars"),
                        all_cost / (all_produced / GIB), rel_tol=1e-6)


def test_consumer_group_lag_is_high_watermark_minus_committed(agent):
    topic, group = unique("lag"), unique("g")
    ck_produce(agent.bootstrap, [Rec(topic, 0, None, b"v") for _ in range(250)])
    consumer = ck_consumer(agent.bootstrap, {"group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 100)], asynchronous=False)
    finally:
        consumer.close()

    def lag():
        return total(scrape(agent.http_url), "weir_consumer_group_lag", group=group)

    wait_until(lambda: lag() == 150, 30, "group lag 150")
    ck_produce(agent.bootstrap, [Rec(topic, 0, None, b"v") for _ in range(50)])
    wait_until(lambda: lag() == 200, 30, "group lag 200 after 50 more records")


def test_readyz_fails_while_the_metadata_bucket_is_down(agent_factory, cloud_env, moto_server,
                                                        fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_HTTP_PROBE_INTERVAL", "200ms")
    monkeypatch.setenv("WEIR_HTTP_PROBE_TIMEOUT", "2s")
    proxy = fault_proxy(moto_server, name="meta")
    meta = moto_server.create_bucket("meta")
    agent = agent_factory(["--ingest-bucket", f"file://{tmp_path / 'ingest'}",
                           "--metadata-bucket", s3_url(meta, proxy.endpoint),
                           "--no-compaction"])
    wait_until(lambda: get(f"{agent.http_url}/readyz")[0] == 200, 30, "ready at start")
    assert total(scrape(agent.http_url), "weir_ready") == 1

    proxy.set_mode("fail")
    wait_until(lambda: get(f"{agent.http_url}/readyz")[0] == 503, 30, "unready")
    status, body = get(f"{agent.http_url}/readyz")
    assert status == 503 and "metadata bucket" in body, body
    assert total(scrape(agent.http_url), "weir_ready") == 0
    # The process itself is fine.
    assert get(f"{agent.http_url}/healthz")[0] == 200

    proxy.set_mode("pass")
    wait_until(lambda: get(f"{agent.http_url}/readyz")[0] == 200, 30, "ready again")
    # And it serves: a produce goes through the recovered metadata bucket.
    ck_produce(agent.bootstrap, [Rec(unique("after"), 0, None, b"v")])


def test_http_endpoint_refuses_what_it_does_not_serve(agent):
    assert get(f"{agent.http_url}/nope")[0] == 404
    request = urllib.request.Request(f"{agent.http_url}/metrics", data=b"x", method="POST")
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("POST accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 405
    # A request head larger than the endpoint accepts closes that connection, nothing else.
    with socket.create_connection(("127.0.0.1", agent.http_port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n")
        try:
            reply = s.recv(100)
        except ConnectionResetError:
            reply = b""
        assert not reply.startswith(b"HTTP/1.1 200"), reply
    assert get(f"{agent.http_url}/healthz")[0] == 200


def test_request_counts_carry_the_error_and_a_bounded_version(agent_factory):
    agent = agent_factory(["--auto-create-topics", "false"])
    missing = unique("missing")
    producer = Producer({"bootstrap.servers": agent.bootstrap, "message.timeout.ms": 3000,
                         "topic.metadata.refresh.interval.ms": 500})
    errors = []
    producer.produce(missing, b"v", partition=0, on_delivery=lambda err, _: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None
    samples = scrape(agent.http_url)
    assert total(samples, "weir_kafka_requests_total", api="Metadata",
                 error="UNKNOWN_TOPIC_OR_PARTITION") >= 1
    # ApiVersions at versions Weir does not serve: answered (UNSUPPORTED_VERSION), counted under
    # one label value, however many versions a client tries.
    sock = kafka_raw.connect(agent.bootstrap)
    try:
        for corr, version in enumerate((99, 1000, 32000), start=1):
            kafka_raw.roundtrip(sock, kafka_raw.request(18, version, corr, b""), corr)
    finally:
        sock.close()
    samples = scrape(agent.http_url)
    versions = {dict(ls)["version"] for (n, ls) in samples
                if n == "weir_kafka_requests_total" and dict(ls)["api"] == "ApiVersions"}
    assert "unsupported" in versions and not {"99", "1000", "32000"} & versions, versions
    assert total(samples, "weir_kafka_requests_total", api="ApiVersions", version="unsupported",
                 error="UNSUPPORTED_VERSION") == 3


def test_one_peer_cannot_take_every_http_connection(agent):
    idle = [socket.create_connection(("127.0.0.1", agent.http_port), timeout=10)
            for _ in range(8)]
    try:
        ninth = socket.create_connection(("127.0.0.1", agent.http_port), timeout=10)
        with ninth:
            ninth.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                reply = ninth.recv(100)
            except ConnectionResetError:
                reply = b""
            assert reply == b"", reply  # the ninth from this address is closed at accept
    finally:
        for s in idle:
            s.close()
    def healthy() -> bool:
        # The agent frees a peer's slots as it sees those connections close: until then a new
        # connection from this address is still refused (reset).
        try:
            return get(f"{agent.http_url}/healthz")[0] == 200
        except OSError:
            return False

    wait_until(healthy, 20, "healthz after the idle connections closed")
