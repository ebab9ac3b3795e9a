"""Fixtures for the Weir end-to-end suite.

Every test gets its own `weir agent` process (own free port, own data dir
under the test's tmp dir). The agent's stdout/stderr go to a log file next to
the data dir and the tail of that log is attached to the report of any failed
test.

Contract with the broker (see tests/e2e/README.md):
  $WEIR_BIN agent --listen 127.0.0.1:PORT --data-dir DIR [extra flags]
  WEIR_BIN defaults to ${CARGO_TARGET_DIR:-target}/debug/weir (relative to the
  repo root). Ready when the TCP port accepts connections.

Knobs (env):
  WEIR_BIN                 binary to run
  WEIR_E2E_EXTRA_ARGS      extra flags for every agent, e.g. "--storage-profile s3-express"
  WEIR_E2E_FLUSH_INTERVAL  value for --flush-interval (default 5ms; empty = don't pass)
  RUST_LOG                 passed through (default info)
  CI                       when true (.ci/run exports it), a skipped test is reported as a
                           failure: a scenario that silently did not run is not a pass
  WEIR_E2E_ALLOW_SKIPS     when true, skips stay skips even in CI (an explicit, visible choice)
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import cloud
from faultproxy import FaultProxy

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 40_000


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


IN_CI = _truthy(os.environ.get("CI"))
ALLOW_SKIPS = _truthy(os.environ.get("WEIR_E2E_ALLOW_SKIPS"))


def weir_bin_path() -> Path:
    env = os.environ.get("WEIR_BIN")
    if env:
        p = Path(env)
    else:
        p = Path(os.environ.get("CARGO_TARGET_DIR") or "target") / "debug" / "weir"
    if not p.is_absolute():
        p = REPO_ROOT / p
    return p


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


# Ports this process handed out: a port is only checked free, not held, so two picks (an
# agent's Kafka and HTTP ports, say) could otherwise return the same one.
_HANDED_OUT: set[int] = set()


def pick_free_port() -> int:
    """A port that is free right now (checked by binding it) and not handed out before by this
    process.

    Preferably one *below* the kernel's ephemeral range: while an agent is
    down for a restart, clients keep reconnecting to its port, and a connect
    to a closed localhost port inside the ephemeral range can occasionally
    pick that very port as its own source port (TCP self-connect), which
    would then keep the agent from binding it again."""
    lo, _ = _ephemeral_range()
    if lo > 12000:
        for _ in range(50):
            port = random.randrange(10000, lo - 1)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                _HANDED_OUT.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Make the agent die with the test process even if that one is killed hard
# (an aborting client library, xdist worker crash): no orphaned agents.
_PDEATHSIG_PREFIX = (["setpriv", "--pdeathsig", "KILL", "--"]
                     if shutil.which("setpriv") and os.uname().sysname == "Linux" else [])


class AgentError(RuntimeError):
    pass


class Agent:
    """One `weir agent` process bound to a fixed port and data dir.

    The port and data dir stay the same across restarts, so clients can keep
    their bootstrap address and the agent must recover its state from DIR.
    """

    def __init__(self, binary: Path, port: int, data_dir: Path, log_path: Path,
                 extra_args=()):
        self.binary = Path(binary)
        self.port = port
        self.host = "127.0.0.1"
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path)
        self.extra_args = list(extra_args)
        # The HTTP endpoint (/metrics, /healthz, /readyz, /): its own free port, kept across
        # restarts like the Kafka port (the default 9644 would collide between agents).
        self.http_port = pick_free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        # True while we expect the process to be running; lets teardown detect
        # an agent that died on its own (a crash is always a test failure).
        self._expect_running = False

    # ----------------------------------------------------------------- info
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        cmd = [str(self.binary), "agent",
               "--listen", self.bootstrap,
               "--http-listen", f"{self.host}:{self.http_port}",
               "--data-dir", str(self.data_dir)]
        flush = os.environ.get("WEIR_E2E_FLUSH_INTERVAL", "5ms")
        if flush:
            cmd += ["--flush-interval", flush]
        cmd += shlex.split(os.environ.get("WEIR_E2E_EXTRA_ARGS", ""))
        cmd += [str(a) for a in self.extra_args]
        return cmd

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        t = self.log_text()
        if len(t) > chars:
            t = "[... log truncated ...]\n" + t[-chars:]
        return t

    def rss_and_peak_kib(self) -> tuple[int, int] | None:
        """(VmRSS, VmPeak) of the agent in KiB, from /proc (Linux only)."""
        if not self.alive():
            return None
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        vals = {}
        for line in status.splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmPeak"):
                vals[k] = int(v.split()[0])
        if "VmRSS" in vals and "VmPeak" in vals:
            return vals["VmRSS"], vals["VmPeak"]
        return None

    # ------------------------------------------------------------ lifecycle
    def start(self, extra_args=None) -> "Agent":
        """Start (or start again) on the same port and data dir.

        `extra_args`, when given, replaces the extra flags for this and later
        starts."""
        if self.alive():
            raise AgentError(f"agent already running (pid {self.proc.pid})")
        if extra_args is not None:
            self.extra_args = list(extra_args)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.setdefault("RUST_BACKTRACE", "1")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== weir-e2e: start #{self.starts}: {shlex.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                _PDEATHSIG_PREFIX + cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=str(self.data_dir.parent), start_new_session=True)
        self._expect_running = True
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        last_err = None
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                self._expect_running = False
                raise AgentError(
                    f"weir agent exited with code {rc} before accepting connections on "
                    f"{self.bootstrap}\n--- agent log ---\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError as e:
                last_err = e
                time.sleep(0.05)
        self._hard_kill()
        raise AgentError(
            f"weir agent did not accept connections on {self.bootstrap} within "
            f"{READY_TIMEOUT_S:.0f}s (last error: {last_err})\n--- agent log ---\n{self.log_tail()}")

    def _note(self, msg: str) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"===== weir-e2e: {msg}\n".encode())

    def _hard_kill(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - kernel trouble
            return None

    def stop(self, timeout: float = STOP_TIMEOUT_S, check: bool = True) -> int | None:
        """Graceful stop: SIGTERM, wait. If it does not exit in time it is
        SIGKILLed and (with check=True) AgentError is raised."""
        if self.proc is None:
            return None
        self._expect_running = False
        if self.proc.poll() is not None:
            return self.proc.returncode
        self._note("SIGTERM")
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._note(f"no exit {timeout:.0f}s after SIGTERM; SIGKILL")
            self._hard_kill()
            if check:
                raise AgentError(
                    f"weir agent did not exit within {timeout:.0f}s of SIGTERM\n"
                    f"--- agent log ---\n{self.log_tail()}")
            return None
        self._note(f"exited with code {rc} after SIGTERM")
        return rc

    def kill9(self) -> None:
        """Crash: SIGKILL, wait for the process to be gone."""
        self._expect_running = False
        if self.proc is not None and self.proc.poll() is None:
            self._note("SIGKILL")
            self._hard_kill()

    def restart(self, kill: bool = False, extra_args=None) -> "Agent":
        if kill:
            self.kill9()
        else:
            rc = self.stop()
            # A graceful stop must be a clean exit (0, or death by SIGTERM if
            # the agent chose to re-raise it).
            if rc not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
                raise AgentError(f"weir agent exited with code {rc} after SIGTERM\n"
                                 f"--- agent log ---\n{self.log_tail()}")
        return self.start(extra_args)

    def check_still_running(self) -> None:
        """Raise if the agent died although nobody stopped it."""
        if self._expect_running and self.proc is not None and self.proc.poll() is not None:
            self._expect_running = False
            raise AgentError(
                f"weir agent died unexpectedly (exit code {self.proc.returncode})\n"
                f"--- agent log ---\n{self.log_tail()}")

    def teardown(self) -> None:
        try:
            self.check_still_running()
        finally:
            if self.alive():
                self.stop(timeout=15, check=False)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def weir_bin() -> Path:
    p = weir_bin_path()
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(
            f"weir binary not found or not executable at {p} "
            f"(set WEIR_BIN, or build it: cargo build -p ... / make build)", pytrace=False)
    return p


@pytest.fixture(scope="session")
def kcat() -> str:
    p = shutil.which("kcat") or shutil.which("kafkacat")
    if not p:
        msg = "kcat not found on PATH (apt-get install -y kcat)"
        if IN_CI:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return p


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


_AGENTS_BY_TEST: dict[str, list[Agent]] = {}


@pytest.fixture
def agent_factory(request, weir_bin, tmp_path):
    """make_agent(extra_args=(), start=True, name=None) -> Agent.

    Each call gets a fresh port and data dir; all agents are stopped at the end
    of the test and their logs attached to the report of a failed test."""
    agents: list[Agent] = []
    _AGENTS_BY_TEST[request.node.nodeid] = agents

    def make(extra_args=(), start: bool = True, name: str | None = None) -> Agent:
        name = name or f"agent{len(agents)}"
        base = tmp_path / name
        a = Agent(weir_bin, pick_free_port(), base / "data", base / "agent.log", extra_args)
        agents.append(a)
        if start:
            a.start()
        return a

    yield make
    teardown_all(agents)


def teardown_all(agents) -> None:
    """Tears every agent down, then raises the first failure (an agent that died on its own)."""
    errors = []
    for a in agents:
        try:
            a.teardown()
        except Exception as e:  # noqa: BLE001 - report every agent
            errors.append(e)
    if errors:
        raise errors[0]


@pytest.fixture
def agent(agent_factory) -> Agent:
    """A running agent with default settings (auto-create on, 1 partition)."""
    return agent_factory()


# ------------------------------------------------------- object-store servers

_CLOUD_SERVERS: list[cloud.Server] = []


def _cloud_server(kind, tmp_path_factory):
    try:
        kind.program()
    except cloud.ServerMissing as e:
        if IN_CI:
            pytest.fail(str(e), pytrace=False)
        pytest.skip(str(e))
    server = kind(tmp_path_factory.mktemp(kind.name))
    _CLOUD_SERVERS.append(server)
    return server.start()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """moto's S3 server, started on first use by this pytest process and stopped at its end."""
    server = _cloud_server(cloud.MotoServer, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory):
    """Azurite's Blob service (in memory), started on first use and stopped at the end."""
    server = _cloud_server(cloud.AzuriteServer, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture
def cloud_env(monkeypatch):
    """No cloud credentials, profiles or endpoints from the environment of the test run, and no
    instance-metadata lookups, for the test process and every agent it starts."""
    for key, value in cloud.CLOUD_ENV.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    return monkeypatch


@pytest.fixture
def fault_proxy():
    """make(server_or_endpoint_port, mode="pass", name=None) -> a started FaultProxy in front of
    a server on 127.0.0.1; every proxy is stopped at the end of the test."""
    proxies: list[FaultProxy] = []

    def make(upstream, mode: str = "pass", name: str | None = None) -> FaultProxy:
        port = upstream.port if hasattr(upstream, "port") else int(upstream)
        proxy = FaultProxy("127.0.0.1", port, mode, name=name or f"proxy{len(proxies)}")
        proxies.append(proxy)
        return proxy.start()

    yield make
    for proxy in proxies:
        proxy.stop()


def pytest_sessionfinish(session, exitstatus):
    """Last-resort cleanup of agents left running (e.g. after a timeout)."""
    for agents in list(_AGENTS_BY_TEST.values()):
        for a in agents:
            if a.alive():
                a._hard_kill()
    for server in _CLOUD_SERVERS:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and IN_CI and not ALLOW_SKIPS and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = (f"skipped in CI: {reason}\n(CI=true: a skipped scenario fails the run; "
                        f"set WEIR_E2E_ALLOW_SKIPS=1 to allow skips explicitly)")
    agents = _AGENTS_BY_TEST.get(item.nodeid)
    if rep.failed and agents:
        for i, a in enumerate(agents):
            rep.sections.append(
                (f"weir agent {i} log ({a.log_path}) [{rep.when}]", a.log_tail()))
    if rep.failed:
        used = {"moto_server": "moto", "azurite_server": "azurite"}
        names = {used[f] for f in getattr(item, "fixturenames", ()) if f in used}
        for server in _CLOUD_SERVERS:
            if server.name in names and server.proc is not None:
                rep.sections.append(
                    (f"{server.name} log ({server.log_path}) [{rep.when}]", server.log_tail()))
    if rep.when == "teardown":
        _AGENTS_BY_TEST.pop(item.nodeid, None)
