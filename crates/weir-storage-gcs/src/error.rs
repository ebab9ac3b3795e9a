//! From the client's errors to [`StorageError`].
//!
//! The same gRPC status means different things depending on the call: a failed precondition on
//! a create is "the object already exists" (the create says `ifGenerationMatch: 0`), while on a
//! writer it means the writer lost the object (taken over, finalized, or a write offset the
//! service no longer agrees with). [`Op`] carries that context.

use google_cloud_gax::error::rpc::Code;
use google_cloud_storage::Error;
use object_store::path::Path;
use weir_storage::StorageError;

/// The store name in [`object_store::Error::Generic`], which callers treat as transient.
const STORE: &str = "GcsRapid";

/// Which call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Opening a new appendable object with a does-not-exist precondition.
    Create,
    /// Reopening an existing appendable object at its generation.
    Takeover,
    /// Opening a new generation of an object with a generation precondition other than 0
    /// (a compare-and-set): a refused precondition is `Precondition`.
    Replace,
    /// An append, flush, finalize or close of an open writer.
    Write,
    /// Opening an object to stat or read it.
    Read,
}

/// Maps `err` from a call of kind `op` on `path`.
///
/// Only what a retry can fix becomes [`object_store::Error::Generic`] (retryable): unavailable,
/// internal, resource exhausted, deadline, cancelled, unknown, and every error that carries no
/// service status (I/O, connect, timeout, an exhausted retry loop, credentials). The rest are
/// deterministic.
pub(crate) fn map(path: &Path, op: Op, err: Error) -> StorageError {
    let Some(code) = err.status().map(|s| s.code) else {
        return generic(err);
    };
    let path_str = path.to_string();
    match code {
        Code::NotFound => object_store::Error::NotFound {
            path: path_str,
            source: Box::new(err),
        }
        .into(),
        Code::AlreadyExists => object_store::Error::AlreadyExists {
            path: path_str,
            source: Box::new(err),
        }
        .into(),
        Code::FailedPrecondition if op == Op::Create => object_store::Error::AlreadyExists {
            path: path_str,
            source: Box::new(err),
        }
        .into(),
        Code::FailedPrecondition | Code::Aborted | Code::OutOfRange
            if matches!(op, Op::Write | Op::Takeover) =>
        {
            StorageError::Fenced {
                path: path_str,
                reason: format!("the service refused the writer: {err}"),
            }
        }
        Code::FailedPrecondition => object_store::Error::Precondition {
            path: path_str,
            source: Box::new(err),
        }
        .into(),
        Code::OutOfRange | Code::InvalidArgument => {
            StorageError::InvalidConfig(format!("{path}: {err}"))
        }
        Code::PermissionDenied => object_store::Error::PermissionDenied {
            path: path_str,
            source: Box::new(err),
        }
        .into(),
        Code::Unauthenticated => object_store::Error::Unauthenticated {
            path: path_str,
            source: Box::new(err),
        }
        .into(),
        Code::Unimplemented => object_store::Error::NotSupported {
            source: Box::new(err),
        }
        .into(),
        _ => generic(err),
    }
}

fn generic(err: Error) -> StorageError {
    transient(Box::new(err))
}

/// A failure a retry may fix: [`object_store::Error::Generic`], which callers retry.
pub(crate) fn transient(source: Box<dyn std::error::Error + Send + Sync>) -> StorageError {
    object_store::Error::Generic {
        store: STORE,
        source,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use google_cloud_gax::error::rpc::Status;

    use super::*;

    fn service(code: Code) -> Error {
        Error::service(Status::default().set_code(code).set_message("test"))
    }

    fn is_fenced(err: &StorageError) -> bool {
        matches!(err, StorageError::Fenced { .. })
    }

    #[test]
    fn test_error_map_by_code_and_op() {
        let path = Path::from("a/b");
        let map = |op, code| map(&path, op, service(code));
        assert!(matches!(
            map(Op::Create, Code::FailedPrecondition),
            StorageError::ObjectStore(object_store::Error::AlreadyExists { .. })
        ));
        for code in [Code::FailedPrecondition, Code::Aborted, Code::OutOfRange] {
            assert!(is_fenced(&map(Op::Write, code)), "{code:?}");
            assert!(is_fenced(&map(Op::Takeover, code)), "{code:?}");
        }
        assert!(matches!(
            map(Op::Read, Code::FailedPrecondition),
            StorageError::ObjectStore(object_store::Error::Precondition { .. })
        ));
        assert!(matches!(
            map(Op::Read, Code::OutOfRange),
            StorageError::InvalidConfig(_)
        ));
        for op in [Op::Create, Op::Takeover, Op::Write, Op::Read] {
            assert!(matches!(
                map(op, Code::NotFound),
                StorageError::ObjectStore(object_store::Error::NotFound { .. })
            ));
            assert!(matches!(
                map(op, Code::PermissionDenied),
                StorageError::ObjectStore(object_store::Error::PermissionDenied { .. })
            ));
        }
    }

    #[test]
    fn test_error_map_retryable_only_when_transient() {
        let path = Path::from("k");
        let transient = [
            Code::Unavailable,
            Code::Internal,
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
        ];
        for code in transient {
            assert!(
                map(&path, Op::Write, service(code)).is_retryable(),
                "{code:?}"
            );
        }
        let deterministic = [
            Code::NotFound,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::Unimplemented,
        ];
        for code in deterministic {
            assert!(
                !map(&path, Op::Write, service(code)).is_retryable(),
                "{code:?}"
            );
        }
        assert!(map(&path, Op::Read, Error::timeout("slow")).is_retryable());
        assert!(map(&path, Op::Write, Error::exhausted("gave up")).is_retryable());
    }
}
