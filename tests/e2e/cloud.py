"""Object-store servers for the cloud end-to-end tests, and helpers to name buckets in them.

- `moto` (PyPI `moto[server]`, in .venv): an S3 server. Verified to answer 412
  PreconditionFailed to PutObject with `If-None-Match: *` on an existing key and with `If-Match`
  naming another ETag (test_faultproxy.py checks it on every run).
- `azurite-blob` (npm, tests/cloud/node_modules): the Azure Blob emulator, run in memory. Answers
  409 BlobAlreadyExists to Put Blob with `If-None-Match: *` on an existing blob and 412
  ConditionNotMet to `If-Match` naming another ETag (test_cloud_azure.py checks it).

Each server binds 127.0.0.1 on a free port, uses static fake credentials and is started once per
pytest process (session fixtures in conftest.py), only when a test asks for it. Its output goes to
a log file whose tail is attached to the report of a failed test. With CI=true a server that
cannot be found is a failure, never a skip.

No request may leave loopback: the agents and clients get `AWS_EC2_METADATA_DISABLED=true`,
explicit endpoints and keys, and no AWS profile or config files (`cloud_env`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 20_000

# Static fake credentials. Azurite's account and key are its documented well-known defaults.
AWS_KEY_ID = "test"
AWS_SECRET = "test"
AWS_REGION = "us-east-1"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")

# Environment for every process of a cloud test: nothing reaches a metadata endpoint, a profile
# or a config file; values set to None are removed.
CLOUD_ENV = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_PROFILE": None,
    "AWS_DEFAULT_PROFILE": None,
    "AWS_ENDPOINT_URL": None,
    "AWS_ENDPOINT_URL_S3": None,
    "AWS_ALLOW_HTTP": None,
    "AWS_ACCESS_KEY_ID": None,
    "AWS_SECRET_ACCESS_KEY": None,
    "AWS_SESSION_TOKEN": None,
    "AWS_REGION": None,
    "AWS_DEFAULT_REGION": None,
    "AZURE_STORAGE_ACCOUNT_NAME": None,
    "AZURE_STORAGE_ACCOUNT_KEY": None,
    "AZURITE_BLOB_STORAGE_URL": None,
    "AZURE_STORAGE_USE_EMULATOR": None,
    "MSI_ENDPOINT": None,
    "IDENTITY_ENDPOINT": None,
}


# The server dies with the test process even if that one is killed hard (as conftest's agents do).
_PDEATHSIG_PREFIX = (["setpriv", "--pdeathsig", "KILL", "--"]
                     if shutil.which("setpriv") and os.uname().sysname == "Linux" else [])


class ServerMissing(RuntimeError):
    """The server's program is not installed (tests/setup.sh installs it)."""


