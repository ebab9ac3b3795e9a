//! One request frame body (everything after the 4-byte length prefix) through the same decode
//! sequence as `weir-server`'s `dispatch`: prefix, API key, version check, header, body.
#![no_main]

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind};
use libfuzzer_sys::fuzz_target;
use weir_protocol::frame::{decode_request_header, peek_request};
use weir_protocol::versions::is_supported;

fuzz_target!(|data: &[u8]| {
    let mut frame = Bytes::copy_from_slice(data);
    let Ok(prefix) = peek_request(&frame) else {
        return;
    };
    let Ok(api_key) = ApiKey::try_from(prefix.api_key) else {
        return;
    };
    let version = prefix.api_version;
    // dispatch answers or closes an unsupported version before touching the header.
    if !is_supported(api_key, version) {
        return;
    }
    if decode_request_header(&mut frame, api_key, version).is_err() {
        return;
    }
    let _ = RequestKind::decode(api_key, &mut frame, version);
});
