use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiVersionsResponse;
use weir_protocol::error_code;
use weir_protocol::versions::SUPPORTED_APIS;

use crate::dispatch::RequestContext;

fn api_keys() -> Vec<ApiVersion> {
    SUPPORTED_APIS
        .iter()
        .map(|api| {
            ApiVersion::default()
                .with_api_key(api.key as i16)
                .with_min_version(api.advertised_min)
                .with_max_version(api.max)
        })
        .collect()
}

pub(crate) fn handle(context: RequestContext) -> Option<Bytes> {
    let response = ApiVersionsResponse::default()
        .with_error_code(error_code::NONE)
        .with_api_keys(api_keys())
        .with_finalized_features_epoch(-1);
    context.encode(&response)
}

/// An ApiVersions request at a version we do not serve: answer with v0 and the key list so the
/// client can pick a version it shares with us (KIP-511).
pub(crate) fn unsupported(context: RequestContext) -> Option<Bytes> {
    let response = ApiVersionsResponse::default()
        .with_error_code(error_code::UNSUPPORTED_VERSION)
        .with_api_keys(api_keys());
    let v0 = RequestContext {
        version: 0,
        ..context
    };
    v0.encode(&response)
}
