"""Reading an agent's Prometheus `/metrics` in tests.

`scrape(url)` parses the text format into {(name, labels): value}, with `labels` a frozenset
of (key, value) pairs; `total(samples, name, **labels)` sums the samples of `name` whose
labels include the given ones."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; HTTP errors are answers, not exceptions."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def parse(text: str) -> Samples:
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        name, labels, value = m.groups()
        key = (name, frozenset(_LABEL.findall(labels or "")))
        assert key not in samples, f"duplicate series {line!r}"
        samples[key] = float(value)
    return samples


def scrape(base_url: str) -> Samples:
    status, body = get(f"{base_url}/metrics")
    assert status == 200, f"/metrics answered {status}: {body[:500]}"
    return parse(body)


def total(samples: Samples, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def label_values(samples: Samples, name: str, label: str) -> set:
    return {dict(ls)[label] for (n, ls) in samples if n == name and label in dict(ls)}


def settled(base_url: str, key, timeout: float = 30.0) -> Samples:
    """A scrape after which `key(samples)` stood still for a second: nothing in flight (an
    uploaded file not yet committed, a log slot not yet durable) between two reads."""
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        samples = scrape(base_url)
        value = key(samples)
        if value == previous:
            return samples
        assert time.monotonic() < deadline, f"metrics did not settle: {value}"
        previous = value
        time.sleep(1.0)
