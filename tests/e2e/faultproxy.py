"""A small HTTP fault proxy for the cloud end-to-end tests: one instance in front of one
object-store server (moto, azurite), on its own free port on 127.0.0.1, controlled in-process.

    proxy = FaultProxy("127.0.0.1", moto_port).start()
    url = f"s3://bucket?endpoint={proxy.endpoint}&..."
    proxy.set_mode("fail")

Modes (`MODES`), read when a request has been received in full:
  pass                  forward the request, answer with the server's response
  fail                  answer 503 SlowDown (S3's throttling error) without forwarding
  hang                  never answer; when the mode changes the connection is closed unanswered
                        (the request is never forwarded, so no late write lands)
  hang_puts             like `hang` for PUT requests, `pass` for every other method
  strip_if_none_match   forward without `If-None-Match` / `If-Match`: a store that ignores
                        conditional writes

HTTP/1.1 keep-alive, `Expect: 100-continue`, Content-Length and chunked bodies in both directions,
and concurrent connections (one thread each) are handled. Each request is forwarded on its own
upstream connection. Chunked request bodies are forwarded chunked (same headers), so signatures
that cover the headers stay valid; a chunked response is passed on with a Content-Length.
`counts` says what the proxy did (forwarded, failed, hung, stripped) per method.
"""

from __future__ import annotations

import http.client
import http.server
import select
import socket
import threading
import time
from collections import Counter

MODES = ("pass", "fail", "hang", "hang_puts", "strip_if_none_match")
UPSTREAM_TIMEOUT_S = 120.0
HUNG_POLL_S = 0.1
# Hop-by-hop headers: about one connection, never forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade",
              "expect"}
