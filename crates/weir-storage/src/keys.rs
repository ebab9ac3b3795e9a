//! Object key layout (DESIGN §4). This module is the only place object keys are built.
//!
//! ```text
//! ingest/{yyyy-mm-dd-hh}/{file_id}.weir     fresh ingest files (UTC hour of creation)
//! compacted/{file_id}.weir                  compacted files
//! meta/log/{seq:020}                        metadata log entries
//! meta/snapshot/{seq:020}                   metadata snapshots (a manifest, or legacy JSON)
//! meta/snapshot-chunk/{seq:020}/{n:06}      chunk n of the binary snapshot at seq
//! meta/epoch/{epoch:020}                    control-plane writer epochs
//! queue/{name}                              object-storage job queues
//! meta/buckets/{n:020}                      ingest bucket ids in holder order (version n)
//! meta/regional-bucket                      the regional (compacted) bucket's id
//! weir/bucket-id                            this bucket's stable id (written at first use)
//! weir/probe/{nonce}                        startup capability probes (deleted after)
//! ```
//!
//! Sequence numbers are zero-padded to 20 digits (`u64::MAX` has 20) so that lexicographic
//! listing order equals numeric order.

use std::cell::RefCell;
use std::collections::VecDeque;

use object_store::path::Path;

/// File extension of Weir data files.
const WEIR_EXT: &str = "weir";

/// Key of a fresh ingest file: `ingest/{yyyy-mm-dd-hh}/{file_id}.weir`, where the hour is the
/// UTC hour of `unix_ms`.
pub fn ingest_file(file_id: &str, unix_ms: i64) -> Path {
    Path::from_iter([
        "ingest".to_string(),
        utc_hour_bucket(unix_ms),
        format!("{file_id}.{WEIR_EXT}"),
    ])
}

pub use weir_common::Tier;

/// Key of a data file from its metadata: the one function readers, writers, the deleter and the
/// sweep use, so the layout can change in one place.
///
/// Recently built keys are remembered per thread (`RECENT_KEYS`): a fetch names every
/// partition's batch in the file a commit wrote, so the same key is asked for many times in a
/// row, and building one (formatting and validating the path) was ~2 % of an agent serving
/// 48.8 MiB/s to a consumer (docs/benchmarks.md §31).
pub fn data_file(tier: Tier, file_id: &weir_common::FileId) -> Path {
    // `try_with`: a key asked for while the thread's locals are torn down is built afresh.
    RECENT_KEYS
        .try_with(|recent| {
            let mut recent = recent.borrow_mut();
            if let Some(at) = recent
                .iter()
                .position(|(t, id, _)| *t == tier && id == file_id)
            {
                return recent[at].2.clone();
            }
            let key = build_data_file(tier, file_id);
            if recent.len() == RECENT_KEY_COUNT {
                recent.pop_back();
            }
            recent.push_front((tier, *file_id, key.clone()));
            key
        })
        .unwrap_or_else(|_| build_data_file(tier, file_id))
}

/// Data-file keys remembered per thread, newest first.
const RECENT_KEY_COUNT: usize = 32;

/// Remembered keys with what they were built from, newest first.
type RecentKeys = VecDeque<(Tier, weir_common::FileId, Path)>;

thread_local! {
    /// The last [`RECENT_KEY_COUNT`] data-file keys built on this thread (a key is a pure
    /// function of its tier and id, so a remembered one is always right).
    static RECENT_KEYS: RefCell<RecentKeys> =
        RefCell::new(VecDeque::with_capacity(RECENT_KEY_COUNT));
}

fn build_data_file(tier: Tier, file_id: &weir_common::FileId) -> Path {
    match tier {
        Tier::Ingest => {
            // Built as one string and checked, not part by part: fetches name a key per batch.
            // A file id prints as 26 Crockford characters, so the parse cannot fail.
            let hour = HourBucket(file_id.unix_ms());
            Path::parse(format!("ingest/{hour}/{file_id}.{WEIR_EXT}"))
                .unwrap_or_else(|_| ingest_file(&file_id.to_string(), file_id.unix_ms()))
        }
        Tier::Regional => compacted_file(&file_id.to_string()),
    }
}

/// The tier and id of a data file key, if `path` is one (the inverse of [`data_file`]).
pub fn parse_data_file(path: &Path) -> Option<(Tier, weir_common::FileId)> {
    let tier = match path.parts().next()?.as_ref() {
        "ingest" => Tier::Ingest,
        "compacted" => Tier::Regional,
        _ => return None,
    };
    let id = weir_common::FileId::parse(parse_file_id(path)?)?;
    Some((tier, id))
}

