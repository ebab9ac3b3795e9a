//! Opening a bucket by URL.
//!
//! | URL | store |
//! |---|---|
//! | `memory://[name]` | in-process, lost on exit |
//! | `file:///abs/path`, `file://rel/path` | local directory, created if missing, fsync on |
//! | `s3://bucket[/prefix]` (`s3a://`) | AWS S3 or an S3-compatible server; `*--x-s3` = S3 Express One Zone |
//! | `gs://bucket[/prefix]` | Google Cloud Storage |
//! | `az://container[/prefix]`, `azure://…`, `abfs[s]://container@account.dfs.core.windows.net/…` | Azure Blob Storage |
//!
//! Options of the cloud stores (endpoint, region, credentials, …) come, lowest precedence
//! first, from the cloud's standard environment variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`, read
//! by the builders' `from_env`), the options given by the caller (config
//! `[storage.options]`, `[storage.bucket_options."<url>"]`) and the URL's query string
//! (`s3://b?endpoint=http://127.0.0.1:9000&allow_http=true`). Keys are `object_store`'s config keys,
//! short or with their cloud prefix (`endpoint` or `aws_endpoint`). Weir's own keys: `price`,
//! the bucket's price table ([`crate::stats::PriceTable`]); on `gs://`, `rapid=true` (a zonal
//! bucket, reached through gRPC) and `grpc_endpoint`.
//!
//! The clients' own retries are switched off: the storage layer ([`crate::layer`]) owns the one
//! retry policy.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::prefix::PrefixStore;
use object_store::{local::LocalFileSystem, memory::InMemory, ObjectStore, RetryConfig};

use crate::StorageError;

/// Weir's own per-bucket option: the price table name.
pub const PRICE_OPTION: &str = "price";

/// Weir's own option of `gs://` buckets: `rapid=true` says the bucket is a zonal (Rapid) bucket,
/// whose objects Weir reads and writes through the gRPC client of `weir-storage-gcs`.
pub const RAPID_OPTION: &str = "rapid";

/// Weir's own option of Rapid buckets: the gRPC endpoint (default Google's).
pub const GRPC_ENDPOINT_OPTION: &str = "grpc_endpoint";

/// Whether `key` (lower case) is one of Weir's own options for buckets of `scheme`.
fn is_weir_option(scheme: &str, key: &str) -> bool {
    key == PRICE_OPTION || (scheme == "gs" && (key == RAPID_OPTION || key == GRPC_ENDPOINT_OPTION))
}

/// A bucket opened by [`BucketUrl::open_parts`]: its `object_store` view without the URL's key
/// prefix, and what a client of the bucket's appendable API needs, where it has one.
pub struct Opened {
    /// The store, without the key prefix ([`BucketUrl::prefixed`] adds it).
    pub store: Arc<dyn ObjectStore>,
    pub access: Option<Access>,
}

/// The settings of a bucket's appendable API, taken from the same options and environment as
/// its `object_store` view, so both views reach the same bucket as the same identity.
pub enum Access {
    /// An S3 directory bucket (`*--x-s3`): S3 Express One Zone appends (`weir-storage-s3x`).
    S3Express {
        bucket: String,
        region: String,
        endpoint: Option<String>,
        /// `object_store`'s credential provider of the bucket.
        credentials: object_store::aws::AwsCredentialProvider,
    },
    /// A GCS bucket with `rapid=true`: zonal appendable objects (`weir-storage-gcs`).
    GcsRapid {
        bucket: String,
        grpc_endpoint: Option<String>,
        credentials: GcsCredentials,
    },
}

/// Where a Rapid bucket's gRPC client gets credentials, from the `object_store` options.
#[derive(Clone, PartialEq, Eq)]
pub enum GcsCredentials {
    /// `skip_signature=true`.
    Anonymous,
    /// `service_account_key` (the key's JSON).
    ServiceAccountKey(String),
    /// `service_account` or `application_credentials` (a key file's path).
    ServiceAccountFile(String),
    /// None of those: Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`,
    /// gcloud's application-default login, then the VM's or GKE workload identity's metadata
    /// server).
    ApplicationDefault,
}

