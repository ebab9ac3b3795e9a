use object_store::memory::InMemory;
use object_store::ObjectStoreExt;

use super::*;

fn mem() -> Arc<dyn ObjectStore> {
    Arc::new(InMemory::new())
}

#[test]
fn test_model_sampling_p50_and_p99_roughly_right() {
    let lat = OpLatency::millis(45, 150);
    let mut rng = fastrand::Rng::with_seed(7);
    let mut samples: Vec<Duration> = (0..20_000).map(|_| lat.sample(&mut rng)).collect();
    samples.sort();
    let p50 = samples[samples.len() / 2].as_secs_f64() * 1000.0;
    let p99 = samples[samples.len() * 99 / 100].as_secs_f64() * 1000.0;
    assert!((42.0..48.0).contains(&p50), "p50 {p50} ms");
    assert!((130.0..170.0).contains(&p99), "p99 {p99} ms");
}

#[test]
fn test_model_sampling_is_deterministic_per_seed() {
    let lat = OpLatency::millis(6, 15);
    let draw = |seed| {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..10).map(|_| lat.sample(&mut rng)).collect::<Vec<_>>()
    };
    assert_eq!(draw(1), draw(1));
    assert_ne!(draw(1), draw(2));
    assert!(OpLatency::ZERO
        .sample(&mut fastrand::Rng::with_seed(1))
        .is_zero());
}

#[test]
fn test_model_named_profiles_valid() {
    for name in PROFILE_NAMES {
        let p = LatencyProfile::named(name).unwrap();
        assert_eq!(p.name, *name);
        p.validate().unwrap();
        assert_eq!(p.is_zero(), *name == "local");
    }
    assert!(LatencyProfile::named("nope").is_none());
    assert!(LatencyProfile::local()
        .with_error_rate(1.5)
        .validate()
        .is_err());
}

#[test]
fn test_model_maybe_wrap_local_is_identity() {
    let inner = mem();
    let wrapped = maybe_wrap(Arc::clone(&inner), "local", 1).unwrap();
    assert!(Arc::ptr_eq(&inner, &wrapped));
    let wrapped = maybe_wrap(Arc::clone(&inner), "s3-express", 1).unwrap();
    assert!(!Arc::ptr_eq(&inner, &wrapped));
    assert!(wrapped.to_string().starts_with("ModelStore(s3-express"));
    assert!(matches!(
        maybe_wrap(inner, "bogus", 1),
        Err(StorageError::InvalidConfig(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn test_model_put_pays_latency_and_bandwidth() {
    let mut profile = LatencyProfile::local();
    profile.name = "fixed".into();
    profile.put = OpLatency::millis(10, 10);
    profile.bandwidth_bytes_per_sec = 1_000_000;
    let store = ModelStore::new(mem(), profile, 1).unwrap();
    let start = tokio::time::Instant::now();
    store
        .put(&Path::from("a"), PutPayload::from(vec![0u8; 100_000]))
        .await
        .unwrap();
    // 10 ms base + 100 kB at 1 MB/s = 110 ms (σ = 0 when p50 == p99).
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(109) && took <= Duration::from_millis(111),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn test_model_constant_profile_stacks_on_another_model() {
    let inner: Arc<dyn ObjectStore> = Arc::new(
        ModelStore::new(
            mem(),
            LatencyProfile::constant("base", Duration::from_millis(5)),
            1,
        )
        .unwrap(),
    );
    let slow = ModelStore::new(
        inner,
        LatencyProfile::constant("slow", Duration::from_secs(2)),
        2,
    )
    .unwrap();
    let key = Path::from("a");
    let start = tokio::time::Instant::now();
    slow.put(&key, PutPayload::from_static(b"xy"))
        .await
        .unwrap();
    let put = start.elapsed();
    assert!(
        put >= Duration::from_millis(2_004) && put <= Duration::from_millis(2_006),
        "{put:?}"
    );
    let start = tokio::time::Instant::now();
    assert_eq!(&slow.get_range(&key, 0..1).await.unwrap()[..], b"x");
    let get = start.elapsed();
    assert!(
        get >= Duration::from_millis(2_004) && get <= Duration::from_millis(2_006),
        "{get:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn test_model_gcs_rapid_put_sums_phases() {
    let store = ModelStore::new(mem(), LatencyProfile::named("gcs-rapid").unwrap(), 3).unwrap();
    let start = tokio::time::Instant::now();
    store
        .put(&Path::from("a"), PutPayload::from_static(b"x"))
        .await
        .unwrap();
    let took = start.elapsed();
    // create + append + finalize ≈ 87 ms; certainly above one append and below 10 × p99s.
    assert!(took > Duration::from_millis(40), "{took:?}");
    assert!(took < Duration::from_millis(1_800), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn test_model_outage_and_error_rate() {
    let store = ModelStore::new(mem(), LatencyProfile::named("s3-express").unwrap(), 5).unwrap();
    let key = Path::from("k");
    store
        .put(&key, PutPayload::from_static(b"v"))
        .await
        .unwrap();
    store.set_outage(true);
    assert!(store.is_down());
    let err = store.get(&key).await.unwrap_err();
    assert!(matches!(
        err,
        object_store::Error::Generic { store: "model", .. }
    ));
    assert!(StorageError::from(err).is_retryable());
    let listed: Vec<_> = store.list(None).collect().await;
    assert!(listed.len() == 1 && listed[0].is_err());
    store.set_outage(false);
    assert_eq!(
        &store.get(&key).await.unwrap().bytes().await.unwrap()[..],
        b"v"
    );

    let always = LatencyProfile::named("s3-express")
        .unwrap()
        .with_error_rate(1.0);
    let store = ModelStore::new(mem(), always, 5).unwrap();
    assert!(store
        .put(&key, PutPayload::from_static(b"v"))
        .await
        .is_err());
    // the failed put did not reach the inner store
    assert!(store.inner.head(&key).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn test_model_multipart_and_delete_pass_through() {
    let store = ModelStore::new(mem(), LatencyProfile::named("gcs-rapid").unwrap(), 9).unwrap();
    let key = Path::from("mp");
    let mut up = store.put_multipart(&key).await.unwrap();
    up.put_part(PutPayload::from_static(b"ab")).await.unwrap();
    up.put_part(PutPayload::from_static(b"cd")).await.unwrap();
    up.complete().await.unwrap();
    assert_eq!(
        &store.get(&key).await.unwrap().bytes().await.unwrap()[..],
        b"abcd"
    );
    assert_eq!(&store.get_range(&key, 1..3).await.unwrap()[..], b"bc");
    store.delete(&key).await.unwrap();
    assert!(store.head(&key).await.is_err());
}
