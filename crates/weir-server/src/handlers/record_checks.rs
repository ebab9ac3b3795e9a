//! What Produce checks inside a batch, beyond its header and CRC: the codec's framing on every
//! batch, and a full decode (decompress, walk every record) where the topic's semantics need it
//! or the agent's `produce.validation = "full"` asks for it. Also the LogAppendTime rewrite.
//!
//! Errors follow Kafka's LogValidator: a stream that is not what its codec claims, or records
//! that do not add up to the header, are CORRUPT_MESSAGE; keyless records on a compacted topic
//! are INVALID_RECORD and timestamps out of bounds INVALID_TIMESTAMP, both naming every bad
//! record in `record_errors` (KIP-467).

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use weir_control::configs::{
    effective, CLEANUP_POLICY, DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES,
    MESSAGE_TIMESTAMP_AFTER_MAX_MS, MESSAGE_TIMESTAMP_BEFORE_MAX_MS,
    MESSAGE_TIMESTAMP_DIFFERENCE_MAX_MS, MESSAGE_TIMESTAMP_TYPE,
};
use weir_protocol::batch::set_log_append_time;
use weir_protocol::codec::CodecError;
use weir_protocol::records::{self, RecordError};
use weir_protocol::{error_code, BatchHeader, ValidatedBatch};

/// How much of each batch Produce decodes (`produce.validation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProduceValidation {
    /// The codec's framing (compressed) or the record lengths and count (uncompressed); a
    /// full decode only where the topic needs one (compacted, timestamp bounds).
    #[default]
    Framing,
    /// Decompress and walk every record of every batch.
    Full,
}

/// The topic configs that decide how a batch is checked, read once per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopicPolicy {
    pub(crate) max_message_bytes: usize,
    pub(crate) require_keys: bool,
    pub(crate) log_append_time: bool,
    /// How far behind / ahead of the agent's clock a CreateTime record may be.
    pub(crate) before_max_ms: i64,
    pub(crate) after_max_ms: i64,
}

impl TopicPolicy {
    pub(crate) fn from_configs(configs: &BTreeMap<String, String>) -> Self {
        let long = |name| {
            effective(configs, name)
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(i64::MAX)
        };
        let difference = long(MESSAGE_TIMESTAMP_DIFFERENCE_MAX_MS);
        Self {
            max_message_bytes: effective(configs, MAX_MESSAGE_BYTES)
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES as usize),
            require_keys: effective(configs, CLEANUP_POLICY).is_some_and(|p| p.contains("compact")),
            log_append_time: effective(configs, MESSAGE_TIMESTAMP_TYPE) == Some("LogAppendTime"),
            before_max_ms: long(MESSAGE_TIMESTAMP_BEFORE_MAX_MS).min(difference),
            after_max_ms: long(MESSAGE_TIMESTAMP_AFTER_MAX_MS).min(difference),
        }
    }

    fn checks_timestamps(&self) -> bool {
        !self.log_append_time && (self.before_max_ms < i64::MAX || self.after_max_ms < i64::MAX)
    }
}

/// Why a partition's records were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub(crate) code: i16,
    pub(crate) message: String,
    /// (index of the record in the batch, what is wrong with it).
    pub(crate) record_errors: Vec<(i32, String)>,
}

impl Rejection {
    pub(crate) fn new(code: i16, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            record_errors: Vec::new(),
        }
    }
}

