use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn test_config_defaults_parse() {
    let config = Config::load(None, Vec::new()).unwrap();
    assert_eq!(config.agent.listen, "127.0.0.1:9092");
    assert_eq!(config.storage.quorum, 1);
    assert_eq!(config.produce.flush_interval, FlushInterval::Auto);
    assert_eq!(
        config.produce.flush_interval.resolve("local"),
        Duration::from_millis(5)
    );
    assert_eq!(
        config.produce.flush_interval.resolve("s3-standard"),
        Duration::from_millis(100)
    );
    assert_eq!(
        config.produce.flush_interval.resolve("s3-express"),
        Duration::from_millis(50)
    );
    assert_eq!(config.produce.target_file_bytes, TargetFileBytes::Auto);
    assert_eq!(config.produce.target_file_bytes.resolve("local"), 1 << 20);
    assert_eq!(
        config.produce.target_file_bytes.resolve("s3-standard"),
        8 << 20
    );
    let groups = config.groups.settings();
    assert_eq!(
        (groups.min_session_timeout_ms, groups.max_session_timeout_ms),
        (6_000, 1_800_000)
    );
    assert_eq!(groups.max_members_per_group, 1000);
}

#[test]
fn test_config_env_overrides_and_rejects_bad_values() {
    let config = Config::load(
        None,
        env(&[
            ("WEIR_PRODUCE_FLUSH_INTERVAL", "20ms"),
            ("WEIR_KAFKA_NUM_PARTITIONS", "3"),
        ]),
    )
    .unwrap();
    assert_eq!(
        config.produce.flush_interval,
        FlushInterval::Fixed(Duration::from_millis(20))
    );
    assert_eq!(config.kafka.num_partitions, 3);
    let config = Config::load(None, env(&[("WEIR_PRODUCE_TARGET_FILE_BYTES", "65536")])).unwrap();
    assert_eq!(
        config.produce.target_file_bytes,
        TargetFileBytes::Fixed(65536)
    );
    // "auto" overrides a number a config file set, and a number in a file is read as such.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, "[produce]\ntarget_file_bytes = 4096\n").unwrap();
    let config = Config::load(Some(&path), Vec::new()).unwrap();
    assert_eq!(
        config.produce.target_file_bytes,
        TargetFileBytes::Fixed(4096)
    );
    let env_auto = env(&[("WEIR_PRODUCE_TARGET_FILE_BYTES", "auto")]);
    let config = Config::load(Some(&path), env_auto).unwrap();
    assert_eq!(config.produce.target_file_bytes, TargetFileBytes::Auto);
    let slow = env(&[("WEIR_PRODUCE_FLUSH_INTERVAL", "11s")]);
    assert!(Config::load(None, slow).is_err(), "a flush past 10 s");
    for bad in ["0", "-1", "\"big\""] {
        let env = env(&[("WEIR_PRODUCE_TARGET_FILE_BYTES", bad)]);
        assert!(Config::load(None, env).is_err(), "{bad}");
    }
    assert!(Config::load(None, env(&[("WEIR_KAFKA_NUM_PARTITIONS", "many")])).is_err());
    assert!(Config::load(None, env(&[("WEIR_STORAGE_PROFILE", "nope")])).is_err());
    let config = Config::load(None, env(&[("WEIR_GROUPS_MIN_SESSION_TIMEOUT", "1s")])).unwrap();
    assert_eq!(config.groups.settings().min_session_timeout_ms, 1_000);
    assert!(Config::load(None, env(&[("WEIR_GROUPS_MIN_SESSION_TIMEOUT", "2h")])).is_err());
}

#[test]
fn test_config_produce_validation() {
    let config = Config::load(None, Vec::new()).unwrap();
    assert_eq!(config.produce.validation, Validation::Framing);
    assert_eq!(config.produce.max_decompressed_bytes, 32 * 1024 * 1024);
    let full = Config::load(None, env(&[("WEIR_PRODUCE_VALIDATION", "full")])).unwrap();
    assert_eq!(full.produce.validation, Validation::Full);
    assert!(Config::load(None, env(&[("WEIR_PRODUCE_VALIDATION", "some")])).is_err());
    let tiny = env(&[("WEIR_PRODUCE_MAX_DECOMPRESSED_BYTES", "1000")]);
    assert!(Config::load(None, tiny).is_err());
    assert_eq!(config.produce.eager_uploads, 1);
    let two = Config::load(None, env(&[("WEIR_PRODUCE_EAGER_UPLOADS", "2")])).unwrap();
    assert_eq!(two.produce.eager_uploads, 2);
    for bad in [
        vec![("WEIR_PRODUCE_EAGER_UPLOADS", "0")],
        vec![
            ("WEIR_PRODUCE_EAGER_UPLOADS", "5"),
            ("WEIR_PRODUCE_MAX_INFLIGHT_UPLOADS", "4"),
        ],
    ] {
        let message = format!("{:#}", Config::load(None, env(&bad)).unwrap_err());
        assert!(message.contains("produce.eager_uploads"), "{message}");
    }
}

