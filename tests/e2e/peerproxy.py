"""A TCP proxy in front of one agent's control service (gRPC) that can shut chosen agents out,
for cutting an agent off its peers while it keeps its buckets and its clients.

    proxy = PeerProxy(control_port).start()      # the agent advertises proxy.address
    proxy.refuse({pid_of_c})                     # C's connections are closed, new ones refused
    proxy.refuse(set())                          # heal

Agents connect from ephemeral ports on 127.0.0.1, so the proxy tells them apart by process:
the connecting socket's inode (from /proc/net/tcp, by its local port) among the open files of
each refused process (/proc/PID/fd). Linux only, like the rest of the suite.
"""

from __future__ import annotations

import os
import socket
import threading

from conftest import pick_free_port

BUFFER = 64 * 1024


def socket_inode(local_port: int) -> int | None:
    """The inode of the TCP socket on 127.0.0.1 whose local port is `local_port`."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == local_port and fields[9] != "0":
                        return int(fields[9])
        except OSError:
            continue
    return None


def owns_socket(pid: int, inode: int) -> bool:
    target = f"socket:[{inode}]"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


class PeerProxy:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.port = pick_free_port()
        self.refused: set[int] = set()
        self.lock = threading.Lock()
        # (the client's port, client socket, upstream socket)
        self.links: list[tuple[int, socket.socket, socket.socket]] = []
        self.refusals = 0
        self._server: socket.socket | None = None
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "PeerProxy":
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        server.settimeout(0.2)
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name=f"peerproxy-{self.port}").start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._server:
            self._server.close()
        self.refuse_all_links()

    def refuse(self, pids: set[int]) -> None:
        """From now on connections of these processes are closed at once; their open ones are
        closed now. An empty set lets everyone through again."""
        with self.lock:
            self.refused = set(pids)
            links = list(self.links)
        for link in links:
            if self._owner(link[0]) is not None:
                self._close(link)

    def refuse_all_links(self) -> None:
        with self.lock:
            links = list(self.links)
        for link in links:
            self._close(link)

    def _close(self, link) -> None:
        with self.lock:
            if link in self.links:
                self.links.remove(link)
        for sock in link[1:]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _owner(self, peer_port: int) -> int | None:
        inode = socket_inode(peer_port)
        if inode is None:
            return None
        with self.lock:
            refused = set(self.refused)
        return next((pid for pid in refused if owns_socket(pid, inode)), None)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, (_, peer_port) = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            owner = self._owner(peer_port)
            if owner is not None:
                self.refusals += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            link = (peer_port, client, upstream)
            with self.lock:
                self.links.append(link)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(link, source, sink), daemon=True).start()

    def _pump(self, link, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(BUFFER)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        self._close(link)
