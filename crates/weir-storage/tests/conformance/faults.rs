//! The storage layer's retries and deadlines against a real S3 server (moto; throttling also on
//! azurite) behind the fault proxy: throttling that clears, throttling that does not, a server that never answers, and
//! one that ignores conditional writes (which the startup probes must refuse).
//! Outcomes are asserted (results, counters, requests the proxy saw), never durations.

use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_storage::layer::http_status;
use weir_storage::{probe, LayerPolicy, Outcome, RequestClass, StorageError};

use crate::cases::{open, open_with};
use crate::proxy::{FaultProxy, Mode};
use crate::servers::{self, Server};

const BUCKET: &str = "weir-faults";

/// A moto server with the test bucket and a fault proxy in front of it (in pass mode).
async fn moto_behind_proxy() -> Option<(Server, FaultProxy)> {
    let moto = servers::start_moto().await?;
    servers::create_s3_bucket(moto.port, BUCKET).await;
    let proxy = FaultProxy::start(moto.port).await;
    Some((moto, proxy))
}

/// An azurite server with the test container and a fault proxy in front of it (in pass mode).
async fn azurite_behind_proxy() -> Option<(Server, FaultProxy)> {
    let azurite = servers::start_azurite().await?;
    servers::create_az_container(azurite.port, BUCKET).await;
    let proxy = FaultProxy::start(azurite.port).await;
    Some((azurite, proxy))
}

