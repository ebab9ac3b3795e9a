use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::*;

#[test]
fn test_url_local_store_has_fsync_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(dir.path()).unwrap();
    let debug = format!("{store:?}");
    assert!(debug.contains("fsync: true"), "{debug}");

    let url = format!("file://{}", dir.path().join("sub").display());
    let opened = open_store(&url).unwrap();
    let debug = format!("{opened:?}");
    assert!(debug.contains("LocalFileSystem"), "{debug}");
    assert!(debug.contains("fsync: true"), "{debug}");
    assert!(dir.path().join("sub").is_dir());
}

#[test]
fn test_url_schemes() {
    assert!(open_store("memory://").is_ok());
    assert!(matches!(
        open_store("ftp://bucket/x"),
        Err(StorageError::UnsupportedScheme(s)) if s == "ftp"
    ));
    assert!(matches!(
        open_store("/no/scheme"),
        Err(StorageError::InvalidConfig(_))
    ));
    assert!(matches!(
        open_store("file://"),
        Err(StorageError::InvalidConfig(_))
    ));
    assert!(matches!(
        open_store("s3://"),
        Err(StorageError::InvalidConfig(_))
    ));
}

#[test]
fn test_url_parse_bucket_prefix_and_query() {
    let url = BucketUrl::parse(
        "s3://weir-a/some/prefix/?endpoint=http%3A%2F%2F127.0.0.1%3A9000&allow_http=true&secret_access_key=s3cr3t",
    )
    .unwrap();
    assert_eq!(url.scheme, "s3");
    assert_eq!(url.bucket, "weir-a");
    assert_eq!(url.prefix, "some/prefix");
    assert_eq!(
        url.query[0],
        ("endpoint".to_string(), "http://127.0.0.1:9000".to_string())
    );
    // Credentials in the query never reach logs.
    assert_eq!(url.display_name(), "s3://weir-a/some/prefix/");
    let file = BucketUrl::parse("file:///var/lib/weir/bucket").unwrap();
    assert_eq!(file.bucket, "/var/lib/weir/bucket");
    assert!(!BucketUrl::parse("memory://x").unwrap().is_durable());
}

#[test]
fn test_url_opens_cloud_stores_without_network() {
    // Building a client does not talk to the cloud; static credentials keep the builders away
    // from any metadata endpoint.
    let s3 = open_store(
        "s3://weir-a/p?endpoint=http://127.0.0.1:1&allow_http=true&region=us-east-1&access_key_id=k&secret_access_key=s",
    )
    .unwrap();
    let debug = format!("{s3:?}");
    assert!(
        debug.contains("PrefixStore") && debug.contains("AmazonS3"),
        "{debug}"
    );
    let express = open_store(
        "s3://logs--use1-az4--x-s3?region=us-east-1&access_key_id=k&secret_access_key=s",
    )
    .unwrap();
    assert!(
        format!("{express:?}").contains("s3express-use1-az4"),
        "{express:?}"
    );
    let azure = open_store(
        "az://container?account=devstoreaccount1&access_key=a2V5&endpoint=http://127.0.0.1:1/devstoreaccount1&allow_http=true",
    )
    .unwrap();
    assert!(format!("{azure:?}").contains("MicrosoftAzure"), "{azure:?}");
    // Options that do not exist, or options on a local bucket, are errors, not silently ignored.
    let err = open_store("s3://weir-a?endpoit=http://x").unwrap_err();
    assert!(
        err.to_string().contains("unknown option \"endpoit\""),
        "{err}"
    );
    let err = open_store("memory://x?endpoint=http://x").unwrap_err();
    assert!(err.to_string().contains("does not apply"), "{err}");
    // The price option is Weir's, not the client's.
    assert!(open_store("memory://x?price=s3-express").is_ok());
}

