"""The orphan sweep (RFC 0003 §6): data files that no log entry names are deleted from the
buckets once older than a fenced horizon; every file the log names stays and reads back."""

from __future__ import annotations

import random
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from weirtest import Rec, assert_dense, ck_consume, ck_create_topics, ck_produce, unique, wait_until

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
SWEEP_TIMEOUT_S = 60.0


def ulid(unix_ms: int) -> str:
    value = (unix_ms << 80) | random.getrandbits(80)
    return "".join(CROCKFORD[(value >> (5 * (25 - i))) & 0x1F] for i in range(26))


def data_files(bucket: Path) -> set[Path]:
    return set((bucket / "ingest").rglob("*.weir"))


def plant_orphan(bucket: Path, template: Path, unix_ms: int) -> Path:
    """A copy of a real data file under an id no log entry names (a crashed agent's upload)."""
    hour = datetime.fromtimestamp(unix_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d-%H")
    target = bucket / "ingest" / hour / f"{ulid(unix_ms)}.weir"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, target)
    return target


def test_sweep_deletes_orphans_and_keeps_every_referenced_file(agent_factory, monkeypatch):
    monkeypatch.setenv("WEIR_GC_SWEEP_INTERVAL", "300ms")
    monkeypatch.setenv("WEIR_GC_ORPHAN_AGE", "2s")
    agent = agent_factory()
    bucket = agent.data_dir / "bucket"
    t = unique("sweep")
    ck_create_topics(agent.bootstrap, {t: 2})
    first = [Rec(t, i % 2, None, f"a-{i}".encode()) for i in range(20)]
    ck_produce(agent.bootstrap, first)
    referenced = data_files(bucket)
    assert referenced, "produce wrote data files"
    template = next(iter(referenced))
    old = plant_orphan(bucket, template, int(time.time() * 1000) - 3_600_000)
    wait_until(lambda: not old.exists(), SWEEP_TIMEOUT_S, "the hour-old orphan to be swept")
    # An orphan minted now is swept only once the horizon passes it, which is after every
    # file produced above: those must all still be there then.
    young = plant_orphan(bucket, template, int(time.time() * 1000))
    wait_until(lambda: not young.exists(), SWEEP_TIMEOUT_S, "the young orphan to be swept")
    missing = referenced - data_files(bucket)
    assert not missing, f"the sweep deleted referenced files: {sorted(missing)}"
    # New produces commit (fresh ids are after the horizon) and everything reads back.
    second = [Rec(t, i % 2, None, f"b-{i}".encode()) for i in range(20)]
    ck_produce(agent.bootstrap, second)
    got = ck_consume(agent.bootstrap, t, [0, 1])
    assert_dense(got, t)
    for p in (0, 1):
        expected = [r.value for r in first + second if r.partition == p]
        assert [g.value for g in got[p]] == expected
