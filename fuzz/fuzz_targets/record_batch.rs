//! A produce request's record set: split into v2 batches, each header and CRC32C validated.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let records = Bytes::copy_from_slice(data);
    if let Ok(batches) = weir_protocol::batch::split_and_validate(&records) {
        let total: usize = batches.iter().map(|batch| batch.bytes.len()).sum();
        assert_eq!(
            total,
            records.len(),
            "validated batches must cover the record set"
        );
    }
});