CONDITIONAL = {"if-none-match", "if-match"}
SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                  b'<Message>Please reduce your request rate. (weir fault proxy)</Message>'
                  b'<RequestId>faultproxy</RequestId></Error>')


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the client says otherwise
    server: "_Server"

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass

    # Every method goes through one path.
    def do_GET(self):
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_GET

    def _read_body(self) -> tuple[bytes, bool]:
        """The request body and whether it came chunked."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    # trailers, up to the empty line
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts), True
                parts.append(self.rfile.read(size))
                self.rfile.readline(3)  # CRLF after the chunk
        length = int(self.headers.get("Content-Length") or 0)
        return (self.rfile.read(length) if length else b""), False

    def _handle(self) -> None:
        proxy = self.server.proxy
        body, chunked = self._read_body()
        mode = proxy.mode
        method = self.command
        proxy._count("requests", method)
        if mode == "hang" or (mode == "hang_puts" and method == "PUT"):
            proxy._count("hung", method)
            self._hang(mode)
            return
        if mode == "fail":
            proxy._count("failed", method)
            self._answer(503, "Slow Down", [("Content-Type", "application/xml")],
                         SLOW_DOWN_BODY)
            return
        strip = mode == "strip_if_none_match"
        self._forward(body, chunked, strip)

    def _hang(self, mode: str) -> None:
        """Holds the request unanswered until the mode changes, the proxy stops or the client
        goes away; then closes the connection without an answer."""
        proxy = self.server.proxy
        self.close_connection = True
        with proxy._hung_lock:
            proxy._hung_now += 1
        try:
            with proxy._mode_changed:
                while proxy.mode == mode and not proxy._stopping:
                    proxy._mode_changed.wait(HUNG_POLL_S)
                    if self._client_gone():
                        return
        finally:
            with proxy._hung_lock:
                proxy._hung_now -= 1
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _forward(self, body: bytes, chunked: bool, strip: bool) -> None:
        proxy = self.server.proxy
        headers = []
        stripped = False
        for name, value in self.headers.items():
            low = name.lower()
            if low in HOP_BY_HOP:
                continue
            if strip and low in CONDITIONAL:
                stripped = True
                continue
            headers.append((name, value))
        if stripped:
            proxy._count("stripped", self.command)
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port,
                                          timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(body if (body or chunked) else None, encode_chunked=chunked)
            resp = conn.getresponse()
            data = resp.read()
            out = []
            upstream_chunked = False
            has_length = False
            for name, value in resp.getheaders():
                low = name.lower()
                if low == "transfer-encoding":
                    upstream_chunked = "chunked" in value.lower()
                    continue
                if low in HOP_BY_HOP:
                    continue
                if low == "content-length":
                    if upstream_chunked:
                        continue
                    has_length = True
                out.append((name, value))
            no_body = self.command == "HEAD" or resp.status in (204, 304) or resp.status < 200
            if not has_length and not no_body:
                out.append(("Content-Length", str(len(data))))
            proxy._count("forwarded", self.command)
            self._write(resp.status, resp.reason, out, b"" if no_body else data)
        except (OSError, http.client.HTTPException) as e:
            proxy._count("upstream_errors", self.command)
            self._answer(502, "Bad Gateway", [("Content-Type", "text/plain")],
                         f"weir fault proxy: upstream error: {e!r}".encode())
        finally:
            conn.close()

    def _answer(self, status: int, reason: str, headers, body: bytes) -> None:
        out = list(headers)
        out.append(("Content-Length", str(len(body))))
        self._write(status, reason, out, b"" if self.command == "HEAD" else body)

    def _write(self, status: int, reason: str, headers, body: bytes) -> None:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{name}: {value}" for name, value in headers]
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head + body)
        self.wfile.flush()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    proxy: "FaultProxy"


class FaultProxy:
    """An HTTP proxy on 127.0.0.1:`port` (a free one by default) forwarding to
    `upstream_host:upstream_port`, with a fault mode that the test sets (see the module doc)."""

    def __init__(self, upstream_host: str, upstream_port: int, mode: str = "pass",
                 port: int = 0, name: str = "proxy"):
        self.upstream_host, self.upstream_port = upstream_host, int(upstream_port)
        self.name = name
        self._check_mode(mode)
        self._mode = mode
        self._mode_changed = threading.Condition()
        self._hung_lock = threading.Lock()
        self._hung_now = 0
        self._stopping = False
        self._counts: Counter = Counter()
        self._counts_lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.proxy = self
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @staticmethod
    def _check_mode(mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown fault proxy mode {mode!r} (known: {', '.join(MODES)})")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> None:
        """Switches the mode for requests received from now on; requests hung in the old mode
        are released (their connections closed unanswered)."""
        self._check_mode(mode)
        with self._mode_changed:
            self._mode = mode
            self._mode_changed.notify_all()

    def hung_now(self) -> int:
        """Requests currently held unanswered."""
        with self._hung_lock:
            return self._hung_now

    def counts(self) -> Counter:
        """What the proxy did so far: keys ("requests" | "forwarded" | "failed" | "hung" |
        "stripped" | "upstream_errors", METHOD), plus (kind, "*") totals."""
        with self._counts_lock:
            return Counter(self._counts)

    def count(self, kind: str, method: str = "*") -> int:
        with self._counts_lock:
            return self._counts[(kind, method)]

    def _count(self, kind: str, method: str) -> None:
        with self._counts_lock:
            self._counts[(kind, method)] += 1
            self._counts[(kind, "*")] += 1

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name=f"faultproxy-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._mode_changed:
            self._stopping = True
            self._mode_changed.notify_all()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def wait_for(self, pred, timeout: float, what: str) -> None:
        """Waits (bounded) until `pred(self)` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self):
                return
            time.sleep(0.02)
        raise AssertionError(f"fault proxy {self.name}: timed out after {timeout:.0f}s waiting "
                             f"for {what}; counts {dict(self.counts())}")

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"FaultProxy({self.name} {self.endpoint} -> "
                f"{self.upstream_host}:{self.upstream_port}, mode={self._mode})")
