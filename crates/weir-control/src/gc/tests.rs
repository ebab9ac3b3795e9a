use object_store::memory::InMemory;
use object_store::PutPayload;
use weir_common::TopicId;

use super::*;
use crate::entry::{LogStartCause, LogStartMove};
use crate::test_support::{one_batch_commit, plane_with_topic};

/// A plane with one topic whose partition 0 holds files 1..=3 (one 10-offset batch each), and
/// three buckets holding each file (as a quorum writer's background copies would).
async fn setup() -> (ControlPlane, TopicId, Vec<Arc<InMemory>>) {
    let (control, topic) = plane_with_topic(7).await;
    let buckets: Vec<Arc<InMemory>> = (0..3).map(|_| Arc::new(InMemory::new())).collect();
    let mut previous = None;
    for file in 1..=3u128 {
        let file_id = FileId(file << 80);
        let key = keys::ingest_file(&file_id.to_string(), file_id.unix_ms());
        for bucket in &buckets {
            bucket.put(&key, PutPayload::from("data")).await.unwrap();
        }
        control
            .submit(one_batch_commit(
                "a".into(),
                previous,
                topic,
                file_id,
                vec![0, 1],
                10,
            ))
            .await
            .unwrap();
        previous = Some(file_id);
    }
    (control, topic, buckets)
}

async fn present(buckets: &[Arc<InMemory>], file: u128) -> usize {
    let file_id = FileId(file << 80);
    let key = keys::ingest_file(&file_id.to_string(), file_id.unix_ms());
    let mut count = 0;
    for bucket in buckets {
        if bucket.head(&key).await.is_ok() {
            count += 1;
        }
    }
    count
}

#[tokio::test(start_paused = true)]
async fn test_deleter_waits_for_the_grace_then_deletes_from_every_bucket_and_records_it() {
    let (control, topic, buckets) = setup().await;
    let stores: Vec<Arc<dyn ObjectStore>> = buckets
        .iter()
        .map(|b| b.clone() as Arc<dyn ObjectStore>)
        .collect();
    let grace = Duration::from_secs(60);
    let mut deleter = FileDeleter::new(
        control.clone(),
        stores,
        DeleterSettings {
            grace,
            interval: Duration::from_secs(1),
        },
    );
    // Nothing released: nothing happens.
    assert_eq!(deleter.pass().await, DeleterPass::default());
    // Offsets 0..20 (files 1 and 2) leave the log; file 3 still holds 20..30.
    control
        .submit(Entry::AdvanceLogStart {
            topic_id: topic,
            partitions: vec![LogStartMove {
                partition: 0,
                offset: 20,
            }],
            cause: LogStartCause::DeleteRecords,
        })
        .await
        .unwrap();
    let first = deleter.pass().await;
    assert_eq!((first.waiting, first.deleted), (2, 0));
    assert_eq!(
        present(&buckets, 1).await,
        3,
        "within the grace, files stay"
    );
    tokio::time::advance(grace - Duration::from_secs(1)).await;
    assert_eq!(deleter.pass().await.deleted, 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    let due = deleter.pass().await;
    assert_eq!((due.deleted, due.recorded, due.failed), (2, 2, 0));
    // From every bucket, including the one that was not a holder; file 3 untouched.
    assert_eq!(present(&buckets, 1).await, 0);
    assert_eq!(present(&buckets, 2).await, 0);
    assert_eq!(present(&buckets, 3).await, 3);
    assert!(control.read(|state| state.released.is_empty()));
    // Recorded: a later pass has nothing to do.
    assert_eq!(deleter.pass().await, DeleterPass::default());
}

/// A store whose deletes fail: the deleter must not record a file it could not delete.
#[derive(Debug)]
struct NoDeletes(InMemory);

impl std::fmt::Display for NoDeletes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NoDeletes")
    }
}

#[async_trait::async_trait]
impl ObjectStore for NoDeletes {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.0.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        locations
            .map(|_| {
                Err(object_store::Error::Generic {
                    store: "NoDeletes",
                    source: "deletes are down".into(),
                })
            })
            .boxed()
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.0.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

#[tokio::test(start_paused = true)]
async fn test_deleter_retries_a_failing_bucket_and_records_nothing_until_all_answered() {
    let (control, topic, buckets) = setup().await;
    let failing = Arc::new(NoDeletes(InMemory::new()));
    let mut stores: Vec<Arc<dyn ObjectStore>> = buckets
        .iter()
        .map(|b| b.clone() as Arc<dyn ObjectStore>)
        .collect();
    stores.push(failing);
    let mut deleter = FileDeleter::new(
        control.clone(),
        stores,
        DeleterSettings {
            grace: Duration::ZERO,
            interval: Duration::from_secs(1),
        },
    );
    control
        .submit(Entry::AdvanceLogStart {
            topic_id: topic,
            partitions: vec![LogStartMove {
                partition: 0,
                offset: -1,
            }],
            cause: LogStartCause::Retention,
        })
        .await
        .unwrap();
    let pass = deleter.pass().await;
    assert_eq!((pass.deleted, pass.failed, pass.recorded), (0, 3, 0));
    assert_eq!(control.read(|state| state.released.len()), 3);
}
