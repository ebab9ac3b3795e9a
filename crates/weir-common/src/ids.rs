use std::fmt;

use serde::{Deserialize, Serialize};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A ULID: 48 bits of milliseconds then 80 random bits, printed as 26 Crockford base32 chars.
///
/// Files named by ULID sort by creation time, which keeps listings and sweeps cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileId(pub u128);

impl FileId {
    pub fn new(unix_ms: i64, rng: &mut fastrand::Rng) -> Self {
        let millis = (u128::try_from(unix_ms.max(0)).unwrap_or(0)) & ((1u128 << 48) - 1);
        let random = rng.u128(..) & ((1u128 << 80) - 1);
        Self((millis << 80) | random)
    }

    pub fn unix_ms(&self) -> i64 {
        i64::try_from(self.0 >> 80).unwrap_or(i64::MAX)
    }

    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 26 {
            return None;
        }
        let mut value: u128 = 0;
        for (index, ch) in text.bytes().enumerate() {
            let digit = CROCKFORD
                .iter()
                .position(|c| *c == ch.to_ascii_uppercase())?;
            // The first char carries only 3 significant bits (26 * 5 = 130 > 128).
            if index == 0 && digit > 7 {
                return None;
            }
            value = (value << 5) | digit as u128;
        }
        Some(Self(value))
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; 26];
        for (index, slot) in out.iter_mut().enumerate() {
            let shift = 5 * (25 - index);
            *slot = CROCKFORD[((self.0 >> shift) & 0x1f) as usize];
        }
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

/// A topic's UUID, as Kafka's topic ids (Metadata v10+, Fetch v13+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TopicId(pub [u8; 16]);

impl TopicId {
    /// A random version-4 UUID.
    pub fn random(rng: &mut fastrand::Rng) -> Self {
        let mut bytes = rng.u128(..).to_be_bytes();
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Self(bytes)
    }

    pub fn is_zero(&self) -> bool {
        self.0 == [0u8; 16]
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_file_id_round_trips_and_sorts_by_time() {
        let mut rng = fastrand::Rng::with_seed(1);
        let early = FileId::new(1_700_000_000_000, &mut rng);
        let late = FileId::new(1_700_000_000_001, &mut rng);
        assert!(early < late);
        assert!(early.to_string() < late.to_string());
        assert_eq!(FileId::parse(&early.to_string()), Some(early));
        assert_eq!(early.unix_ms(), 1_700_000_000_000);
        assert_eq!(FileId::parse("not-a-ulid"), None);
    }

    #[test]
    fn test_topic_id_is_uuid_v4() {
        let mut rng = fastrand::Rng::with_seed(3);
        let id = TopicId::random(&mut rng);
        assert_eq!(id.0[6] >> 4, 4);
        assert!(!id.is_zero());
    }
}
