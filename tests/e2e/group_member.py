"""A consumer-group member run as its own process by test_groups.py, so that a
test can SIGTERM it (clean close: LeaveGroup) or SIGKILL it (detected only by
the coordinator's session timeout).

    python group_member.py CONFIG_JSON

CONFIG_JSON: {"client": "ck"|"kp", "bootstrap", "topic", "group", "out",
              "instance_id": str|null, "session_timeout_ms": int}

Every event is appended to `out` as one JSON line and flushed at once, with "t", the
system-wide monotonic clock (time.monotonic(): CLOCK_MONOTONIC, comparable across processes) at
the moment of the event:
  {"ev": "assign"|"revoke", "parts": [p, ...]}   from the client's rebalance callbacks
  {"ev": "msg", "p": partition, "o": offset}
  {"ev": "commit"}  after each synchronous commit of everything consumed so far
  {"ev": "closing"}  the member stopped consuming and is about to close its consumer
Offsets are committed synchronously after each polled batch (at-least-once).
"""

from __future__ import annotations

import json
import signal
import sys
import time

STOP = False


def _stop(_sig, _frame):
    global STOP
    STOP = True


def main() -> None:
    conf = json.loads(sys.argv[1])
    out = open(conf["out"], "a", buffering=1)

    def emit(**event):
        out.write(json.dumps({**event, "t": time.monotonic()}) + "\n")
        out.flush()

    signal.signal(signal.SIGTERM, _stop)
    if conf["client"] == "ck":
        run_confluent(conf, emit)
    else:
        run_kafka_python(conf, emit)
    emit(ev="closed")


def run_confluent(conf: dict, emit) -> None:
    from confluent_kafka import Consumer
    settings = {
        "bootstrap.servers": conf["bootstrap"],
        "group.id": conf["group"],
        "client.id": "weir-e2e-member",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": conf["session_timeout_ms"],
        "heartbeat.interval.ms": 500,
        "socket.timeout.ms": 30000,
        "log.connection.close": False,
    }
    if conf.get("instance_id"):
        settings["group.instance.id"] = conf["instance_id"]
    consumer = Consumer(settings)

    def on_assign(_c, parts):
        emit(ev="assign", parts=sorted(p.partition for p in parts))

    def on_revoke(_c, parts):
        emit(ev="revoke", parts=sorted(p.partition for p in parts))

    consumer.subscribe([conf["topic"]], on_assign=on_assign, on_revoke=on_revoke)
    try:
        while not STOP:
            msgs = consumer.consume(num_messages=500, timeout=0.2)
            got = False
            for m in msgs:
                if m.error():
                    continue
                emit(ev="msg", p=m.partition(), o=m.offset())
                got = True
            if got:
                try:
                    consumer.commit(asynchronous=False)
                    emit(ev="commit")
                except Exception as e:  # noqa: BLE001 - a rebalance may void the commit
                    emit(ev="commit_failed", error=str(e))
    finally:
        emit(ev="closing")
        consumer.close()


def run_kafka_python(conf: dict, emit) -> None:
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned):
            emit(ev="assign", parts=sorted(tp.partition for tp in assigned))

        def on_partitions_revoked(self, revoked):
            emit(ev="revoke", parts=sorted(tp.partition for tp in revoked))

    consumer = KafkaConsumer(
        bootstrap_servers=conf["bootstrap"], group_id=conf["group"],
        client_id="weir-e2e-kp-member", enable_auto_commit=False,
        auto_offset_reset="earliest", session_timeout_ms=conf["session_timeout_ms"],
        heartbeat_interval_ms=500, request_timeout_ms=40000)
    consumer.subscribe([conf["topic"]], listener=Listener())
    try:
        while not STOP:
            batches = consumer.poll(timeout_ms=200, max_records=500)
            got = False
            for _tp, msgs in batches.items():
                for m in msgs:
                    emit(ev="msg", p=m.partition, o=m.offset)
                    got = True
            if got:
                try:
                    consumer.commit()
                    emit(ev="commit")
                except Exception as e:  # noqa: BLE001 - a rebalance may void the commit
                    emit(ev="commit_failed", error=str(e))
    finally:
        emit(ev="closing")
        consumer.close()


if __name__ == "__main__":
    main()
