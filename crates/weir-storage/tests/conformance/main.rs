//! The storage conformance suite: every backend Weir can store data in passes the same cases
//! ([`cases`]), opened exactly as the agent opens a bucket (URL → store → storage layer), and
//! the storage layer's deadlines and retries hold against a real S3 server behind a fault proxy
//! ([`faults`], [`proxy`]).
//!
//! Backends: `memory://`, `file://`, `s3://` on a `moto` server and `az://` on `azurite`, both
//! spawned by the test on 127.0.0.1 ([`servers`]). Each test function starts its own server (the
//! test runner runs every test in its own process) and kills it when it ends.

mod cases;
mod faults;
mod proxy;
mod servers;

use cases::Backend;

fn assert_all_pass(backend: &Backend, failures: Vec<(&'static str, String)>) {
    assert!(
        failures.is_empty(),
        "{} case(s) failed on {}:\n{}",
        failures.len(),
        backend.name,
        failures
            .iter()
            .map(|(case, why)| format!("  {case}: {why}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_conformance_memory() {
    let backend = Backend {
        name: "memory",
        url: Box::new(|case| format!("memory://{case}")),
        compare_and_set: true,
    };
    assert_all_pass(&backend, cases::run_all(&backend).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_conformance_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().display().to_string();
    let backend = Backend {
        name: "file",
        url: Box::new(move |case| format!("file://{root}/{case}")),
        compare_and_set: false,
    };
    assert_all_pass(&backend, cases::run_all(&backend).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_conformance_s3_moto() {
    let Some(moto) = servers::start_moto().await else {
        return;
    };
    servers::create_s3_bucket(moto.port, "weir-conformance").await;
    let port = moto.port;
    let backend = Backend {
        name: "s3 (moto)",
        url: Box::new(move |case| servers::s3_url(port, "weir-conformance", case)),
        compare_and_set: true,
    };
    assert_all_pass(&backend, cases::run_all(&backend).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_conformance_az_azurite() {
    let Some(azurite) = servers::start_azurite().await else {
        return;
    };
    servers::create_az_container(azurite.port, "weir-conformance").await;
    let port = azurite.port;
    let backend = Backend {
        name: "az (azurite)",
        url: Box::new(move |case| servers::az_url(port, "weir-conformance", case)),
        compare_and_set: true,
    };
    assert_all_pass(&backend, cases::run_all(&backend).await);
}