/// Two throttled attempts, then one that passes: the PUT succeeds, and the counters say how.
async fn assert_throttled_put_is_retried(url: &str, proxy: &FaultProxy) {
    let bucket = open(url);
    let key = Path::from("ingest/throttled.weir");
    assert_eq!(LayerPolicy::default().max_attempts, 3);
    proxy.set(Mode::FailNext(2));
    bucket
        .store
        .put(&key, "payload".into())
        .await
        .expect("the third attempt passes");
    assert_eq!(
        proxy.requests(),
        3,
        "two throttled attempts, then one that passed"
    );
    let stats = bucket.snapshot();
    assert_eq!(stats.requests(RequestClass::Put, Outcome::Throttled), 2);
    assert_eq!(stats.requests(RequestClass::Put, Outcome::Ok), 1);
    assert_eq!(stats.retries_of(RequestClass::Put), 2);
    // The write really reached the server.
    let got = bucket.store.get(&key).await.expect("get").bytes().await;
    assert_eq!(got.expect("body").as_ref(), b"payload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_fault_proxy_throttled_put_is_retried_until_it_succeeds() {
    let Some((_moto, proxy)) = moto_behind_proxy().await else {
        return;
    };
    assert_throttled_put_is_retried(&servers::s3_url(proxy.port, BUCKET, "throttled"), &proxy)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_fault_proxy_throttled_azure_put_is_retried_until_it_succeeds() {
    let Some((_azurite, proxy)) = azurite_behind_proxy().await else {
        return;
    };
    assert_throttled_put_is_retried(&servers::az_url(proxy.port, BUCKET, "throttled"), &proxy)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_fault_proxy_constant_503_fails_after_max_attempts() {
    let Some((_moto, proxy)) = moto_behind_proxy().await else {
        return;
    };
    let bucket = open(&servers::s3_url(proxy.port, BUCKET, "always-503"));
    let policy = LayerPolicy::default();
    proxy.set(Mode::Fail503);
    let err = bucket
        .store
        .put(&Path::from("ingest/never.weir"), "payload".into())
        .await
        .unwrap_err();
    assert_eq!(http_status(&err), Some(503), "{err}");
    assert_eq!(proxy.requests(), u64::from(policy.max_attempts));
    let stats = bucket.snapshot();
    assert_eq!(
        stats.requests(RequestClass::Put, Outcome::Throttled),
        u64::from(policy.max_attempts)
    );
    assert_eq!(
        stats.retries_of(RequestClass::Put),
        u64::from(policy.max_attempts - 1)
    );
    // Throttling is worth retrying later: the caller sees a retriable error.
    assert!(StorageError::from(err).is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_fault_proxy_hung_store_times_out_then_recovers() {
    let Some((_moto, proxy)) = moto_behind_proxy().await else {
        return;
    };
    let policy = LayerPolicy {
        request_timeout: Duration::from_secs(1),
        attempt_timeout: Duration::from_millis(300),
        ..LayerPolicy::default()
    };
    let bucket = open_with(&servers::s3_url(proxy.port, BUCKET, "hung"), policy);
    let key = Path::from("ingest/hung.weir");
    bucket
        .store
        .put(&key, "before".into())
        .await
        .expect("put while passing");

    proxy.set(Mode::Hang);
    let before = bucket.snapshot();
    let err = bucket.store.put(&key, "during".into()).await.unwrap_err();
    assert!(err.to_string().contains("did not finish within"), "{err}");
    let err = StorageError::from(err);
    assert!(err.is_retryable(), "a hung PUT must fail retriably: {err}");
    let err = bucket.store.get(&key).await.unwrap_err();
    assert!(err.to_string().contains("did not finish within"), "{err}");
    assert!(StorageError::from(err).is_retryable());
    let listed: Vec<_> = bucket.store.list(None).collect().await;
    match listed.as_slice() {
        [Err(err)] => assert!(err.to_string().contains("did not finish within"), "{err}"),
        other => panic!("a hung LIST must end in one timeout error: {other:?}"),
    }
    let during = bucket.snapshot().since(&before);
    assert!(during.requests(RequestClass::Put, Outcome::Timeout) >= 1);
    assert_eq!(
        during.requests(RequestClass::Put, Outcome::Timeout),
        during.requests_of(RequestClass::Put),
        "every PUT attempt timed out"
    );
    assert_eq!(
        during.requests(RequestClass::Get, Outcome::Timeout),
        during.requests_of(RequestClass::Get),
        "every GET attempt timed out"
    );
    // A listing is retried while no key has arrived, so every attempt timed out.
    assert!(during.requests(RequestClass::List, Outcome::Timeout) >= 1);
    assert_eq!(
        during.requests(RequestClass::List, Outcome::Timeout),
        during.requests_of(RequestClass::List),
        "every LIST attempt timed out"
    );

    proxy.set(Mode::Pass);
    bucket
        .store
        .put(&key, "after".into())
        .await
        .expect("the same store works again once the proxy passes");
    let got = bucket.store.get(&key).await.expect("get").bytes().await;
    assert_eq!(got.expect("body").as_ref(), b"after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_fault_proxy_store_ignoring_conditions_is_refused_by_the_probes() {
    let Some((_moto, proxy)) = moto_behind_proxy().await else {
        return;
    };
    let bucket = open(&servers::s3_url(proxy.port, BUCKET, "no-conditions"));
    // Through the proxy as it is, moto honours conditional writes.
    probe::create_only(bucket.store.as_ref(), &bucket.name, "the metadata log")
        .await
        .expect("create-only through a passing proxy");
    probe::compare_and_set(bucket.store.as_ref(), &bucket.name, "the job queue")
        .await
        .expect("compare-and-set through a passing proxy");

    proxy.set(Mode::StripConditions);
    let err = probe::create_only(bucket.store.as_ref(), &bucket.name, "the metadata log")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::MissingCapability { capability, .. } if *capability == probe::CREATE_ONLY),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&bucket.name) && text.contains("the metadata log"),
        "the message names the bucket and what needs it: {text}"
    );
    assert!(
        !text.contains("secret_access_key"),
        "no credentials in the message: {text}"
    );
    assert!(!err.is_retryable());
    let err = probe::compare_and_set(bucket.store.as_ref(), &bucket.name, "the job queue")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StorageError::MissingCapability { capability, .. } if *capability == probe::COMPARE_AND_SET),
        "{err}"
    );
}
