"""Fault scenarios of the reliability harness. Each is repeatable from its seed: the seed picks the
crash points (kill times, fail-point hit counts) and seeds the storage fault model.

Every scenario runs idempotent producers through the fault and must show 0 lost, 0 duplicated,
0 reordered records and no offset gaps (checker.py). Reports are printed as JSON lines and
appended to $WEIR_RELIABILITY_REPORT when set (docs/reliability.md quotes them)."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from checker import CheckedProducer, Report, verify
from weirtest import ck_create_topics, unique, wait_until

PARTITIONS = 4
WAIT_S = 90.0
IDEMPOTENT = {"enable.idempotence": True}




def publish(report: Report) -> None:
    line = report.line()
    print(line)
    path = os.environ.get("WEIR_RELIABILITY_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")


def stop_producers(producers: list[CheckedProducer]) -> None:
    """Stops the producers and waits until each delivered everything it sent."""
    for producer in producers:
        producer.stop()
    for producer in producers:
        producer.join(200)
        assert not producer.is_alive(), "producer did not finish"
        assert producer.exc is None, producer.exc
        assert producer.remaining == 0, f"{producer.remaining} records undelivered"


def finish(agent, topic: str, producers: list[CheckedProducer], report: Report) -> Report:
    stop_producers(producers)
    verify(agent.bootstrap, topic, PARTITIONS, producers, report)
    publish(report)
    assert report.acked > 0
    assert report.lost == 0, report.line()
    assert report.duplicated == 0, report.line()
    assert report.reordered == 0, report.line()
    # The only holes allowed: with parallel persistence (RFC 0006), a file no bucket holds is
    # aborted and its reserved offsets hold empty batches, which consumers step over. The
    # serial path never logs such an abort.
    if "resolver aborted pending files" not in agent.log_text():
        assert report.gaps == 0, report.line()
    # librdkafka retries until message.timeout.ms (180 s): a failed delivery means the agent
    # gave a non-retriable answer to a fault.
    assert report.failed_deliveries == 0, report.line()
    return report


def start_producers(agent, topic: str, count: int = 2) -> list[CheckedProducer]:
    producers = [CheckedProducer(agent.bootstrap, topic, PARTITIONS, f"p{i}", IDEMPOTENT)
                 for i in range(count)]
    for producer in producers:
        producer.start()
    return producers


def assert_failpoint_abort(agent, point: str, hit: int) -> None:
    """The agent's exit was the armed fail point's abort: SIGABRT, and the fail point's own line
    (printed just before it aborts) naming this point and hit count."""
    rc = agent.proc.returncode
    assert rc == -signal.SIGABRT, (
        f"the agent exited with {rc}, not SIGABRT from fail point {point}\n{agent.log_tail(4000)}")
    line = f"fail point {point} hit {hit} times: aborting the process"
    assert line in agent.log_text(), f"no {line!r} in the agent log\n{agent.log_tail(4000)}"


def acked(producers) -> int:
    return sum(p.n_acked() for p in producers)


@pytest.mark.parametrize("seed,parallel", [(7, True), (1234, True), (7, False)],
                         ids=["7", "1234", "7-serial"])
def test_fault_kill9_at_random_points(agent_factory, monkeypatch, seed, parallel):
    """kill -9 the agent three times at seeded random moments under load (with parallel
    persistence, the default, and once with commit-after-upload)."""
    monkeypatch.setenv("WEIR_PRODUCE_PARALLEL_PERSISTENCE", str(parallel).lower())
    agent = agent_factory()
    rng = random.Random(seed)
    topic = unique("kill9")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    producers = start_producers(agent, topic)
    report = Report("kill9-random", seed)
    for _ in range(3):
        target = acked(producers) + rng.randint(100, 1500)
        wait_until(lambda: acked(producers) >= target, WAIT_S, "acks before a kill")
        time.sleep(rng.uniform(0, 0.3))
        agent.kill9()
        report.crashes += 1
        time.sleep(rng.uniform(0.05, 0.5))
        agent.start()
    after = acked(producers) + 300
    wait_until(lambda: acked(producers) >= after, WAIT_S, "acks after the last restart")
    finish(agent, topic, producers, report)


@pytest.mark.parametrize("point", ["after-upload-before-commit", "after-commit-before-ack",
                                   "after-log-write-before-publish"])
def test_fault_failpoint_crash(agent, point, monkeypatch):
    """The agent aborts itself at a named protocol window on a seeded hit count, then restarts."""
    if point == "after-upload-before-commit":
        # A window of the serial path only: with parallel persistence the reservation and the
        # upload overlap (its window is after-reserve-before-ack, test_parallel_persistence.py).
        monkeypatch.setenv("WEIR_PRODUCE_PARALLEL_PERSISTENCE", "false")
    seed = sum(map(ord, point))
    hit = random.Random(seed).randint(20, 80)
    topic = unique("fp")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    agent.stop()
    agent.start(extra_args=["--failpoints", f"{point}=abort@{hit}"])
    producers = start_producers(agent, topic)
    report = Report(f"failpoint:{point}@{hit}", seed)
    # The agent is expected to die by itself, and from this fail point's abort: any other death
    # (a panic, another signal, an unrelated abort) fails the scenario.
    wait_until(lambda: not agent.alive(), WAIT_S, f"the agent to abort at {point}")
    assert_failpoint_abort(agent, point, hit)
    agent.kill9()  # reap and mark as expected
    report.crashes += 1
    acked_at_crash = acked(producers)
    agent.start(extra_args=[])
    wait_until(lambda: acked(producers) >= acked_at_crash + 500, WAIT_S, "acks after restart")
    finish(agent, topic, producers, report)


@pytest.mark.parametrize("seed", [42])
def test_fault_storage_errors_and_latency(agent, seed):
    """5% of object-store requests (data files and metadata log) fail after s3-express latency."""
    topic = unique("storefault")
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    agent.stop()
    agent.start(extra_args=["--storage-profile", "s3-express", "--storage-error-rate", "0.05",
                            "--fault-seed", str(seed)])
    producers = start_producers(agent, topic)
    report = Report("storage-errors-5pct-s3-express", seed)
    wait_until(lambda: acked(producers) >= 3000, WAIT_S, "acks under storage faults")
    finish(agent, topic, producers, report)


def test_fault_one_bucket_down_with_two_of_three_quorum(agent):
    """Three file:// ingest buckets, quorum 2. Bucket 2 is down while producers run; the agent is
    killed and comes back with bucket 2 up and bucket 1 down instead, so every file written
    before the crash (held by buckets 0 and 1) must now be read without bucket 1."""
    seed = 3
    root = agent.data_dir.parent / "buckets"
    buckets = [f"file://{root}/b{i}" for i in range(3)]
    layout = [arg for url in buckets for arg in ("--ingest-bucket", url)] + ["--quorum", "2"]
    topic = unique("quorum")
    agent.stop()
    agent.start(extra_args=layout + ["--down-bucket", "2"])
    ck_create_topics(agent.bootstrap, {topic: PARTITIONS})
    producers = start_producers(agent, topic)
    report = Report("2-of-3-one-bucket-down-then-another", seed)
    wait_until(lambda: acked(producers) >= 2000, WAIT_S, "acks with bucket 2 down")
    agent.kill9()
    report.crashes += 1
    before = acked(producers)
    run1 = ingest_names(root)
    assert not run1[2], "a file reached bucket 2 while it was down"
    agent.start(extra_args=layout + ["--down-bucket", "1"])
    wait_until(lambda: acked(producers) >= before + 2000, WAIT_S, "acks with bucket 1 down")
    finish(agent, topic, producers, report)
    # Files from before the crash live in buckets 0 and 1 only; after it, in 0 and 2. With
    # parallel persistence, files the kill left pending are found with bucket 1 not answering,
    # and the resolver copies them from bucket 0 into bucket 2 to confirm them.
    ingest = ingest_names(root)
    assert all(ingest), [len(files) for files in ingest]
    assert ingest[1] == run1[1], "a file reached bucket 1 while it was down"
    assert ingest[2] <= ingest[0], "a file in bucket 2 but not bucket 0"


def ingest_names(root):
    """The data files' names in each of the three buckets under `root`."""
    return [{p.name for p in (root / f"b{i}" / "ingest").rglob("*.weir")} for i in range(3)]
