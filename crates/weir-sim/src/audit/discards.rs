//! DELETEs of data files no entry names that the auditor accepts, and what it checks instead:
//! a WriterPool discarding unused (empty) objects, and a compaction worker deleting the output
//! of a refused swap. Neither file may ever be named by an entry afterwards.

use super::Auditor;

impl Auditor {
    /// Records `key` as discarded by the pool if it is a data file no entry names.
    pub(super) fn pool_discard(&mut self, key: &object_store::path::Path, bucket: usize) -> bool {
        let Some(discards) = self.pool_discards.as_mut() else {
            return false;
        };
        let Some((_, id)) = weir_storage::keys::parse_data_file(key) else {
            return false;
        };
        if self.durable.state().knows_file(&id) {
            return false;
        }
        discards.insert(id, bucket);
        true
    }

    /// Records `key` as a discarded compaction output if it is a compacted file no entry names.
    pub(super) fn output_discard(&mut self, key: &object_store::path::Path, bucket: usize) -> bool {
        let Some(discards) = self.output_discards.as_mut() else {
            return false;
        };
        let Some((weir_common::Tier::Regional, id)) = weir_storage::keys::parse_data_file(key)
        else {
            return false;
        };
        if self.durable.state().knows_file(&id) {
            return false;
        }
        discards.insert(id, bucket);
        true
    }
}