impl std::fmt::Debug for GcsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GcsCredentials::Anonymous => f.write_str("Anonymous"),
            GcsCredentials::ServiceAccountKey(_) => f.write_str("ServiceAccountKey(..)"),
            GcsCredentials::ServiceAccountFile(path) => {
                f.debug_tuple("ServiceAccountFile").field(path).finish()
            }
            GcsCredentials::ApplicationDefault => f.write_str("ApplicationDefault"),
        }
    }
}

/// A parsed bucket URL: scheme, bucket, key prefix and options. Its `Debug` shows option keys
/// only: values may be credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct BucketUrl {
    /// `s3`, `gs`, `az`, `file`, `memory`, …
    pub scheme: String,
    /// The bucket or container (for `file://`, the directory; for `memory://`, the name).
    pub bucket: String,
    /// Key prefix inside the bucket ("" for none).
    pub prefix: String,
    /// Options from the URL's query string, in order.
    pub query: Vec<(String, String)>,
    raw: String,
}

impl std::fmt::Debug for BucketUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketUrl")
            .field("name", &self.display_name())
            .field(
                "query_keys",
                &self.query.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// `url` without its query string (which may hold credentials).
fn without_query(url: &str) -> &str {
    url.split_once('?').map_or(url, |(name, _)| name)
}

/// Whether `bucket` is an S3 directory bucket (S3 Express One Zone `--x-s3`, or a Local Zone
/// `--xa-s3`).
fn is_directory_bucket(bucket: &str) -> bool {
    bucket.ends_with("--x-s3") || bucket.ends_with("--xa-s3")
}

impl BucketUrl {
    /// Parses `url`. Errors name the URL without its query string.
    pub fn parse(url: &str) -> Result<BucketUrl, StorageError> {
        let name = without_query(url);
        let invalid =
            |why: &str| StorageError::InvalidConfig(format!("bucket URL {name:?}: {why}"));
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid(
                "no scheme (expected e.g. file:///path, memory://, s3://bucket, gs://bucket, az://container)",
            ));
        };
        let scheme = scheme.to_ascii_lowercase();
        let (location, query) = match rest.split_once('?') {
            Some((location, query)) => (location, parse_query(query).map_err(|e| invalid(&e))?),
            None => (rest, Vec::new()),
        };
        let (bucket, prefix) = match scheme.as_str() {
            // The whole path is the directory.
            "file" => {
                if location.is_empty() {
                    return Err(invalid("no path"));
                }
                (location.to_string(), String::new())
            }
            "memory" => (location.to_string(), String::new()),
            "s3" | "s3a" | "gs" | "az" | "azure" | "abfs" | "abfss" => {
                let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
                if bucket.is_empty() {
                    return Err(invalid("no bucket name"));
                }
                (bucket.to_string(), prefix.trim_matches('/').to_string())
            }
            other => return Err(StorageError::UnsupportedScheme(other.to_string())),
        };
        Ok(BucketUrl {
            scheme,
            bucket,
            prefix,
            query,
            raw: url.to_string(),
        })
    }

    /// The URL without its query string (which may hold credentials): how logs, errors and
    /// metrics name the bucket.
    pub fn display_name(&self) -> String {
        without_query(&self.raw).to_string()
    }

    /// Whether objects written here outlive the process.
    pub fn is_durable(&self) -> bool {
        self.scheme != "memory"
    }

    /// The value of option `key` after merging `options` and the query (query wins).
    pub fn option(&self, options: &BTreeMap<String, String>, key: &str) -> Option<String> {
        self.query
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .or_else(|| options.get(key).cloned())
    }

    /// Opens the store: the cloud's environment, then `options`, then the URL's query.
    pub fn open(
        &self,
        options: &BTreeMap<String, String>,
    ) -> Result<Arc<dyn ObjectStore>, StorageError> {
        Ok(self.prefixed(self.open_parts(options)?.store))
    }

    /// `store` under this URL's key prefix (unchanged without one).
    pub fn prefixed(&self, store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        if self.prefix.is_empty() {
            return store;
        }
        Arc::new(PrefixStore::new(store, self.prefix.as_str()))
    }

    /// Whether option `rapid` is true for this `gs://` bucket.
    fn is_rapid(&self, options: &BTreeMap<String, String>) -> Result<bool, StorageError> {
        if self.scheme != "gs" {
            return Ok(false);
        }
        match self.option(options, RAPID_OPTION).as_deref().map(str::trim) {
            None | Some("false") | Some("0") | Some("no") => Ok(false),
            Some("true") | Some("1") | Some("yes") => Ok(true),
            Some(other) => Err(StorageError::InvalidConfig(format!(
                "bucket {}: option rapid={other:?} (expected true or false)",
                self.display_name()
            ))),
        }
    }

    /// Opens the store without its key prefix, and the settings of its appendable API.
    pub fn open_parts(&self, options: &BTreeMap<String, String>) -> Result<Opened, StorageError> {
        let rapid = self.is_rapid(options)?;
        let grpc_endpoint = self.option(options, GRPC_ENDPOINT_OPTION);
        if grpc_endpoint.is_some() && !rapid {
            return Err(StorageError::InvalidConfig(format!(
                "bucket {}: option {GRPC_ENDPOINT_OPTION} applies to Rapid buckets only (add rapid=true)",
                self.display_name()
            )));
        }
        let merged: Vec<(String, String)> = options
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .chain(
                self.query
                    .iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.clone())),
            )
            .filter(|(k, _)| !is_weir_option(&self.scheme, k))
            .collect();
        let no_options = || -> Result<(), StorageError> {
            match merged.first() {
                Some((key, _)) => Err(StorageError::InvalidConfig(format!(
                    "bucket {}: option {key:?} does not apply to {}:// buckets",
                    self.display_name(),
                    self.scheme
                ))),
                None => Ok(()),
            }
        };
        let unknown = |key: &str| {
            StorageError::InvalidConfig(format!(
                "bucket {}: unknown option {key:?} (see object_store's config keys for {}://)",
                self.display_name(),
                self.scheme
            ))
        };
        let mut access = None;
        let store: Arc<dyn ObjectStore> = match self.scheme.as_str() {
            "memory" => {
                no_options()?;
                Arc::new(InMemory::new())
            }
            "file" => {
                no_options()?;
                Arc::new(local_store(std::path::Path::new(&self.bucket))?)
            }
            "s3" | "s3a" => {
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(&self.bucket);
                if is_directory_bucket(&self.bucket) {
                    builder = builder.with_s3_express(true);
                }
                if env_truthy("AWS_EC2_METADATA_DISABLED") {
                    // object_store ignores the variable; honour it by pointing the instance
                    // credential provider at a closed local port, so it fails instead of
                    // reaching the metadata service.
                    builder = builder
                        .with_config(AmazonS3ConfigKey::MetadataEndpoint, "http://127.0.0.1:1");
                }
                for (key, value) in &merged {
                    let parsed: AmazonS3ConfigKey = key.parse().map_err(|_| unknown(key))?;
                    builder = builder.with_config(parsed, value);
                }
                let region = builder.get_config_value(&AmazonS3ConfigKey::Region);
                let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
                let s3 = builder.with_retry(no_client_retries()).build()?;
                if is_directory_bucket(&self.bucket) {
                    access = Some(Access::S3Express {
                        bucket: self.bucket.clone(),
                        region: region.unwrap_or_else(|| "us-east-1".to_string()),
                        endpoint,
                        credentials: s3.credentials().clone(),
                    });
                }
                Arc::new(s3)
            }
            "gs" => {
                let mut builder =
                    GoogleCloudStorageBuilder::from_env().with_bucket_name(&self.bucket);
                for (key, value) in &merged {
                    let parsed: GoogleConfigKey = key.parse().map_err(|_| unknown(key))?;
                    builder = builder.with_config(parsed, value);
                }
                if rapid {
                    access = Some(Access::GcsRapid {
                        bucket: self.bucket.clone(),
                        grpc_endpoint,
                        credentials: gcs_credentials(&builder),
                    });
                }
                Arc::new(builder.with_retry(no_client_retries()).build()?)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                let mut builder = MicrosoftAzureBuilder::from_env();
                builder = if self.scheme.starts_with("abfs") {
                    // `abfs://container@account.dfs.core.windows.net/prefix`
                    let host = self.display_name();
                    let host = host.split('/').take(3).collect::<Vec<_>>().join("/");
                    builder.with_url(host)
                } else {
                    builder.with_container_name(&self.bucket)
                };
                for (key, value) in &merged {
                    // `account` reads better in a URL than object_store's `account_name`.
                    let key = if key == "account" {
                        "account_name"
                    } else {
                        key
                    };
                    let parsed: AzureConfigKey = key.parse().map_err(|_| unknown(key))?;
                    builder = builder.with_config(parsed, value);
                }
                Arc::new(builder.with_retry(no_client_retries()).build()?)
            }
            other => return Err(StorageError::UnsupportedScheme(other.to_string())),
        };
        Ok(Opened { store, access })
    }
}

