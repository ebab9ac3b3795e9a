//! Test-only crate: end-to-end tests that drive a real `weir agent` process with the `rdkafka`
//! crate. It exists so that librdkafka is built and linked only here, never into the agent.
//!
//! The tests need the agent binary: `WEIR_BIN`, or `$CARGO_TARGET_DIR/debug/weir`
//! (`make test` builds it first).
