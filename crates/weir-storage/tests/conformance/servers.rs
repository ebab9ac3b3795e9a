//! The real servers the suite runs against: a `moto` S3 server and an `azurite` Blob server,
//! spawned on 127.0.0.1 free ports, killed on drop, plus the one request each needs that
//! `object_store` cannot make (creating the bucket or container).
//!
//! Programs come from `WEIR_TEST_MOTO_PYTHON` (a python with moto installed, which runs
//! `tests/cloud/moto_atomic.py`) / `WEIR_TEST_AZURITE_BLOB`, defaulting to where
//! `tests/setup.sh` installs them. A missing binary skips the scenario with a message, except
//! under `CI=true`, where it fails: a scenario that silently did not run is not a pass.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_lc_rs::hmac;
use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a server may take to start answering (moto imports a lot of Python).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// Azurite's well-known development account (public, documented by Microsoft).
pub(crate) const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development key (public, documented by Microsoft).
pub(crate) const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Keeps every cloud client away from instance metadata endpoints: nothing may leave loopback.
pub(crate) fn isolate_from_clouds() {
    // Edition 2021: `set_var` is safe; each test sets the same values before any client exists.
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The server binary named by `env_var` (or `default` under the repo root), or `None` with the
/// reason printed when it is missing outside CI. Panics when it is missing under `CI=true`.
pub(crate) fn server_binary(env_var: &str, default: &str, what: &str) -> Option<PathBuf> {
    let path = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(default));
    if path.is_file() {
        return Some(path);
    }
    let why = format!(
        "{what} not found at {} (set {env_var}, or run tests/setup.sh)",
        path.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and {why}: the scenario cannot run, which is a failure in CI");
    }
    eprintln!("skipping: {why}");
    None
}

/// A free TCP port on 127.0.0.1 (the OS picks it; the listener is closed before use).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A spawned server process, killed (and reaped) on drop.
pub(crate) struct Server {
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Spawns `program` with `args(port)` on a free port and waits until it answers HTTP. A
    /// server that exits before answering (another process took the port between our check and
    /// its bind) is started again on another port, a few times.
    async fn start(program: &Path, what: &str, args: impl Fn(u16) -> Vec<String>) -> Server {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let mut server = Server::spawn(program, &args(port), port, what);
            match server.wait_ready(what).await {
                Ok(()) => return server,
                Err(why) => failures.push(why),
            }
        }
        panic!("{what} did not start:\n{}", failures.join("\n---\n"));
    }

    fn spawn(program: &Path, args: &[String], port: u16, what: &str) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).expect("server log");
        let err = out.try_clone().expect("server log");
        let child = Command::new(program)
            .args(args)
            .current_dir(dir.path())
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {what} {}: {e}", program.display()));
        Server {
            port,
            child,
            log,
            _dir: dir,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Waits until the server answers HTTP on its port; `Err` with its log when it exited
    /// first. Panics when it neither answers nor exits within [`READY_WITHIN`].
    async fn wait_ready(&mut self, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "{what} on port {} exited early ({status}):\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            if let Ok((status, _)) = http(self.port, "GET", "/", &[], b"").await {
                if status > 0 {
                    return Ok(());
                }
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not answer on 127.0.0.1:{} within {READY_WITHIN:?}:\n{}",
                self.port,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Starts moto's S3 server on a free port, or `None` when the venv is missing (outside CI).
/// It runs through `tests/cloud/moto_atomic.py`, which makes moto decide a conditional write and
/// the write itself as one step, as S3 does (moto alone can lose one of two concurrent
/// compare-and-set writes).
pub(crate) async fn start_moto() -> Option<Server> {
    isolate_from_clouds();
    let python = server_binary(
        "WEIR_TEST_MOTO_PYTHON",
        ".venv/bin/python",
        "a python with moto[server] (the repo's .venv)",
    )?;
    let script = repo_root().join("tests/cloud/moto_atomic.py");
    let args = move |port: u16| {
        let script = script.display().to_string();
        [script.as_str(), "-H", "127.0.0.1", "-p", &port.to_string()]
            .map(String::from)
            .to_vec()
    };
    Some(Server::start(&python, "moto_server", args).await)
}

/// Starts `azurite-blob` (in memory) on a free port, or `None` when the binary is missing.
pub(crate) async fn start_azurite() -> Option<Server> {
    isolate_from_clouds();
    let program = server_binary(
        "WEIR_TEST_AZURITE_BLOB",
        "tests/cloud/node_modules/.bin/azurite-blob",
        "azurite-blob (npm azurite)",
    )?;
    let args = |port: u16| {
        [
            "--inMemoryPersistence",
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            &port.to_string(),
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ]
        .map(String::from)
        .to_vec()
    };
    Some(Server::start(&program, "azurite-blob", args).await)
}

/// The `s3://` URL of `bucket/prefix` on the S3 server at `port` (static fake credentials).
pub(crate) fn s3_url(port: u16, bucket: &str, prefix: &str) -> String {
    format!(
        "s3://{bucket}/{prefix}?endpoint=http://127.0.0.1:{port}&allow_http=true\
         &region=us-east-1&access_key_id=test&secret_access_key=test"
    )
}

/// The `az://` URL of `container/prefix` on the azurite server at `port`.
pub(crate) fn az_url(port: u16, container: &str, prefix: &str) -> String {
    let key: String = AZURITE_KEY
        .bytes()
        .map(|b| match b {
            b'+' => "%2B".to_string(),
            b'/' => "%2F".to_string(),
            b'=' => "%3D".to_string(),
            b => (b as char).to_string(),
        })
        .collect();
    format!(
        "az://{container}/{prefix}?account={AZURITE_ACCOUNT}&access_key={key}\
         &endpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT}&allow_http=true"
    )
}

/// Creates `bucket` on the moto server (moto accepts an unsigned `PUT /<bucket>`).
pub(crate) async fn create_s3_bucket(port: u16, bucket: &str) {
    let (status, body) = http(port, "PUT", &format!("/{bucket}"), &[], b"")
        .await
        .expect("create bucket on moto");
    assert_eq!(status, 200, "creating bucket {bucket}: {body}");
}

/// Creates `container` on azurite with a Shared Key signed `Create Container` request.
pub(crate) async fn create_az_container(port: u16, container: &str) {
    let date = chrono::Utc::now()
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    let version = "2023-11-03";
    // VERB, then 11 empty standard headers (no body: Content-Length is empty), then the
    // canonical x-ms-* headers and the resource (emulator style: the account twice).
    let to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n\
         /{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{container}\nrestype:container"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(AZURITE_KEY).expect("azurite key is base64");
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &key), to_sign.as_bytes());
    let auth = format!("SharedKey {AZURITE_ACCOUNT}:{}", b64.encode(tag.as_ref()));
    let path = format!("/{AZURITE_ACCOUNT}/{container}?restype=container");
    let headers = [
        ("x-ms-date", date.as_str()),
        ("x-ms-version", version),
        ("Authorization", auth.as_str()),
    ];
    let (status, body) = http(port, "PUT", &path, &headers, b"")
        .await
        .expect("create container on azurite");
    assert_eq!(status, 201, "creating container {container}: {body}");
}

/// One HTTP/1.1 request to 127.0.0.1:`port` on a fresh connection; the status and body text.
pub(crate) async fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut response))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((status, text))
}
