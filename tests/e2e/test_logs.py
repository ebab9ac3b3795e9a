"""Agent logs an operator can use (issue 15): no terminal colour codes when stdout is not a
terminal (a file here, like docker logs or journald), and `--log-format json` writes one JSON
object per line with the event's fields."""

from __future__ import annotations

import json

from weirtest import Rec, ck_produce, unique


def test_logs_to_a_file_have_no_colour_codes(agent):
    ck_produce(agent.bootstrap, [Rec(unique("logs"), 0, None, b"v")])
    text = agent.log_text()
    assert "weir agent listening" in text
    assert "\x1b[" not in text


def test_json_logs_are_one_object_per_line(agent_factory):
    agent = agent_factory(["--log-format", "json"])
    topic = unique("json")
    ck_produce(agent.bootstrap, [Rec(topic, 0, None, b"v")])
    agent.stop()
    # The fixture's own markers ("===== weir-e2e: …") share the log file.
    lines = [line for line in agent.log_text().splitlines()
             if line.strip() and not line.startswith("===== weir-e2e")]
    events = [json.loads(line) for line in lines]
    assert all({"timestamp", "level", "message"} <= set(e) for e in events), events[:3]
    listening = [e for e in events if e["message"] == "weir agent listening"]
    assert listening and listening[0]["listen"] == agent.bootstrap
    created = [e for e in events if e["message"] == "auto-created topic"]
    assert created and created[0]["topic"] == topic
