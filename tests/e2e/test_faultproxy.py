"""The fault proxy (faultproxy.py) against moto's S3 server: each mode does what it says, and
moto itself honours the conditional writes the `strip_if_none_match` mode takes away. No agent
is involved."""

from __future__ import annotations

import http.client
import select
import socket
import threading

import botocore.exceptions
import pytest

WAIT_S = 30.0


def status_of(exc: botocore.exceptions.ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


@pytest.fixture
def bucket(moto_server, cloud_env) -> str:
    return moto_server.create_bucket("proxy")


def test_moto_honours_conditional_puts(moto_server, bucket):
    """The baseline the strip mode removes: moto refuses a create-only PUT on an existing key and
    a PUT whose If-Match names another ETag, both with 412 PreconditionFailed."""
    s3 = moto_server.client()
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")["ETag"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert status_of(e.value) == (412, "PreconditionFailed")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k", Body=b"three", IfMatch='"0123456789abcdef"')
    assert status_of(e.value) == (412, "PreconditionFailed")
    s3.put_object(Bucket=bucket, Key="k", Body=b"four", IfMatch=etag)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"four"


def test_faultproxy_pass_forwards_everything(moto_server, bucket, fault_proxy):
    proxy = fault_proxy(moto_server)
    s3 = moto_server.client(proxy.endpoint)
    s3.put_object(Bucket=bucket, Key="a/1", Body=b"x" * 100_000)
    s3.put_object(Bucket=bucket, Key="a/2", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="a/1")["Body"].read() == b"x" * 100_000
    assert s3.get_object(Bucket=bucket, Key="a/1", Range="bytes=10-19")["Body"].read() == b"x" * 10
    assert s3.head_object(Bucket=bucket, Key="a/1")["ContentLength"] == 100_000
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="a/")["Contents"]]
    assert listed == ["a/1", "a/2"]
    s3.delete_object(Bucket=bucket, Key="a/2")
    assert moto_server.keys(bucket) == ["a/1"]
    # Conditional writes keep working through the proxy.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="a/1", Body=b"again", IfNoneMatch="*")
    assert status_of(e.value) == (412, "PreconditionFailed")
    counts = proxy.counts()
    assert counts[("forwarded", "PUT")] == 3 and counts[("forwarded", "GET")] >= 3
    assert counts[("forwarded", "HEAD")] == 1 and counts[("forwarded", "DELETE")] == 1
    assert counts[("failed", "*")] == counts[("hung", "*")] == counts[("stripped", "*")] == 0


def test_faultproxy_keep_alive_and_chunked_bodies(moto_server, bucket, fault_proxy):
    """Several requests on one client connection, one with a chunked body; moto's answers come
    back framed so the connection stays usable."""
    proxy = fault_proxy(moto_server)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=WAIT_S)
    try:
        chunks = (part for part in (b"hello ", b"chunked ", b"world"))
        conn.request("PUT", f"/{bucket}/chunked", body=chunks, encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        conn.request("PUT", f"/{bucket}/plain", body=b"plain body")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        sock = conn.sock
        assert sock is not None, "the proxy closed a keep-alive connection"
        conn.request("GET", f"/{bucket}?list-type=2")
        resp = conn.getresponse()
        listing = resp.read()
        assert resp.status == 200 and b"<Key>chunked</Key>" in listing and b"<Key>plain</Key>" in listing
        assert conn.sock is sock, "the proxy did not keep the connection alive"
    finally:
        conn.close()
    s3 = moto_server.client()
    assert s3.get_object(Bucket=bucket, Key="chunked")["Body"].read() == b"hello chunked world"
    assert s3.get_object(Bucket=bucket, Key="plain")["Body"].read() == b"plain body"


def test_faultproxy_concurrent_connections(moto_server, bucket, fault_proxy):
    proxy = fault_proxy(moto_server)
    errors: list = []

    def worker(i: int) -> None:
        try:
            s3 = moto_server.client(proxy.endpoint)
            for j in range(5):
                body = f"{i}-{j}".encode() * 1000
                s3.put_object(Bucket=bucket, Key=f"c/{i}/{j}", Body=body)
                assert s3.get_object(Bucket=bucket, Key=f"c/{i}/{j}")["Body"].read() == body
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 2)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]
    assert len(moto_server.keys(bucket, "c/")) == 40
    assert proxy.count("forwarded", "PUT") == 40


