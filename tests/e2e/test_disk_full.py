"""Disk full on file:// (BAD-1, DUR-1).

The agent's data directory — its ingest bucket and its metadata log — is a small tmpfs.
Idempotent producers (checker.py) run while a filler producer fills it with data; then a ballast
file takes whatever room is left, so that metadata log writes fail too. With no space left the
agent must answer with retriable Kafka error codes (not crash, not hang, not acknowledge anything
that is not durable). Then the tmpfs grows, production resumes, the agent restarts (kill -9, or
SIGTERM while the disk is still full), and the checker must find every acknowledged record at its
offset: 0 lost, 0 duplicated, 0 reordered, no gaps, no failed deliveries.

What the clients saw is printed as a JSON line (`-s` shows it). Needs root (mount); skipped, with
the reason, only where mounting a tmpfs is not permitted.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

import kafka_raw as raw
from checker import CheckedProducer, Report
from test_faults import IDEMPOTENT, PARTITIONS, acked, finish, start_producers, wait_until
from weirtest import ck_create_topics, ck_producer, unique

KiB = 1024
SMALL = "32m"
LARGE = "256m"
WAIT_S = 60.0
# A request the agent cannot complete must still be answered: this bounds every probe.
ANSWER_TIMEOUT_S = 20.0
# Kafka error codes a client may see while the disk is full; all retriable.
KAFKA_STORAGE_ERROR = 56
REQUEST_TIMED_OUT = 7
RETRIABLE_WHILE_FULL = {KAFKA_STORAGE_ERROR, REQUEST_TIMED_OUT}

# ------------------------------------------------------------------ tmpfs

def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("the disk-full tests mount a tmpfs, which needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {r.stderr.strip()}")


def remount(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def take_all_space(path: Path) -> int:
    """Writes a ballast file in `path` until the file system is full; returns its size."""
    written = 0
    chunk = b"\0" * (64 * KiB)
    with open(path / "ballast", "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError:
                break
        # tmpfs has sub-chunk room left: fill it byte by byte (bounded by one chunk).
        for _ in range(len(chunk)):
            try:
                written += f.write(b"\0")
            except OSError:
                break
    return written


# ------------------------------------------------------------------ what the clients see

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_lines(agent, needle: str) -> list[str]:
    return [ANSI.sub("", line) for line in agent.log_text().splitlines() if needle in line]


def answered(probe, *args) -> int:
    """Runs a raw request `probe`; returns its error code. The agent must answer within
    ANSWER_TIMEOUT_S: a timeout fails the test."""
    try:
        return probe(*args)
    except socket.timeout:
        raise AssertionError(f"no answer to {probe.__name__} within {ANSWER_TIMEOUT_S:.0f}s "
                             f"while the disk is full") from None


def produce_probe(agent, topic: str, corr_id: int) -> int:
    batch = raw.build_batch([(None, b"probe-%d" % corr_id, int(time.time() * 1000))])
    with raw.connect(agent.bootstrap, timeout=ANSWER_TIMEOUT_S) as s:
        err, _ = raw.produce_v3(s, topic, 0, batch, acks=-1, corr_id=corr_id)
    return err


def init_producer_id_probe(agent, corr_id: int) -> int:
    with raw.connect(agent.bootstrap, timeout=ANSWER_TIMEOUT_S) as s:
        err, _, _ = raw.init_producer_id(s, 1, corr_id=corr_id)
    return err


class Filler:
    """A plain producer of incompressible 32 KiB values to its own topic, to fill the disk."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.errors: Counter = Counter()
        self.producer = ck_producer(bootstrap, {"linger.ms": 5, "message.timeout.ms": 15000,
                                                "compression.type": "none"})

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.errors[err.name()] += 1

    def run_until(self, pred, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"the disk did not fill within {timeout:.0f}s"
            try:
                self.producer.produce(self.topic, os.urandom(32 * KiB), on_delivery=self._delivered)
            except BufferError:
                pass
            self.producer.poll(0.01)

    def close(self) -> None:
        self.producer.flush(20)


def fill_disk(agent, data: Path, fill_topic: str) -> dict:
    """Fills the agent's disk with produced data until uploads fail with ENOSPC, then takes the
    rest with a ballast file. Returns what was seen."""
    filler = Filler(agent.bootstrap, fill_topic)
    filler.run_until(lambda: log_lines(agent, "No space left on device"), WAIT_S)
    ballast = take_all_space(data)
    filler.close()
    return {"filler_delivery_errors": dict(filler.errors), "ballast_bytes": ballast,
            "free_bytes": free_bytes(data)}


def start_and_fill(agent, data: Path, prefix: str, scenario: str):
    """Starts the agent on the mounted tmpfs, runs the checked producers until they have 1,000
    acks, then fills the disk. Returns (topic, side topic, producers, report, what was seen)."""
    agent.start()
    topic, side = unique(prefix), unique("side")
    # `side` takes the filler's data and the raw probes; `topic` only the checked records.
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS, side: 1})
    producers = start_producers(agent, topic)
    report = Report(scenario, 0)
    wait_until(lambda: acked(producers) >= 1000, WAIT_S, "acks before the disk fills")
    return topic, side, producers, report, fill_disk(agent, data, side)


# ------------------------------------------------------------------ tests