/// Prefix under which all ingest files live.
pub fn ingest_prefix() -> Path {
    Path::from("ingest")
}

/// Key of a compacted file: `compacted/{file_id}.weir`.
pub fn compacted_file(file_id: &str) -> Path {
    Path::from_iter(["compacted".to_string(), format!("{file_id}.{WEIR_EXT}")])
}

/// Prefix under which all compacted files live.
pub fn compacted_prefix() -> Path {
    Path::from("compacted")
}

/// Key of metadata log entry `seq`: `meta/log/{seq:020}`.
pub fn meta_log(seq: u64) -> Path {
    meta_log_prefix().join(format!("{seq:020}"))
}

/// Key of metadata snapshot taken at `seq`: `meta/snapshot/{seq:020}`.
pub fn meta_snapshot(seq: u64) -> Path {
    meta_snapshot_prefix().join(format!("{seq:020}"))
}

/// Key of chunk `n` of the binary snapshot taken at `seq`:
/// `meta/snapshot-chunk/{seq:020}/{n:06}`. Six digits cover a million 64 MiB chunks (64 TiB).
pub fn meta_snapshot_chunk(seq: u64, n: u32) -> Path {
    meta_snapshot_chunk_prefix()
        .join(format!("{seq:020}"))
        .join(format!("{n:06}"))
}

/// Prefix of every snapshot chunk: `meta/snapshot-chunk`. A sibling of `meta/snapshot`, not
/// below it, so listing snapshots lists manifests only.
pub fn meta_snapshot_chunk_prefix() -> Path {
    Path::from_iter(["meta", "snapshot-chunk"])
}

/// The snapshot seq and chunk number of a [`meta_snapshot_chunk`] key.
pub fn parse_snapshot_chunk(path: &Path) -> Option<(u64, u32)> {
    let parts: Vec<_> = path.parts().collect();
    let [meta, prefix, seq, n] = parts.as_slice() else {
        return None;
    };
    if meta.as_ref() != "meta" || prefix.as_ref() != "snapshot-chunk" {
        return None;
    }
    let digits = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(seq.as_ref(), 20) || !digits(n.as_ref(), 6) {
        return None;
    }
    Some((seq.as_ref().parse().ok()?, n.as_ref().parse().ok()?))
}

/// Key of control-plane writer epoch `epoch`: `meta/epoch/{epoch:020}`.
pub fn meta_epoch(epoch: u64) -> Path {
    meta_epoch_prefix().join(format!("{epoch:020}"))
}

/// Key recording the id of the regional bucket compacted files are written to:
/// `meta/regional-bucket` (create-only, written at first use).
pub fn meta_regional_bucket() -> Path {
    Path::from_iter(["meta", "regional-bucket"])
}

/// Key of the job queue object `name`: `queue/{name}`.
pub fn queue(name: &str) -> Path {
    Path::from_iter(["queue", name])
}

/// Key of version `n` of the ingest bucket list: `meta/buckets/{n:020}`.
pub fn meta_buckets(n: u64) -> Path {
    meta_buckets_prefix().join(format!("{n:020}"))
}

/// Prefix of the ingest bucket lists: `meta/buckets`.
pub fn meta_buckets_prefix() -> Path {
    Path::from_iter(["meta", "buckets"])
}

/// Key of a bucket's own stable id: `weir/bucket-id`.
pub fn bucket_id() -> Path {
    Path::from_iter(["weir", "bucket-id"])
}

/// Key of a startup probe object: `weir/probe/{nonce}`.
pub fn probe(nonce: &str) -> Path {
    Path::from_iter(["weir", "probe", nonce])
}

/// Prefix of the metadata log: `meta/log`.
pub fn meta_log_prefix() -> Path {
    Path::from_iter(["meta", "log"])
}

/// The slot of a metadata-log key `meta/log/{seq:020}`, if `path` is one.
pub fn parse_meta_log(path: &Path) -> Option<u64> {
    if !path.prefix_matches(&meta_log_prefix()) {
        return None;
    }
    parse_seq_key(path)
}

/// Prefix of metadata snapshots: `meta/snapshot`.
pub fn meta_snapshot_prefix() -> Path {
    Path::from_iter(["meta", "snapshot"])
}

/// Prefix of writer epochs: `meta/epoch`.
pub fn meta_epoch_prefix() -> Path {
    Path::from_iter(["meta", "epoch"])
}