/// Checks the records of one batch against the agent's validation level and the topic's
/// policy. `now_ms` is the agent's clock (timestamp bounds).
pub(crate) fn check_batch(
    batch: &ValidatedBatch,
    policy: &TopicPolicy,
    level: ProduceValidation,
    max_decompressed_bytes: usize,
    now_ms: i64,
) -> Result<(), Rejection> {
    let header = &batch.header;
    records::check_framing(header, &batch.bytes, max_decompressed_bytes).map_err(corrupt)?;
    let full =
        level == ProduceValidation::Full || policy.require_keys || policy.checks_timestamps();
    if !full {
        return Ok(());
    }
    let section = records::decode(header, &batch.bytes, max_decompressed_bytes).map_err(corrupt)?;
    let mut bad = Vec::new();
    records::walk(header, &section, |record| {
        if policy.require_keys && record.key.is_none() {
            bad.push((
                error_code::INVALID_RECORD,
                record.index,
                "compacted topic cannot accept a record without a key".to_string(),
            ));
        }
        if policy.checks_timestamps() {
            if let Some(problem) = timestamp_problem(record.timestamp(header), policy, now_ms) {
                bad.push((error_code::INVALID_TIMESTAMP, record.index, problem));
            }
        }
    })
    .map_err(corrupt)?;
    let Some((code, _, _)) = bad.first() else {
        return Ok(());
    };
    let code = *code;
    let shown: Vec<String> = bad
        .iter()
        .take(3)
        .map(|(_, index, message)| format!("record {index}: {message}"))
        .collect();
    Err(Rejection {
        code,
        message: format!(
            "{} record(s) rejected, the first: [{}]",
            bad.len(),
            shown.join("; ")
        ),
        record_errors: bad
            .into_iter()
            .map(|(_, index, message)| (index, message))
            .collect(),
    })
}

fn timestamp_problem(timestamp: i64, policy: &TopicPolicy, now_ms: i64) -> Option<String> {
    if timestamp < now_ms.saturating_sub(policy.before_max_ms) {
        Some(format!(
            "timestamp {timestamp} is more than message.timestamp.before.max.ms={} before the agent's time {now_ms}",
            policy.before_max_ms
        ))
    } else if timestamp > now_ms.saturating_add(policy.after_max_ms) {
        Some(format!(
            "timestamp {timestamp} is more than message.timestamp.after.max.ms={} after the agent's time {now_ms}",
            policy.after_max_ms
        ))
    } else {
        None
    }
}

fn corrupt(error: RecordError) -> Rejection {
    let code = match error {
        RecordError::Codec(CodecError::TooLarge { .. }) => error_code::MESSAGE_TOO_LARGE,
        _ => error_code::CORRUPT_MESSAGE,
    };
    Rejection::new(code, error.to_string())
}

