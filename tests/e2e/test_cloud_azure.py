"""`weir agent` on Azure Blob (azurite, cloud.py): three `az://` ingest containers (quorum 2) and a
separate `az://` metadata container, account, key and endpoint in each URL's query; plus a check
that azurite honours the conditional writes Weir's startup probe relies on."""

from __future__ import annotations

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError

from cloud import az_url
from test_cloud_s3 import assert_bucket_roles, roundtrip_and_restart


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
