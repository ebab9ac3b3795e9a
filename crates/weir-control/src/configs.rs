//! Topic configuration keys Weir knows, their defaults and validation.

use std::collections::BTreeMap;

use crate::ControlError;

/// A topic config key with its default and a validator.
#[derive(Debug, Clone, Copy)]
pub struct ConfigKey {
    pub name: &'static str,
    pub default: &'static str,
    pub kind: ConfigKind,
    pub doc: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    Long { min: i64 },
    Int { min: i64 },
    OneOf(&'static [&'static str]),
    Bool,
    Text,
}

pub const MAX_MESSAGE_BYTES: &str = "max.message.bytes";
pub const CLEANUP_POLICY: &str = "cleanup.policy";
pub const MESSAGE_TIMESTAMP_TYPE: &str = "message.timestamp.type";
pub const MESSAGE_TIMESTAMP_BEFORE_MAX_MS: &str = "message.timestamp.before.max.ms";
pub const MESSAGE_TIMESTAMP_AFTER_MAX_MS: &str = "message.timestamp.after.max.ms";
pub const MESSAGE_TIMESTAMP_DIFFERENCE_MAX_MS: &str = "message.timestamp.difference.max.ms";
/// Kafka's "no bound" for the timestamp limits (Long.MAX_VALUE).
pub const NO_TIMESTAMP_BOUND: &str = "9223372036854775807";
pub const DEFAULT_MAX_MESSAGE_BYTES: i64 = 1_048_588;

