//! The `.weir` data file, the metadata-log envelope and a snapshot index block, on arbitrary
//! bytes.
//!
//! Both formats are CRC-protected, so random input almost never gets past the checksum. The
//! footer parser is also run with the CRC of the input itself, which reaches the structure
//! checks (counts, lengths, allocation bounds) behind it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = weir_format::decode_file(data);
    let _ = weir_format::decode_envelope(data);
    let _ = weir_format::parse_trailer(data);
    let _ = weir_format::parse_footer(data, crc32c::crc32c(data));
    // The index codec has no CRC of its own (the snapshot chunk's covers it): every structure
    // check is reachable.
    let mut rows = Vec::new();
    let _ = weir_format::IndexDecoder::new(64).decode_block(data, &mut rows);
    if let Some(header) = data.first_chunk::<{ weir_format::INDEX_BLOCK_HEADER }>() {
        let _ = weir_format::index_block_len(*header);
    }
});
