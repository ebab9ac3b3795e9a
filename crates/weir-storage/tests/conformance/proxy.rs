//! A tiny HTTP fault proxy: listens on a free 127.0.0.1 port and forwards to an upstream server,
//! or fails requests on purpose. The mode is switched at runtime and applies per request.
//!
//! Each client connection carries one request: the proxy asks the upstream to close after its
//! answer and tells the client the same (`Connection: close`), so it only has to find where a
//! request ends (`Content-Length`), never where a response ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy does with the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Forward to the upstream.
    Pass,
    /// Answer `503 Slow Down` with an S3 `SlowDown` error body, without forwarding.
    Fail503,
    /// Accept the request and never answer.
    Hang,
    /// Answer 503 to the next N requests, then pass.
    FailNext(u32),
    /// Forward without the conditional-write headers (`If-None-Match`, `If-Match`): a store
    /// that silently ignores conditions, which the startup probes must refuse.
    StripConditions,
}

struct Shared {
    mode: Mutex<Mode>,
    requests: AtomicU64,
    upstream: u16,
}

impl Shared {
    /// The mode for one arriving request (counts down `FailNext`).
    fn take(&self) -> Mode {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let mut mode = self.mode.lock().unwrap_or_else(|e| e.into_inner());
        match *mode {
            Mode::FailNext(0) => {
                *mode = Mode::Pass;
                Mode::Pass
            }
            Mode::FailNext(n) => {
                *mode = Mode::FailNext(n - 1);
                Mode::Fail503
            }
            other => other,
        }
    }
}

/// A running proxy; stops accepting when dropped.
pub(crate) struct FaultProxy {
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

const SLOW_DOWN: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
<Message>Please reduce your request rate.</Message><RequestId>weir-fault-proxy</RequestId></Error>";

impl FaultProxy {
    /// Starts a proxy in front of 127.0.0.1:`upstream`, in [`Mode::Pass`].
    pub(crate) async fn start(upstream: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            requests: AtomicU64::new(0),
            upstream,
        });
        let accept_shared = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    // A client that gives up mid-request is not the proxy's failure.
                    let _ = serve(client, &shared).await;
                });
            }
        });
        FaultProxy {
            port,
            shared,
            accept,
        }
    }

    /// Switches what the proxy does with the following requests.
    pub(crate) fn set(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    /// Requests that have arrived so far, whatever was done with them.
    pub(crate) fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

/// Reads until the end of the request head; returns the head and any body bytes read past it.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok(Some((String::from_utf8_lossy(&buf).into_owned(), rest)));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The head without the headers named in `drop` and with any `Connection` header replaced by
/// `Connection: close`.
fn closing(head: &str, drop: &[&str]) -> String {
    let mut out = String::new();
    for line in head.trim_end_matches("\r\n").split("\r\n") {
        let name = line.split(':').next().unwrap_or("").trim();
        if !name.eq_ignore_ascii_case("connection")
            && !drop.iter().any(|d| name.eq_ignore_ascii_case(d))
        {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then_some(value.trim())
    })
}

async fn serve(mut client: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let Some((head, mut body)) = read_head(&mut client).await? else {
        return Ok(());
    };
    let mode = shared.take();
    if mode == Mode::Hang {
        // Hold the connection without answering until the client gives up.
        let mut sink = [0u8; 8192];
        while client.read(&mut sink).await? > 0 {}
        return Ok(());
    }
    if header(&head, "transfer-encoding").is_some() {
        let answer =
            "HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        return client.write_all(answer.as_bytes()).await;
    }
    let length: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut chunk = vec![0u8; 64 * 1024];
    while body.len() < length {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    if mode == Mode::Fail503 {
        let answer = format!(
            "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{SLOW_DOWN}",
            SLOW_DOWN.len()
        );
        return client.write_all(answer.as_bytes()).await;
    }
    let mut upstream = TcpStream::connect(("127.0.0.1", shared.upstream)).await?;
    let drop: &[&str] = match mode {
        Mode::StripConditions => &["if-none-match", "if-match"],
        _ => &[],
    };
    upstream.write_all(closing(&head, drop).as_bytes()).await?;
    upstream.write_all(&body).await?;
    let Some((response_head, rest)) = read_head(&mut upstream).await? else {
        return Ok(());
    };
    client
        .write_all(closing(&response_head, &[]).as_bytes())
        .await?;
    client.write_all(&rest).await?;
    tokio::io::copy(&mut upstream, &mut client).await?;
    client.shutdown().await
}