/// Every topic-level config Weir accepts. Values are stored as given and validated here.
pub const TOPIC_CONFIGS: &[ConfigKey] = &[
    key(
        CLEANUP_POLICY,
        "delete",
        ConfigKind::OneOf(&["delete", "compact", "compact,delete", "delete,compact"]),
        "compact: every record must have a key (INVALID_RECORD otherwise, KIP-467); the log \
         itself is not compacted yet, it keeps every record (which compaction's guarantees allow).",
    ),
    key(
        "compression.type",
        "producer",
        ConfigKind::OneOf(&["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]),
        "Weir never recompresses: batches are stored as produced.",
    ),
    key(
        "delete.retention.ms",
        "86400000",
        ConfigKind::Long { min: 0 },
        "Tombstone retention for compacted topics.",
    ),
    key(
        "file.delete.delay.ms",
        "60000",
        ConfigKind::Long { min: 0 },
        "Accepted for compatibility.",
    ),
    key(
        "flush.messages",
        "9223372036854775807",
        ConfigKind::Long { min: 1 },
        "Accepted for compatibility: every ack is already durable in object storage.",
    ),
    key(
        "flush.ms",
        "9223372036854775807",
        ConfigKind::Long { min: 0 },
        "Accepted for compatibility: every ack is already durable in object storage.",
    ),
    key(
        MAX_MESSAGE_BYTES,
        "1048588",
        ConfigKind::Int { min: 0 },
        "Largest record batch accepted for this topic.",
    ),
    key(
        MESSAGE_TIMESTAMP_AFTER_MAX_MS,
        NO_TIMESTAMP_BOUND,
        ConfigKind::Long { min: 0 },
        "CreateTime records more than this far ahead of the agent's clock get INVALID_TIMESTAMP.",
    ),
    key(
        MESSAGE_TIMESTAMP_BEFORE_MAX_MS,
        NO_TIMESTAMP_BOUND,
        ConfigKind::Long { min: 0 },
        "CreateTime records more than this far behind the agent's clock get INVALID_TIMESTAMP.",
    ),
    key(
        MESSAGE_TIMESTAMP_DIFFERENCE_MAX_MS,
        NO_TIMESTAMP_BOUND,
        ConfigKind::Long { min: 0 },
        "Deprecated bound on both sides (KIP-937 splits it); the tighter of it and before/after applies.",
    ),
    key(
        MESSAGE_TIMESTAMP_TYPE,
        "CreateTime",
        ConfigKind::OneOf(&["CreateTime", "LogAppendTime"]),
        "LogAppendTime: the agent stamps each batch with its append time when it accepts it.",
    ),
    key(
        "min.insync.replicas",
        "1",
        ConfigKind::Int { min: 1 },
        "Durability comes from the object-store quorum, not replicas.",
    ),
    key(
        "retention.bytes",
        "-1",
        ConfigKind::Long { min: -1 },
        "Size-based retention per partition.",
    ),
    key(
        "retention.ms",
        "604800000",
        ConfigKind::Long { min: -1 },
        "Time-based retention.",
    ),
    key(
        "segment.bytes",
        "1073741824",
        ConfigKind::Int { min: 14 },
        "Accepted for compatibility: Weir has no segments.",
    ),
    key(
        "segment.ms",
        "604800000",
        ConfigKind::Long { min: 1 },
        "Accepted for compatibility: Weir has no segments.",
    ),
    key(
        "unclean.leader.election.enable",
        "false",
        ConfigKind::Bool,
        "Accepted for compatibility: there are no replicas to elect.",
    ),
    key(
        "message.downconversion.enable",
        "true",
        ConfigKind::Bool,
        "Accepted for compatibility.",
    ),
];

const fn key(
    name: &'static str,
    default: &'static str,
    kind: ConfigKind,
    doc: &'static str,
) -> ConfigKey {
    ConfigKey {
        name,
        default,
        kind,
        doc,
    }
}

pub fn lookup(name: &str) -> Option<&'static ConfigKey> {
    TOPIC_CONFIGS.iter().find(|config| config.name == name)
}

/// Validates a set of topic config overrides.
pub fn validate(configs: &BTreeMap<String, String>) -> Result<(), ControlError> {
    for (name, value) in configs {
        let Some(config) = lookup(name) else {
            return Err(ControlError::InvalidConfig(format!(
                "unknown topic config {name}"
            )));
        };
        let valid = match config.kind {
            ConfigKind::Long { min } => value.parse::<i64>().is_ok_and(|v| v >= min),
            ConfigKind::Int { min } => value.parse::<i32>().is_ok_and(|v| i64::from(v) >= min),
            ConfigKind::OneOf(allowed) => allowed.contains(&value.as_str()),
            ConfigKind::Bool => value == "true" || value == "false",
            ConfigKind::Text => true,
        };
        if !valid {
            return Err(ControlError::InvalidConfig(format!(
                "invalid value {value:?} for {name}"
            )));
        }
    }
    Ok(())
}

/// The effective value of `name` for a topic with `overrides`.
pub fn effective<'a>(overrides: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    overrides
        .get(name)
        .map(String::as_str)
        .or_else(|| lookup(name).map(|config| config.default))
}

/// Kafka's topic-name rule: 1..=249 chars of `[a-zA-Z0-9._-]`, not "." or "..".
pub fn validate_topic_name(name: &str) -> Result<(), ControlError> {
    let legal = !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if legal {
        Ok(())
    } else {
        Err(ControlError::InvalidTopic(format!(
            "illegal topic name {name:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_configs_validate_known_and_reject_unknown() {
        let mut configs = BTreeMap::new();
        configs.insert("retention.ms".to_string(), "1000".to_string());
        assert!(validate(&configs).is_ok());
        configs.insert("retention.ms".to_string(), "soon".to_string());
        assert!(validate(&configs).is_err());
        let mut unknown = BTreeMap::new();
        unknown.insert("no.such.key".to_string(), "1".to_string());
        assert!(validate(&unknown).is_err());
        assert_eq!(
            effective(&BTreeMap::new(), MAX_MESSAGE_BYTES),
            Some("1048588")
        );
    }

    #[test]
    fn test_topic_names() {
        assert!(validate_topic_name("orders.v1_A-b").is_ok());
        for bad in ["", ".", "..", "has space", "slash/", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad}");
        }
    }
}