/// Stamps a batch of a LogAppendTime topic with `append_time` (a copy: the request's bytes
/// are shared and the CRC changes).
pub(crate) fn stamp_log_append_time(batch: &mut ValidatedBatch, append_time: i64) {
    let mut bytes = BytesMut::from(&batch.bytes[..]);
    set_log_append_time(&mut bytes, append_time);
    let bytes: Bytes = bytes.freeze();
    if let Ok(header) = BatchHeader::parse(&bytes) {
        batch.header = header;
    }
    batch.bytes = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_protocol::batch::{split_and_validate, Compression};
    use weir_protocol::records::{build_batch, RecordSpec};

    const LIMIT: usize = 1 << 20;

    fn policy() -> TopicPolicy {
        TopicPolicy::from_configs(&BTreeMap::new())
    }

    fn batch(codec: Compression, keys: &[bool], timestamp: i64) -> ValidatedBatch {
        let specs: Vec<RecordSpec> = keys
            .iter()
            .map(|&keyed| RecordSpec {
                key: keyed.then(|| b"k".to_vec()),
                value: Some(b"value".to_vec()),
                timestamp,
            })
            .collect();
        split_and_validate(&build_batch(codec, &specs))
            .unwrap()
            .remove(0)
    }

    fn with_codec_bits(batch: &ValidatedBatch, codec: Compression) -> ValidatedBatch {
        let mut bytes = batch.bytes.to_vec();
        bytes[22] = (bytes[22] & !0x07) | codec as u8;
        weir_protocol::batch::reseal(&mut bytes);
        split_and_validate(&Bytes::from(bytes)).unwrap().remove(0)
    }

    #[test]
    fn test_record_checks_garbage_codec_is_corrupt_at_every_level() {
        let plain = batch(Compression::None, &[true, true], 1);
        for codec in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let garbage = with_codec_bits(&plain, codec);
            for level in [ProduceValidation::Framing, ProduceValidation::Full] {
                let err = check_batch(&garbage, &policy(), level, LIMIT, 0).unwrap_err();
                assert_eq!(err.code, error_code::CORRUPT_MESSAGE, "{codec:?} {level:?}");
            }
        }
    }

    #[test]
    fn test_record_checks_valid_batches_pass_every_codec() {
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let good = batch(codec, &[true, false, true], 1);
            for level in [ProduceValidation::Framing, ProduceValidation::Full] {
                check_batch(&good, &policy(), level, LIMIT, 0).unwrap();
            }
        }
    }

    #[test]
    fn test_record_checks_compacted_topic_names_each_keyless_record() {
        let mut configs = BTreeMap::new();
        configs.insert(CLEANUP_POLICY.to_string(), "compact".to_string());
        let compacted = TopicPolicy::from_configs(&configs);
        let keyless = batch(Compression::Gzip, &[true, false, true, false], 1);
        let err =
            check_batch(&keyless, &compacted, ProduceValidation::Framing, LIMIT, 0).unwrap_err();
        assert_eq!(err.code, error_code::INVALID_RECORD);
        let indexes: Vec<i32> = err.record_errors.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, vec![1, 3]);
        let keyed = batch(Compression::Gzip, &[true, true], 1);
        check_batch(&keyed, &compacted, ProduceValidation::Framing, LIMIT, 0).unwrap();
    }

    #[test]
    fn test_record_checks_timestamp_bounds() {
        let mut configs = BTreeMap::new();
        configs.insert(
            MESSAGE_TIMESTAMP_BEFORE_MAX_MS.to_string(),
            "1000".to_string(),
        );
        configs.insert(
            MESSAGE_TIMESTAMP_DIFFERENCE_MAX_MS.to_string(),
            "5000".to_string(),
        );
        let bounded = TopicPolicy::from_configs(&configs);
        assert_eq!((bounded.before_max_ms, bounded.after_max_ms), (1000, 5000));
        let now = 100_000;
        let level = ProduceValidation::Framing;
        check_batch(
            &batch(Compression::None, &[true], now - 1000),
            &bounded,
            level,
            LIMIT,
            now,
        )
        .unwrap();
        let old = check_batch(
            &batch(Compression::Lz4, &[true], now - 1001),
            &bounded,
            level,
            LIMIT,
            now,
        )
        .unwrap_err();
        assert_eq!(old.code, error_code::INVALID_TIMESTAMP);
        assert_eq!(old.record_errors.len(), 1);
        let ahead = check_batch(
            &batch(Compression::None, &[true], now + 5001),
            &bounded,
            level,
            LIMIT,
            now,
        )
        .unwrap_err();
        assert_eq!(ahead.code, error_code::INVALID_TIMESTAMP);
        configs.insert(
            MESSAGE_TIMESTAMP_TYPE.to_string(),
            "LogAppendTime".to_string(),
        );
        let append_time = TopicPolicy::from_configs(&configs);
        check_batch(
            &batch(Compression::None, &[true], 0),
            &append_time,
            level,
            LIMIT,
            now,
        )
        .unwrap();
    }

    #[test]
    fn test_record_checks_stamp_log_append_time_keeps_batch_valid() {
        let mut stamped = batch(Compression::Snappy, &[true, true], 5);
        stamp_log_append_time(&mut stamped, 77_000);
        let again = split_and_validate(&stamped.bytes).unwrap().remove(0);
        assert_eq!(again.header.max_timestamp, 77_000);
        assert_eq!(again.header.attributes & 0x08, 0x08);
        assert_eq!(stamped.header, again.header);
    }
}
