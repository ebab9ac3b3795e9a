"""`weir agent` on Azure Blob (azurite, cloud.py): three `az://` ingest containers (quorum 2) and a
separate `az://` metadata container, account, key and endpoint in each URL's query; the
`use_emulator` form with azurite's address from the environment; and a check that azurite
honours the conditional writes Weir's startup probe relies on."""

from __future__ import annotations

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError

from cloud import az_url
from test_cloud_s3 import assert_bucket_roles, roundtrip_and_restart
from weirtest import (Rec, assert_acked_present, assert_dense, ck_consume, ck_create_topics,
                      ck_produce, unique)


def test_azurite_honours_conditional_put_blob(azurite_server, cloud_env):
    """Put Blob with If-None-Match: * on an existing blob is refused (409 BlobAlreadyExists, as
    Azure itself answers), and so is If-Match with another ETag (412 ConditionNotMet)."""
    container = azurite_server.create_container("cond")
    blob = azurite_server.service().get_blob_client(container, "k")
    etag = blob.upload_blob(b"one", overwrite=True,
                            match_condition=MatchConditions.IfMissing)["etag"]
    with pytest.raises(HttpResponseError) as e:
        blob.upload_blob(b"two", overwrite=True, match_condition=MatchConditions.IfMissing)
    assert (e.value.status_code, e.value.error_code) == (409, "BlobAlreadyExists")
    with pytest.raises(HttpResponseError) as e:
        blob.upload_blob(b"three", overwrite=True, etag='"0x8D0000000000000"',
                         match_condition=MatchConditions.IfNotModified)
    assert (e.value.status_code, e.value.error_code) == (412, "ConditionNotMet")
    blob.upload_blob(b"four", overwrite=True, etag=etag,
                     match_condition=MatchConditions.IfNotModified)
    assert blob.download_blob().readall() == b"four"


def test_az_roundtrip_and_restart(agent_factory, azurite_server, cloud_env, kcat):
    ingest = [azurite_server.create_container("ingest") for _ in range(3)]
    meta = azurite_server.create_container("meta")
    args = [a for c in ingest for a in ("--ingest-bucket", az_url(c, azurite_server.endpoint))]
    args += ["--quorum", "2", "--metadata-bucket", az_url(meta, azurite_server.endpoint)]
    agent = agent_factory(extra_args=args)
    roundtrip_and_restart(agent, kcat)
    assert_bucket_roles(azurite_server.blobs, ingest, meta, min_holders=2)


def test_az_use_emulator_with_azurite_url_from_env(agent_factory, azurite_server, cloud_env):
    """`az://container?use_emulator=true` takes azurite's well-known account and key, and its
    address from AZURITE_BLOB_STORAGE_URL."""
    cloud_env.setenv("AZURITE_BLOB_STORAGE_URL", azurite_server.endpoint)
    ingest = azurite_server.create_container("emu")
    meta = azurite_server.create_container("emumeta")
    agent = agent_factory(extra_args=[
        "--ingest-bucket", f"az://{ingest}?use_emulator=true", "--quorum", "1",
        "--metadata-bucket", f"az://{meta}?use_emulator=true"])
    topic = unique("cloud-emu")
    ck_create_topics(agent.bootstrap, {topic: 2})
    acked = ck_produce(agent.bootstrap, [Rec(topic, i % 2, None, f"emu-{i}".encode())
                                         for i in range(50)])
    got = ck_consume(agent.bootstrap, topic, range(2))
    assert_dense(got, topic)
    assert_acked_present(acked, got)
    assert_bucket_roles(azurite_server.blobs, [ingest], meta, min_holders=1)
