"""The status page at `/`, loaded in a real headless browser (Chromium from Debian) against a
running agent with traffic: what it shows must match what the clients did (issue 15).

The browser runs with every host name but 127.0.0.1 unresolvable, and the page must name no
external asset: it works offline."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from html.parser import HTMLParser

from confluent_kafka import TopicPartition

from conftest import IN_CI
from weirtest import Rec, ck_consumer, ck_create_topics, ck_produce, ck_producer, unique

import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = "no chromium on PATH (tests/setup.sh installs Debian's)"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def browse(url: str, *args: str) -> str:
    """The DOM Chromium built from `url`, or what `args` (e.g. --screenshot) made it do."""
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", *args, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Page(HTMLParser):
    """Tables by id (rows of cell texts), element texts by id, and every URL the page names."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.texts: dict[str, str] = {}
        self.urls: list[str] = []
        self.title = ""
        self._table = None
        self._cell = None
        self._ids: list[tuple[str, str]] = []
        self._tag_stack: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.urls += [v for k, v in attrs.items() if k in ("src", "href", "action") and v]
        if tag == "table":
            self._table = attrs.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = ""
        if "id" in attrs and tag != "table":
            self._ids.append((tag, attrs["id"]))
            self.texts[attrs["id"]] = ""
        self._tag_stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append(self._cell.strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        if self._ids and self._ids[-1][0] == tag:
            self._ids.pop()
        if self._tag_stack:
            self._tag_stack.pop()

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        for _, element in self._ids:
            self.texts[element] += data
        if self._tag_stack and self._tag_stack[-1] == "title":
            self.title += data

    def rows(self, table: str) -> list[dict]:
        header, *rows = self.tables[table]
        return [dict(zip(header, row)) for row in rows]


def test_status_page_in_a_browser_shows_the_agent_topics_groups_and_buckets(agent, tmp_path):
    topic, group, n = unique("status"), unique("g"), 400
    ck_create_topics(agent.bootstrap, {topic: 2})
    ck_produce(agent.bootstrap, [Rec(topic, i % 2, None, b"x" * 100) for i in range(n)])
    consumer = ck_consumer(agent.bootstrap, {"group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 50)], asynchronous=False)
    finally:
        consumer.close()
    # Traffic across two of the page's rate samples (every 5 s), so its rates are not zero.
    stop = threading.Event()

    def produce():
        producer = ck_producer(agent.bootstrap)
        while not stop.is_set():
            producer.produce(topic, b"y" * 100, partition=1)
            producer.poll(0.01)
        producer.flush(30)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    time.sleep(11)
    page = Page(browse(f"{agent.http_url}/", "--dump-dom"))
    stop.set()
    thread.join(60)

    assert page.title == "Weir agent 1"
    assert page.texts["ready"] == "ready"
    assert not [u for u in page.urls if "://" in u or u.startswith("//")], page.urls
    [me] = page.rows("agent")
    assert me["Kafka address"] == agent.bootstrap
    assert me["control plane"] == "leader" and int(me["epoch"]) >= 1
    topics = {row["topic"]: row for row in page.rows("topics")}
    assert topics[topic]["partitions"] == "2"
    assert int(topics[topic]["records retained"]) >= n
    assert float(topics[topic]["produced records/s"]) > 0
    assert topics[topic]["retention"] == "7days"
    groups = {row["group"]: row for row in page.rows("groups")}
    assert groups[group]["partitions"] == "1"
    assert groups[group]["lag"] == str(n // 2 - 50)
    buckets = page.rows("buckets")
    ingest = [b for b in buckets if b["bucket"].endswith("/bucket")]
    assert ingest and int(ingest[0]["PUT"]) > 0 and ingest[0]["probe"] == "answers"
    assert page.texts["cost"].startswith("Estimated object-store cost since start: $")

    # The browser also renders it: a screenshot of a real page, not an error page.
    shot = tmp_path / "status.png"
    browse(f"{agent.http_url}/", f"--screenshot={shot}", "--window-size=1200,900")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_status_page_escapes_names(agent):
    topic = unique("x") + "_-.a"
    ck_produce(agent.bootstrap, [Rec(topic, 0, None, b"v")])
    group = "<b>g</b>&'\""
    consumer = ck_consumer(agent.bootstrap, {"group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    time.sleep(0.5)
    page = Page(browse(f"{agent.http_url}/", "--dump-dom"))
    assert group in {row["group"] for row in page.rows("groups")}