def test_faultproxy_fail_answers_503_without_forwarding(moto_server, bucket, fault_proxy):
    proxy = fault_proxy(moto_server, mode="fail")
    s3 = moto_server.client(proxy.endpoint)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="never", Body=b"x")
    assert status_of(e.value) == (503, "SlowDown")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.head_object(Bucket=bucket, Key="never")
    assert status_of(e.value)[0] == 503
    assert moto_server.keys(bucket) == [], "a failed request reached the server"
    assert proxy.count("failed") == 2 and proxy.count("forwarded") == 0, proxy.counts()
    proxy.set_mode("pass")
    s3.put_object(Bucket=bucket, Key="after", Body=b"x")
    assert moto_server.keys(bucket) == ["after"]


def raw_request(port: int, method: str, path: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def assert_unanswered(sock: socket.socket) -> None:
    """Nothing has arrived on `sock` (checked after the proxy says it holds the request)."""
    readable, _, _ = select.select([sock], [], [], 0.2)
    assert not readable, f"the proxy answered a hung request: {sock.recv(200)!r}"


def test_faultproxy_hang_holds_requests_until_the_mode_changes(moto_server, bucket, fault_proxy):
    proxy = fault_proxy(moto_server, mode="hang")
    put = raw_request(proxy.port, "PUT", f"/{bucket}/hung", b"payload")
    get = raw_request(proxy.port, "GET", f"/{bucket}/hung")
    try:
        proxy.wait_for(lambda p: p.hung_now() == 2, WAIT_S, "two hung requests")
        assert_unanswered(put)
        assert_unanswered(get)
        proxy.set_mode("pass")
        # Released unanswered: the connections are closed, nothing was forwarded.
        assert put.recv(100) == b"" and get.recv(100) == b""
    finally:
        put.close()
        get.close()
    proxy.wait_for(lambda p: p.hung_now() == 0, WAIT_S, "released requests")
    assert moto_server.keys(bucket) == [], "a hung PUT reached the server"
    assert proxy.count("hung") == 2 and proxy.count("forwarded") == 0
    moto_server.client(proxy.endpoint).put_object(Bucket=bucket, Key="after", Body=b"x")
    assert moto_server.keys(bucket) == ["after"]


def test_faultproxy_hang_lets_go_of_a_client_that_left(moto_server, bucket, fault_proxy):
    proxy = fault_proxy(moto_server, mode="hang")
    sock = raw_request(proxy.port, "GET", f"/{bucket}/x")
    proxy.wait_for(lambda p: p.hung_now() == 1, WAIT_S, "a hung request")
    sock.close()
    proxy.wait_for(lambda p: p.hung_now() == 0, WAIT_S, "the proxy to notice the client left")
    assert proxy.mode == "hang"


def test_faultproxy_hang_puts_hangs_only_puts(moto_server, bucket, fault_proxy):
    moto_server.client().put_object(Bucket=bucket, Key="existing", Body=b"old")
    proxy = fault_proxy(moto_server, mode="hang_puts")
    put = raw_request(proxy.port, "PUT", f"/{bucket}/hung", b"payload")
    try:
        proxy.wait_for(lambda p: p.hung_now() == 1, WAIT_S, "a hung PUT")
        # While the PUT hangs, reads, lists and deletes go through (another connection).
        s3 = moto_server.client(proxy.endpoint)
        assert s3.get_object(Bucket=bucket, Key="existing")["Body"].read() == b"old"
        assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["existing"]
        assert_unanswered(put)
        proxy.set_mode("pass")
        assert put.recv(100) == b""
    finally:
        put.close()
    assert moto_server.keys(bucket) == ["existing"]
    assert proxy.count("hung", "PUT") == 1 and proxy.count("hung") == 1
    assert proxy.count("forwarded", "GET") == 2


def test_faultproxy_strip_if_none_match_ignores_conditional_writes(moto_server, bucket,
                                                                   fault_proxy):
    """Through the proxy a create-only PUT on an existing key and a PUT with a wrong If-Match
    both succeed (moto refuses them when asked directly: test_moto_honours_conditional_puts)."""
    proxy = fault_proxy(moto_server, mode="strip_if_none_match")
    s3 = moto_server.client(proxy.endpoint)
    s3.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")
    s3.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    s3.put_object(Bucket=bucket, Key="k", Body=b"three", IfMatch='"0123456789abcdef"')
    assert moto_server.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"three"
    assert proxy.count("stripped", "PUT") == 3 and proxy.count("forwarded", "PUT") == 3
    # A plain GET passes untouched.
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"three"
    assert proxy.count("stripped") == 3


def test_faultproxy_rejects_unknown_modes(moto_server, fault_proxy):
    proxy = fault_proxy(moto_server)
    with pytest.raises(ValueError):
        proxy.set_mode("flaky")
    assert proxy.mode == "pass"