/// Parses the sequence number of a `meta/log`, `meta/snapshot` or `meta/epoch` key: the last
/// segment must be exactly 20 ASCII digits.
pub fn parse_seq_key(path: &Path) -> Option<u64> {
    let last = path.filename()?;
    if last.len() != 20 || !last.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    last.parse().ok()
}

/// The file id of an `ingest/…/{id}.weir` or `compacted/{id}.weir` key.
pub fn parse_file_id(path: &Path) -> Option<&str> {
    let mut parts = path.parts();
    let expected_parts = match parts.next()?.as_ref() {
        "ingest" => 3,
        "compacted" => 2,
        _ => return None,
    };
    if path.parts_count() != expected_parts {
        return None;
    }
    path.filename()?
        .strip_suffix(WEIR_EXT)?
        .strip_suffix('.')
        .filter(|id| !id.is_empty())
}

/// `yyyy-mm-dd-hh` of the UTC hour containing `unix_ms`.
fn utc_hour_bucket(unix_ms: i64) -> String {
    HourBucket(unix_ms).to_string()
}

/// Prints as `yyyy-mm-dd-hh`, the UTC hour containing the milliseconds it holds.
struct HourBucket(i64);

impl std::fmt::Display for HourBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.0.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let hour = secs.rem_euclid(86_400) / 3600;
        let (y, m, d) = civil_from_days(days);
        write!(f, "{y:04}-{m:02}-{d:02}-{hour:02}")
    }
}

