//! What a failed S3 Express request means to Weir: [`StorageError`]s whose
//! [`StorageError::is_retryable`] tells callers whether trying again can help.

use std::error::Error as StdError;

use aws_runtime::retries::classifiers::{THROTTLING_ERRORS, TRANSIENT_ERRORS};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use object_store::path::Path;
use weir_storage::StorageError;

/// The store name in [`object_store::Error::Generic`] and its siblings.
pub(crate) const STORE: &str = "S3Express";

/// Which request failed; the same answer means different things for different requests (a
/// 412 on a create-only put is "already exists", on an append it is a fence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// `PutObject` with `If-None-Match: *` and an empty body.
    Create,
    /// `PutObject` with `x-amz-write-offset-bytes`.
    Append,
    /// `HeadObject`.
    Head,
    /// `GetObject` with a `Range`.
    Get,
}

/// Maps a failed request on `path` to a [`StorageError`]:
///
/// - no answer (dispatch failure, timeout) or an answer the SDK could not parse: retryable
///   [`object_store::Error::Generic`];
/// - `InvalidWriteOffset`, and 412/409 on an append: [`StorageError::Fenced`] (the object's
///   size is no longer the writer's offset: another writer appended);
/// - 412/409 on a create: `AlreadyExists`; `TooManyParts`: [`StorageError::ObjectFull`];
/// - 416 on a read (a range starting at or past the end): the double's past-the-end error;
/// - 404: `NotFound`; 401/403: `Unauthenticated`/`PermissionDenied`; `NotImplemented`:
///   `NotImplemented` (a bucket without appends);
/// - 5xx, 408, 429 and the codes the SDK itself retries as throttling or transient: retryable
///   `Generic`; any other answer: `NotSupported` (the bucket refuses this request; sending it
///   again unchanged cannot help).
pub(crate) fn map_error<E>(
    request: Request,
    path: &Path,
    err: SdkError<E, HttpResponse>,
) -> StorageError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    if !matches!(err, SdkError::ServiceError(_)) {
        if matches!(err, SdkError::ConstructionFailure(_)) {
            // Never sent: the client or the request is misconfigured.
            return StorageError::InvalidConfig(format!(
                "S3 Express {request:?} of {path} could not be built: {}",
                DisplayErrorContext(&err)
            ));
        }
        return generic(DisplayErrorContext(&err));
    }
    let status = err.raw_response().map_or(0, |r| r.status().as_u16());
    let code = err.code().unwrap_or_default().to_string();
    let mut what = format!("S3 Express {request:?} answered {status} {code}");
    if let Some(message) = err.message().filter(|m| !m.is_empty()) {
        what = format!("{what}: {message}");
    }
    let path_str = path.to_string();
    match (request, status, code.as_str()) {
        (_, _, "InvalidWriteOffset") | (Request::Append, 409 | 412, _) => StorageError::Fenced {
            path: path_str,
            reason: format!("{what} (another writer appended; take the object over)"),
        },
        (Request::Create, 409 | 412, _) => object_store::Error::AlreadyExists {
            path: path_str,
            source: what.into(),
        }
        .into(),
        (_, _, "TooManyParts") => StorageError::ObjectFull {
            path: path_str,
            reason: what,
        },
        (_, 404, _) | (_, _, "NoSuchKey" | "NotFound") => object_store::Error::NotFound {
            path: path_str,
            source: what.into(),
        }
        .into(),
        (_, 401, _) => object_store::Error::Unauthenticated {
            path: path_str,
            source: what.into(),
        }
        .into(),
        (_, 403, _) => object_store::Error::PermissionDenied {
            path: path_str,
            source: what.into(),
        }
        .into(),
        (_, _, "NotImplemented") => object_store::Error::NotImplemented {
            operation: what,
            implementer: STORE.to_string(),
        }
        .into(),
        (Request::Get, 416, _) | (_, _, "InvalidRange") => past_end(path, what),
        (_, 408 | 429 | 500..=599, _) => generic(DisplayErrorContext(&err)),
        (_, _, code) if THROTTLING_ERRORS.contains(&code) || TRANSIENT_ERRORS.contains(&code) => {
            generic(DisplayErrorContext(&err))
        }
        _ => object_store::Error::NotSupported {
            source: format!("{what} (on {path})").into(),
        }
        .into(),
    }
}

/// A retryable error saying what went wrong (an SDK error through [`DisplayErrorContext`],
/// which prints its whole source chain).
pub(crate) fn generic(detail: impl std::fmt::Display) -> StorageError {
    object_store::Error::Generic {
        store: STORE,
        source: detail.to_string().into(),
    }
    .into()
}

/// A read that asked for bytes past the persisted size (an error, as in the trait's double).
pub(crate) fn past_end(path: &Path, detail: impl std::fmt::Display) -> StorageError {
    StorageError::InvalidConfig(format!(
        "read past the persisted size of the appendable object {path}: {detail}"
    ))
}
