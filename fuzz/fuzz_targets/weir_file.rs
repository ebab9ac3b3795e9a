//! The `.weir` data file and the metadata-log envelope, on arbitrary bytes.
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
});
