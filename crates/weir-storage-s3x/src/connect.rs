//! Building the `aws-sdk-s3` client of a bucket Weir also reaches through `object_store`, from
//! the same settings: one region, one endpoint, one source of credentials.
//!
//! The credentials are `object_store`'s own provider for the bucket (static keys, web identity,
//! ECS task role, instance metadata: whatever its builder chose from the options and the
//! environment), adapted to the SDK's [`ProvideCredentials`]. Both views of a bucket then sign
//! with the same identity and refresh it the same way, and a setting that keeps `object_store`
//! away from the instance metadata service keeps the SDK away from it too.

use std::fmt;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{future, ProvideCredentials};
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::Client;
use object_store::aws::AwsCredentialProvider;

/// How long the SDK may keep credentials before asking `object_store`'s provider again. The
/// provider caches them itself and refreshes temporary ones before they expire, so asking is
/// cheap; five minutes bounds how long a rotated key stays in use.
pub const CREDENTIALS_REASKED_AFTER: Duration = Duration::from_secs(300);

/// How many attempts the SDK makes per request (the first and two retries). A retried append
/// whose first attempt landed comes back fenced, which the trait treats as "take it over".
pub const MAX_ATTEMPTS: u32 = 3;

/// What the client of one bucket needs (see [`client`]).
#[derive(Clone)]
pub struct Settings {
    /// The bucket's region (S3 Express: the region of its availability zone).
    pub region: String,
    /// An endpoint other than AWS's (an S3-compatible server, a test fake).
    pub endpoint: Option<String>,
    pub credentials: AwsCredentialProvider,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// The SDK client for `settings`: its own HTTPS client (hyper 1 + rustls), standard retries
/// with [`MAX_ATTEMPTS`], credentials from `object_store`'s provider. Sends nothing yet.
pub fn client(settings: &Settings) -> Client {
    Client::from_conf(config(settings).build())
}

/// The configuration [`client`] builds its client from (tests add their HTTP connector).
pub fn config(settings: &Settings) -> aws_sdk_s3::config::Builder {
    let mut config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(settings.region.clone()))
        .credentials_provider(SharedProvider(settings.credentials.clone()))
        .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS));
    if let Some(endpoint) = &settings.endpoint {
        config = config.endpoint_url(endpoint);
    }
    config
}

/// `object_store`'s credential provider as the SDK's.
#[derive(Clone)]
struct SharedProvider(AwsCredentialProvider);

impl fmt::Debug for SharedProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedProvider(object_store)")
    }
}

impl ProvideCredentials for SharedProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(async move {
            let credential = self
                .0
                .get_credential()
                .await
                .map_err(CredentialsError::provider_error)?;
            Ok(Credentials::new(
                credential.key_id.clone(),
                credential.secret_key.clone(),
                credential.token.clone(),
                Some(SystemTime::now() + CREDENTIALS_REASKED_AFTER),
                "weir-object-store",
            ))
        })
    }
}
