use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression as KpCompression, Record as KpRecord, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType,
};
use proptest::prelude::*;

use super::*;
use crate::batch::split_and_validate;

const LIMIT: usize = 1 << 20;
const CODECS: [Compression; 5] = Compression::ALL;

fn kp_codec(codec: Compression) -> KpCompression {
    match codec {
        Compression::None => KpCompression::None,
        Compression::Gzip => KpCompression::Gzip,
        Compression::Snappy => KpCompression::Snappy,
        Compression::Lz4 => KpCompression::Lz4,
        Compression::Zstd => KpCompression::Zstd,
    }
}

/// Encodes with kafka-protocol's record encoder (our compressors plugged in for the payload).
fn kp_encode(codec: Compression, specs: &[RecordSpec]) -> Bytes {
    let records: Vec<KpRecord> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| KpRecord {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32,
            timestamp: spec.timestamp,
            key: spec.key.clone().map(Bytes::from),
            value: spec.value.clone().map(Bytes::from),
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: kp_codec(codec),
    };
    RecordBatchEncoder::encode_with_custom_compression(
        &mut out,
        &records,
        &options,
        Some(|input: &mut BytesMut, output: &mut BytesMut, _| {
            output.extend_from_slice(&codec::compress(codec, input));
            Ok(())
        }),
    )
    .unwrap();
    out.freeze()
}

fn specs_strategy() -> impl Strategy<Value = Vec<RecordSpec>> {
    let record = (
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
        -5_000i64..5_000,
    );
    proptest::collection::vec(record, 1..40).prop_map(|records| {
        records
            .into_iter()
            .map(|(key, value, delta)| RecordSpec {
                key,
                value,
                timestamp: 1_700_000_000_000 + delta,
            })
            .collect()
    })
}

fn decode_all(batch: &Bytes) -> Vec<RecordSpec> {
    let parsed = split_and_validate(batch).unwrap();
    let header = &parsed[0].header;
    check_framing(header, &parsed[0].bytes, LIMIT).unwrap();
    let section = decode(header, &parsed[0].bytes, LIMIT).unwrap();
    let mut out = Vec::new();
    walk(header, &section, |record| {
        out.push(RecordSpec {
            key: record.key.map(<[u8]>::to_vec),
            value: record.value.map(<[u8]>::to_vec),
            timestamp: record.timestamp(header),
        })
    })
    .unwrap();
    out
}

#[test]
fn test_records_walk_every_codec() {
    let specs: Vec<RecordSpec> = (0..10)
        .map(|i| RecordSpec {
            key: (i % 2 == 0).then(|| vec![i as u8]),
            value: Some(vec![b'v'; i]),
            timestamp: 1000 + 1000 * i as i64,
        })
        .collect();
    for codec in CODECS {
        assert_eq!(decode_all(&build_batch(codec, &specs)), specs, "{codec:?}");
        assert_eq!(decode_all(&kp_encode(codec, &specs)), specs, "{codec:?}");
    }
}

#[test]
fn test_records_count_mismatch_detected() {
    let specs = vec![
        RecordSpec {
            key: None,
            value: Some(b"a".to_vec()),
            timestamp: 5,
        };
        3
    ];
    let mut batch = build_batch(Compression::None, &specs).to_vec();
    // Declare 4 records (and last offset delta 3) while holding 3.
    batch[57..61].copy_from_slice(&4i32.to_be_bytes());
    batch[23..27].copy_from_slice(&3i32.to_be_bytes());
    crate::batch::reseal(&mut batch);
    let header = BatchHeader::parse(&batch).unwrap();
    assert_eq!(
        check_framing(&header, &batch, LIMIT),
        Err(RecordError::CountMismatch {
            declared: 4,
            found: 3
        })
    );
}

#[test]
fn test_records_garbage_flagged_as_gzip_fails_framing() {
    let specs = vec![RecordSpec {
        key: None,
        value: Some(b"a".to_vec()),
        timestamp: 5,
    }];
    let mut batch = build_batch(Compression::None, &specs).to_vec();
    batch[22] |= Compression::Gzip as u8;
    crate::batch::reseal(&mut batch);
    let header = BatchHeader::parse(&batch).unwrap();
    assert!(matches!(
        check_framing(&header, &batch, LIMIT),
        Err(RecordError::Codec(CodecError::BadFraming { .. }))
    ));
}

#[test]
fn test_records_log_append_time_applies_to_every_record() {
    let specs: Vec<RecordSpec> = (0..3)
        .map(|i| RecordSpec {
            key: None,
            value: None,
            timestamp: 10 + i,
        })
        .collect();
    let mut batch = build_batch(Compression::None, &specs).to_vec();
    crate::batch::set_log_append_time(&mut batch, 99_000);
    let decoded = decode_all(&Bytes::from(batch));
    assert!(decoded.iter().all(|r| r.timestamp == 99_000));
}

proptest! {
    #[test]
    fn test_records_round_trip_against_kafka_protocol(specs in specs_strategy(), codec in 0usize..5) {
        let codec = CODECS[codec];
        let ours = build_batch(codec, &specs);
        let theirs = kp_encode(codec, &specs);
        prop_assert_eq!(decode_all(&ours), specs.clone());
        prop_assert_eq!(decode_all(&theirs), specs.clone());
        // kafka-protocol reads what we build (uncompressed: its decoder has no codecs enabled).
        if codec == Compression::None {
            let mut buf = ours.clone();
            let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut buf).unwrap();
            prop_assert_eq!(set.records.len(), specs.len());
        }
    }

    #[test]
    fn test_records_walk_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300), count in 0i32..10) {
        let mut header = BatchHeader::parse(&build_batch(Compression::None, &[RecordSpec { key: None, value: None, timestamp: 0 }])).unwrap();
        header.records_count = count;
        let _ = walk(&header, &data, |_| {});
        let mut batch = vec![0u8; RECORD_BATCH_HEADER_LEN];
        batch.extend_from_slice(&data);
        let _ = check_framing(&header, &batch, 4096);
    }
}
