"""A hung bucket cannot stall the agent: every object-store request has a deadline
(`storage.request_timeout`), so a PUT that never answers fails retriably instead of blocking its
file and every later produce forever (issue: no deadline on object-store calls)."""

from __future__ import annotations

import kafka_raw
from weirtest import ck_create_topics, unique

# The file's offsets are reserved while it uploads (parallel persistence, the default), so a
# failed upload is "possibly written" (the resolver may still confirm it): REQUEST_TIMED_OUT.
REQUEST_TIMED_OUT = 7


def test_hung_ingest_bucket_fails_produce_retriably(agent_factory, monkeypatch, tmp_path):
    """One ingest bucket (quorum 1 of 1) whose every request takes an hour; the metadata log lives
    in its own healthy bucket. A produce gets REQUEST_TIMED_OUT (retriable, possibly written)
    after the upload attempts time out, and the agent keeps answering. Before the deadline
    existed the produce never returned."""
    monkeypatch.setenv("WEIR_STORAGE_SLOW_BUCKET_DELAY", "1h")
    monkeypatch.setenv("WEIR_STORAGE_REQUEST_TIMEOUT", "500ms")
    monkeypatch.setenv("WEIR_PRODUCE_UPLOAD_ATTEMPTS", "2")
    agent = agent_factory(start=False)
    layout = ["--ingest-bucket", f"file://{tmp_path / 'b0'}", "--quorum", "1",
              "--metadata-bucket", f"file://{tmp_path / 'meta'}", "--slow-bucket", "0"]
    agent.start(extra_args=layout)
    topic = unique("hung")
    ck_create_topics(agent.bootstrap, {topic: 1})
    batch = kafka_raw.build_batch([(b"k", b"v", 1_700_000_000_000)])
    sock = kafka_raw.connect(agent.bootstrap, timeout=60.0)
    try:
        # Two produces in flight: the second is behind the first in the commit chain.
        err, base = kafka_raw.produce_v3(sock, topic, 0, batch, corr_id=11)
        assert err == REQUEST_TIMED_OUT, f"produce to a hung bucket answered {err} at {base}"
        err, _ = kafka_raw.produce_v3(sock, topic, 0, batch, corr_id=12)
        assert err == REQUEST_TIMED_OUT, f"second produce answered {err}"
    finally:
        sock.close()
    kafka_raw.check_api_versions(agent.bootstrap)
    agent.check_still_running()
    assert "did not finish within" in agent.log_text(), "no timeout in the agent log"
