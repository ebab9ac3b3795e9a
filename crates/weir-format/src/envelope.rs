//! The envelope around every metadata-log object (`meta/log`, `meta/snapshot`,
//! `meta/snapshot-chunk`, `meta/epoch`).
//!
//! Layout, big-endian: magic `b"WMET"`, u16 version, u8 kind, u64 epoch, u64 seq, u32 payload
//! length, payload, u32 CRC32C over everything before it. The payload is opaque here (the
//! control plane serializes it); this module only frames it and detects corruption.

use bytes::{BufMut, Bytes, BytesMut};

use crate::cursor::Cursor;
use crate::error::FormatError;

/// Magic bytes opening every envelope.
pub const ENVELOPE_MAGIC: [u8; 4] = *b"WMET";
/// Envelope version written by this build and the only one it reads.
pub const ENVELOPE_VERSION: u16 = 1;
/// Bytes an envelope adds around its payload (fixed header plus CRC).
pub const ENVELOPE_OVERHEAD: usize = ENVELOPE_HEADER_LEN + CRC_LEN;

const ENVELOPE_HEADER_LEN: usize = 4 + 2 + 1 + 8 + 8 + 4;
const CRC_LEN: usize = 4;
const SECTION: &str = "envelope";

/// What a metadata object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EnvelopeKind {
    LogEntry = 1,
    /// A whole state as one JSON object: written before binary snapshots, read only now.
    Snapshot = 2,
    Epoch = 3,
    /// A binary snapshot's manifest (JSON: chunks with lengths and CRCs, section table).
    SnapshotManifest = 4,
    /// One chunk of a binary snapshot's body.
    SnapshotChunk = 5,
}

impl TryFrom<u8> for EnvelopeKind {
    type Error = FormatError;

    fn try_from(value: u8) -> Result<Self, FormatError> {
        match value {
            1 => Ok(Self::LogEntry),
            2 => Ok(Self::Snapshot),
            3 => Ok(Self::Epoch),
            4 => Ok(Self::SnapshotManifest),
            5 => Ok(Self::SnapshotChunk),
            other => Err(FormatError::UnknownEnvelopeKind(other)),
        }
    }
}

/// A decoded envelope borrowing its payload from the input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub kind: EnvelopeKind,
    pub epoch: u64,
    pub seq: u64,
    pub payload: &'a [u8],
}

/// Frames `payload` as one metadata object.
///
/// A payload of 4 GiB or more does not fit the u32 length field: that is
/// [`FormatError::EnvelopeTooLarge`], an error the caller survives (a snapshot of a huge state
/// is skipped), not a panic of the control plane.
pub fn encode_envelope(
    kind: EnvelopeKind,
    epoch: u64,
    seq: u64,
    payload: &[u8],
) -> Result<Bytes, FormatError> {
    let payload_len = envelope_payload_len(payload.len())?;
    let mut buf = BytesMut::with_capacity(ENVELOPE_OVERHEAD + payload.len());
    buf.put_slice(&ENVELOPE_MAGIC);
    buf.put_u16(ENVELOPE_VERSION);
    buf.put_u8(kind as u8);
    buf.put_u64(epoch);
    buf.put_u64(seq);
    buf.put_u32(payload_len);
    buf.put_slice(payload);
    let crc = crc32c::crc32c(&buf);
    buf.put_u32(crc);
    Ok(buf.freeze())
}

/// The u32 length field for a payload of `len` bytes.
fn envelope_payload_len(len: usize) -> Result<u32, FormatError> {
    u32::try_from(len).map_err(|_| FormatError::EnvelopeTooLarge { len: len as u64 })
}