/// Proleptic Gregorian date of `days` since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_keys_parse_meta_log_only_reads_log_slots() {
        assert_eq!(parse_meta_log(&meta_log(7)), Some(7));
        assert_eq!(parse_meta_log(&meta_snapshot(7)), None);
        assert_eq!(parse_meta_log(&meta_epoch(7)), None);
    }

    #[test]
    fn test_keys_data_file_round_trips() {
        let id = weir_common::FileId((1_764_547_200_000u128 << 80) | 42);
        let key = data_file(Tier::Ingest, &id);
        assert_eq!(
            key.as_ref(),
            format!("ingest/2025-12-01-00/{id}.weir").as_str()
        );
        assert_eq!(parse_data_file(&key), Some((Tier::Ingest, id)));
        // The one-string key is the key the part-by-part builder makes, at any time and id.
        let mut rng = fastrand::Rng::with_seed(7);
        for unix_ms in [
            0,
            1,
            86_399_999,
            951_782_400_000,
            4_102_444_800_000,
            (1 << 48) - 1,
        ] {
            let id = weir_common::FileId::new(unix_ms, &mut rng);
            assert_eq!(
                data_file(Tier::Ingest, &id),
                ingest_file(&id.to_string(), id.unix_ms())
            );
        }
        assert_eq!(
            parse_data_file(&Path::from("ingest/x/not-an-id.weir")),
            None
        );
        assert_eq!(
            parse_data_file(&Path::from("meta/log/00000000000000000001")),
            None
        );
    }

    #[test]
    fn test_keys_remembered_data_file_keys_are_the_keys_built() {
        let mut rng = fastrand::Rng::with_seed(11);
        let ids: Vec<_> = (0..RECENT_KEY_COUNT * 2 + 3)
            .map(|n| weir_common::FileId::new(1_764_547_200_000 + n as i64 * 3_600_000, &mut rng))
            .collect();
        // Asked for over and over, newest and evicted alike, in both tiers: a remembered key is
        // the one built, and the tier is part of what is remembered.
        for round in 0..3 {
            for (n, id) in ids.iter().enumerate() {
                for tier in [Tier::Ingest, Tier::Regional] {
                    assert_eq!(
                        data_file(tier, id),
                        build_data_file(tier, id),
                        "round {round}, id {n}, {tier:?}"
                    );
                }
                let again = ids[n / 2];
                assert_eq!(
                    data_file(Tier::Ingest, &again),
                    build_data_file(Tier::Ingest, &again)
                );
            }
        }
        RECENT_KEYS.with(|recent| assert_eq!(recent.borrow().len(), RECENT_KEY_COUNT));
        assert_ne!(
            data_file(Tier::Ingest, &ids[0]),
            data_file(Tier::Regional, &ids[0])
        );
    }

    #[test]
    fn test_keys_ingest_epoch_zero() {
        assert_eq!(
            ingest_file("01ABC", 0).as_ref(),
            "ingest/1970-01-01-00/01ABC.weir"
        );
    }

    #[test]
    fn test_keys_ingest_civil_dates() {
        // 2024-02-29T23:59:59.999Z (leap day)
        assert_eq!(
            ingest_file("f", 1_709_251_199_999).as_ref(),
            "ingest/2024-02-29-23/f.weir"
        );
        // one ms later: 2024-03-01T00:00:00Z
        assert_eq!(
            ingest_file("f", 1_709_251_200_000).as_ref(),
            "ingest/2024-03-01-00/f.weir"
        );
        // 2000-12-31T13:00:00Z
        assert_eq!(
            ingest_file("f", 978_267_600_000).as_ref(),
            "ingest/2000-12-31-13/f.weir"
        );
        // before the epoch: 1969-12-31T23:59:59.999Z
        assert_eq!(ingest_file("f", -1).as_ref(), "ingest/1969-12-31-23/f.weir");
    }

    #[test]
    fn test_keys_ingest_file_id_cannot_add_segments() {
        let p = ingest_file("a/b", 0);
        assert_eq!(p.parts_count(), 3);
    }

    #[test]
    fn test_keys_meta_formats() {
        assert_eq!(meta_log(42).as_ref(), "meta/log/00000000000000000042");
        assert_eq!(
            meta_snapshot(u64::MAX).as_ref(),
            "meta/snapshot/18446744073709551615"
        );
        assert_eq!(meta_epoch(7).as_ref(), "meta/epoch/00000000000000000007");
        assert_eq!(queue("compaction").as_ref(), "queue/compaction");
        assert_eq!(compacted_file("x").as_ref(), "compacted/x.weir");
        assert!(meta_log(1).prefix_matches(&meta_log_prefix()));
        assert!(meta_snapshot(1).prefix_matches(&meta_snapshot_prefix()));
        assert!(meta_epoch(1).prefix_matches(&meta_epoch_prefix()));
        assert!(!meta_snapshot(1).prefix_matches(&meta_log_prefix()));
        // lexicographic order equals numeric order
        assert!(meta_log(9).as_ref() < meta_log(10).as_ref());
    }

    #[test]
    fn test_keys_snapshot_chunks() {
        let key = meta_snapshot_chunk(42, 7);
        assert_eq!(
            key.as_ref(),
            "meta/snapshot-chunk/00000000000000000042/000007"
        );
        assert!(key.prefix_matches(&meta_snapshot_chunk_prefix()));
        assert!(!key.prefix_matches(&meta_snapshot_prefix()));
        assert_eq!(parse_seq_key(&key), None, "never taken for a snapshot");
        for (seq, n) in [(0, 0), (42, 7), (u64::MAX, 999_999)] {
            assert_eq!(
                parse_snapshot_chunk(&meta_snapshot_chunk(seq, n)),
                Some((seq, n))
            );
        }
        assert!(meta_snapshot_chunk(1, 9).as_ref() < meta_snapshot_chunk(1, 10).as_ref());
        for bad in [
            "meta/snapshot-chunk/00000000000000000042",
            "meta/snapshot-chunk/00000000000000000042/7",
            "meta/snapshot-chunk/42/000007",
            "meta/snapshot/00000000000000000042/000007",
            "meta/snapshot-chunk/00000000000000000042/000007/x",
        ] {
            assert_eq!(parse_snapshot_chunk(&Path::from(bad)), None, "{bad}");
        }
    }

    #[test]
    fn test_keys_parse_seq_roundtrip() {
        for seq in [0, 1, 42, u64::MAX] {
            assert_eq!(parse_seq_key(&meta_log(seq)), Some(seq));
            assert_eq!(parse_seq_key(&meta_snapshot(seq)), Some(seq));
            assert_eq!(parse_seq_key(&meta_epoch(seq)), Some(seq));
        }
        assert_eq!(parse_seq_key(&Path::from("meta/log/42")), None);
        assert_eq!(
            parse_seq_key(&Path::from("meta/log/99999999999999999999")),
            None
        );
        assert_eq!(
            parse_seq_key(&Path::from("meta/log/0000000000000000004x")),
            None
        );
        assert_eq!(parse_seq_key(&Path::default()), None);
    }

    #[test]
    fn test_keys_parse_file_id() {
        assert_eq!(parse_file_id(&ingest_file("01XYZ", 0)), Some("01XYZ"));
        assert_eq!(parse_file_id(&compacted_file("01XYZ")), Some("01XYZ"));
        assert_eq!(parse_file_id(&meta_log(1)), None);
        assert_eq!(parse_file_id(&Path::from("ingest/x.weir")), None);
        assert_eq!(parse_file_id(&Path::from("compacted/x.tmp")), None);
    }
}
