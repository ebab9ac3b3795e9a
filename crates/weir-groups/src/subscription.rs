//! Reads the topic list of a `consumer` protocol subscription (ConsumerProtocolSubscription:
//! version i16, then an array of topic names). Only OffsetDelete needs it, to refuse deleting
//! offsets of topics a live group is subscribed to; assignment bytes are never parsed.

use std::collections::BTreeSet;

/// The subscribed topics, or `None` if the bytes are not a subscription this code understands.
pub(crate) fn subscribed_topics(metadata: &[u8]) -> Option<BTreeSet<String>> {
    let mut cursor = metadata;
    let _version = read_i16(&mut cursor)?;
    let count = read_i32(&mut cursor)?;
    if count < 0 {
        return None;
    }
    let mut topics = BTreeSet::new();
    for _ in 0..count {
        let len = usize::try_from(read_i16(&mut cursor)?).ok()?;
        if cursor.len() < len {
            return None;
        }
        let (name, rest) = cursor.split_at(len);
        topics.insert(String::from_utf8(name.to_vec()).ok()?);
        cursor = rest;
    }
    Some(topics)
}

fn read_i16(cursor: &mut &[u8]) -> Option<i16> {
    let (head, rest) = cursor.split_first_chunk::<2>()?;
    *cursor = rest;
    Some(i16::from_be_bytes(*head))
}

fn read_i32(cursor: &mut &[u8]) -> Option<i32> {
    let (head, rest) = cursor.split_first_chunk::<4>()?;
    *cursor = rest;
    Some(i32::from_be_bytes(*head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_subscription_reads_topics_and_rejects_garbage() {
        let mut bytes = vec![0, 1, 0, 0, 0, 2, 0, 1, b'a', 0, 2, b'b', b'c'];
        bytes.extend_from_slice(&[0, 0, 0, 0]); // user data and more: ignored
        let topics = subscribed_topics(&bytes).unwrap();
        assert_eq!(topics.into_iter().collect::<Vec<_>>(), vec!["a", "bc"]);
        assert_eq!(subscribed_topics(&[0, 1, 0, 0, 0, 5, 0, 9]), None);
        assert_eq!(subscribed_topics(&[0]), None);
    }
}