#[tokio::test]
async fn test_url_file_put_create_conflict_is_already_exists() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&format!("file://{}", dir.path().display())).unwrap();
    let key = crate::keys::meta_log(1);
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    store
        .put_opts(&key, PutPayload::from_static(b"first"), create())
        .await
        .unwrap();
    let err = store
        .put_opts(&key, PutPayload::from_static(b"second"), create())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "{err:?}"
    );
    let got = store.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], b"first");
    // the file really is on disk under the directory
    assert!(dir.path().join("meta/log/00000000000000000001").is_file());
}

fn parts(url: &str) -> Result<Opened, StorageError> {
    BucketUrl::parse(url)?.open_parts(&BTreeMap::new())
}

#[tokio::test]
async fn test_url_appendable_access_of_directory_and_rapid_buckets() {
    // An S3 directory bucket's appendable client gets the same region, endpoint and identity.
    let opened = parts(
        "s3://logs--use1-az4--x-s3/p?region=us-east-1&endpoint=http://127.0.0.1:1&allow_http=true&access_key_id=AKIDX&secret_access_key=s",
    )
    .unwrap();
    let Some(Access::S3Express {
        bucket,
        region,
        endpoint,
        credentials,
    }) = opened.access
    else {
        panic!("a directory bucket has appendable access");
    };
    assert_eq!(bucket, "logs--use1-az4--x-s3");
    assert_eq!(region, "us-east-1");
    assert_eq!(endpoint.as_deref(), Some("http://127.0.0.1:1"));
    assert_eq!(credentials.get_credential().await.unwrap().key_id, "AKIDX");
    // A general-purpose bucket has none.
    let opened = parts("s3://weir-a?region=us-east-1&access_key_id=k&secret_access_key=s").unwrap();
    assert!(opened.access.is_none());

    // A Rapid bucket: `rapid` and `grpc_endpoint` are Weir's, the credentials object_store's.
    let opened =
        parts("gs://zonal/p?rapid=true&grpc_endpoint=http://127.0.0.1:1&skip_signature=true")
            .unwrap();
    let Some(Access::GcsRapid {
        bucket,
        grpc_endpoint,
        credentials,
    }) = opened.access
    else {
        panic!("rapid=true has appendable access");
    };
    assert_eq!(bucket, "zonal");
    assert_eq!(grpc_endpoint.as_deref(), Some("http://127.0.0.1:1"));
    assert_eq!(credentials, GcsCredentials::Anonymous);
    // (object_store reads keys when it builds, so these are checked on a builder.)
    let file = GoogleCloudStorageBuilder::new()
        .with_config(GoogleConfigKey::ApplicationCredentials, "/k.json");
    assert_eq!(
        gcs_credentials(&file),
        GcsCredentials::ServiceAccountFile("/k.json".into())
    );
    let inline = GoogleCloudStorageBuilder::new()
        .with_config(GoogleConfigKey::ServiceAccountKey, "{\"k\": 1}")
        .with_config(GoogleConfigKey::ServiceAccount, "/ignored.json");
    assert_eq!(
        gcs_credentials(&inline),
        GcsCredentials::ServiceAccountKey("{\"k\": 1}".into())
    );
    assert_eq!(
        gcs_credentials(&GoogleCloudStorageBuilder::new()),
        GcsCredentials::ApplicationDefault
    );
    assert!(parts("gs://regional?rapid=false&skip_signature=true")
        .unwrap()
        .access
        .is_none());

    // Mistakes are refused, naming the option.
    let err = parts("gs://zonal?rapid=maybe").err().unwrap();
    assert!(err.to_string().contains("rapid=\"maybe\""), "{err}");
    let err = parts("gs://regional?grpc_endpoint=http://x").err().unwrap();
    assert!(err.to_string().contains("rapid=true"), "{err}");
    let err = parts("s3://weir-a?rapid=true").err().unwrap();
    assert!(
        err.to_string().contains("unknown option \"rapid\""),
        "{err}"
    );
}
