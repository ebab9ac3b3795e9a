//! Storage tiers: which group of buckets holds a data file.

use serde::{Deserialize, Serialize};

/// Where a data file lives. A file's holders are positions in its tier's bucket list, which is
/// append-only and checked at every start (`weir_storage::identity`), so a position always names
/// the same bucket id. Every file is in the ingest tier today; the compaction issue adds the
/// regional tier.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The zonal buckets producers write to (`storage.ingest_buckets`).
    #[default]
    Ingest,
    /// The regional bucket compacted files go to (`storage.compacted_bucket`).
    Regional,
}

impl Tier {
    /// Whether this is the default tier (lets records leave the field out).
    pub fn is_ingest(&self) -> bool {
        *self == Tier::Ingest
    }
}
