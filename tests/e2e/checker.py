"""The correctness checker of the reliability harness (DUR-*, ORD-*, IDM-1).

Producers send uniquely identified, sequence-numbered payloads (`"{producer}:{seq:09d}"`) and log
every acknowledgement (partition, offset). After the run a consumer reads every partition from
the log start to the high watermark, and the checker reports:

- acked:       acknowledged records
- lost:        acked but not found at the acked (partition, offset), or for an ack without an
               offset (librdkafka's implicit ack) nowhere in its partition — must be 0 (DUR-1/2)
- duplicated:  payloads stored more than once — must be 0 for idempotent producers (IDM-1)
- reordered:   per producer and partition, a stored sequence lower than one stored before it,
               ignoring duplicates of records already seen (ORD-1 as a producer sees it)
- gaps:        offsets missing between the log start and the high watermark (ORD-1)
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from weirtest import ck_consume, ck_producer, ck_watermarks, wait_readable


def payload(producer: str, seq: int) -> bytes:
    return f"{producer}:{seq:09d}".encode()


def parse(value: bytes) -> tuple[str, int]:
    producer, seq = value.decode().rsplit(":", 1)
    return producer, int(seq)


@dataclass
class Report:
    scenario: str
    seed: int
    acked: int = 0
    failed_deliveries: int = 0
    stored: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    gaps: int = 0
    crashes: int = 0
    examples: dict = field(default_factory=dict)

    def line(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class CheckedProducer(threading.Thread):
    """A confluent-kafka producer thread that sends `producer:seq` payloads round-robin over the
    partitions and records every delivery report."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, name: str, conf: dict,
                 max_records: int = 500_000, track_stats: bool = False):
        super().__init__(daemon=True, name=f"checked-producer-{name}")
        self.bootstrap, self.topic, self.partitions, self.producer_name = bootstrap, topic, partitions, name
        self.conf, self.max_records = conf, max_records
        self.lock = threading.Lock()
        self.acked: list[tuple[int, int, bytes]] = []
        self.failed: list[tuple[bytes, str]] = []
        self.sent = 0
        self.remaining: int | None = None
        self.exc: BaseException | None = None
        self._halt = threading.Event()
        # librdkafka's statistics (every 100 ms) when asked: what the client did, request by request.
        self.track_stats = track_stats
        self.stats: dict = {}

    def _on_stats(self, raw_json: str) -> None:
        stats = json.loads(raw_json)
        with self.lock:
            self.stats = stats

    def requests_sent(self, request: str) -> int:
        """How many `request` (librdkafka's name, e.g. "InitProducerId") requests the client has
        sent to all brokers so far (needs track_stats)."""
        assert self.track_stats, "requests_sent needs track_stats=True"
        with self.lock:
            brokers = self.stats.get("brokers", {})
            return sum(b.get("req", {}).get(request, 0) for b in brokers.values())

    def idempotence_state(self) -> str | None:
        """librdkafka's idempotent-producer state ("Assigned" once it has a producer id)."""
        with self.lock:
            return self.stats.get("eos", {}).get("idemp_state")

    def n_acked(self) -> int:
        with self.lock:
            return len(self.acked)

    def stop(self) -> None:
        self._halt.set()

    def _delivered(self, err, msg) -> None:
        with self.lock:
            if err is None:
                self.acked.append((msg.partition(), msg.offset(), msg.value()))
            else:
                self.failed.append((msg.value(), str(err)))

    def run(self) -> None:
        try:
            producer = ck_producer(self.bootstrap, {
                "acks": "all", "linger.ms": 2, "message.timeout.ms": 180_000,
                "retry.backoff.ms": 100, "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500, **self.conf,
                **({"statistics.interval.ms": 100, "stats_cb": self._on_stats}
                   if self.track_stats else {})})
            seq = 0
            while not self._halt.is_set() and seq < self.max_records:
                try:
                    producer.produce(self.topic, value=payload(self.producer_name, seq),
                                     partition=seq % self.partitions, on_delivery=self._delivered)
                except BufferError:
                    producer.poll(0.05)
                    continue
                seq += 1
                self.sent = seq
                producer.poll(0)
                if seq % 20 == 0:
                    time.sleep(0.002)  # bounded backlog
            self.remaining = producer.flush(150)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the checker
            self.exc = exc


# How long `verify` waits for acknowledged offsets to become readable: with parallel
# persistence a pending file below them (a crashed predecessor's, never uploaded) holds readers
# until the resolver aborts it, up to the ack deadline plus the clock-skew margin (20 s).
READABLE_WAIT_S = 60.0


def verify(bootstrap: str, topic: str, partitions: int, producers: list[CheckedProducer],
           report: Report) -> Report:
    """Reads everything back and fills `report`, once every acknowledged offset is below its
    partition's high watermark (or `READABLE_WAIT_S` passed: whatever is missing then counts
    as lost)."""
    last: dict[int, int] = {}
    for producer in producers:
        with producer.lock:
            for partition, offset, _ in producer.acked:
                if known_offset(offset):
                    last[partition] = max(last.get(partition, -1), offset)
    wait_readable(bootstrap, topic, last, READABLE_WAIT_S)
    watermarks = ck_watermarks(bootstrap, topic, range(partitions))
    got = ck_consume(bootstrap, topic, range(partitions), timeout=120)
    stored_at: dict[tuple[int, int], bytes] = {}
    for partition, records in got.items():
        for record in records:
            stored_at[(partition, record.offset)] = record.value
    acked = []
    for producer in producers:
        with producer.lock:
            acked.extend(producer.acked)
            report.failed_deliveries += len(producer.failed)
    return analyze(stored_at, watermarks, acked, report)


def known_offset(offset: int | None) -> bool:
    return offset is not None and offset >= 0


def analyze(stored_at: dict[tuple[int, int], bytes], watermarks: dict[int, tuple[int, int]],
            acked: list[tuple[int, int, bytes]], report: Report) -> Report:
    """The checks themselves, on plain data (unit-tested in test_checker.py)."""
    report.stored = len(stored_at)
    report.acked += len(acked)
    gaps = [(partition, offset)
            for partition, (low, high) in sorted(watermarks.items())
            for offset in range(low, high) if (partition, offset) not in stored_at]
    report.gaps = len(gaps)
    # librdkafka reports an "implicitly acked" message (its request timed out but a later batch
    # of the same idempotent producer succeeded, so the broker must hold it) without an offset:
    # such an ack is checked by value within its partition.
    values_in = defaultdict(set)
    for (partition, _), value in stored_at.items():
        values_in[partition].add(value)
    lost = [(partition, offset, value.decode()) for partition, offset, value in acked
            if (stored_at.get((partition, offset)) != value if known_offset(offset)
                else value not in values_in[partition])]
    report.lost = len(lost)
    counts = Counter(stored_at.values())
    duplicated = [value.decode() for value, count in counts.items() if count > 1]
    report.duplicated = len(duplicated)
    reordered = []
    last_seen: dict[tuple[str, int], int] = defaultdict(lambda: -1)
    seen: set[bytes] = set()
    for (partition, offset) in sorted(stored_at):
        value = stored_at[(partition, offset)]
        if value in seen:
            continue  # a duplicate of an earlier record; counted above
        seen.add(value)
        producer_name, seq = parse(value)
        key = (producer_name, partition)
        if seq < last_seen[key]:
            reordered.append((partition, offset, value.decode()))
        last_seen[key] = max(last_seen[key], seq)
    report.reordered = len(reordered)
    report.examples = {"lost": lost[:5], "duplicated": duplicated[:5], "reordered": reordered[:5],
                       "gaps": gaps[:5]}
    return report
