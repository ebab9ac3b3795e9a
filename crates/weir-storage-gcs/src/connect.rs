//! Building the gRPC client of a Rapid bucket from the settings its `object_store` view has.

use google_cloud_auth::credentials::{anonymous, service_account, Builder as Adc, Credentials};
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};
use google_cloud_storage::client::Storage;
use weir_storage::StorageError;

/// Where a Rapid bucket's client gets its credentials: read from the bucket's `object_store`
/// options by `weir_storage::url` (one definition, so the two views cannot disagree).
pub use weir_storage::url::GcsCredentials;

/// How many attempts the client makes per call by default (the first and two retries, of
/// what AIP-194 calls retryable). Weir's storage layer puts its deadline around each call.
pub const DEFAULT_ATTEMPTS: u32 = 3;

/// What the client of one Rapid bucket needs (see [`client`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// A gRPC endpoint other than Google's (`grpc_endpoint`).
    pub endpoint: Option<String>,
    pub credentials: GcsCredentials,
    /// Attempts per call, at least 1 ([`DEFAULT_ATTEMPTS`]).
    pub attempts: u32,
}

impl Settings {
    /// Google's endpoint, `credentials`, [`DEFAULT_ATTEMPTS`].
    pub fn new(credentials: GcsCredentials) -> Settings {
        Settings {
            endpoint: None,
            credentials,
            attempts: DEFAULT_ATTEMPTS,
        }
    }
}

fn invalid(why: String) -> StorageError {
    StorageError::InvalidConfig(format!("GCS Rapid client: {why}"))
}

fn service_account_from_json(json: &str, from: &str) -> Result<Credentials, StorageError> {
    let key: serde_json::Value =
        serde_json::from_str(json).map_err(|e| invalid(format!("{from} is not JSON: {e}")))?;
    if key.get("type").and_then(|t| t.as_str()) != Some("service_account") {
        return Err(invalid(format!(
            "{from} is not a service account key (\"type\": \"service_account\"); for other \
             credentials leave it unset and use Application Default Credentials"
        )));
    }
    service_account::Builder::new(key)
        .build()
        .map_err(|e| invalid(format!("{from}: {e}")))
}

/// The credentials of `source`. Nothing is fetched yet: tokens are asked for on first use.
pub fn credentials(source: &GcsCredentials) -> Result<Credentials, StorageError> {
    match source {
        GcsCredentials::Anonymous => Ok(anonymous::Builder::new().build()),
        GcsCredentials::ServiceAccountKey(json) => {
            service_account_from_json(json, "the service account key")
        }
        GcsCredentials::ServiceAccountFile(path) => {
            let json = std::fs::read_to_string(path)
                .map_err(|e| invalid(format!("reading {path}: {e}")))?;
            service_account_from_json(&json, path)
        }
        GcsCredentials::ApplicationDefault => Adc::default()
            .build()
            .map_err(|e| invalid(format!("Application Default Credentials: {e}"))),
    }
}

/// The gRPC client of a Rapid bucket. It connects lazily: nothing is sent until the first
/// request, so building one for an unreachable endpoint succeeds and the startup checks then
/// name the bucket that cannot be reached.
pub async fn client(settings: &Settings) -> Result<Storage, StorageError> {
    let mut builder = Storage::builder()
        .with_credentials(credentials(&settings.credentials)?)
        .with_retry_policy(Aip194Strict.with_attempt_limit(settings.attempts.max(1)));
    if let Some(endpoint) = &settings.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    builder
        .build()
        .await
        .map_err(|e| invalid(format!("building the client: {e}")))
}