#[test]
fn test_config_rejects_max_inflight_writes_beyond_the_dead_slot_probe() {
    let probe = weir_control::log::DEAD_SLOT_PROBE.to_string();
    let config = Config::load(None, env(&[("WEIR_CONTROL_MAX_INFLIGHT_WRITES", &probe)]));
    assert_eq!(
        config.unwrap().control.max_inflight_writes.to_string(),
        probe
    );
    for bad in [
        (weir_control::log::DEAD_SLOT_PROBE + 1).to_string(),
        "0".into(),
    ] {
        let err =
            Config::load(None, env(&[("WEIR_CONTROL_MAX_INFLIGHT_WRITES", &bad)])).unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("control.max_inflight_writes") && message.contains(&probe),
            "{message}"
        );
    }
}

#[test]
fn test_config_storage_fault_and_bucket_keys() {
    let config = Config::load(None, Vec::new()).unwrap();
    assert!(config.storage.slow_buckets.is_empty());
    assert_eq!(config.storage.slow_bucket_delay, Duration::from_secs(2));
    assert_eq!(config.storage.metadata_bucket, "");
    assert_eq!(
        config.storage.max_lagging_bytes_per_bucket,
        weir_storage::DEFAULT_MAX_LAGGING_BYTES_PER_BUCKET
    );

    let three = (
        "WEIR_STORAGE_INGEST_BUCKETS",
        r#"["memory://a", "memory://b", "memory://c"]"#,
    );
    let config = Config::load(
        None,
        env(&[
            three,
            ("WEIR_STORAGE_QUORUM", "2"),
            ("WEIR_STORAGE_SLOW_BUCKETS", "[1, 2]"),
            ("WEIR_STORAGE_SLOW_BUCKET_DELAY", "1500ms"),
            ("WEIR_STORAGE_METADATA_BUCKET", "memory://meta"),
            ("WEIR_STORAGE_MAX_LAGGING_BYTES_PER_BUCKET", "8388608"),
            ("WEIR_STORAGE_DOWN_BUCKETS", "[0]"),
        ]),
    )
    .unwrap();
    assert_eq!(config.storage.slow_buckets, vec![1, 2]);
    assert_eq!(
        config.storage.slow_bucket_delay,
        Duration::from_millis(1500)
    );
    assert_eq!(config.storage.metadata_bucket, "memory://meta");
    assert_eq!(config.storage.max_lagging_bytes_per_bucket, 8 << 20);
    assert_eq!(config.storage.down_buckets, vec![0]);

    let err = Config::load(None, env(&[three, ("WEIR_STORAGE_SLOW_BUCKETS", "[3]")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("storage.slow_buckets names bucket 3"), "{err}");
    assert!(err.contains("3 ingest buckets (indices 0 to 2)"), "{err}");
    // Without ingest buckets there is the one default bucket.
    let err = Config::load(None, env(&[("WEIR_STORAGE_SLOW_BUCKETS", "[1]")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("there is 1 ingest bucket (indices 0 to 0)"),
        "{err}"
    );
    assert!(Config::load(None, env(&[three, ("WEIR_STORAGE_DOWN_BUCKETS", "[3]")])).is_err());
    // Bucket 0 may be down only when the metadata log lives elsewhere.
    let err = Config::load(None, env(&[three, ("WEIR_STORAGE_DOWN_BUCKETS", "[0]")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("metadata log"), "{err}");
    assert!(Config::load(None, env(&[("WEIR_STORAGE_SLOW_BUCKET_DELAY", "soon")])).is_err());
}

#[test]
fn test_config_file_rejects_unknown_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, "[produce]\nflush_interval = \"1ms\"\n").unwrap();
    let config = Config::load(Some(&path), Vec::new()).unwrap();
    assert_eq!(
        config.produce.flush_interval,
        FlushInterval::Fixed(Duration::from_millis(1))
    );
    std::fs::write(&path, "[produce]\nflush_intervall = \"1ms\"\n").unwrap();
    assert!(Config::load(Some(&path), Vec::new()).is_err());
}

#[test]
fn test_config_snapshot_every_slots_is_an_alias_of_snapshot_max_slots() {
    let config = Config::load(None, Vec::new()).unwrap();
    assert_eq!(config.control.snapshot_max_slots, 10_000);
    assert_eq!(config.control.snapshot_max_log_bytes, 256 << 20);
    assert_eq!(
        config.control.snapshot_max_interval,
        Duration::from_secs(600)
    );
    assert!(config.control.log_gc);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, "[control]\nsnapshot_every_slots = 50\n").unwrap();
    let config = Config::load(Some(&path), Vec::new()).unwrap();
    assert_eq!(config.control.snapshot_max_slots, 50);
    let config = Config::load(None, env(&[("WEIR_CONTROL_SNAPSHOT_EVERY_SLOTS", "70")])).unwrap();
    assert_eq!(config.control.snapshot_max_slots, 70);
    let config = Config::load(
        None,
        env(&[
            ("WEIR_CONTROL_SNAPSHOT_MAX_INTERVAL", "30s"),
            ("WEIR_CONTROL_LOG_GC", "false"),
        ]),
    )
    .unwrap();
    assert_eq!(
        config.control.snapshot_max_interval,
        Duration::from_secs(30)
    );
    assert!(!config.control.log_gc);
}

#[test]
fn test_config_appendable_ingest_keys_and_their_bounds() {
    let config = Config::load(None, Vec::new()).unwrap();
    assert_eq!(config.storage.ingest_writes, IngestWriteMode::Auto);
    assert_eq!(config.storage.pool.target_ready, 48);
    assert_eq!(config.control.prewarmed_slots, 8);
    let put = Config::load(None, env(&[("WEIR_STORAGE_INGEST_WRITES", "put")])).unwrap();
    assert_eq!(put.storage.ingest_writes, IngestWriteMode::Put);
    assert!(Config::load(None, env(&[("WEIR_STORAGE_INGEST_WRITES", "sometimes")])).is_err());
    config.validate_pool().unwrap();
    // The pool's items must expire before the orphan sweep could delete them. Checked when a
    // pool starts: the PUT path has none, so its tests may use a short orphan age.
    let short = env(&[("WEIR_GC_ORPHAN_AGE", "4m")]);
    let err = Config::load(None, short)
        .unwrap()
        .validate_pool()
        .unwrap_err();
    assert!(err.to_string().contains("gc.orphan_age"), "{err}");
    // A busy agent's commit chain must outlive its oldest pooled file id.
    let tip = env(&[("WEIR_CONTROL_AGENT_TIP_EXPIRY", "10m")]);
    let err = Config::load(None, tip)
        .unwrap()
        .validate_pool()
        .unwrap_err();
    assert!(err.to_string().contains("agent_tip_expiry"), "{err}");
    let err = Config::load(None, env(&[("WEIR_CONTROL_PREWARMED_SLOTS", "33")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("prewarmed_slots"), "{err}");
}

#[test]
fn test_config_control_advertise_is_host_and_port() {
    let load = |value: &str| {
        Config::load(
            None,
            env(&[
                ("WEIR_CLUSTER_CONTROL_LISTEN", "127.0.0.1:0"),
                ("WEIR_CLUSTER_CONTROL_ADVERTISE", value),
            ]),
        )
    };
    let config = load("weir-0.weir.svc:9093").unwrap();
    assert_eq!(config.cluster.control_advertise, "weir-0.weir.svc:9093");
    assert!(
        load("").is_ok(),
        "empty: the advertised host and bound port"
    );
    for bad in ["weir-0", ":9093", "host:port", "host:70000"] {
        assert!(load(bad).is_err(), "{bad} was accepted");
    }
    let alone = Config::load(None, env(&[("WEIR_CLUSTER_CONTROL_ADVERTISE", "h:1")]));
    assert!(
        alone.is_err(),
        "an advertised control address without a control service"
    );
}

#[test]
fn test_config_cluster_grace_covers_plan_ttl_and_a_followers_staleness() {
    let load = |grace: &str, cluster: bool| {
        let mut pairs = vec![
            ("WEIR_GC_GRACE", grace),
            ("WEIR_GC_FETCH_PLAN_TTL", "5s"),
            ("WEIR_CLUSTER_LEASE_TIMEOUT", "10s"),
        ];
        if cluster {
            pairs.push(("WEIR_CLUSTER_CONTROL_LISTEN", "127.0.0.1:0"));
        }
        Config::load(None, env(&pairs))
    };
    let err = load("20s", true).unwrap_err().to_string();
    assert!(err.contains("cluster.lease_timeout"), "{err}");
    assert!(load("21s", true).is_ok());
    assert!(load("20s", false).is_ok(), "a single agent has no follower");
}
