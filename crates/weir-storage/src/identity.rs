//! Stable bucket identity.
//!
//! The metadata log names the holders of a data file by their position in
//! `storage.ingest_buckets`. If an operator reorders, replaces or removes a bucket in that list,
//! positions would silently point reads at the wrong buckets. So every bucket gets a stable id,
//! written into the bucket itself at first use (`weir/bucket-id`, create-only), and the metadata
//! bucket records the ids in holder order (`meta/buckets/{n}`, create-only, highest `n` wins).
//! At startup the configured buckets' ids must equal the recorded list, or extend it at the end
//! (a new bucket holds nothing yet, so appending is safe). Anything else refuses to start with a
//! message that says which positions differ and, when the same buckets are merely reordered, the
//! order to configure.
//!
//! A log written before bucket ids existed has no list: the first start records the configured
//! order (there is nothing to check it against).

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::{keys, StorageError};

const ID_HEADER: &str = "weir-bucket-id v1";
const LIST_HEADER: &str = "weir-ingest-buckets v1";
const REGIONAL_HEADER: &str = "weir-regional-bucket v1";

fn create() -> PutOptions {
    PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    }
}

fn new_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

fn parse_id(bucket: &str, bytes: &Bytes) -> Result<String, StorageError> {
    let text = std::str::from_utf8(bytes).unwrap_or("");
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(ID_HEADER), Some(id)) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => Err(StorageError::BucketMismatch(format!(
            "bucket {bucket}: {} is not a Weir bucket id ({} bytes); is another program using this bucket?",
            keys::bucket_id(),
            bytes.len()
        ))),
    }
}

