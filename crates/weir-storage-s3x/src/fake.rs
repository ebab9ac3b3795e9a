//! An in-memory S3 Express One Zone directory bucket behind the SDK's `HttpConnector` seam: the
//! real client builds, signs and parses every request and answer; only the socket is replaced.
//!
//! It answers what Weir sends, as the S3 documentation describes it: `CreateSession`
//! (`GET /?session`, session credentials), `PutObject` (create-only with `If-None-Match: *` →
//! 412 `PreconditionFailed` on a taken key; with `x-amz-write-offset-bytes` → an append at
//! exactly the object's size, else 400 `InvalidWriteOffset`, and 400 `TooManyParts` past the
//! part limit, counting every `PutObject` as one part), `HeadObject` (no body on errors, as S3
//! does) and `GetObject` with a `Range` (206, or 416 `InvalidRange` from the end on). Data
//! requests must carry the session token `CreateSession` gave out, virtual-hosted on the
//! bucket's host. Faults can be queued for the next data request.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aws_sdk_s3::config::http::{HttpRequest, HttpResponse};
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::ConnectorError;
use aws_sdk_s3::primitives::SdkBody;
use aws_sdk_s3::Client;
use aws_smithy_runtime_api::client::http::{
    http_client_fn, HttpConnector, HttpConnectorFuture, SharedHttpConnector,
};
use aws_smithy_runtime_api::http::StatusCode;

/// The directory bucket (`name--zone-id--x-s3`): the SDK takes the S3 Express path for it.
pub(crate) const BUCKET: &str = "weir--use1-az4--x-s3";
/// The endpoint the client is configured with; never resolved, the connector is in memory.
pub(crate) const ENDPOINT: &str = "https://s3x.test";
/// Where the SDK sends the bucket's requests (virtual-hosted style).
const HOST: &str = "weir--use1-az4--x-s3.s3x.test";
const SESSION_TOKEN: &str = "weir-fake-session-token";
/// S3 Express's part limit per object.
const MAX_PARTS: u32 = 10_000;