def pick_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique_bucket(prefix: str) -> str:
    """A name valid for an S3 bucket and an Azure container: 3-63 lowercase letters, digits and
    dashes."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Server:
    """A server process on 127.0.0.1:port with its log in `log_path`."""

    name = "server"
    # Both servers keep everything in memory: after this grace period they are killed.
    stop_grace_s = 3.0

    def __init__(self, log_dir: Path):
        self.port = pick_port()
        self.log_path = Path(log_dir) / f"{self.name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Server":
        cmd = self.command()
        env = dict(os.environ)
        for key, value in CLOUD_ENV.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"===== weir-e2e: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(_PDEATHSIG_PREFIX + cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} before "
                                   f"it was ready\n--- log ---\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    pass
                if self.ready():
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready on port {self.port} within "
                           f"{START_TIMEOUT_S:.0f}s\n--- log ---\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(self.stop_grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text if len(text) <= chars else "[... log truncated ...]\n" + text[-chars:]


class MotoServer(Server):
    """moto's S3 server, run by the test python through tests/cloud/moto_atomic.py, which makes
    moto decide a conditional write and the write as one step, as S3 does."""

    name = "moto"

    SCRIPT = Path(__file__).resolve().parents[1] / "cloud" / "moto_atomic.py"

    @staticmethod
    def program() -> str:
        if importlib.util.find_spec("moto") is None:
            raise ServerMissing("moto is not installed in the test python "
                                "(tests/setup.sh installs moto[server] into .venv)")
        return sys.executable

    def command(self) -> list[str]:
        return [self.program(), str(self.SCRIPT), "-H", "127.0.0.1", "-p", str(self.port)]

    def ready(self) -> bool:
        self.client().list_buckets()
        return True

    def client(self, endpoint: str | None = None):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=endpoint or self.endpoint, region_name=AWS_REGION,
                            aws_access_key_id=AWS_KEY_ID, aws_secret_access_key=AWS_SECRET,
                            config=Config(retries={"total_max_attempts": 1, "mode": "standard"},
                                          connect_timeout=10, read_timeout=60))

    def create_bucket(self, prefix: str = "weir") -> str:
        name = unique_bucket(prefix)
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                            Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out


def query_string(query: dict) -> str:
    """Percent-encoded, but leaving `:`, `/` and `=` as they are (all valid in a query value), so
    endpoints and keys read the same with or without decoding."""
    return urlencode(query, safe=":/=", quote_via=quote)


def s3_url(bucket: str, endpoint: str | None = None, credentials: bool = True) -> str:
    """`s3://bucket` with the endpoint and keys in the query (object_store's config keys), or
    bare when they come from the environment (`s3_env`)."""
    if endpoint is None:
        return f"s3://{bucket}"
    query = {"endpoint": endpoint, "allow_http": "true", "region": AWS_REGION}
    if credentials:
        query |= {"access_key_id": AWS_KEY_ID, "secret_access_key": AWS_SECRET}
    return f"s3://{bucket}?{query_string(query)}"


def s3_env(endpoint: str) -> dict:
    """The standard AWS variables that point every s3:// bucket at `endpoint`."""
    return {"AWS_ACCESS_KEY_ID": AWS_KEY_ID, "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
            "AWS_REGION": AWS_REGION, "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}


class AzuriteServer(Server):
    """Azurite's Blob service, in memory (tests/cloud/node_modules/.bin/azurite-blob)."""

    name = "azurite"
    # Azurite says "successfully closed" on SIGTERM but lingers while clients hold idle
    # connections.
    stop_grace_s = 0.5

    @staticmethod
    def program() -> str:
        local = REPO_ROOT / "tests" / "cloud" / "node_modules" / ".bin" / "azurite-blob"
        if not local.is_file():
            raise ServerMissing(f"{local} not found (tests/setup.sh installs azurite with npm ci "
                                f"in tests/cloud)")
        if not shutil.which("node"):
            raise ServerMissing("node not found on PATH (azurite needs Node.js)")
        return str(local)

    def command(self) -> list[str]:
        return [self.program(), "--inMemoryPersistence", "--blobHost", "127.0.0.1",
                "--blobPort", str(self.port), "--skipApiVersionCheck", "--loose"]

    @property
    def account_endpoint(self) -> str:
        return f"{self.endpoint}/{AZURITE_ACCOUNT}"

    def ready(self) -> bool:
        next(iter(self.service().list_containers()), None)
        return True

    def service(self, endpoint: str | None = None):
        from azure.storage.blob import BlobServiceClient
        conn = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={endpoint or self.endpoint}/{AZURITE_ACCOUNT};")
        return BlobServiceClient.from_connection_string(conn, retry_total=0)

    def create_container(self, prefix: str = "weir") -> str:
        name = unique_bucket(prefix)
        self.service().create_container(name)
        return name

    def blobs(self, container: str, prefix: str = "") -> list[str]:
        client = self.service().get_container_client(container)
        return [b.name for b in client.list_blobs(name_starts_with=prefix or None)]


def az_url(container: str, endpoint: str) -> str:
    """`az://container` with the account, key and endpoint (`http://host:port/account`) in the
    query."""
    query = {"account": AZURITE_ACCOUNT, "access_key": AZURITE_KEY,
             "endpoint": f"{endpoint}/{AZURITE_ACCOUNT}", "allow_http": "true"}
    return f"az://{container}?{query_string(query)}"
