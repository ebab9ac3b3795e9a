//! The records inside a batch: codec framing check, bounded decompression and the record walk
//! must never panic or allocate past the limit, whatever the bytes and the declared codec.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_protocol::batch::{BatchHeader, Compression};
use weir_protocol::{codec, records};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, payload)) = data.split_first() else {
        return;
    };
    let codec = match selector % 5 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        _ => Compression::Zstd,
    };
    let framing = codec::check_framing(codec, payload, LIMIT);
    if let Ok(decoded) = codec::decompress(codec, payload, LIMIT) {
        assert!(decoded.len() <= LIMIT, "decompression exceeded its limit");
        assert!(framing.is_ok(), "decompressed a stream whose framing was rejected");
    }
    // A batch header with this payload as its records section.
    let spec = records::RecordSpec {
        key: None,
        value: None,
        timestamp: 0,
    };
    let mut batch = records::build_batch(Compression::None, &[spec]).to_vec();
    batch.truncate(weir_protocol::RECORD_BATCH_HEADER_LEN);
    batch[22] = codec as u8;
    batch.extend_from_slice(payload);
    if let Ok(header) = BatchHeader::parse(&batch) {
        let _ = records::check_framing(&header, &batch, LIMIT);
        if let Ok(section) = records::decode(&header, &batch, LIMIT) {
            let _ = records::walk(&header, &section, |_| {});
        }
    }
});