/// Decodes one envelope that must span all of `buf`.
///
/// Checks, in order: magic, length (no truncation, no trailing bytes), CRC, version, kind. The
/// CRC comes before version and kind so that corruption is reported as such.
pub fn decode_envelope(buf: &[u8]) -> Result<Envelope<'_>, FormatError> {
    let mut cursor = Cursor::new(buf, SECTION);
    let magic = cursor.array::<4>()?;
    if magic != ENVELOPE_MAGIC {
        return Err(FormatError::BadMagic {
            section: SECTION,
            found: magic,
            expected: ENVELOPE_MAGIC,
        });
    }
    let version = cursor.u16()?;
    let kind_byte = cursor.u8()?;
    let epoch = cursor.u64()?;
    let seq = cursor.u64()?;
    let payload_len = cursor.u32()? as usize;
    let payload = cursor.take(payload_len)?;
    let stored_crc = cursor.u32()?;
    cursor.finish()?;

    let computed_crc = crc32c::crc32c(&buf[..buf.len() - CRC_LEN]);
    if stored_crc != computed_crc {
        return Err(FormatError::CrcMismatch {
            section: SECTION,
            stored: stored_crc,
            computed: computed_crc,
        });
    }
    if version != ENVELOPE_VERSION {
        return Err(FormatError::UnsupportedVersion {
            section: SECTION,
            found: version,
            expected: ENVELOPE_VERSION,
        });
    }
    let kind = EnvelopeKind::try_from(kind_byte)?;
    Ok(Envelope {
        kind,
        epoch,
        seq,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_envelope_round_trip() {
        let encoded = encode_envelope(EnvelopeKind::Snapshot, 7, 42, b"{\"a\":1}").unwrap();
        assert_eq!(encoded.len(), ENVELOPE_OVERHEAD + 7);
        let decoded = decode_envelope(&encoded).unwrap();
        assert_eq!(
            decoded,
            Envelope {
                kind: EnvelopeKind::Snapshot,
                epoch: 7,
                seq: 42,
                payload: b"{\"a\":1}",
            }
        );
    }

    #[test]
    fn test_envelope_rejects_bad_magic() {
        let mut encoded = encode_envelope(EnvelopeKind::LogEntry, 1, 2, b"x")
            .unwrap()
            .to_vec();
        encoded[0] = b'X';
        assert!(matches!(
            decode_envelope(&encoded),
            Err(FormatError::BadMagic { .. })
        ));
    }

    #[test]
    fn test_envelope_rejects_corruption() {
        let mut encoded = encode_envelope(EnvelopeKind::LogEntry, 1, 2, b"payload")
            .unwrap()
            .to_vec();
        encoded[ENVELOPE_HEADER_LEN + 1] ^= 0x01;
        assert!(matches!(
            decode_envelope(&encoded),
            Err(FormatError::CrcMismatch { .. })
        ));
    }

    #[test]
    fn test_envelope_rejects_trailing_and_truncated() {
        let encoded = encode_envelope(EnvelopeKind::Epoch, 1, 2, b"payload")
            .unwrap()
            .to_vec();
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(matches!(
            decode_envelope(&longer),
            Err(FormatError::TrailingBytes { count: 1, .. })
        ));
        for cut in 0..encoded.len() {
            assert!(matches!(
                decode_envelope(&encoded[..cut]),
                Err(FormatError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn test_envelope_rejects_unknown_kind_and_version() {
        let mut encoded = encode_envelope(EnvelopeKind::Epoch, 1, 2, b"p")
            .unwrap()
            .to_vec();
        encoded[6] = 9;
        refresh_crc(&mut encoded);
        assert_eq!(
            decode_envelope(&encoded),
            Err(FormatError::UnknownEnvelopeKind(9))
        );
        let mut encoded = encode_envelope(EnvelopeKind::Epoch, 1, 2, b"p")
            .unwrap()
            .to_vec();
        encoded[5] = 2;
        refresh_crc(&mut encoded);
        assert!(matches!(
            decode_envelope(&encoded),
            Err(FormatError::UnsupportedVersion { found: 2, .. })
        ));
    }

    #[test]
    fn test_envelope_length_over_u32_is_an_error() {
        // A 4 GiB payload cannot be allocated in a test; the length check is what decides.
        assert_eq!(envelope_payload_len(u32::MAX as usize), Ok(u32::MAX));
        assert_eq!(
            envelope_payload_len(u32::MAX as usize + 1),
            Err(FormatError::EnvelopeTooLarge {
                len: u64::from(u32::MAX) + 1
            })
        );
    }

    fn refresh_crc(encoded: &mut [u8]) {
        let body_len = encoded.len() - CRC_LEN;
        let crc = crc32c::crc32c(&encoded[..body_len]);
        encoded[body_len..].copy_from_slice(&crc.to_be_bytes());
    }

    fn any_kind() -> impl Strategy<Value = EnvelopeKind> {
        prop_oneof![
            Just(EnvelopeKind::LogEntry),
            Just(EnvelopeKind::Snapshot),
            Just(EnvelopeKind::Epoch),
            Just(EnvelopeKind::SnapshotManifest),
            Just(EnvelopeKind::SnapshotChunk),
        ]
    }

    proptest! {
        #[test]
        fn test_envelope_round_trip_prop(
            kind in any_kind(),
            epoch in any::<u64>(),
            seq in any::<u64>(),
            payload in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let encoded = encode_envelope(kind, epoch, seq, &payload).unwrap();
            let decoded = decode_envelope(&encoded).unwrap();
            prop_assert_eq!(decoded, Envelope { kind, epoch, seq, payload: &payload });
        }

        #[test]
        fn test_envelope_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_envelope(&bytes);
        }

        #[test]
        fn test_envelope_decode_mutated_never_panics(
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            fix_crc in any::<bool>(),
        ) {
            let mut encoded = encode_envelope(EnvelopeKind::LogEntry, 3, 4, &payload).unwrap().to_vec();
            for (index, value) in flips {
                let position = index.index(encoded.len());
                encoded[position] = value;
            }
            if fix_crc {
                refresh_crc(&mut encoded);
            }
            let _ = decode_envelope(&encoded);
        }
    }
}