def test_disk_full_data_path_answers_and_loses_nothing(agent_factory):
    """Producers keep running while data fills the disk: produce requests get
    KAFKA_STORAGE_ERROR (retriable) from the failed uploads, nothing unacknowledged is acked,
    and once the disk grows everything resumes, also across a kill -9."""
    agent = agent_factory(start=False)
    data = agent.data_dir
    mount_tmpfs(data, SMALL)
    try:
        topic, side, producers, report, seen = start_and_fill(
            agent, data, "diskfull", "disk-full-data-path-tmpfs-32m")
        # The first probe's answer is a whole produce round trip on the full disk: any ack of a
        # file made durable before the ballast has reached its producer by then.
        first_code = answered(produce_probe, agent, side, 899)
        acked_full = acked(producers)
        failed_uploads = len(log_lines(agent, "file upload failed"))
        seen["produce_codes"] = dict(Counter([first_code] + [
            answered(produce_probe, agent, side, 900 + i) for i in range(3)]))
        # The checked producers keep retrying on the full disk; wait until the agent has tried
        # (and failed) to upload their data several more times, then nothing may have been acked.
        wait_until(lambda: len(log_lines(agent, "file upload failed")) >= failed_uploads + 10,
                   WAIT_S, "more failed uploads while the disk is full")
        agent.check_still_running()
        seen["acked_while_full"] = acked(producers) - acked_full
        seen["upload_enospc_lines"] = len(log_lines(agent, "file upload failed"))
        seen["example_log_line"] = (log_lines(agent, "No space left on device") or [""])[0][-300:]
        print(json.dumps({"scenario": report.scenario, **seen}, sort_keys=True))
        assert set(seen["produce_codes"]) <= RETRIABLE_WHILE_FULL, seen["produce_codes"]
        assert KAFKA_STORAGE_ERROR in seen["produce_codes"], seen["produce_codes"]
        assert seen["acked_while_full"] == 0, f"records acknowledged while the disk was full: {seen}"

        remount(data, LARGE)
        resumed = acked(producers)
        wait_until(lambda: acked(producers) >= resumed + 2000, WAIT_S, "acks once space returned")
        assert answered(produce_probe, agent, side, 950) == 0
        agent.kill9()
        report.crashes += 1
        agent.start()
        restarted = acked(producers)
        wait_until(lambda: acked(producers) >= restarted + 1000, WAIT_S, "acks after the restart")
        finish(agent, topic, producers, report)
    finally:
        if agent.alive():
            agent.stop(check=False)
        unmount(data)


def test_disk_full_metadata_log_answers_recovers_and_stops(agent_factory):
    """The disk is full for the metadata log too. Requests that need the control plane are
    answered with retriable codes while it cannot write; a producer that starts meanwhile gets
    going once space returns; SIGTERM on the full disk stops the agent; after the disk grows the
    agent starts, recovers its log, and has every acknowledged record."""
    agent = agent_factory(start=False)
    data = agent.data_dir
    mount_tmpfs(data, SMALL)
    try:
        topic, side, producers, report, seen = start_and_fill(
            agent, data, "metafull", "disk-full-metadata-log-tmpfs-32m")
        # Each InitProducerId is a metadata log entry: the first one's slot write fails and
        # the log starts recovering; later ones arrive while recovery keeps failing.
        seen["init_producer_id_codes"] = [answered(init_producer_id_probe, agent, 800 + i)
                                          for i in range(3)]
        seen["produce_codes"] = dict(Counter(answered(produce_probe, agent, side, 900 + i)
                                             for i in range(2)))
        late = CheckedProducer(agent.bootstrap, topic, PARTITIONS, "late", IDEMPOTENT,
                               track_stats=True)
        late.start()
        producers.append(late)
        # The late producer's InitProducerId must meet the full disk: wait until (librdkafka's own
        # statistics) it has sent InitProducerId twice, i.e. the first one was refused, and it
        # still has no producer id.
        wait_until(lambda: late.requests_sent("InitProducerId") >= 2, WAIT_S,
                   "the late producer's InitProducerId retried against the full disk")
        assert late.idempotence_state() != "Assigned", late.stats.get("eos")
        assert late.n_acked() == 0
        agent.check_still_running()
        seen["metadata_log_lines"] = len(log_lines(agent, "metadata log"))
        seen["recovery_failures"] = len(log_lines(agent, "control plane recovery failed"))
        print(json.dumps({"scenario": report.scenario, **seen}, sort_keys=True))
        assert all(code in RETRIABLE_WHILE_FULL for code in seen["init_producer_id_codes"]), seen
        assert set(seen["produce_codes"]) <= RETRIABLE_WHILE_FULL, seen

        # A graceful stop must not hang on the full disk (the final snapshot cannot be written).
        rc = agent.stop()
        assert rc == 0, f"exit code {rc} after SIGTERM on a full disk"
        report.crashes += 1
        remount(data, LARGE)
        agent.start()
        wait_until(lambda: late.n_acked() >= 500, WAIT_S, "the late producer's first acks")
        before = acked(producers)
        wait_until(lambda: acked(producers) >= before + 1000, WAIT_S, "acks after the restart")
        finish(agent, topic, producers, report)
    finally:
        agent.kill9()  # a stop on the full disk was checked above; here only clean up fast
        unmount(data)