/// The id of the bucket behind `store`, written (create-only) if it has none yet.
pub async fn ensure_bucket_id(
    store: &dyn ObjectStore,
    bucket: &str,
) -> Result<String, StorageError> {
    let key = keys::bucket_id();
    for _ in 0..3 {
        match store.get(&key).await {
            Ok(got) => return parse_id(bucket, &got.bytes().await?),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let id = new_id();
        let body = format!("{ID_HEADER}\n{id}\n");
        match store.put_opts(&key, PutPayload::from(body), create()).await {
            Ok(_) => {
                tracing::info!(bucket, id, "bucket id written at first use");
                return Ok(id);
            }
            // Someone else (another agent, or our own earlier attempt that timed out) wrote it
            // first: read theirs.
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(StorageError::BucketMismatch(format!(
        "bucket {bucket}: could not read or write {}",
        keys::bucket_id()
    )))
}

/// What [`check_holders`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderCheck {
    /// No list was recorded (a new log, or one from before bucket ids): recorded now.
    Recorded,
    /// The configured buckets are the recorded ones, in the same order (unreachable buckets
    /// excepted: their position is only checked not to be taken by another known bucket).
    Matches,
    /// The configured buckets extend the recorded list at the end; the longer list is recorded.
    Extended {
        /// How many buckets were added.
        added: usize,
    },
    /// Nothing contradicts the configuration, but a bucket whose id is unknown (unreachable at
    /// startup) keeps the list from being recorded or extended now; the next start does it.
    NotRecorded,
}

fn render_list(ids: &[String]) -> String {
    let mut out = format!("{LIST_HEADER}\n");
    for id in ids {
        out.push_str(id);
        out.push('\n');
    }
    out
}

fn parse_list(bytes: &Bytes) -> Result<Vec<String>, StorageError> {
    let text = std::str::from_utf8(bytes).unwrap_or("");
    let mut lines = text.lines();
    if lines.next() != Some(LIST_HEADER) {
        return Err(StorageError::BucketMismatch(format!(
            "{} is not a Weir bucket list",
            keys::meta_buckets_prefix()
        )));
    }
    Ok(lines
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

async fn latest_list(meta: &dyn ObjectStore) -> Result<Option<(u64, Vec<String>)>, StorageError> {
    let listed: Vec<_> = meta
        .list(Some(&keys::meta_buckets_prefix()))
        .try_collect()
        .await?;
    let Some(latest) = listed
        .iter()
        .filter_map(|m| keys::parse_seq_key(&m.location))
        .max()
    else {
        return Ok(None);
    };
    let bytes = meta.get(&keys::meta_buckets(latest)).await?.bytes().await?;
    Ok(Some((latest, parse_list(&bytes)?)))
}

/// Checks that `id` is the regional bucket compacted files were written to: the first start
/// with compaction records it in the metadata bucket (`meta/regional-bucket`, create-only), and
/// every later start must configure the same bucket, since compacted files are read only from
/// it. `name` is `storage.compacted_bucket`, for the message.
pub async fn check_regional(
    meta: &dyn ObjectStore,
    id: &str,
    name: &str,
) -> Result<(), StorageError> {
    let key = keys::meta_regional_bucket();
    let record = Bytes::from(format!("{REGIONAL_HEADER}\n{id}\n"));
    for _ in 0..3 {
        match meta.get(&key).await {
            Ok(got) => {
                let bytes = got.bytes().await?;
                let text = std::str::from_utf8(&bytes).unwrap_or("");
                let mut lines = text.lines();
                return match (lines.next(), lines.next().map(str::trim)) {
                    (Some(REGIONAL_HEADER), Some(recorded)) if recorded == id => Ok(()),
                    (Some(REGIONAL_HEADER), Some(recorded)) => {
                        Err(StorageError::BucketMismatch(format!(
                        "storage.compacted_bucket {name} has bucket id {id}, but compacted files \
                         were written to the bucket with id {recorded} ({key}): configure that \
                         bucket again (compacted files are read only from it)"
                    )))
                    }
                    _ => Err(StorageError::BucketMismatch(format!(
                        "{key} in the metadata bucket is not a Weir regional bucket record"
                    ))),
                };
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        match meta
            .put_opts(&key, PutPayload::from(record.clone()), create())
            .await
        {
            Ok(_) => return Ok(()),
            // Another agent recorded one first: read and compare it.
            Err(object_store::Error::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StorageError::BucketMismatch(format!(
        "{key} kept changing while it was read"
    )))
}

/// Checks the configured ingest buckets against the list recorded in the metadata bucket
/// `meta`, and records a new or extended list. `ids[i]` is the id of `names[i]`, i.e. of
/// `storage.ingest_buckets[i]`, or `None` when that bucket could not be read at startup. See the
/// module docs.
pub async fn check_holders(
    meta: &dyn ObjectStore,
    ids: &[Option<String>],
    names: &[String],
) -> Result<HolderCheck, StorageError> {
    let known: Vec<&String> = ids.iter().flatten().collect();
    if let Some(dup) = known
        .iter()
        .enumerate()
        .find(|(i, id)| known[..*i].contains(id))
    {
        return Err(StorageError::BucketMismatch(format!(
            "bucket id {} appears twice in storage.ingest_buckets ({}): the same bucket under two              URLs would make a quorum count one copy twice",
            dup.1,
            ids.iter()
                .zip(names)
                .filter(|(id, _)| id.as_ref() == Some(*dup.1))
                .map(|(_, n)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    for _ in 0..3 {
        let (version, recorded) = latest_list(meta).await?.unwrap_or_default();
        if version > 0 && !consistent(&recorded, ids) {
            return Err(StorageError::BucketMismatch(mismatch_message(
                &recorded, ids, names,
            )));
        }
        let outcome = if version == 0 {
            HolderCheck::Recorded
        } else if ids.len() == recorded.len() {
            return Ok(HolderCheck::Matches);
        } else {
            HolderCheck::Extended {
                added: ids.len() - recorded.len(),
            }
        };
        let Some(known) = ids.iter().cloned().collect::<Option<Vec<String>>>() else {
            return Ok(HolderCheck::NotRecorded);
        };
        let key = keys::meta_buckets(version + 1);
        match meta
            .put_opts(&key, PutPayload::from(render_list(&known)), create())
            .await
        {
            Ok(_) => return Ok(outcome),
            // A concurrent start recorded a list first: check against it.
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(StorageError::BucketMismatch(
        "the ingest bucket list kept changing under this agent's start; retry".into(),
    ))
}

/// Whether `ids` is `recorded`, possibly extended at the end, with unknown ids allowed where
/// they cannot hide a reordering.
fn consistent(recorded: &[String], ids: &[Option<String>]) -> bool {
    if ids.len() < recorded.len() {
        return false;
    }
    ids.iter()
        .enumerate()
        .all(|(i, id)| match (id, recorded.get(i)) {
            (Some(id), Some(want)) => id == want,
            // An added bucket must be new.
            (Some(id), None) => !recorded.contains(id),
            // Unknown: the recorded id of this position must not be claimed by another bucket.
            (None, Some(want)) => !ids.iter().flatten().any(|other| other == want),
            (None, None) => true,
        })
}

fn mismatch_message(recorded: &[String], ids: &[Option<String>], names: &[String]) -> String {
    let mut lines = vec![format!(
        "storage.ingest_buckets does not match the buckets the metadata log's holders name \
         ({} recorded, {} configured):",
        recorded.len(),
        ids.len()
    )];
    for (i, id) in ids.iter().enumerate() {
        match (id, recorded.get(i)) {
            (Some(id), Some(want)) if id != want => lines.push(format!(
                "  ingest_buckets[{i}] = {} has bucket id {id}, but holder #{i} is bucket id {want}",
                names[i]
            )),
            (Some(id), None) if recorded.contains(id) => lines.push(format!(
                "  ingest_buckets[{i}] = {} (bucket id {id}) is already a holder at another position",
                names[i]
            )),
            _ => {}
        }
    }
    let missing: Vec<String> = recorded
        .iter()
        .enumerate()
        .filter(|(_, id)| !ids.iter().flatten().any(|known| known == *id))
        .map(|(i, id)| format!("holder #{i} (bucket id {id})"))
        .collect();
    if !missing.is_empty() {
        lines.push(format!(
            "  not configured: {}; the data it holds would be unreadable",
            missing.join(", ")
        ));
    }
    let order: Option<Vec<&str>> = recorded
        .iter()
        .map(|want| {
            ids.iter()
                .position(|id| id.as_ref() == Some(want))
                .map(|at| names[at].as_str())
        })
        .collect();
    match order {
        Some(order) => {
            let extra: Vec<&str> = ids
                .iter()
                .zip(names)
                .filter(|(id, _)| id.as_ref().is_none_or(|id| !recorded.contains(id)))
                .map(|(_, name)| name.as_str())
                .collect();
            lines.push(format!(
                "  fix: list the buckets in this order: [{}]",
                order
                    .into_iter()
                    .chain(extra)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        None => lines.push(
            "  fix: configure every recorded bucket at its position (new buckets may only be \
             added at the end); bucket ids are in each bucket's weir/bucket-id"
                .into(),
        ),
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;

    async fn ids(stores: &[&InMemory]) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            out.push(Some(
                ensure_bucket_id(*store, &format!("b{i}")).await.unwrap(),
            ));
        }
        out
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn test_identity_id_is_stable_and_written_once() {
        let store = InMemory::new();
        let first = ensure_bucket_id(&store, "b").await.unwrap();
        assert_eq!(ensure_bucket_id(&store, "b").await.unwrap(), first);
        store
            .put(&keys::bucket_id(), PutPayload::from_static(b"junk"))
            .await
            .unwrap();
        assert!(ensure_bucket_id(&store, "b").await.is_err());
    }

    #[tokio::test]
    async fn test_identity_reordered_buckets_refuse_with_the_right_order() {
        let (a, b, c, meta) = (
            InMemory::new(),
            InMemory::new(),
            InMemory::new(),
            InMemory::new(),
        );
        let abc = ids(&[&a, &b, &c]).await;
        let n = names(&["s3://a", "s3://b", "s3://c"]);
        assert_eq!(
            check_holders(&meta, &abc, &n).await.unwrap(),
            HolderCheck::Recorded
        );
        assert_eq!(
            check_holders(&meta, &abc, &n).await.unwrap(),
            HolderCheck::Matches
        );

        let cab = vec![abc[2].clone(), abc[0].clone(), abc[1].clone()];
        let err = check_holders(&meta, &cab, &names(&["s3://c", "s3://a", "s3://b"]))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("ingest_buckets[0] = s3://c"), "{err}");
        assert!(
            err.contains("fix: list the buckets in this order: [s3://a, s3://b, s3://c]"),
            "{err}"
        );

        // A bucket swapped for an empty one: the recorded one is named as missing.
        let d = InMemory::new();
        let abd = vec![abc[0].clone(), abc[1].clone(), ids(&[&d]).await[0].clone()];
        let err = check_holders(&meta, &abd, &names(&["s3://a", "s3://b", "s3://d"]))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not configured: holder #2"), "{err}");
        // Dropping the last bucket is refused too.
        let err = check_holders(&meta, &abc[..2], &n[..2]).await.unwrap_err();
        assert!(err.to_string().contains("holder #2"), "{err}");
    }

    #[tokio::test]
    async fn test_identity_the_same_bucket_twice_is_refused() {
        let (a, meta) = (InMemory::new(), InMemory::new());
        let id = ids(&[&a]).await.remove(0);
        let err = check_holders(&meta, &[id.clone(), id], &names(&["s3://a", "s3a://a"]))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("appears twice") && err.contains("s3a://a"),
            "{err}"
        );
        // Nothing was recorded.
        assert!(latest_list(&meta).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn test_identity_appending_a_bucket_extends_the_list() {
        let (a, b, meta) = (InMemory::new(), InMemory::new(), InMemory::new());
        let ab = ids(&[&a, &b]).await;
        check_holders(&meta, &ab[..1], &names(&["s3://a"]))
            .await
            .unwrap();
        assert_eq!(
            check_holders(&meta, &ab, &names(&["s3://a", "s3://b"]))
                .await
                .unwrap(),
            HolderCheck::Extended { added: 1 }
        );
        assert_eq!(
            check_holders(&meta, &ab, &names(&["s3://a", "s3://b"]))
                .await
                .unwrap(),
            HolderCheck::Matches
        );
        // ... and the shorter list is no longer accepted.
        assert!(check_holders(&meta, &ab[..1], &names(&["s3://a"]))
            .await
            .is_err());
    }

    #[tokio::test]
    async fn test_identity_unreachable_bucket_is_tolerated_unless_it_hides_a_reorder() {
        let (a, b, c, meta) = (
            InMemory::new(),
            InMemory::new(),
            InMemory::new(),
            InMemory::new(),
        );
        let abc = ids(&[&a, &b, &c]).await;
        let n = names(&["s3://a", "s3://b", "s3://c"]);
        // Unreachable before anything was recorded: nothing recorded yet.
        let a_unknown = vec![None, abc[1].clone(), abc[2].clone()];
        assert_eq!(
            check_holders(&meta, &a_unknown, &n).await.unwrap(),
            HolderCheck::NotRecorded
        );
        check_holders(&meta, &abc, &n).await.unwrap();
        // Bucket b down at a later start: fine.
        let b_down = vec![abc[0].clone(), None, abc[2].clone()];
        assert_eq!(
            check_holders(&meta, &b_down, &n).await.unwrap(),
            HolderCheck::Matches
        );
        // Bucket b down, and c configured in b's place: refused (c's id is holder #2's).
        let moved = vec![abc[0].clone(), abc[2].clone(), None];
        let err = check_holders(&meta, &moved, &names(&["s3://a", "s3://c", "s3://b"]))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("ingest_buckets[1] = s3://c"), "{err}");
    }

    #[tokio::test]
    async fn test_identity_regional_bucket_is_recorded_once_and_checked() {
        let meta = InMemory::new();
        let (a, b) = (InMemory::new(), InMemory::new());
        let id_a = ensure_bucket_id(&a, "a").await.unwrap();
        let id_b = ensure_bucket_id(&b, "b").await.unwrap();
        check_regional(&meta, &id_a, "file:///a").await.unwrap();
        check_regional(&meta, &id_a, "file:///a-again")
            .await
            .unwrap();
        let err = check_regional(&meta, &id_b, "file:///b").await.unwrap_err();
        assert!(matches!(err, StorageError::BucketMismatch(_)), "{err}");
        assert!(
            err.to_string().contains("file:///b") && err.to_string().contains(&id_a),
            "{err}"
        );
    }
}