/// A fault for the next data request (not `CreateSession`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fault {
    /// Answer with this status and error code; the request is not applied.
    Answer(u16, &'static str),
    /// The connection fails before the request arrives.
    Refuse,
    /// The request is applied, then the connection fails before the answer arrives.
    LoseAnswer,
    /// An append is applied and the answer reports this object size.
    ReportSize(i64),
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: String,
    /// The decoded object key ("" for `CreateSession`).
    pub(crate) key: String,
    pub(crate) query: String,
    headers: HashMap<String, String>,
    pub(crate) body: Vec<u8>,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

#[derive(Debug)]
struct Object {
    data: Vec<u8>,
    parts: u32,
}

#[derive(Debug)]
struct State {
    objects: HashMap<String, Object>,
    max_parts: u32,
    sessions: usize,
    seen: Vec<Seen>,
    faults: VecDeque<Fault>,
}

/// The bucket (cloning shares it).
#[derive(Debug, Clone)]
pub(crate) struct FakeS3Express {
    state: Arc<Mutex<State>>,
}

/// An answer before it becomes an [`HttpResponse`].
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn ok() -> Answer {
        Answer {
            status: 200,
            headers: vec![("etag", "\"fake\"".to_string())],
            body: Vec::new(),
        }
    }

    fn error(status: u16, code: &str, message: &str) -> Answer {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
             <Message>{message}</Message><RequestId>fake</RequestId></Error>"
        );
        Answer {
            status,
            headers: vec![("content-type", "application/xml".to_string())],
            body: body.into_bytes(),
        }
    }

    fn header(mut self, name: &'static str, value: impl ToString) -> Answer {
        self.headers.push((name, value.to_string()));
        self
    }

    fn into_response(self) -> HttpResponse {
        let status = StatusCode::try_from(self.status).expect("a valid status");
        let mut response = HttpResponse::new(status, SdkBody::from(self.body));
        for (name, value) in self.headers {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

impl FakeS3Express {
    pub(crate) fn new() -> FakeS3Express {
        FakeS3Express {
            state: Arc::new(Mutex::new(State {
                objects: HashMap::new(),
                max_parts: MAX_PARTS,
                sessions: 0,
                seen: Vec::new(),
                faults: VecDeque::new(),
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client of this bucket: [`test_config`] with the fake endpoint and this server as its
    /// HTTP connector.
    pub(crate) fn client(&self, retries: bool) -> Client {
        self.client_with(test_config(ENDPOINT, retries))
    }

    /// A client built from `config` with this server as its HTTP connector.
    pub(crate) fn client_with(&self, config: aws_sdk_s3::config::Builder) -> Client {
        let fake = self.clone();
        let http = http_client_fn(move |_, _| SharedHttpConnector::new(fake.clone()));
        Client::from_conf(config.http_client(http).build())
    }

    pub(crate) fn inject(&self, fault: Fault) {
        self.state().faults.push_back(fault);
    }

    pub(crate) fn set_max_parts(&self, max_parts: u32) {
        self.state().max_parts = max_parts;
    }

    /// Every request so far, oldest first.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state().seen.clone()
    }

    /// How many sessions `CreateSession` gave out.
    pub(crate) fn sessions(&self) -> usize {
        self.state().sessions
    }

    /// The bytes at `key`.
    pub(crate) fn object(&self, key: &str) -> Option<Vec<u8>> {
        self.state().objects.get(key).map(|o| o.data.clone())
    }

    /// Deletes `key`, as another client would.
    pub(crate) fn remove(&self, key: &str) {
        self.state().objects.remove(key);
    }

    fn serve(&self, request: &HttpRequest) -> Result<HttpResponse, ConnectorError> {
        let seen = match parse(request) {
            Ok(seen) => seen,
            Err(answer) => return Ok(answer.into_response()),
        };
        let mut state = self.state();
        state.seen.push(seen.clone());
        if seen.query == "session" {
            state.sessions += 1;
            return Ok(create_session(&seen).into_response());
        }
        if seen.header("x-amz-s3session-token") != Some(SESSION_TOKEN) {
            let answer = Answer::error(403, "AccessDenied", "no S3 Express session token");
            return Ok(answer.into_response());
        }
        let fault = state.faults.pop_front();
        match fault {
            Some(Fault::Answer(status, code)) => {
                let answer = Answer::error(status, code, "injected");
                Ok(without_body_for_head(&seen, answer).into_response())
            }
            Some(Fault::Refuse) => Err(ConnectorError::io("connection refused".into())),
            Some(Fault::LoseAnswer) => {
                state.apply(&seen);
                Err(ConnectorError::io("connection reset".into()))
            }
            Some(Fault::ReportSize(size)) => {
                let answer = state.apply(&seen);
                let mut response = answer.into_response();
                response
                    .headers_mut()
                    .insert("x-amz-object-size", size.to_string());
                Ok(response)
            }
            None => Ok(state.apply(&seen).into_response()),
        }
    }
}

/// A client config for tests: static credentials (no provider chain, no IMDS), us-east-1,
/// `endpoint`; with `retries`, the SDK's standard retries with a 1 ms backoff, else none.
pub(crate) fn test_config(endpoint: &str, retries: bool) -> aws_sdk_s3::config::Builder {
    let retry = if retries {
        RetryConfig::standard().with_initial_backoff(Duration::from_millis(1))
    } else {
        RetryConfig::disabled()
    };
    let credentials = Credentials::new("AKIDWEIRTEST", "secret", None, None, "test");
    aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(credentials)
        .endpoint_url(endpoint)
        .retry_config(retry)
}

impl HttpConnector for FakeS3Express {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        HttpConnectorFuture::ready(self.serve(&request))
    }
}

impl State {
    fn apply(&mut self, seen: &Seen) -> Answer {
        let answer = match seen.method.as_str() {
            "PUT" => self.put_object(seen),
            "HEAD" => self.head_object(seen),
            "GET" => self.get_object(seen),
            other => Answer::error(405, "MethodNotAllowed", other),
        };
        without_body_for_head(seen, answer)
    }

    fn put_object(&mut self, seen: &Seen) -> Answer {
        let declared = seen.header("content-length").and_then(|v| v.parse().ok());
        if declared != Some(seen.body.len()) {
            return Answer::error(400, "IncompleteBody", "content-length is not the body's");
        }
        let Some(offset) = seen.header("x-amz-write-offset-bytes") else {
            return self.put_whole(seen);
        };
        let Ok(offset) = offset.parse::<usize>() else {
            return Answer::error(400, "InvalidArgument", "x-amz-write-offset-bytes");
        };
        let max_parts = self.max_parts;
        let object = match self.objects.get_mut(&seen.key) {
            // "If no object exists, setting this header to 0 will create a new object."
            None if offset == 0 => self.objects.entry(seen.key.clone()).or_insert(Object {
                data: Vec::new(),
                parts: 0,
            }),
            None => return Answer::error(404, "NoSuchKey", "no object to append to"),
            Some(object) => object,
        };
        if offset != object.data.len() {
            return Answer::error(400, "InvalidWriteOffset", "offset is not the object size");
        }
        if object.parts >= max_parts {
            return Answer::error(400, "TooManyParts", "part limit reached");
        }
        object.data.extend_from_slice(&seen.body);
        object.parts += 1;
        Answer::ok().header("x-amz-object-size", object.data.len())
    }

    fn put_whole(&mut self, seen: &Seen) -> Answer {
        let create_only = seen.header("if-none-match") == Some("*");
        if create_only && self.objects.contains_key(&seen.key) {
            return Answer::error(412, "PreconditionFailed", "the key is taken");
        }
        let object = Object {
            data: seen.body.clone(),
            parts: 1,
        };
        self.objects.insert(seen.key.clone(), object);
        Answer::ok()
    }

    fn head_object(&self, seen: &Seen) -> Answer {
        match self.objects.get(&seen.key) {
            Some(object) => Answer::ok()
                .header("content-length", object.data.len())
                .header("last-modified", "Wed, 01 Jan 2025 00:00:00 GMT"),
            None => Answer::error(404, "NotFound", ""),
        }
    }

    fn get_object(&self, seen: &Seen) -> Answer {
        let Some(object) = self.objects.get(&seen.key) else {
            return Answer::error(404, "NoSuchKey", "The specified key does not exist.");
        };
        let size = object.data.len();
        let Some(range) = seen.header("range") else {
            return Answer {
                body: object.data.clone(),
                ..Answer::ok()
            }
            .header("content-length", size);
        };
        let Some((start, last)) = parse_range(range) else {
            return Answer::error(400, "InvalidArgument", "range");
        };
        if start >= size {
            return Answer::error(
                416,
                "InvalidRange",
                "The requested range is not satisfiable",
            );
        }
        let end = last.min(size - 1) + 1;
        Answer {
            status: 206,
            body: object.data[start..end].to_vec(),
            ..Answer::ok()
        }
        .header("content-length", end - start)
        .header("content-range", format!("bytes {start}-{}/{size}", end - 1))
    }
}

/// S3 answers HEAD requests without a body, errors included.
fn without_body_for_head(seen: &Seen, mut answer: Answer) -> Answer {
    if seen.method == "HEAD" {
        answer.body.clear();
    }
    answer
}

fn create_session(seen: &Seen) -> Answer {
    if seen.header("x-amz-s3session-token").is_some() {
        return Answer::error(400, "InvalidRequest", "CreateSession signed with a session");
    }
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CreateSessionResult \
         xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Credentials>\
         <SessionToken>{SESSION_TOKEN}</SessionToken><SecretAccessKey>session-secret\
         </SecretAccessKey><AccessKeyId>ASIAWEIRTEST</AccessKeyId>\
         <Expiration>2100-01-01T00:00:00Z</Expiration></Credentials></CreateSessionResult>"
    );
    Answer {
        body: body.into_bytes(),
        ..Answer::ok()
    }
}

/// The request as the server sees it, or the answer to a request for another host or one
/// without a signature or a readable body.
fn parse(request: &HttpRequest) -> Result<Seen, Answer> {
    let uri = request.uri();
    let rest = uri.strip_prefix("https://").unwrap_or(uri);
    let (host, path_query) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if host != HOST {
        return Err(Answer::error(400, "InvalidBucketName", host));
    }
    if !request.headers().contains_key("authorization") {
        return Err(Answer::error(403, "AccessDenied", "unsigned request"));
    }
    let Some(body) = request.body().bytes() else {
        return Err(Answer::error(501, "NotImplemented", "streaming bodies"));
    };
    let (path, query) = path_query.split_once('?').unwrap_or((path_query, ""));
    let headers = request
        .headers()
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_string()))
        .collect();
    Ok(Seen {
        method: request.method().to_string(),
        key: percent_decode(path.trim_start_matches('/')),
        query: query.to_string(),
        headers,
        body: body.to_vec(),
    })
}

/// `bytes=a-b` → (a, b).
fn parse_range(range: &str) -> Option<(usize, usize)> {
    let (start, last) = range.strip_prefix("bytes=")?.split_once('-')?;
    Some((start.parse().ok()?, last.parse().ok()?))
}

/// Undoes the SDK's percent-encoding of keys (it keeps `/`).
fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if bytes[i] == b'%' => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
