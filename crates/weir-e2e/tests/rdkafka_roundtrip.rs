//! The rdkafka crate (bundled librdkafka) against a real `weir agent`: admin, producers with
//! every codec librdkafka builds here, idempotence, and assign-based consumers.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

struct Agent {
    child: Child,
    bootstrap: String,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn weir_bin() -> PathBuf {
    if let Ok(path) = std::env::var("WEIR_BIN") {
        return PathBuf::from(path);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target").to_string());
    PathBuf::from(target).join("debug").join("weir")
}

fn start_agent() -> Agent {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = weir_bin();
    assert!(
        bin.exists(),
        "weir binary not found at {} (build it: cargo build -p weir)",
        bin.display()
    );
    let child = Command::new(&bin)
        .args([
            "agent",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--http-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .args(["--flush-interval", "5ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start weir agent");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "agent did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    Agent {
        child,
        bootstrap: format!("127.0.0.1:{port}"),
        _dir: dir,
    }
}

async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("create topics request");
    for result in results {
        result.expect("topic created");
    }
}

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> FutureProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000");
    for (key, value) in extra {
        config.set(*key, *value);
    }
    config.create().expect("producer")
}

/// Produces `count` records round-robin over `partitions`; returns (partition, offset, key, value).
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
    count: usize,
) -> Vec<(i32, i64, String, Vec<u8>)> {
    let mut sends = Vec::with_capacity(count);
    for index in 0..count {
        let key = format!("key-{index}");
        let value = format!("value-{index}-")
            .repeat(index % 40 + 1)
            .into_bytes();
        let partition = (index as i32) % partitions;
        let headers = OwnedHeaders::new().insert(Header {
            key: "index",
            value: Some(index.to_string().as_bytes()),
        });
        let record = FutureRecord::to(topic)
            .key(&key)
            .payload(&value)
            .partition(partition)
            .headers(headers);
        let delivery = producer.send_result(record).expect("queue record");
        sends.push((key, value, delivery));
    }
    let mut acked = Vec::with_capacity(count);
    for (key, value, delivery) in sends {
        let delivered = delivery
            .await
            .expect("delivery future")
            .expect("record acked");
        acked.push((delivered.partition, delivered.offset, key, value));
    }
    acked
}

/// Reads every partition from the beginning up to `expected` records with assign().
fn consume_all(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
) -> Vec<(i32, i64, String, Vec<u8>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "weir-e2e-rdkafka")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .expect("assignment");
    }
    consumer.assign(&assignment).expect("assign");
    let mut got = Vec::with_capacity(expected);
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < expected && Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.expect("consume");
        let headers = message.headers().expect("headers present");
        assert_eq!(headers.get(0).key, "index");
        got.push((
            message.partition(),
            message.offset(),
            String::from_utf8(message.key().expect("key").to_vec()).expect("utf8 key"),
            message.payload().unwrap_or_default().to_vec(),
        ));
    }
    got
}

fn assert_same(
    mut acked: Vec<(i32, i64, String, Vec<u8>)>,
    mut got: Vec<(i32, i64, String, Vec<u8>)>,
) {
    acked.sort();
    got.sort();
    assert_eq!(acked.len(), got.len(), "record count");
    assert!(
        acked == got,
        "consumed records differ from acknowledged records"
    );
    // Offsets are dense from 0 in every partition.
    let mut next = std::collections::BTreeMap::new();
    for (partition, offset, _, _) in &got {
        let expected = next.entry(*partition).or_insert(0i64);
        assert_eq!(*offset, *expected, "offset gap in partition {partition}");
        *expected += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_rdkafka_roundtrip_every_codec() {
    let agent = start_agent();
    for codec in ["none", "gzip", "snappy", "lz4"] {
        let topic = format!("rd-{codec}");
        create_topic(&agent.bootstrap, &topic, 4).await;
        let producer = producer(&agent.bootstrap, &[("compression.type", codec)]);
        let acked = produce(&producer, &topic, 4, 500).await;
        let bootstrap = agent.bootstrap.clone();
        let topic_for_read = topic.clone();
        let got =
            tokio::task::spawn_blocking(move || consume_all(&bootstrap, &topic_for_read, 4, 500))
                .await
                .expect("consumer thread");
        assert_same(acked, got);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_rdkafka_idempotent_producer_has_no_duplicates() {
    let agent = start_agent();
    create_topic(&agent.bootstrap, "rd-idempotent", 2).await;
    let producer = producer(
        &agent.bootstrap,
        &[
            ("enable.idempotence", "true"),
            ("max.in.flight.requests.per.connection", "5"),
        ],
    );
    let acked = produce(&producer, "rd-idempotent", 2, 2000).await;
    let bootstrap = agent.bootstrap.clone();
    let got =
        tokio::task::spawn_blocking(move || consume_all(&bootstrap, "rd-idempotent", 2, 2000))
            .await
            .expect("consumer thread");
    assert_same(acked, got);
}

/// `AdminClient::delete_records` answers the new low watermark; the watermarks and a consumer
/// from the beginning follow it, and `Offset::End` deletes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_rdkafka_delete_records_moves_the_beginning() {
    let agent = start_agent();
    let topic = "rd-delete";
    create_topic(&agent.bootstrap, topic, 1).await;
    let producer = producer(&agent.bootstrap, &[]);
    let acked = produce(&producer, topic, 1, 20).await;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &agent.bootstrap)
        .create()
        .expect("admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let delete_to = |offset: Offset| {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, 0, offset)
            .expect("partition offset");
        list
    };
    let deleted = admin
        .delete_records(&delete_to(Offset::Offset(12)), &options)
        .await
        .expect("delete records request");
    let partition = deleted
        .find_partition(topic, 0)
        .expect("partition 0 answered");
    assert!(partition.error().is_ok(), "{:?}", partition.error());
    assert_eq!(partition.offset(), Offset::Offset(12));

    let bootstrap = agent.bootstrap.clone();
    let (watermarks, got) = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .expect("consumer");
        let watermarks = consumer
            .fetch_watermarks(topic, 0, Duration::from_secs(30))
            .expect("watermarks");
        (watermarks, consume_all(&bootstrap, topic, 1, 8))
    })
    .await
    .expect("consumer thread");
    assert_eq!(watermarks, (12, 20));
    assert_same_from(&acked[12..], got);

    let deleted = admin
        .delete_records(&delete_to(Offset::End), &options)
        .await
        .expect("delete records request");
    let partition = deleted
        .find_partition(topic, 0)
        .expect("partition 0 answered");
    assert_eq!(partition.offset(), Offset::Offset(20));
}

/// The consumed records are exactly `acked` (a suffix of a partition), in offset order.
fn assert_same_from(acked: &[(i32, i64, String, Vec<u8>)], got: Vec<(i32, i64, String, Vec<u8>)>) {
    assert_eq!(got.len(), acked.len(), "record count");
    assert!(
        got == acked,
        "consumed records differ from the acknowledged suffix"
    );
}