/// The gRPC client's credentials from the options of a GCS bucket's `object_store` builder.
fn gcs_credentials(builder: &GoogleCloudStorageBuilder) -> GcsCredentials {
    let value = |key: GoogleConfigKey| builder.get_config_value(&key).filter(|v| !v.is_empty());
    if value(GoogleConfigKey::SkipSignature).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return GcsCredentials::Anonymous;
    }
    if let Some(key) = value(GoogleConfigKey::ServiceAccountKey) {
        return GcsCredentials::ServiceAccountKey(key);
    }
    if let Some(path) = value(GoogleConfigKey::ServiceAccount)
        .or_else(|| value(GoogleConfigKey::ApplicationCredentials))
    {
        return GcsCredentials::ServiceAccountFile(path);
    }
    GcsCredentials::ApplicationDefault
}

fn env_truthy(name: &str) -> bool {
    std::env::var(name)
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// The canonical spelling of option `key` for buckets of `scheme` (`endpoint` and
/// `aws_endpoint_url` are both `aws_endpoint`), so options merged from several places override
/// each other by meaning, not by spelling; `None` when the scheme has no such option. Weir's own
/// `price` is kept as is.
pub fn canonical_option(scheme: &str, key: &str) -> Option<String> {
    let key = key.to_ascii_lowercase();
    if is_weir_option(scheme, &key) {
        return Some(key);
    }
    match scheme {
        "s3" | "s3a" => key
            .parse::<AmazonS3ConfigKey>()
            .ok()
            .map(|k| k.as_ref().to_string()),
        "gs" => key
            .parse::<GoogleConfigKey>()
            .ok()
            .map(|k| k.as_ref().to_string()),
        "az" | "azure" | "abfs" | "abfss" => {
            let key = if key == "account" {
                "account_name".to_string()
            } else {
                key
            };
            key.parse::<AzureConfigKey>()
                .ok()
                .map(|k| k.as_ref().to_string())
        }
        _ => None,
    }
}

/// The cloud clients retry nothing themselves: [`crate::layer`] decides.
fn no_client_retries() -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    }
}

fn parse_query(query: &str) -> Result<Vec<(String, String)>, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
            Ok((percent_decode(key)?, percent_decode(value)?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| "bad percent escape in the query string".to_string())?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "the query string is not UTF-8 after decoding".to_string())
}

/// Opens the store named by `url` with no options beyond the environment and its query.
pub fn open_store(url: &str) -> Result<Arc<dyn ObjectStore>, StorageError> {
    BucketUrl::parse(url)?.open(&BTreeMap::new())
}

/// A [`LocalFileSystem`] rooted at `dir` (created if missing) with fsync enabled.
///
/// With fsync on, `object_store` 0.14 `sync_all`s each written file before publishing it by
/// rename/hard link and then fsyncs the parent directory (and any directories it created), so a
/// successful put is durable as DUR-1 requires.
pub fn local_store(dir: &std::path::Path) -> Result<LocalFileSystem, StorageError> {
    std::fs::create_dir_all(dir)?;
    Ok(LocalFileSystem::new_with_prefix(dir)?.with_fsync(true))
}

#[cfg(test)]
mod tests;
