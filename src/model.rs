//! The model client a host plugs in.

use crate::message::{ModelRequest, ModelResponse};
use async_trait::async_trait;

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Worth retrying (rate limit, overload, network).
    #[error("transient model error: {0}")]
    Transient(String),
    /// Retrying will not help (bad request, auth).
    #[error("model error: {0}")]
    Permanent(String),
}

/// A model endpoint.
///
/// # Contract
/// - It **may be called again for the same step** after a crash: a process
///   killed after the request was sent but before the response was persisted
///   repeats the call on resume. A response is persisted in its step's
///   transaction, with the step's transactional tool calls, and always before
///   any outside tool call it makes. Once persisted it is never requested
///   again. Like every durable-execution system, the call itself is
///   at-least-once; what is exactly-once is the recorded outcome.
/// - It should report usage where the provider does; without input tokens
///   abridge estimates the context size with the configured token counter.
/// - It must not panic; a panic is caught and treated as a transient error.
/// - It is polled in the step's own task, not spawned: a call that outlives
///   `RunnerConfig::model_timeout` is dropped (cancelled), not left running.
/// - It must not block its thread (await I/O instead): a blocking client holds
///   up a runtime worker for as long as it blocks.
#[async_trait]
pub trait ModelClient: Send + Sync {
    /// Sends one request and returns the response.
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError>;
}
