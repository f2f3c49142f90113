//! The model client a host plugs in.

use crate::message::{ModelRequest, ModelResponse};
use async_trait::async_trait;

/// Why a model call failed.
///
/// The runner retries [`ModelError::Transient`] and [`ModelError::RateLimited`]
/// under `RunnerConfig::model_retry`, fails the step on
/// [`ModelError::Permanent`], and meets [`ModelError::ContextOverflow`] by
/// making the context smaller and trying the step once more (see
/// `docs/design.md`, "Context overflow").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Worth retrying (overload, 5xx, network, timeout).
    #[error("transient model error: {0}")]
    Transient(String),
    /// Rate limited (HTTP 429): worth retrying, not before `retry_after` when
    /// the provider said when.
    #[error("rate limited: {message}")]
    RateLimited {
        /// What the provider said.
        message: String,
        /// The provider's `Retry-After`, if it sent one.
        retry_after: Option<std::time::Duration>,
    },
    /// The request is longer than the model's context window. Retrying the
    /// same request cannot help; a smaller one can.
    #[error("context overflow: {0}")]
    ContextOverflow(String),
    /// Retrying will not help (bad request, auth).
    #[error("model error: {0}")]
    Permanent(String),
    /// The answer's body is longer than the client reads
    /// (`HttpOptions::max_response_bytes`); refused before it was buffered
    /// whole. Not retried: the same request is likely to get the same answer.
    #[error("the provider's answer is larger than {limit_bytes} bytes; refused")]
    ResponseTooLarge {
        /// The limit in force.
        limit_bytes: u64,
    },
}

impl ModelError {
    /// True for the errors a retry of the same request can cure.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ModelError::Transient(_) | ModelError::RateLimited { .. }
        )
    }
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
