//! The storage error type.

/// Errors returned by `weir-storage`.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An error from the underlying object store (or from the latency/fault model).
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),

    /// A local I/O error outside the object store (e.g. creating a `file://` root).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),

    /// The store URL names a scheme this build does not support.
    #[error("unsupported object store URL scheme: {0}")]
    UnsupportedScheme(String),

    /// A quorum write can no longer reach `needed` successful buckets.
    #[error(
        "quorum write failed: needed {needed}, succeeded {succeeded}; last error: {last_error}"
    )]
    QuorumFailed {
        /// The quorum size.
        needed: usize,
        /// How many buckets had succeeded when the quorum became impossible.
        succeeded: usize,
        /// The error of the bucket whose failure made the quorum impossible.
        last_error: Box<StorageError>,
    },

    /// A bucket lacks something Weir relies on (found by [`crate::probe`] at startup).
    #[error("bucket {bucket} does not support {capability}: {detail}. Weir relies on it for {needed_for}; refusing to start (docs/operations.md lists stores that pass)")]
    MissingCapability {
        /// The bucket's display name.
        bucket: String,
        /// What is missing, e.g. `create-only writes (If-None-Match: *)`.
        capability: &'static str,
        /// What the probe saw.
        detail: String,
        /// Why Weir needs it.
        needed_for: &'static str,
    },

    /// The configured buckets are not the ones the metadata log's holders name.
    #[error("{0}")]
    BucketMismatch(String),

    /// A configuration value (URL, profile, quorum, holder index…) is invalid.
    #[error("invalid storage config: {0}")]
    InvalidConfig(String),

    /// An appendable object refused a writer: another writer took it over, it was finalized, or
    /// the write offset no longer matches its size. The writer must stop; it never succeeds by
    /// retrying.
    #[error("appendable object {path}: writer fenced: {reason}")]
    Fenced {
        /// The object's key.
        path: String,
        /// What the backend saw (generation, offsets, finalized).
        reason: String,
    },

    /// An appendable object reached a per-object limit (size, append count or age).
    #[error("appendable object {path} is full: {reason}")]
    ObjectFull {
        /// The object's key.
        path: String,
        /// Which limit.
        reason: String,
    },
}

impl StorageError {
    /// Whether retrying the same operation later may succeed.
    ///
    /// Deterministic outcomes (not found, already exists, precondition failed, bad path,
    /// unsupported operation, auth failures, bad config) are not retryable; transient store errors
    /// (`Generic`, which is what HTTP stores report after their own retries and what the latency
    /// model injects) are.
    pub fn is_retryable(&self) -> bool {
        use object_store::Error as E;
        match self {
            StorageError::ObjectStore(e) => !matches!(
                e,
                E::NotFound { .. }
                    | E::AlreadyExists { .. }
                    | E::Precondition { .. }
                    | E::NotModified { .. }
                    | E::InvalidPath { .. }
                    | E::NotSupported { .. }
                    | E::NotImplemented { .. }
                    | E::PermissionDenied { .. }
                    | E::Unauthenticated { .. }
                    | E::UnknownConfigurationKey { .. }
            ),
            StorageError::Io(e) => matches!(
                e.kind(),
                std::io::ErrorKind::Interrupted
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::WouldBlock
            ),
            StorageError::QuorumFailed { last_error, .. } => last_error.is_retryable(),
            StorageError::UnsupportedScheme(_)
            | StorageError::InvalidConfig(_)
            | StorageError::MissingCapability { .. }
            | StorageError::BucketMismatch(_)
            | StorageError::Fenced { .. }
            | StorageError::ObjectFull { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_error_is_retryable_classification() {
        let transient = StorageError::from(object_store::Error::Generic {
            store: "model",
            source: "boom".into(),
        });
        assert!(transient.is_retryable());
        let exists = StorageError::from(object_store::Error::AlreadyExists {
            path: "a".into(),
            source: "exists".into(),
        });
        assert!(!exists.is_retryable());
        let quorum = StorageError::QuorumFailed {
            needed: 2,
            succeeded: 1,
            last_error: Box::new(transient),
        };
        assert!(quorum.is_retryable());
        assert!(!StorageError::InvalidConfig("x".into()).is_retryable());
        assert!(!StorageError::UnsupportedScheme("s3".into()).is_retryable());
    }
}
